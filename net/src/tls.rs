//! The cluster CA, role certificates and mutual-TLS QUIC configurations.
//!
//! Every QUIC endpoint in a Granary cluster presents a certificate signed by
//! the cluster CA and requires one from its peer, so that nothing outside the
//! cluster can reach the coordinator or a node. A certificate also says what
//! its holder is: the [`Role`] lives in a URI subject-alternative name
//! `urn:granary:role:<role>`. The TLS layer only checks that a peer belongs to
//! the cluster; which roles may use which protocol is the server's decision,
//! taken after the handshake with [`peer_role`] or [`require_peer_role`].
//!
//! Every leaf certificate carries the DNS names `granary-<role>` (see
//! [`Role::server_name`]) and `localhost` and the address 127.0.0.1, and can
//! act as both client and server, because every party both dials and serves.
//!
//! On disk a cluster directory holds `ca.pem`/`ca.key` and one `<name>.pem`/
//! `<name>.key` pair per identity; [`init_cluster`] creates it and [`issue`]
//! adds to it. Nothing is ever overwritten, and key files are mode 0600.
//!
//! rustls is always built with an explicit ring provider, never the
//! process-wide default, which may not be installed.
//!
//! Error messages carry the failing file or peer and the underlying cause in
//! their text, so that one line in a log says everything.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use quinn::crypto::rustls::{HandshakeData, NoInitialCipherSuite, QuicClientConfig, QuicServerConfig};
use quinn::{IdleTimeout, VarInt};
use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SanType,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{VerifierBuilderError, WebPkiClientVerifier};
use rustls::{RootCertStore, version::TLS13};
use serde::{Deserialize, Serialize};
use x509_parser::extensions::GeneralName;
use x509_parser::time::ASN1Time;

/// ALPN protocol of the coordinator API (clients, trainers and admins to the coordinator).
pub const ALPN_API: &[u8] = b"granary-api/1";
/// ALPN protocol of Raft traffic between coordinators.
pub const ALPN_RAFT: &[u8] = b"granary-raft/1";
/// ALPN protocol of node-to-node and trainer-to-node data traffic.
pub const ALPN_PEER: &[u8] = b"granary-peer/2";

/// Prefix of the URI subject-alternative name that carries a certificate's role.
pub const ROLE_URI_PREFIX: &str = "urn:granary:role:";

/// Prefix of the subject-alternative-name URI that binds a node certificate to one node id
/// (`urn:granary:node:<id>`). A bound certificate may register and heartbeat only as that node.
pub const NODE_URI_PREFIX: &str = "urn:granary:node:";

/// File stem of the cluster CA's certificate and key in a cluster directory.
pub const CA_NAME: &str = "ca";

/// How often an idle connection sends a keep-alive, so that the peer's idle timer never fires on a live link.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// How long a connection may hear nothing before it is declared dead (the default of [`transport_config`]).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bidirectional streams a peer may have open at once on one connection (one per in-flight request).
pub const MAX_CONCURRENT_BIDI_STREAMS: u32 = 256;
/// Most unidirectional streams a peer may have open at once on one connection.
pub const MAX_CONCURRENT_UNI_STREAMS: u32 = 64;

/// Lifetime of every certificate this module issues.
const VALIDITY: Duration = Duration::from_secs(3653 * 24 * 60 * 60);
/// Backdating of `not_before`, so that a peer whose clock runs a little behind accepts a fresh certificate.
const CLOCK_SKEW: Duration = Duration::from_secs(60 * 60);

/// What a certificate's holder is in the cluster.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A coordinator: holds the cluster map, takes part in Raft.
    Coordinator,
    /// A cache node: stores and serves chunks.
    Node,
    /// A training process: reads batches.
    Trainer,
    /// An operator's command-line tool.
    Admin,
}

impl Role {
    /// Every role, in declaration order.
    pub const ALL: [Role; 4] = [Role::Coordinator, Role::Node, Role::Trainer, Role::Admin];

