//! Messages between nodes (the peer fabric, over QUIC with mutual TLS).
//!
//! One bidirectional stream per chunk request: the asking node writes one
//! frame (a u32 little-endian length, then an rkyv archive of
//! [`PeerRequest`]) and finishes its side; the owner answers with one
//! [`PeerResponse`] frame and, for [`PeerResponse::Chunk`], exactly `len`
//! chunk bytes as stored (no re-encoding), then finishes. The asking node
//! validates the chunk (header and payload checksum) before using it.
//!
//! Frames are bounded by [`MAX_PEER_FRAME_LEN`] and chunks by
//! [`MAX_PEER_CHUNK_LEN`], both checked before anything is allocated.

use crate::ids::{DatasetVersion, ShardId};
use crate::wire::ErrorKind;

/// Largest request or response frame (not counting chunk bytes).
pub const MAX_PEER_FRAME_LEN: usize = 64 << 10;
/// Largest chunk a peer may send.
pub const MAX_PEER_CHUNK_LEN: u64 = 4 << 30;

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
        /// The owner could not produce the chunk.
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
        let r = PeerRequest::FetchChunk { version: DatasetVersion([3; 16]), shard: ShardId { file: 1, row_group: 2 } };
        assert_eq!(decode::<PeerRequest>(&encode(&r)).expect("decode"), r);
        for resp in [
            PeerResponse::Chunk { len: 12345 },
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
