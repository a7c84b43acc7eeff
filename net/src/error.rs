//! [`TlsError`]: why a certificate, a key, a TLS configuration or a QUIC
//! endpoint could not be made or used.
//!
//! Messages carry the failing file or peer and the underlying cause in
//! their text, so that one line in a log says everything.

use crate::role::{ParseRoleError, ROLE_URI_PREFIX, Role, RoleList};
use quinn::crypto::rustls::NoInitialCipherSuite;
use rustls::server::VerifierBuilderError;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Why a certificate, a key or a TLS configuration could not be made or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// Reading, writing or creating a file or directory failed.
    #[error("{action} {}: {error}", path.display())]
    Io {
        /// What was being done: "reading", "writing", "creating directory".
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        error: io::Error,
    },
    /// A file to be written exists already; nothing is overwritten.
    #[error("{} already exists; refusing to overwrite it", path.display())]
    AlreadyExists {
        /// The existing file.
        path: PathBuf,
    },
    /// A PEM file could not be parsed.
    #[error("{}: malformed PEM: {error}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        error: rustls::pki_types::pem::Error,
    },
    /// A file that should hold a certificate holds none.
    #[error("{}: no PEM certificate in the file", path.display())]
    NoCertificateInFile {
        /// The file.
        path: PathBuf,
    },
    /// A file that should hold a private key holds none.
    #[error("{}: no PEM private key in the file", path.display())]
    NoKeyInFile {
        /// The file.
        path: PathBuf,
    },
    /// A private key file holds a key that cannot be used.
    #[error("{}: unusable private key: {error}", path.display())]
    BadKey {
        /// The key file.
        path: PathBuf,
        /// Why the key was refused.
        error: String,
    },
    /// A certificate is not signed by the CA it is meant to be loaded with.
    #[error("{} is not signed by the CA in {}", cert.display(), ca.display())]
    NotSignedByCa {
        /// The certificate file.
        cert: PathBuf,
        /// The CA certificate file.
        ca: PathBuf,
    },
    /// A private key does not belong to the certificate it was paired with.
    #[error("{} does not hold the private key of the certificate in {}", key.display(), cert.display())]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// A certificate read from a file is unusable; `error` says why.
    #[error("{}: {error}", path.display())]
    CertificateFile {
        /// The certificate file.
        path: PathBuf,
        /// What is wrong with the certificate.
        error: Box<TlsError>,
    },
    /// A name for a new certificate is not a plain file stem.
    #[error(
        "invalid certificate name {name:?}: use 1 to 64 of A-Z a-z 0-9 . _ -, not starting with '.', and not \"ca\""
    )]
    InvalidName {
        /// The name that was given.
        name: String,
    },
    /// No identity was named and the folder does not hold exactly one.
    #[error(
        "{} holds {} identities ({}): name the one to use (cert_name in node.toml, --cert-name on the command line), \
         or give this host its own folder of `granary certs init` (hosts/NAME/, one identity)",
        dir.display(), found.len(), if found.is_empty() { "no key file".to_string() } else { found.join(", ") }
    )]
    WhichIdentity {
        /// The folder.
        dir: PathBuf,
        /// The identities it holds (stems of its key files).
        found: Vec<String>,
    },
    /// A certificate was to be issued into an identity folder that holds another identity's key.
    #[error(
        "{} already holds the key of {}: one identity per folder (the folder a host is given must let it be only \
         that identity); issue into a folder of its own, such as hosts/NAME/",
        dir.display(), found.join(", ")
    )]
    FolderHoldsIdentity {
        /// The folder.
        dir: PathBuf,
        /// The identities it already holds.
        found: Vec<String>,
    },
    /// The bytes are not a DER X.509 certificate.
    #[error("malformed X.509 certificate: {0}")]
    MalformedCertificate(String),
    /// A node id was asked for in a certificate of another role.
    #[error(
        "only node and coordinator certificates can be bound to an id (a node id, a voter id), not a {0} certificate"
    )]
    NodeIdForRole(Role),
    /// The certificate has no `urn:granary:role:` subject-alternative name.
    #[error("certificate carries no granary role (no {ROLE_URI_PREFIX}<role> subject-alternative name)")]
    NoRole,
    /// The certificate's role URI names no known role.
    #[error("certificate carries an unknown granary role: {0}")]
    UnknownRole(#[from] ParseRoleError),
    /// The certificate names more than one role.
    #[error("certificate carries more than one granary role: {first} and {second}")]
    ConflictingRoles {
        /// The first role found.
        first: Role,
        /// A different role found after it.
        second: Role,
    },
    /// The peer of a connection presented no certificate.
    #[error("peer {peer} presented no certificate")]
    NoPeerCertificate {
        /// The peer's address.
        peer: SocketAddr,
    },
    /// The certificate the peer of a connection presented is unusable; `error` says why.
    #[error("peer {peer}: {error}")]
    PeerCertificate {
        /// The peer's address.
        peer: SocketAddr,
        /// What is wrong with the certificate.
        error: Box<TlsError>,
    },
    /// The peer's certificate carries a role that may not use this service.
    #[error("peer {peer} has the wrong role: expected {}, got {got}", RoleList(expected))]
    WrongRole {
        /// The peer's address.
        peer: SocketAddr,
        /// The roles that would have been accepted.
        expected: Vec<Role>,
        /// The role the peer's certificate carries.
        got: Role,
    },
    /// Generating a key or signing a certificate failed.
    #[error("generating {what}: {error}")]
    Generate {
        /// What was being generated.
        what: String,
        /// rcgen's error.
        error: rcgen::Error,
    },
    /// The system clock is before 1970 or too far in the future for a certificate.
    #[error("the system clock cannot be used for certificate validity: {0}")]
    Clock(String),
    /// rustls refused the configuration.
    #[error("building the {side} TLS configuration: {error}")]
    Rustls {
        /// "server" or "client".
        side: &'static str,
        /// rustls's error.
        error: rustls::Error,
    },
    /// The CA roots could not be made into a client-certificate verifier.
    #[error("building the client-certificate verifier: {0}")]
    Verifier(VerifierBuilderError),
    /// The TLS configuration lacks the cipher suite QUIC's initial packets need.
    #[error("the {side} TLS configuration cannot be used for QUIC: {error}")]
    Quic {
        /// "server" or "client".
        side: &'static str,
        /// quinn's error.
        error: NoInitialCipherSuite,
    },
    /// The UDP socket could not be bound.
    #[error("binding a QUIC endpoint on {addr}: {error}")]
    Bind {
        /// The requested local address.
        addr: SocketAddr,
        /// The operating system's error.
        error: io::Error,
    },
}
