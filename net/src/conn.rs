//! A cache of outgoing QUIC connections: one per peer address, made on
//! first use within a bound, checked for the role the peer must hold, and
//! made again once it closes. The coordinator client, the Raft transport and
//! the peer fabric all dial through it.

use crate::error::TlsError;
use crate::identity;
use crate::role::Role;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Outgoing connections to peers of one role.
pub struct Connections {
    endpoint: quinn::Endpoint,
    config: quinn::ClientConfig,
    /// The ALPN protocol `config` offers first: the wire dialed for.
    alpn: &'static [u8],
    role: Role,
    connect_timeout: Duration,
    map: Mutex<HashMap<SocketAddr, quinn::Connection>>,
    /// Dials in progress: callers that find one wait for its outcome
    /// instead of dialing again (one handshake per peer, not one per
    /// concurrent request; one connect timeout for a dead peer, not one per
    /// request in turn).
    dialing: Mutex<HashMap<SocketAddr, Arc<Dial>>>,
}

type Dial = tokio::sync::OnceCell<Result<quinn::Connection, DialError>>;

/// Why no connection to a peer could be made. Every variant names the
/// address dialed. Cloneable: callers that share one dial share its error.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DialError {
    /// The dial could not start (no usable configuration, address, or
    /// endpoint): it will fail again the same way.
    #[error("{addr}: {error}")]
    Start {
        /// The address dialed.
        addr: SocketAddr,
        /// quinn's reason.
        error: quinn::ConnectError,
    },
    /// No handshake completed within the connect timeout: the peer is down,
    /// unreachable, or too slow to answer.
    #[error("{addr}: no handshake within {timeout:?}")]
    Timeout {
        /// The address dialed.
        addr: SocketAddr,
        /// The connect timeout.
        timeout: Duration,
    },
    /// The handshake failed (refused, reset, TLS rejected, timed out in
    /// QUIC).
    #[error("{addr}: {error}")]
    Handshake {
        /// The address dialed.
        addr: SocketAddr,
        /// quinn's reason.
        error: quinn::ConnectionError,
    },
    /// The peer's certificate names no role we could read.
    #[error("{addr}: {error}")]
    Certificate {
        /// The address dialed.
        addr: SocketAddr,
        /// What was wrong with the certificate.
        error: Arc<TlsError>,
    },
    /// The peer shares no version of the wire with this build (it chose
    /// [`crate::transport::ALPN_VERSIONS`]): `why` names both sides'
    /// versions and the side to upgrade.
    #[error("{addr}: {why}")]
    Version {
        /// The address dialed.
        addr: SocketAddr,
        /// Both sides' versions, and which to upgrade.
        why: String,
    },
    /// The peer holds a certificate of another role than the one dialed
    /// for.
    #[error("{addr}: peer holds a {found} certificate, not a {wanted}'s")]
    WrongRole {
        /// The address dialed.
        addr: SocketAddr,
        /// The role its certificate holds.
        found: Role,
        /// The role it must hold.
        wanted: Role,
    },
}

impl DialError {
    /// The address dialed.
    pub fn addr(&self) -> SocketAddr {
        match self {
            Self::Start { addr, .. }
            | Self::Timeout { addr, .. }
            | Self::Handshake { addr, .. }
            | Self::Certificate { addr, .. }
            | Self::Version { addr, .. }
            | Self::WrongRole { addr, .. } => *addr,
        }
    }
}

impl Connections {
    /// Dials from `endpoint` with `config`, made for the ALPN protocol
    /// `alpn` ([`crate::identity::Identity::client_config`]); every peer
    /// must present a certificate of `role` (and the name
    /// `role.server_name()`).
    pub fn new(
        endpoint: quinn::Endpoint,
        config: quinn::ClientConfig,
        alpn: &'static [u8],
        role: Role,
        connect_timeout: Duration,
    ) -> Self {
        Self {
            endpoint,
            config,
            alpn,
            role,
            connect_timeout,
            map: Mutex::new(HashMap::new()),
            dialing: Mutex::new(HashMap::new()),
        }
    }