    /// The lowercase name: `"coordinator"`, `"node"`, `"trainer"`, `"admin"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Coordinator => "coordinator",
            Role::Node => "node",
            Role::Trainer => "trainer",
            Role::Admin => "admin",
        }
    }

    /// The DNS name in this role's certificates, which clients pass as the server name when they connect:
    /// `"granary-coordinator"`, `"granary-node"`, `"granary-trainer"`, `"granary-admin"`.
    pub fn server_name(self) -> &'static str {
        match self {
            Role::Coordinator => "granary-coordinator",
            Role::Node => "granary-node",
            Role::Trainer => "granary-trainer",
            Role::Admin => "granary-admin",
        }
    }

    /// The URI subject-alternative name that marks a certificate with this role.
    pub fn uri(self) -> String {
        format!("{ROLE_URI_PREFIX}{}", self.as_str())
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no [`Role`].
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("unknown role {input:?}: expected one of coordinator, node, trainer, admin")]
pub struct ParseRoleError {
    /// The string that was given.
    pub input: String,
}

impl FromStr for Role {
    type Err = ParseRoleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL.into_iter().find(|r| r.as_str() == s).ok_or_else(|| ParseRoleError { input: s.to_owned() })
    }
}

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
    /// The bytes are not a DER X.509 certificate.
    #[error("malformed X.509 certificate: {0}")]
    MalformedCertificate(String),
    /// A node id was asked for in a certificate of another role.
    #[error("only a node certificate can be bound to a node id, not a {0} certificate")]
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

/// Formats a list of roles as "a", "a or b", "a, b or c".
struct RoleList<'a>(&'a [Role]);

impl fmt::Display for RoleList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [] => f.write_str("no role"),
            [only] => write!(f, "{only}"),
            [init @ .., last] => {
                for (i, r) in init.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{r}")?;
                }
                write!(f, " or {last}")
            }
        }
    }
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> TlsError + use<> {
    let path = path.to_owned();
    move |error| TlsError::Io { action, path, error }
}

fn gen_err(what: impl Into<String>) -> impl FnOnce(rcgen::Error) -> TlsError {
    let what = what.into();
    move |error| TlsError::Generate { what, error }
}

/// The certificate and key paths of identity `name` in cluster directory `dir`.
pub fn identity_paths(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")))
}

/// Checks that `name` is safe as a file stem inside the cluster directory.
fn check_name(name: &str) -> Result<(), TlsError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name != CA_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok { Ok(()) } else { Err(TlsError::InvalidName { name: name.to_owned() }) }
}

/// Parameters with the validity window of a new certificate: from an hour ago to ten years from now.
fn params_valid_from_now() -> Result<CertificateParams, TlsError> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_err(|e| TlsError::Clock(e.to_string()))?;
    let secs = |d: Duration| i64::try_from(d.as_secs()).map_err(|e| TlsError::Clock(e.to_string()));
    let not_before = secs(now.saturating_sub(CLOCK_SKEW))?;
    let not_after = secs(now.saturating_add(VALIDITY))?;
    let time =
        |s: i64| ASN1Time::from_timestamp(s).map(|t| t.to_datetime()).map_err(|e| TlsError::Clock(e.to_string()));
    let mut params = CertificateParams::default();
    params.not_before = time(not_before)?;
    params.not_after = time(not_after)?;
    Ok(params)
}

/// Parameters of the cluster CA certificate.
fn ca_params() -> Result<CertificateParams, TlsError> {
    let mut params = params_valid_from_now()?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "granary");
    dn.push(DnType::CommonName, "granary cluster CA");
    params.distinguished_name = dn;
    // The CA signs leaves only; it never signs another CA.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    Ok(params)
}

/// Parameters of a leaf certificate for `role`, issued to `name`.
#[cfg(test)]
fn leaf_params(role: Role, name: &str) -> Result<CertificateParams, TlsError> {
    leaf_params_for(role, name, None)
}

