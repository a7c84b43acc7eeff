//! [`PeerError`]: why a fetch from a peer failed, typed so that the fetch
//! route (and a test) can branch on the cause: the peer refused in words,
//! the link or stream failed ([`LinkFault`]), the peer stalled while its
//! connection still answered ([`Stall`]), or its bytes failed validation
//! ([`Corruption`]). Every variant names the peer, and the shard or file.

use granary_net::conn::DialError;
use granary_node_core::route::AskFailure;
use granary_proto::wire::ErrorKind;
use granary_proto::{ChunkError, DatasetVersion, ShardId};
use std::net::SocketAddr;
use std::time::Duration;

/// A peer fetch failed; the caller falls back to another source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    /// No connection could be made.
    #[error("peer {addr}: {fault}")]
    Connect {
        /// The peer.
        addr: SocketAddr,
        /// Why: [`LinkFault::Dial`], [`LinkFault::RecentlyDown`] or
        /// [`LinkFault::Closed`].
        fault: LinkFault,
    },
    /// The stream failed or the peer broke the protocol.
    #[error("peer {addr}, {shard}: {fault}")]
    Transfer {
        /// The peer.
        addr: SocketAddr,
        /// The shard asked for.
        shard: ShardId,
        /// Why.
        fault: LinkFault,
    },
    /// The peer answered that it could not produce the chunk.
    #[error("peer {addr} could not serve {shard} ({kind:?}): {message}")]
    Refused {
        /// The peer.
        addr: SocketAddr,
        /// The shard.
        shard: ShardId,
        /// Category.
        kind: ErrorKind,
        /// The peer's message.
        message: String,
    },
    /// Asking for a file's footer failed: the link, the stream, the
    /// protocol, the peer's own read, or the deadline.
    #[error("peer {addr}, footer of file {file}: {fault}")]
    Footer {
        /// The peer.
        addr: SocketAddr,
        /// File index in the manifest.
        file: u32,
        /// Why.
        fault: LinkFault,
    },
    /// Asked for a copy it holds (a handoff), the peer holds none.
    #[error("peer {addr} holds no copy of {shard}")]
    NotHeld {
        /// The peer.
        addr: SocketAddr,
        /// The shard.
        shard: ShardId,
    },
    /// The chunk failed validation.
    #[error("peer {addr} sent a corrupt chunk for {shard}: {corruption}")]
    Corrupt {
        /// The peer.
        addr: SocketAddr,
        /// The shard.
        shard: ShardId,
        /// What failed.
        corruption: Corruption,
    },
    /// The peer sent nothing on the stream (no progress frame, no chunk
    /// byte) for [`super::FabricConfig::stall_timeout`] while its
    /// connection still answered: the stream is dropped and the caller
    /// reads elsewhere without waiting for the placement to move. A stall
    /// on a connection that went quiet too is a [`PeerError::Transfer`]
    /// with [`LinkFault::Gone`]: the peer is gone.
    #[error("peer {addr}, {shard}: {stall}")]
    Stalled {
        /// The peer.
        addr: SocketAddr,
        /// The shard.
        shard: ShardId,
        /// How long nothing came, and in what.
        stall: Stall,
    },
    /// The deadline passed.
    #[error("peer {addr}: no chunk for {shard} within {deadline:?}")]
    Timeout {
        /// The peer.
        addr: SocketAddr,
        /// The shard.
        shard: ShardId,
        /// The deadline.
        deadline: Duration,
    },
}

impl PeerError {
    /// How the fetch route takes this failure: an owner known to be alive
    /// (it stalled while its connection answered, or sent a chunk that
    /// failed validation; it keeps its lease, so waiting for the placement
    /// to move its shard would only wait) or one that may be dead or may
    /// not be the owner. A refusal is the latter: most often two nodes'
    /// placements disagree for a moment (each asks the other), and the
    /// placement settles it within moments; reading here at once made both
    /// nodes read the shard (`tests/cluster.rs`, a node killed during an
    /// epoch: 19 conversions for 16 shards).
    pub fn into_ask_failure(self) -> AskFailure<PeerError> {
        if self.is_alive() { AskFailure::Alive(self) } else { AskFailure::Unavailable(self) }
    }

    /// Whether the peer is known to be alive: it stalled while its
    /// connection answered, or sent a chunk that failed validation
    /// ([`PeerError::into_ask_failure`]).
    pub fn is_alive(&self) -> bool {
        match self {
            PeerError::Stalled { .. } | PeerError::Corrupt { .. } => true,
            PeerError::Connect { .. }
            | PeerError::Transfer { .. }
            | PeerError::Refused { .. }
            | PeerError::NotHeld { .. }
            | PeerError::Footer { .. }
            | PeerError::Timeout { .. } => false,
        }
    }
}

/// Nothing came on a peer's stream for the stall timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stalled for {idle:?} ({what}: nothing came after {got} of {len} bytes)")]
pub struct Stall {
    /// How long nothing came (the stall timeout).
    pub idle: Duration,
    /// What was being read: "response header", "chunk bytes", ...
    pub what: &'static str,
    /// Bytes of it received.
    pub got: usize,
    /// Bytes of it expected.
    pub len: usize,
}