    /// The endpoint dialed from.
    pub fn endpoint(&self) -> &quinn::Endpoint {
        &self.endpoint
    }

    /// The open connection to `addr`, or a new one. The error names `addr`.
    /// Concurrent callers share one dial.
    pub async fn get(&self, addr: SocketAddr) -> Result<quinn::Connection, DialError> {
        if let Some(c) = self.cached(addr) {
            return Ok(c);
        }
        let dial = self.dialing.lock().unwrap_or_else(|p| p.into_inner()).entry(addr).or_default().clone();
        let result = dial
            .get_or_init(|| async {
                // A dial that finished just before ours was registered.
                if let Some(c) = self.cached(addr) {
                    return Ok(c);
                }
                self.dial(addr).await
            })
            .await
            .clone();
        // The next caller after this dial (failed, or its connection later
        // closed) dials anew.
        let mut dialing = self.dialing.lock().unwrap_or_else(|p| p.into_inner());
        if dialing.get(&addr).is_some_and(|d| Arc::ptr_eq(d, &dial)) {
            dialing.remove(&addr);
        }
        result
    }

    fn cached(&self, addr: SocketAddr) -> Option<quinn::Connection> {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).get(&addr).filter(|c| c.close_reason().is_none()).cloned()
    }

    async fn dial(&self, addr: SocketAddr) -> Result<quinn::Connection, DialError> {
        let connecting = self
            .endpoint
            .connect_with(self.config.clone(), addr, self.role.server_name())
            .map_err(|error| DialError::Start { addr, error })?;
        let conn = tokio::time::timeout(self.connect_timeout, connecting)
            .await
            .map_err(|_| DialError::Timeout { addr, timeout: self.connect_timeout })?
            .map_err(|error| DialError::Handshake { addr, error })?;
        if crate::transport::alpn_of(&conn).as_deref() == Some(crate::transport::ALPN_VERSIONS) {
            // The server closes at once, naming what it speaks.
            let why = match tokio::time::timeout(self.connect_timeout, conn.closed()).await {
                Ok(quinn::ConnectionError::ApplicationClosed(c))
                    if c.error_code == crate::transport::VERSIONS_CLOSE.into() =>
                {
                    crate::transport::version_refusal(self.alpn, &c.reason)
                }
                _ => format!("shares no version of {} with this build", String::from_utf8_lossy(self.alpn)),
            };
            return Err(DialError::Version { addr, why });
        }
        match identity::peer_role(&conn) {
            Ok(r) if r == self.role => {}
            Ok(found) => return Err(DialError::WrongRole { addr, found, wanted: self.role }),
            Err(error) => return Err(DialError::Certificate { addr, error: Arc::new(error) }),
        }
        self.map.lock().unwrap_or_else(|p| p.into_inner()).insert(addr, conn.clone());
        Ok(conn)
    }

    /// Drops the cached connection to `addr` (after a failure on it).
    pub fn forget(&self, addr: SocketAddr) {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).remove(&addr);
    }

    /// Closes the connection to `addr`, if one is open, with `reason`
    /// (the peer logs it): one no longer needed, such as a voter that is not
    /// the leader. A request still on it fails and is retried by its caller.
    pub fn close(&self, addr: SocketAddr, reason: &[u8]) {
        if let Some(c) = self.map.lock().unwrap_or_else(|p| p.into_inner()).remove(&addr) {
            c.close(0u32.into(), reason);
        }
    }

    /// The addresses with an open connection.
    pub fn open(&self) -> Vec<SocketAddr> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let mut open: Vec<SocketAddr> =
            map.iter().filter(|(_, c)| c.close_reason().is_none()).map(|(a, _)| *a).collect();
        open.sort();
        open
    }
}
