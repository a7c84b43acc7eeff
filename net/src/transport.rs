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
pub const ALPN_RAFT: &[u8] = b"granary-raft/2";
/// Raft between voters as the build before speaks it: the same frames,
/// without the log entries version 2 added (`EnableContentOwners`).
pub const ALPN_RAFT_PREVIOUS: &[u8] = b"granary-raft/1";
/// Every version of Raft between voters this build speaks, newest first.
pub const RAFT_PROTOCOLS: &[&[u8]] = &[ALPN_RAFT, ALPN_RAFT_PREVIOUS];
/// ALPN protocol of the peer fabric: node-to-node chunk and footer traffic (trainers reach their node over its Unix socket, never over QUIC).
/// Version 5 sends chunks of format 3 (which name their converter) or 2.
pub const ALPN_PEER: &[u8] = b"granary-peer/5";
/// The peer fabric as the build before speaks it: the same frames, chunks
/// of format 2 only (`granary_proto::chunk`).
pub const ALPN_PEER_PREVIOUS: &[u8] = b"granary-peer/4";
/// Every version of the peer fabric this build speaks, newest first (the
/// order a server lists them in, so that two new builds speak the newest).
pub const PEER_PROTOCOLS: &[&[u8]] = &[ALPN_PEER, ALPN_PEER_PREVIOUS];

/// ALPN protocol every Granary server lists last and every client offers
/// last: chosen only when the two share no version of the wire the client
/// dials for. The server then closes the connection with
/// [`VERSIONS_CLOSE`] and, as the reason, the ALPN names it speaks, so the
/// client can say which versions each side speaks and which to upgrade
/// ([`version_refusal`]) instead of a TLS alert.
pub const ALPN_VERSIONS: &[u8] = b"granary-versions";
/// The close code of a connection that chose [`ALPN_VERSIONS`].
pub const VERSIONS_CLOSE: u32 = 0x76;

/// Why a server that chose [`ALPN_VERSIONS`] could not serve `offered`
/// (the ALPN name this client dials with), from the server's close reason
/// (`theirs`, its ALPN names separated by spaces): both sides' versions of
/// the wire, and which side to upgrade. Pure, for tests.
pub fn version_refusal(offered: &[u8], theirs: &[u8]) -> String {
    let offered = String::from_utf8_lossy(offered);
    let theirs = String::from_utf8_lossy(theirs);
    let (stem, ours) = split_alpn(&offered);
    let versions: Vec<u16> =
        theirs.split_whitespace().map(split_alpn).filter(|(s, _)| *s == stem).filter_map(|(_, v)| v).collect();
    let (Some(lo), Some(hi), Some(ours)) = (versions.iter().min(), versions.iter().max(), ours) else {
        return format!("speaks {theirs}, not {stem} at all (is this the right address?)");
    };
    let range = if lo == hi { format!("{stem}/{lo}") } else { format!("{stem}/{lo} to {hi}") };
    let upgrade = if ours < *lo { "upgrade this build" } else { "upgrade the other side" };
    format!("speaks {range}, this build {offered}: no version in common; {upgrade}")
}

/// An ALPN name's stem and version (`granary-peer/4`: `granary-peer`, 4).
fn split_alpn(name: &str) -> (&str, Option<u16>) {
    match name.rsplit_once('/') {
        Some((stem, v)) => (stem, v.parse().ok()),
        None => (name, None),
    }
}

/// Closes `conn` with the list of `speaks` (the ALPN names this server
/// lists) if its client chose [`ALPN_VERSIONS`]; `true` when it did (the
/// caller serves nothing more on it).
pub fn answer_versions(conn: &quinn::Connection, speaks: &[&[u8]]) -> bool {
    if alpn_of(conn).as_deref() != Some(ALPN_VERSIONS) {
        return false;
    }
    let reason: Vec<u8> = speaks.join(&b' ');
    conn.close(VERSIONS_CLOSE.into(), &reason);
    true
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_both_versions_and_the_side_to_upgrade() {
        let ahead = version_refusal(b"granary-peer/4", b"granary-peer/6 granary-peer/5");
        assert_eq!(
            ahead,
            "speaks granary-peer/5 to 6, this build granary-peer/4: no version in common; upgrade this build"
        );
        let behind = version_refusal(b"granary-api/3", b"granary-api/1 granary-raft/1");
        assert_eq!(
            behind,
            "speaks granary-api/1, this build granary-api/3: no version in common; upgrade the other side"
        );
        let elsewhere = version_refusal(b"granary-api/1", b"granary-peer/4");
        assert!(elsewhere.contains("not granary-api at all"), "{elsewhere}");
    }
}
