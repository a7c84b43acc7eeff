//! Messages between nodes (the peer fabric, over QUIC with mutual TLS).
//!
//! One bidirectional stream per request: the asking node writes one frame
//! (a u32 little-endian length, then an rkyv archive of [`PeerRequest`])
//! and finishes its side; the owner answers with one [`PeerResponse`] frame
//! and, for [`PeerResponse::Chunk`], exactly `len` chunk bytes as stored (no
//! re-encoding), or for [`PeerResponse::Footer`] exactly `len` bytes of the
//! file's Parquet footer as stored at the end of the file, then finishes.
//! The asking node validates a chunk (header and payload checksum) before
//! using it, and a footer by decoding it and checking it against the
//! manifest.
//!
//! A node that a placement made the owner of a shard another live node
//! owned before asks that node first with [`PeerRequest::HandOver`] (a
//! handoff): it answers with the chunk it holds, or with the chunk of a
//! load of its own that is already reading remote storage, or at once with
//! [`PeerResponse::NotHeld`]; it never starts a load for it.
//!
//! While the owner is still producing the answer (reading remote storage,
//! converting) it sends a [`PeerResponse::Working`] frame at least every
//! [`PEER_PROGRESS_INTERVAL`] before the answer's frame, so the asking node
//! tells a slow owner from a stalled one: it gives up on a stream that
//! sends nothing (no frame, no byte) for [`PEER_STALL_TIMEOUT`]. Both are the
//! defaults of a node's `[cluster.fabric]` (`progress_interval_ms`,
//! `stall_timeout_ms`), which must be the same on every node.
//!
//! Frames are bounded by [`MAX_PEER_FRAME_LEN`], chunks by
//! [`MAX_PEER_CHUNK_LEN`] and footers by [`MAX_PEER_FOOTER_LEN`], all checked
//! before anything is allocated.

use crate::ids::{DatasetVersion, ShardId};
use crate::wire::ErrorKind;

/// Largest request or response frame (not counting chunk bytes).
pub const MAX_PEER_FRAME_LEN: usize = 64 << 10;
/// Largest chunk a peer may send.
pub const MAX_PEER_CHUNK_LEN: u64 = 4 << 30;
/// Largest Parquet footer a peer may send.
pub const MAX_PEER_FOOTER_LEN: u64 = 256 << 20;

/// How often an owner that is still producing an answer says so
/// ([`PeerResponse::Working`]).
pub const PEER_PROGRESS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// How long an asking node waits for anything on a stream (a frame, chunk
/// or footer bytes) before it treats the owner as stalled: several
/// progress intervals, so a loaded owner is not mistaken for a stalled one.
pub const PEER_STALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

pub use defs::{PeerRequest, PeerResponse};

// rkyv derives undocumented resolver types for enums with fields.
#[allow(missing_docs)]
mod defs {
    use super::*;

    /// A node asks a shard's owner for its chunk.
    #[derive(Clone, Copy, PartialEq, Eq, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    pub enum PeerRequest {
        /// Send the chunk of `shard` in `version`.
        FetchChunk {
            /// Dataset version.
            version: DatasetVersion,
            /// Shard.
            shard: ShardId,
            /// The placement epoch that named the asked node the owner. The
            /// owner joins the request to a load of its own that is asking
            /// another node only if that load's owner came from an epoch at
            /// least as new, so no cycle of waiting loads can form (see
            /// `granary_node`'s single flight).
            placement_epoch: u64,
        },
        /// Send the chunk of `shard` in `version` if this node holds it or
        /// is already reading it from remote storage; else answer
        /// [`PeerResponse::NotHeld`] at once. Asked of the node a placement
        /// handed the shard over from (a handoff), never forwarded, never a
        /// new load.
        HandOver {
            /// Dataset version.
            version: DatasetVersion,
            /// Shard.
            shard: ShardId,
        },
        /// Send the Parquet footer of file `file` (its index in the
        /// manifest) of `version`: asked of the owner of the file's first
        /// row group, so each footer is read from remote storage once per
        /// cluster.
        FetchFooter {
            /// Dataset version.
            version: DatasetVersion,
            /// File index in the manifest.
            file: u32,
        },
    }

    /// The owner's answer.
    #[derive(Clone, PartialEq, Eq, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    pub enum PeerResponse {
        /// `len` chunk bytes follow on the stream.
        Chunk {
            /// Chunk length in bytes.
            len: u64,
        },
        /// `len` footer bytes follow on the stream: the file's last
        /// `len` bytes (metadata, its length, the `PAR1` magic).
        Footer {
            /// Footer length in bytes.
            len: u64,
        },
        /// The owner is still producing the answer; another frame follows.
        Working,
        /// The answer to [`PeerRequest::HandOver`] when the node holds no
        /// copy of the shard and is not reading it.
        NotHeld,
        /// The owner could not produce the chunk or footer.
        Failed {
            /// Category.
            kind: ErrorKind,
            /// What failed, naming the file and row group.
            message: String,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{decode, encode};
    use proptest::prelude::*;

    #[test]
    fn messages_round_trip() {
        let r = PeerRequest::FetchChunk {
            version: DatasetVersion([3; 16]),
            shard: ShardId { file: 1, row_group: 2 },
            placement_epoch: u64::MAX,
        };
        assert_eq!(decode::<PeerRequest>(&encode(&r)).expect("decode"), r);
        let f = PeerRequest::FetchFooter { version: DatasetVersion([4; 16]), file: 7 };
        assert_eq!(decode::<PeerRequest>(&encode(&f)).expect("decode"), f);
        let h = PeerRequest::HandOver { version: DatasetVersion([5; 16]), shard: ShardId { file: 3, row_group: 0 } };
        assert_eq!(decode::<PeerRequest>(&encode(&h)).expect("decode"), h);
        for resp in [
            PeerResponse::Chunk { len: 12345 },
            PeerResponse::Footer { len: 73284 },
            PeerResponse::Working,
            PeerResponse::NotHeld,
            PeerResponse::Failed { kind: ErrorKind::BadRequest, message: "no such version".into() },
        ] {
            assert_eq!(decode::<PeerResponse>(&encode(&resp)).expect("decode"), resp);
        }
        assert!(encode(&r).len() < MAX_PEER_FRAME_LEN);
    }

    proptest! {
        #[test]
        fn arbitrary_frames_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode::<PeerRequest>(&bytes);
            let _ = decode::<PeerResponse>(&bytes);
        }
    }
}