fn leaf_params_for(role: Role, name: &str, node_id: Option<u64>) -> Result<CertificateParams, TlsError> {
    let mut params = params_valid_from_now()?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "granary");
    dn.push(DnType::CommonName, format!("granary {role} {name}"));
    params.distinguished_name = dn;
    let ia5 = |s: String| Ia5String::try_from(s).map_err(gen_err(format!("the subject names of {name}")));
    params.subject_alt_names = vec![
        SanType::URI(ia5(role.uri())?),
        SanType::DnsName(ia5(role.server_name().to_owned())?),
        SanType::DnsName(ia5("localhost".to_owned())?),
        SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
    ];
    if let Some(id) = node_id {
        params.subject_alt_names.push(SanType::URI(ia5(format!("{NODE_URI_PREFIX}{id}"))?));
    }
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    // Every party both dials out and serves.
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    Ok(params)
}

/// Creates `path` with `contents`, failing if it exists. `secret` files get mode 0600.
fn write_new(path: &Path, contents: &[u8], secret: bool) -> Result<(), TlsError> {
    let mut opts = OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(if secret { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = opts.open(path).map_err(|error| {
        if error.kind() == io::ErrorKind::AlreadyExists {
            TlsError::AlreadyExists { path: path.to_owned() }
        } else {
            TlsError::Io { action: "creating", path: path.to_owned(), error }
        }
    })?;
    file.write_all(contents).and_then(|()| file.sync_all()).map_err(io_err("writing", path))
}

fn refuse_existing(paths: &[&Path]) -> Result<(), TlsError> {
    for path in paths {
        // symlink_metadata so that a dangling link also counts as "exists" (create_new would fail on it anyway).
        if fs::symlink_metadata(path).is_ok() {
            return Err(TlsError::AlreadyExists { path: path.to_path_buf() });
        }
    }
    Ok(())
}

/// Generates a key and a `role` certificate for `name` signed by `issuer`, and writes both. Returns (cert, key).
fn write_leaf(
    dir: &Path,
    role: Role,
    name: &str,
    issuer: &Issuer<'_, KeyPair>,
) -> Result<(PathBuf, PathBuf), TlsError> {
    write_leaf_for(dir, role, name, None, issuer)
}

fn write_leaf_for(
    dir: &Path,
    role: Role,
    name: &str,
    node_id: Option<u64>,
    issuer: &Issuer<'_, KeyPair>,
) -> Result<(PathBuf, PathBuf), TlsError> {
    let (cert_path, key_path) = identity_paths(dir, name);
    refuse_existing(&[&cert_path, &key_path])?;
    let key = KeyPair::generate().map_err(gen_err(format!("the key of {name}")))?;
    let cert = leaf_params_for(role, name, node_id)?
        .signed_by(&key, issuer)
        .map_err(gen_err(format!("the certificate of {name}")))?;
    // The key first: a certificate without its key is useless, a key without its certificate is harmless.
    write_new(&key_path, key.serialize_pem().as_bytes(), true)?;
    write_new(&cert_path, cert.pem().as_bytes(), false)?;
    Ok((cert_path, key_path))
}

/// Creates `dir` (if missing), a new cluster CA (`ca.pem`, `ca.key`) and one certificate per role named after the role
/// (`coordinator.pem`/`.key`, `node.pem`/`.key`, `trainer.pem`/`.key`, `admin.pem`/`.key`).
///
/// Refuses if `dir/ca.key` or any of the other files already exists. Returns the paths written, CA first. Key files
/// are written with mode 0600.
pub fn init_cluster(dir: &Path) -> Result<Vec<PathBuf>, TlsError> {
    fs::create_dir_all(dir).map_err(io_err("creating directory", dir))?;
    let (ca_cert_path, ca_key_path) = identity_paths(dir, CA_NAME);
    let mut targets = vec![ca_key_path.clone(), ca_cert_path.clone()];
    for role in Role::ALL {
        let (c, k) = identity_paths(dir, role.as_str());
        targets.extend([k, c]);
    }
    refuse_existing(&targets.iter().map(PathBuf::as_path).collect::<Vec<_>>())?;

    let ca_key = KeyPair::generate().map_err(gen_err("the CA key"))?;
    let params = ca_params()?;
    let ca_cert = params.self_signed(&ca_key).map_err(gen_err("the CA certificate"))?;
    // ca.key is created first and with create_new, so two concurrent inits cannot both succeed.
    write_new(&ca_key_path, ca_key.serialize_pem().as_bytes(), true)?;
    write_new(&ca_cert_path, ca_cert.pem().as_bytes(), false)?;
    let issuer = Issuer::new(params, ca_key);

    let mut written = vec![ca_cert_path, ca_key_path];
    for role in Role::ALL {
        let (c, k) = write_leaf(dir, role, role.as_str(), &issuer)?;
        written.extend([c, k]);
    }
    tracing::info!(dir = %dir.display(), "created cluster CA and role certificates");
    Ok(written)
}

/// Issues `dir/{name}.pem` and `dir/{name}.key` for `role`, signed by the CA in `dir/ca.pem` and `dir/ca.key`.
///
/// Refuses to overwrite either file, and refuses names that are not plain file stems (or are `ca`). Returns
/// (certificate path, key path).
pub fn issue(dir: &Path, role: Role, name: &str) -> Result<(PathBuf, PathBuf), TlsError> {
    issue_bound(dir, role, name, None)
}

/// [`issue`], with `node_id` (role node only) bound into the certificate as `urn:granary:node:<id>`: the coordinator
/// then lets it register and heartbeat only as that node.
pub fn issue_bound(dir: &Path, role: Role, name: &str, node_id: Option<u64>) -> Result<(PathBuf, PathBuf), TlsError> {
    if node_id.is_some() && role != Role::Node {
        return Err(TlsError::NodeIdForRole(role));
    }
    check_name(name)?;
    let (ca_cert_path, ca_key_path) = identity_paths(dir, CA_NAME);
    let ca_certs = read_certs(&ca_cert_path)?;
    let ca_key_der = read_key(&ca_key_path)?;
    let ca_key = KeyPair::try_from(&ca_key_der)
        .map_err(|e| TlsError::BadKey { path: ca_key_path.clone(), error: e.to_string() })?;
    // ca.pem may hold several CAs (during a rotation); sign with the one whose key we hold.
    let ca_cert = ca_certs
        .iter()
        .find(|c| spki_of(c).is_some_and(|spki| spki == ca_key.subject_public_key_info()))
        .ok_or_else(|| TlsError::KeyMismatch { cert: ca_cert_path.clone(), key: ca_key_path.clone() })?;
    let issuer = Issuer::from_ca_cert_der(ca_cert, ca_key).map_err(|e| TlsError::CertificateFile {
        path: ca_cert_path.clone(),
        error: Box::new(TlsError::MalformedCertificate(e.to_string())),
    })?;
    let written = write_leaf_for(dir, role, name, node_id, &issuer)?;
    tracing::info!(dir = %dir.display(), %role, name, ?node_id, "issued certificate");
    Ok(written)
}

/// The DER SubjectPublicKeyInfo of a certificate, or None if it does not parse.
fn spki_of(der: &CertificateDer<'_>) -> Option<Vec<u8>> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(cert.tbs_certificate.subject_pki.raw.to_vec())
}

/// A trust store holding exactly `certs`.
fn roots_of(certs: &[CertificateDer<'static>]) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert.clone())
            .map_err(|e| TlsError::MalformedCertificate(format!("unusable as a trust root: {e}")))?;
    }
    Ok(roots)
}

/// Whether `leaf` carries a valid signature by the key of one of `cas`.
fn signed_by_any(leaf: &CertificateDer<'_>, cas: &[CertificateDer<'_>]) -> bool {
    let Ok((_, leaf)) = x509_parser::parse_x509_certificate(leaf) else { return false };
    cas.iter().any(|ca| {
        x509_parser::parse_x509_certificate(ca)
            .is_ok_and(|(_, ca)| leaf.verify_signature(Some(ca.public_key())).is_ok())
    })
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    fs::read(path).map_err(io_err("reading", path))
}

/// Every PEM certificate in `path` (at least one).
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_file(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TlsError::Pem { path: path.to_owned(), error })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificateInFile { path: path.to_owned() });
    }
    Ok(certs)
}