/// What failed on the link to a peer or on one stream of it, when the peer
/// did not answer in words.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LinkFault {
    /// No connection could be made.
    #[error(transparent)]
    Dial(#[from] DialError),
    /// The peer could not be dialed moments ago
    /// ([`super::FabricConfig::down_for`]); it is not dialed again yet.
    #[error("unreachable moments ago; not retried yet")]
    RecentlyDown,
    /// The link is shutting down.
    #[error("the link is shutting down")]
    Closed,
    /// The peer is not the node the placement names at its address.
    #[error("not the node expected there: {0}")]
    Identity(String),
    /// No stream could be opened on the connection.
    #[error("opening a stream: {0}")]
    Open(quinn::ConnectionError),
    /// The request could not be sent.
    #[error("sending the request: {0}")]
    Send(quinn::WriteError),
    /// A frame broke the length rules (too long for its cap).
    #[error("{what}: {error}")]
    Frame {
        /// The frame: "request", "response header".
        what: &'static str,
        /// The codec's reason.
        error: granary_proto::frame::FrameError,
    },
    /// The response header does not decode as a peer response.
    #[error("response header: {0}")]
    Decode(granary_proto::wire::FrameError),
    /// Reading the stream failed (reset, connection lost).
    #[error("{what}: {error}")]
    Read {
        /// What was being read.
        what: &'static str,
        /// quinn's reason.
        error: quinn::ReadError,
    },
    /// The stream ended early.
    #[error("{what}: the stream ended after {got} of {len} bytes")]
    Ended {
        /// What was being read.
        what: &'static str,
        /// Bytes received.
        got: usize,
        /// Bytes expected.
        len: usize,
    },
    /// The stream stalled and the connection went quiet too: the peer is
    /// gone (or cut off), not merely slow.
    #[error("{0}, and the connection went quiet too: the peer is gone")]
    Gone(Stall),
    /// The stream stalled (a footer fetch does not tell a stalled peer
    /// from a gone one; a chunk fetch does, see [`PeerError::Stalled`]).
    #[error("{0}")]
    Stalled(Stall),
    /// The peer answered with a message that does not answer the request.
    #[error("answered with {0}")]
    Unexpected(&'static str),
    /// The peer announced more bytes than the protocol or the file allows.
    #[error("announced a {what} of {len} bytes, over {cap}")]
    TooLarge {
        /// "chunk" or "footer".
        what: &'static str,
        /// Bytes announced.
        len: u64,
        /// The cap.
        cap: u64,
    },
    /// The peer refused the request in words.
    #[error("refused ({kind:?}): {message}")]
    Refused {
        /// Category.
        kind: ErrorKind,
        /// The peer's message.
        message: String,
    },
    /// Memory for the chunk could not be made, written or sealed.
    #[error("{what} chunk memory of {len} bytes: {error}")]
    Memory {
        /// "allocating", "writing", "sealing".
        what: &'static str,
        /// The chunk's length.
        len: usize,
        /// The operating system's error.
        error: std::io::Error,
    },
    /// The deadline passed.
    #[error("nothing within {0:?}")]
    Timeout(Duration),
}

/// Why a chunk a peer sent was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Corruption {
    /// The announced length is not the one the manifest's layout gives.
    #[error("announced a chunk of {announced} bytes; the manifest's layout gives {expected}")]
    Length {
        /// Bytes announced.
        announced: u64,
        /// Bytes the layout gives.
        expected: u64,
    },
    /// A chunk with jagged tensors that is not the shard the manifest
    /// describes (other rows or tensors).
    #[error("sent a chunk that is not the shard the manifest describes: {0}")]
    Shape(String),
    /// The peer announced an empty chunk.
    #[error("announced an empty chunk")]
    Empty,
    /// The header or the payload checksum did not validate.
    #[error(transparent)]
    Invalid(#[from] ChunkError),
    /// A valid chunk, of another shard or version than asked for.
    #[error("it is the chunk of {shard} in version {version}")]
    Misplaced {
        /// The shard it is of.
        shard: ShardId,
        /// The version it is of.
        version: DatasetVersion,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_that_stalled_or_sent_a_bad_chunk_is_alive_and_one_that_refused_or_went_quiet_may_not_serve() {
        let (addr, shard) = (SocketAddr::from(([10, 0, 0, 2], 7000)), ShardId { file: 0, row_group: 3 });
        let stall = Stall { idle: Duration::from_secs(5), what: "chunk bytes", got: 0, len: 10 };
        let alive = [
            PeerError::Stalled { addr, shard, stall },
            PeerError::Corrupt { addr, shard, corruption: Corruption::Empty },
        ];
        for e in alive {
            assert!(e.is_alive(), "{e}");
            assert!(matches!(e.into_ask_failure(), AskFailure::Alive(_)));
        }
        let maybe_dead = [
            PeerError::Refused { addr, shard, kind: ErrorKind::Unavailable, message: "its load asks this node".into() },
            PeerError::Transfer { addr, shard, fault: LinkFault::Gone(stall) },
            PeerError::Connect { addr, fault: LinkFault::RecentlyDown },
            PeerError::Timeout { addr, shard, deadline: Duration::from_secs(30) },
        ];
        for e in maybe_dead {
            assert!(!e.is_alive(), "{e}");
            assert!(matches!(e.into_ask_failure(), AskFailure::Unavailable(_)));
        }
    }
}
