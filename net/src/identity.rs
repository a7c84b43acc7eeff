//! The runtime identity: a loaded [`Identity`] (CA, certificate chain, key
//! and role), the mutual-TLS QUIC configurations it builds, and what the
//! peer of an established connection is ([`peer_role`],
//! [`require_peer_role`], [`peer_node_id`]).
//!
//! Every QUIC endpoint in a Granary cluster presents a certificate signed by
//! the cluster CA and requires one from its peer, so that nothing outside the
//! cluster can reach the coordinator or a node.
//!
//! rustls is always built with an explicit ring provider, never the
//! process-wide default, which may not be installed.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, version::TLS13};

use crate::error::TlsError;
use crate::pki::{
    CA_NAME, identity_name, identity_paths, node_id_of_cert, read_certs, read_key, role_of_cert, voter_id_of_cert,
};
use crate::role::Role;
use crate::transport::{ALPN_VERSIONS, transport_config};

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

    /// Loads the identity `name` of folder `dir`, or when no name is given, `default` if the folder holds it,
    /// else the folder's one identity ([`crate::pki::identity_name`]): a host given its own folder of `granary
    /// certs init` names nothing. Returns the identity and the name it was loaded as.
    pub fn load_in(dir: &Path, name: Option<&str>, default: &str) -> Result<(Self, String), TlsError> {
        let name = identity_name(dir, name, default)?;
        Ok((Self::load(dir, &name)?, name))
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

    /// The node id this identity's certificate is bound to, if any (`urn:granary:node:<id>`).
    pub fn bound_node_id(&self) -> Result<Option<u64>, TlsError> {
        // Indexing is safe: a loaded identity has at least one certificate.
        node_id_of_cert(&self.chain[0])
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
    /// advertises the given ALPN protocols (then [`ALPN_VERSIONS`]: serve a
    /// connection that chose it with [`crate::transport::answer_versions`]) and uses [`transport_config`].
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
        // Last, so chosen only when a client shares no version with us.
        tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).chain([ALPN_VERSIONS.to_vec()]).collect();
        let quic = QuicServerConfig::try_from(tls).map_err(|error| TlsError::Quic { side, error })?;
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
        config.transport_config(Arc::new(transport_config()));
        Ok(config)
    }

    /// A client configuration that trusts only the cluster CA, presents this identity's certificate, offers the one
    /// ALPN protocol `alpn` (then [`ALPN_VERSIONS`], which
    /// [`crate::conn::Connections`] turns into a [`crate::conn::DialError::Version`]) and uses [`transport_config`]. Connect with a [`Role::server_name`] as the server name.
    pub fn client_config(&self, alpn: &[u8]) -> Result<quinn::ClientConfig, TlsError> {
        self.client_config_for(&[alpn])
    }

    /// [`Identity::client_config`] offering each of `alpns` (the versions
    /// of one wire this build speaks): the server picks the first of its
    /// own list that is offered, so a server lists its newest first.
    pub fn client_config_for(&self, alpns: &[&[u8]]) -> Result<quinn::ClientConfig, TlsError> {
        let side = "client";
        let mut tls = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&TLS13])
            .map_err(|error| TlsError::Rustls { side, error })?
            .with_root_certificates(self.roots())
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|error| TlsError::Rustls { side, error })?;
        tls.alpn_protocols = alpns.iter().map(|p| p.to_vec()).chain([ALPN_VERSIONS.to_vec()]).collect();
        let quic = QuicClientConfig::try_from(tls).map_err(|error| TlsError::Quic { side, error })?;
        let mut config = quinn::ClientConfig::new(Arc::new(quic));
        config.transport_config(Arc::new(transport_config()));
        Ok(config)
    }
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

/// The node id the peer's certificate is bound to, if any.
pub fn peer_node_id(conn: &quinn::Connection) -> Result<Option<u64>, TlsError> {
    let peer = conn.remote_address();
    node_id_of_cert(&peer_leaf(conn)?).map_err(|error| TlsError::PeerCertificate { peer, error: Box::new(error) })
}

/// The voter id the peer's (coordinator) certificate is bound to, if any.
pub fn peer_voter_id(conn: &quinn::Connection) -> Result<Option<u64>, TlsError> {
    let peer = conn.remote_address();
    voter_id_of_cert(&peer_leaf(conn)?).map_err(|error| TlsError::PeerCertificate { peer, error: Box::new(error) })
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