/// The first PEM private key in `path`.
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read_file(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|error| match error {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKeyInFile { path: path.to_owned() },
        error => TlsError::Pem { path: path.to_owned(), error },
    })
}

/// The role a DER certificate carries in its `urn:granary:role:<role>` subject-alternative name.
///
/// Fails if the bytes are not a certificate, if no role is named, if the role is unknown, or if two different roles
/// are named.
pub fn role_of_cert(der: &[u8]) -> Result<Role, TlsError> {
    let mut found: Option<Role> = None;
    for uri in san_uris(der)? {
        let Some(role) = uri.strip_prefix(ROLE_URI_PREFIX) else { continue };
        let role: Role = role.parse()?;
        match found {
            Some(first) if first != role => return Err(TlsError::ConflictingRoles { first, second: role }),
            _ => found = Some(role),
        }
    }
    found.ok_or(TlsError::NoRole)
}

/// The URI subject-alternative names of a DER certificate.
fn san_uris(der: &[u8]) -> Result<Vec<String>, TlsError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| TlsError::MalformedCertificate(e.to_string()))?;
    let san = cert.subject_alternative_name().map_err(|e| TlsError::MalformedCertificate(e.to_string()))?;
    Ok(san
        .iter()
        .flat_map(|ext| ext.value.general_names.iter())
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some(uri.to_string()),
            _ => None,
        })
        .collect())
}

