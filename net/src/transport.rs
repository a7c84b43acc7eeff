//! Transport tuning shared by every Granary connection (keep-alive, idle
//! timeout, stream limits), the ALPN protocol names, and binding a QUIC
//! endpoint.

use std::net::SocketAddr;
use std::time::Duration;

use quinn::crypto::rustls::HandshakeData;
use quinn::{IdleTimeout, VarInt};

use crate::error::TlsError;

/// ALPN protocol of the coordinator API (clients, trainers and admins to the coordinator).
pub const ALPN_API: &[u8] = b"granary-api/1";
/// ALPN protocol of Raft traffic between coordinators.
pub const ALPN_RAFT: &[u8] = b"granary-raft/1";
/// ALPN protocol of the peer fabric: node-to-node chunk and footer traffic (trainers reach their node over its Unix socket, never over QUIC).
pub const ALPN_PEER: &[u8] = b"granary-peer/4";

/// How often an idle connection sends a keep-alive, so that the peer's idle timer never fires on a live link.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// How long a connection may hear nothing before it is declared dead (the default of [`transport_config`]).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most bidirectional streams a peer may have open at once on one connection (one per in-flight request).
pub const MAX_CONCURRENT_BIDI_STREAMS: u32 = 256;
/// Most unidirectional streams a peer may have open at once on one connection.
pub const MAX_CONCURRENT_UNI_STREAMS: u32 = 64;

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
/// [`quinn::Endpoint::connect_with`] and an
/// [`Identity::client_config`](crate::identity::Identity::client_config), or set a default client configuration.
/// Must be called inside a tokio runtime.
pub fn endpoint(addr: SocketAddr, server: Option<quinn::ServerConfig>) -> Result<quinn::Endpoint, TlsError> {
    match server {
        Some(config) => quinn::Endpoint::server(config, addr),
        None => quinn::Endpoint::client(addr),
    }
    .map_err(|error| TlsError::Bind { addr, error })
}

/// The ALPN protocol negotiated on a connection, or None if none was.
pub fn alpn_of(conn: &quinn::Connection) -> Option<Vec<u8>> {
    conn.handshake_data()?.downcast::<HandshakeData>().ok()?.protocol
}