/// A loaded identity: the cluster CA, this party's certificate chain and key, and its role (read from its own
/// certificate).
pub struct Identity {
    ca: Vec<CertificateDer<'static>>,
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    role: Role,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self {
            ca: self.ca.clone(),
            roots: self.roots.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            role: self.role,
        }
    }
}

impl fmt::Debug for Identity {
    /// Leaves the private key out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("role", &self.role)
            .field("ca_certs", &self.ca.len())
            .field("chain_certs", &self.chain.len())
            .finish_non_exhaustive()
    }
}

/// Makes ring the process-wide default rustls provider unless one is set
/// already. HTTPS clients that take the process default (reqwest, under
/// object_store's S3, GCS and HTTP stores) panic without one; this module's
/// own configurations name their provider and do not need it.
pub fn ensure_default_crypto_provider() {
    if CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: one is set.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The crypto provider of every configuration this module builds.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Identity {
    /// Loads `dir/ca.pem`, `dir/{name}.pem` and `dir/{name}.key`.
    pub fn load(dir: &Path, name: &str) -> Result<Self, TlsError> {
        let (cert, key) = identity_paths(dir, name);
        Self::load_files(&dir.join(format!("{CA_NAME}.pem")), &cert, &key)
    }

    /// Loads the CA certificate(s), this party's certificate chain (leaf first) and its private key from the given
    /// PEM files, and checks them: every CA certificate is usable as a trust root, the leaf is signed directly by one
    /// of them (the cluster CA has path length 0), the key belongs to the leaf, and the leaf carries a role.
    pub fn load_files(ca: &Path, cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let ca_certs = read_certs(ca)?;
        let chain = read_certs(cert)?;
        let key_der = read_key(key)?;
        let in_file = |path: &Path| {
            let path = path.to_owned();
            move |error: TlsError| TlsError::CertificateFile { path, error: Box::new(error) }
        };
        let roots = roots_of(&ca_certs).map_err(in_file(ca))?;
        // Indexing is safe: read_certs returns at least one certificate or an error.
        let role = role_of_cert(&chain[0]).map_err(in_file(cert))?;
        if !signed_by_any(&chain[0], &ca_certs) {
            return Err(TlsError::NotSignedByCa { cert: cert.to_owned(), ca: ca.to_owned() });
        }
        let signing_key = provider()
            .key_provider
            .load_private_key(key_der.clone_key())
            .map_err(|e| TlsError::BadKey { path: key.to_owned(), error: e.to_string() })?;
        match rustls::sign::CertifiedKey::new(chain.clone(), signing_key).keys_match() {
            // ring's keys always expose their public half, so "Unknown" does not happen; accept it as rustls does.
            Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
                return Err(TlsError::KeyMismatch { cert: cert.to_owned(), key: key.to_owned() });
            }
            Err(e) => return Err(in_file(cert)(TlsError::MalformedCertificate(e.to_string()))),
        }
        Ok(Self { ca: ca_certs, roots: Arc::new(roots), chain, key: key_der, role })
    }

    /// The role this identity's certificate carries.
    pub fn role(&self) -> Role {
        self.role
    }

    /// This identity's certificate chain, leaf first.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    /// The cluster CA certificate(s) this identity trusts.
    pub fn ca(&self) -> &[CertificateDer<'static>] {
        &self.ca
    }

    /// The trust anchors: the cluster CA certificate(s) and nothing else.
    pub fn roots(&self) -> Arc<RootCertStore> {
        self.roots.clone()
    }

    /// A server configuration that requires a client certificate signed by the cluster CA, speaks TLS 1.3 only,
    /// advertises the given ALPN protocols and uses [`transport_config`].
    pub fn server_config(&self, alpn: &[&[u8]]) -> Result<quinn::ServerConfig, TlsError> {
        let provider = provider();
        let verifier = WebPkiClientVerifier::builder_with_provider(self.roots(), provider.clone())
            .build()
            .map_err(TlsError::Verifier)?;
        let side = "server";
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&TLS13])
            .map_err(|error| TlsError::Rustls { side, error })?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|error| TlsError::Rustls { side, error })?;
        tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let quic = QuicServerConfig::try_from(tls).map_err(|error| TlsError::Quic { side, error })?;
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
        config.transport_config(Arc::new(transport_config()));
        Ok(config)
    }

    /// A client configuration that trusts only the cluster CA, presents this identity's certificate, offers the one
    /// ALPN protocol `alpn` and uses [`transport_config`]. Connect with a [`Role::server_name`] as the server name.
    pub fn client_config(&self, alpn: &[u8]) -> Result<quinn::ClientConfig, TlsError> {
        let side = "client";
        let mut tls = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&TLS13])
            .map_err(|error| TlsError::Rustls { side, error })?
            .with_root_certificates(self.roots())
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|error| TlsError::Rustls { side, error })?;
        tls.alpn_protocols = vec![alpn.to_vec()];
        let quic = QuicClientConfig::try_from(tls).map_err(|error| TlsError::Quic { side, error })?;
        let mut config = quinn::ClientConfig::new(Arc::new(quic));
        config.transport_config(Arc::new(transport_config()));
        Ok(config)
    }
}

/// The transport settings of every Granary connection: keep-alive every [`KEEP_ALIVE_INTERVAL`], idle timeout
/// [`IDLE_TIMEOUT`] so that a dead peer is noticed within seconds, and at most [`MAX_CONCURRENT_BIDI_STREAMS`] /
/// [`MAX_CONCURRENT_UNI_STREAMS`] streams open at once. Other settings are quinn's defaults.
pub fn transport_config() -> quinn::TransportConfig {
    transport_config_with_idle_timeout(IDLE_TIMEOUT)
}

/// [`transport_config`] with another idle timeout. A timeout at or below [`KEEP_ALIVE_INTERVAL`] would let a live
/// but quiet connection die, so it is raised to twice the keep-alive interval.
pub fn transport_config_with_idle_timeout(idle: Duration) -> quinn::TransportConfig {
    transport_config_with(KEEP_ALIVE_INTERVAL, idle)
}

/// [`transport_config`] with another keep-alive interval and idle timeout (the idle timeout is raised to at least
/// twice the keep-alive). For links that must notice a dead peer within a fraction of a second, such as Raft
/// between voters; the effective idle timeout of a connection is the smaller of both sides'.
pub fn transport_config_with(keep_alive: Duration, idle: Duration) -> quinn::TransportConfig {
    let idle = idle.max(2 * keep_alive);
    // Saturate rather than fail: an idle timeout beyond 2^62 ms is "never" either way.
    let idle_ms = VarInt::try_from(idle.as_millis()).unwrap_or(VarInt::MAX);
    let mut config = quinn::TransportConfig::default();
    config
        .keep_alive_interval(Some(keep_alive))
        .max_idle_timeout(Some(IdleTimeout::from(idle_ms)))
        .max_concurrent_bidi_streams(VarInt::from_u32(MAX_CONCURRENT_BIDI_STREAMS))
        .max_concurrent_uni_streams(VarInt::from_u32(MAX_CONCURRENT_UNI_STREAMS));
    config
}

/// Binds a UDP endpoint on `addr`. With a server configuration it accepts connections and can also dial out
/// (`Endpoint::server`); with `None` it only dials out (`Endpoint::client`). Dial with
/// [`quinn::Endpoint::connect_with`] and an [`Identity::client_config`], or set a default client configuration.
/// Must be called inside a tokio runtime.
pub fn endpoint(addr: SocketAddr, server: Option<quinn::ServerConfig>) -> Result<quinn::Endpoint, TlsError> {
    match server {
        Some(config) => quinn::Endpoint::server(config, addr),
        None => quinn::Endpoint::client(addr),
    }
    .map_err(|error| TlsError::Bind { addr, error })
}

/// Binds a serving endpoint whose QUIC stateless-reset key derives from
/// `identity`'s private key, so it is the same in every life of the
/// process. When a peer restarts on the same address, connections the others
/// still hold to its previous life are reset by the first packet they send
/// (quinn accepts the reset because the token matches) instead of hanging
/// until the idle timeout: a Raft vote to a restarted voter then fails and
/// reconnects at once.
pub fn server_endpoint(
    identity: &Identity,
    addr: SocketAddr,
    server: quinn::ServerConfig,
) -> Result<quinn::Endpoint, TlsError> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(b"granary quic stateless reset v1");
    ctx.update(identity.key.secret_der());
    let reset_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, ctx.finish().as_ref());
    let config = quinn::EndpointConfig::new(Arc::new(reset_key));
    let bind_err = |error| TlsError::Bind { addr, error };
    let socket = std::net::UdpSocket::bind(addr).map_err(bind_err)?;
    let runtime = quinn::default_runtime().ok_or_else(|| bind_err(std::io::Error::other("no async runtime found")))?;
    quinn::Endpoint::new(config, Some(server), socket, runtime).map_err(bind_err)
}

/// The role in the certificate the peer presented on an established connection.
pub fn peer_role(conn: &quinn::Connection) -> Result<Role, TlsError> {
    let peer = conn.remote_address();
    role_of_cert(&peer_leaf(conn)?).map_err(|error| TlsError::PeerCertificate { peer, error: Box::new(error) })
}

/// The node id a DER certificate is bound to (`urn:granary:node:<id>`), if any.
pub fn node_id_of_cert(der: &[u8]) -> Result<Option<u64>, TlsError> {
    let mut found: Option<u64> = None;
    for uri in san_uris(der)? {
        let Some(id) = uri.strip_prefix(NODE_URI_PREFIX) else { continue };
        let id: u64 = id.parse().map_err(|_| TlsError::MalformedCertificate(format!("bad node id in {uri:?}")))?;
        if let Some(first) = found
            && first != id
        {
            return Err(TlsError::MalformedCertificate(format!("names two node ids, {first} and {id}")));
        }
        found = Some(id);
    }
    Ok(found)
}

/// The node id the peer's certificate is bound to, if any.
pub fn peer_node_id(conn: &quinn::Connection) -> Result<Option<u64>, TlsError> {
    let peer = conn.remote_address();
    node_id_of_cert(&peer_leaf(conn)?).map_err(|error| TlsError::PeerCertificate { peer, error: Box::new(error) })
}

/// The leaf certificate the peer presented.
fn peer_leaf(conn: &quinn::Connection) -> Result<CertificateDer<'static>, TlsError> {
    let peer = conn.remote_address();
    let certs = conn
        .peer_identity()
        .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
        .ok_or(TlsError::NoPeerCertificate { peer })?;
    certs.first().cloned().ok_or(TlsError::NoPeerCertificate { peer })
}

/// The peer's role, if it is one of `allowed`; [`TlsError::WrongRole`] otherwise.
pub fn require_peer_role(conn: &quinn::Connection, allowed: &[Role]) -> Result<Role, TlsError> {
    let role = peer_role(conn)?;
    if allowed.contains(&role) {
        Ok(role)
    } else {
        Err(TlsError::WrongRole { peer: conn.remote_address(), expected: allowed.to_vec(), got: role })
    }
}

/// The ALPN protocol negotiated on a connection, or None if none was.
pub fn alpn_of(conn: &quinn::Connection) -> Option<Vec<u8>> {
    conn.handshake_data()?.downcast::<HandshakeData>().ok()?.protocol
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_round_trip() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
            assert_eq!(role.to_string(), role.as_str());
            assert_eq!(serde_json::to_string(&role).unwrap(), format!("\"{}\"", role.as_str()));
            assert_eq!(serde_json::from_str::<Role>(&format!("\"{role}\"")).unwrap(), role);
            assert_eq!(role.server_name(), format!("granary-{role}"));
        }
        assert_eq!("Node".parse::<Role>(), Err(ParseRoleError { input: "Node".into() }));
    }

    #[test]
    fn names_must_be_plain_file_stems() {
        for good in ["node-1", "trainer.a_b", "N0"] {
            check_name(good).unwrap();
        }
        for bad in ["", "ca", ".hidden", "a/b", "..", "a b", "ü", &"x".repeat(65)] {
            assert!(matches!(check_name(bad), Err(TlsError::InvalidName { .. })), "{bad:?} accepted");
        }
    }

    #[test]
    fn role_list_reads_as_prose() {
        assert_eq!(RoleList(&[Role::Node]).to_string(), "node");
        assert_eq!(RoleList(&[Role::Node, Role::Admin]).to_string(), "node or admin");
        assert_eq!(RoleList(&[Role::Node, Role::Trainer, Role::Admin]).to_string(), "node, trainer or admin");
    }

    fn cert_with_sans(uris: &[&str]) -> Vec<u8> {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.subject_alt_names =
            uris.iter().map(|u| SanType::URI(Ia5String::try_from(*u).unwrap())).collect::<Vec<_>>();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn role_of_cert_reads_the_role_uri() {
        assert_eq!(role_of_cert(&cert_with_sans(&["urn:granary:role:trainer"])).unwrap(), Role::Trainer);
        assert_eq!(
            role_of_cert(&cert_with_sans(&[
                "https://example.invalid",
                "urn:granary:role:node",
                "urn:granary:role:node"
            ]))
            .unwrap(),
            Role::Node
        );
        assert!(matches!(role_of_cert(&cert_with_sans(&[])), Err(TlsError::NoRole)));
        assert!(matches!(role_of_cert(&cert_with_sans(&["urn:granary:role:root"])), Err(TlsError::UnknownRole(_))));
        assert!(matches!(
            role_of_cert(&cert_with_sans(&["urn:granary:role:node", "urn:granary:role:admin"])),
            Err(TlsError::ConflictingRoles { first: Role::Node, second: Role::Admin })
        ));
        assert!(matches!(role_of_cert(b"not a certificate"), Err(TlsError::MalformedCertificate(_))));
        assert!(matches!(role_of_cert(&[]), Err(TlsError::MalformedCertificate(_))));
    }

    #[test]
    fn leaf_certificates_carry_role_names_and_usages() {
        let ca_key = KeyPair::generate().unwrap();
        let ca = ca_params().unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let der = leaf_params(Role::Coordinator, "c1").unwrap().signed_by(&key, &issuer).unwrap().der().to_vec();
        assert_eq!(role_of_cert(&der).unwrap(), Role::Coordinator);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let names = &cert.subject_alternative_name().unwrap().unwrap().value.general_names;
        assert_eq!(
            names,
            &[
                GeneralName::URI("urn:granary:role:coordinator"),
                GeneralName::DNSName("granary-coordinator"),
                GeneralName::DNSName("localhost"),
                GeneralName::IPAddress(&[127, 0, 0, 1]),
            ]
        );
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth);
        assert!(!cert.is_ca());
        let years = (cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp()) / (365 * 86400);
        assert_eq!(years, 10);
    }
}
