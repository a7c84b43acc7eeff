//! Messages between a trainer and the node on its host.
//!
//! The transport is a Unix stream socket. Every message is a frame
//! ([`crate::frame`]): a u32 little-endian length, then an rkyv archive of
//! [`LocalRequest`] or [`LocalResponse`] ([`encode_frame`] writes one whole). A [`LocalResponse::Chunk`] reply carries a sealed memory
//! file descriptor alongside (SCM_RIGHTS) holding the chunk bytes, so the
//! trainer maps the chunk instead of reading it through the socket.
//!
//! Frames from the other process are bounded by [`MAX_FRAME_LEN`] and
//! validated (bytecheck) before use.

use crate::frame;
use crate::ids::{DatasetVersion, ShardId};
use crate::manifest::ShardRows;
use crate::plan::PlanParams;
use crate::view::TensorLayout;

/// Largest frame either side accepts.
pub const MAX_FRAME_LEN: usize = 64 << 20;

pub use request_def::LocalRequest;

// rkyv derives undocumented resolver types for enums with fields.
#[allow(missing_docs)]
mod request_def {
    use super::*;

    /// A trainer's request.
    #[derive(Clone, PartialEq, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    pub enum LocalRequest {
        /// Describe a dataset the node serves: the version a job pinned,
        /// or the current one.
        Describe {
            /// Dataset name.
            dataset: String,
            /// The version; `None`: the current one.
            version: Option<DatasetVersion>,
        },
        /// The trainer is about to walk this plan: the node prefetches along it.
        Follow {
            /// Dataset version.
            version: DatasetVersion,
            /// The rank's plan parameters for the epoch.
            params: PlanParams,
        },
        /// Hand over one chunk; the reply carries a memory file descriptor.
        FetchChunk {
            /// Dataset version.
            version: DatasetVersion,
            /// Shard.
            shard: ShardId,
        },
        /// Report the node's counters.
        Stats,
        /// The trainer used a chunk it still had mapped: only moves the
        /// node's prefetch cursor along the plan.
        Touch {
            /// Dataset version.
            version: DatasetVersion,
            /// Shard.
            shard: ShardId,
        },
        /// A rank's loader clocks, for `granary doctor` (sent every half
        /// second or so while it reads).
        Report(crate::doctor::RankReport),
        /// The node's stage clocks and its ranks' last reports.
        Doctor,
        /// The trainer is about to walk this plan from this batch (the
        /// rank plan or its slice of a global plan): the node prefetches
        /// along it from there. Supersedes `Follow`, which a node still
        /// takes as a rank plan walked from its first batch.
        FollowWalk {
            /// Dataset version.
            version: DatasetVersion,
            /// The plan and where the rank starts in it.
            walk: crate::plan::Walk,
        },
        /// The node's counters beyond [`NodeStats`], by name (local
        /// protocol 3): a counter added later is a new name, which an
        /// older trainer skips, never a new layout.
        Counters,
    }
}

/// What a dataset looks like to a trainer.
#[derive(Clone, PartialEq, Eq, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct DatasetInfo {
    /// Dataset name.
    pub name: String,
    /// The version described.
    pub version: DatasetVersion,
    /// What seeds the batch order ([`crate::PlanKey`]): the same for the
    /// same files wherever they live.
    pub plan_key: crate::ids::PlanKey,
    /// Tensors in view order.
    pub tensors: Vec<TensorLayout>,
    /// Shards in manifest order.
    pub shards: Vec<ShardRows>,
    /// Source file paths, indexed by `ShardId::file`.
    pub files: Vec<String>,
    /// Total size of the source files in bytes.
    pub source_bytes: u64,
    /// The most bytes of chunk mappings a trainer should keep beyond the
    /// chunks its node holds: a kept mapping of a chunk the node evicted is
    /// charged to the node's memory, so the node shares what it has left
    /// among the ranks it expects (`u64::MAX`: no advice). The client's
    /// mapping cache takes the lower of this and its own setting.
    pub mapping_budget_bytes: u64,
}

/// Node counters, cumulative since start.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct NodeStats {
    /// Bytes read from remote storage (footers and row groups).
    pub remote_bytes: u64,
    /// Requests made to remote storage.
    pub remote_requests: u64,
    /// Parquet footers read from remote storage.
    pub remote_footers: u64,
    /// Parquet footers received from the peer that reads them for the
    /// cluster instead.
    pub peer_footers: u64,
    /// Shards converted.
    pub conversions: u64,
    /// Converted bytes produced.
    pub converted_bytes: u64,
    /// Chunk requests answered from the RAM tier.
    pub ram_hits: u64,
    /// Chunk requests answered from the SSD tier.
    pub ssd_hits: u64,
    /// Chunk requests that started a load (a peer fetch or a conversion).
    pub misses: u64,
    /// Chunk requests that waited for a load another request had started
    /// (single flight).
    pub joined: u64,
    /// SSD entries that failed Granary's chunk validation and were re-read.
    /// Entries that foyer's own entry checksum rejects first are counted as
    /// misses instead.
    pub corrupt_entries: u64,
    /// Chunks prefetched ahead of a request.
    pub prefetched: u64,
    /// Bytes of chunks the node holds in memory files right now.
    pub chunk_memory_bytes: u64,
    /// Chunks fetched from their owner over the peer fabric.
    pub peer_fetched: u64,
    /// Bytes of those chunks.
    pub peer_fetched_bytes: u64,
    /// Peer fetches that failed (the chunk was then read from remote storage).
    pub peer_failures: u64,
    /// Chunk requests from other nodes answered.
    pub peer_served: u64,
    /// Of those, refused because this node's placement gives the shard to
    /// another node (and the asker's is no newer): a read this node would
    /// have made for a peer that was out of date.
    pub peer_refused: u64,
    /// Chunk requests answered from guest copies (chunks other nodes own).
    pub guest_hits: u64,
    /// Bytes of guest copies held.
    pub guest_bytes: u64,
    /// Chunks from peers that this node also converted and found the same
    /// (`verify_peer_chunks`).
    pub peer_verified: u64,
    /// Chunks from peers that differed from this node's own conversion
    /// (never served; the peer was quarantined).
    pub peer_mismatched: u64,
    /// Peers quarantined for a chunk that differed (a gauge).
    pub peers_quarantined: u64,
    /// Loads in flight right now (a gauge, not cumulative): reading and
    /// converting, fetching from a peer, or queued for a load permit.
    pub loads_in_flight: u64,
}

/// Kinds of failure a trainer can act on.
#[derive(Clone, Copy, PartialEq, Eq, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum ErrorKind {
    /// The request was malformed or named something unknown; retrying the
    /// same request cannot help.
    BadRequest,
    /// The source data is bad (corrupt file, schema mismatch, nulls...).
    BadInput,
    /// A transient failure; a retry may succeed.
    Unavailable,
}

pub use response_def::LocalResponse;

// rkyv derives undocumented resolver types for enums with fields.
#[allow(missing_docs)]
mod response_def {
    use super::*;

    /// The node's reply.
    #[derive(Clone, PartialEq, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    pub enum LocalResponse {
        /// Reply to `Describe`.
        Described(DatasetInfo),
        /// Reply to `Follow`.
        Following,
        /// Reply to `FetchChunk`: a memory file of `len` bytes is attached.
        Chunk {
            /// Chunk length in bytes.
            len: u64,
        },
        /// Reply to `Stats`.
        Stats(NodeStats),
        /// Reply to `Touch`.
        Touched,
        /// Reply to `Report`.
        Reported,
        /// Reply to `Doctor`.
        Doctor(crate::doctor::DoctorSnapshot),
        /// Reply to `Describe`: the dataset, or the version asked for, is
        /// not served here.
        NotServed {
            /// The name asked for.
            dataset: String,
            /// The version asked for, if any.
            version: Option<DatasetVersion>,
            /// The version served under that name now, if the name is.
            current: Option<DatasetVersion>,
            /// The names of the datasets served.
            served: Vec<String>,
        },
        /// The request failed.
        Failed {
            /// What kind of failure.
            kind: ErrorKind,
            /// What failed, naming file, row group, column or request.
            message: String,
        },
        /// Reply to `Counters`.
        Counters(Vec<Counter>),
    }
}

/// One counter of [`LocalRequest::Counters`]' reply.
#[derive(Clone, PartialEq, Eq, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Counter {
    /// Its name, as the node's metrics name it without the
    /// `granary_node_` prefix and `_total` suffix (`chunks_reused`).
    pub name: String,
    /// Its value since the node started.
    pub value: u64,
}

/// A frame that cannot be encoded or decoded: the one codec error
/// ([`crate::frame::FrameError`]), named here too where messages are.
pub use crate::frame::FrameError;

/// Encodes a message as a frame body (without the length prefix).
pub fn encode<T>(msg: &T) -> Vec<u8>
where
    T: for<'a> rkyv::Serialize<
            rkyv::api::high::HighSerializer<
                rkyv::util::AlignedVec,
                rkyv::ser::allocator::ArenaHandle<'a>,
                rkyv::rancor::Error,
            >,
        >,
{
    // Serialising plain owned data into a growable buffer cannot fail; an
    // empty frame would be refused by the receiver anyway.
    rkyv::to_bytes::<rkyv::rancor::Error>(msg).map(|v| v.to_vec()).unwrap_or_default()
}

/// Encodes a message as one whole frame, header and body. Refuses
/// ([`FrameError::TooLarge`], with the body's length) a body over
/// [`MAX_FRAME_LEN`], which the receiver would refuse without saying why.
pub fn encode_frame<T>(msg: &T) -> Result<Vec<u8>, FrameError>
where
    T: for<'a> rkyv::Serialize<
            rkyv::api::high::HighSerializer<
                rkyv::util::AlignedVec,
                rkyv::ser::allocator::ArenaHandle<'a>,
                rkyv::rancor::Error,
            >,
        >,
{
    let body = encode(msg);
    frame::encode(&body, MAX_FRAME_LEN)
}

/// Validates and decodes a frame body.
pub fn decode<T>(body: &[u8]) -> Result<T, FrameError>
where
    T: rkyv::Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>>
        + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
{
    frame::check_len(body.len(), MAX_FRAME_LEN)?;
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(body.len());
    aligned.extend_from_slice(body);
    rkyv::from_bytes::<T, rkyv::rancor::Error>(&aligned)
        .map_err(|e| FrameError::Malformed { expected: std::any::type_name::<T>(), reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Shuffle;
    use proptest::prelude::*;

    #[test]
    fn requests_round_trip() {
        let reqs = [
            LocalRequest::Describe { dataset: "ads".into(), version: None },
            LocalRequest::Describe { dataset: "ads".into(), version: Some(DatasetVersion([9; 16])) },
            LocalRequest::FetchChunk { version: DatasetVersion([1; 16]), shard: ShardId { file: 3, row_group: 4 } },
            LocalRequest::Follow {
                version: DatasetVersion([2; 16]),
                params: PlanParams {
                    seed: 1,
                    epoch: 2,
                    world_size: 4,
                    rank: 3,
                    batch_size: 512,
                    shuffle: Shuffle::Windowed { window_shards: 4 },
                    drop_last: false,
                },
            },
            LocalRequest::Stats,
            LocalRequest::FollowWalk {
                version: DatasetVersion([3; 16]),
                walk: crate::plan::Walk::Global {
                    params: crate::plan::GlobalParams {
                        seed: 1,
                        epoch: 2,
                        global_batch: 1024,
                        partitions: 16,
                        shuffle: Shuffle::Blocks { window_batches: 8 },
                        drop_last: true,
                    },
                    world_size: 8,
                    rank: 5,
                    start: 77,
                },
            },
        ];
        for r in reqs {
            assert_eq!(decode::<LocalRequest>(&encode(&r)).unwrap(), r);
            let whole = encode_frame(&r).unwrap();
            assert_eq!(whole, frame::encode(&encode(&r), MAX_FRAME_LEN).unwrap());
            let len = frame::decode_len(whole[..frame::HEADER_LEN].try_into().unwrap(), MAX_FRAME_LEN).unwrap();
            assert_eq!(decode::<LocalRequest>(&whole[frame::HEADER_LEN..][..len]).unwrap(), r);
        }
    }

    #[test]
    fn frames_over_the_limit_are_refused_on_both_sides() {
        let huge = LocalResponse::Failed { kind: ErrorKind::BadInput, message: "x".repeat(MAX_FRAME_LEN) };
        let len = encode(&huge).len();
        assert_eq!(encode_frame(&huge), Err(FrameError::TooLarge { len, cap: MAX_FRAME_LEN }));
        assert_eq!(
            decode::<LocalResponse>(&vec![0; MAX_FRAME_LEN + 1]),
            Err(FrameError::TooLarge { len: MAX_FRAME_LEN + 1, cap: MAX_FRAME_LEN })
        );
    }

    proptest! {
        #[test]
        fn arbitrary_frames_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode::<LocalRequest>(&bytes);
            let _ = decode::<LocalResponse>(&bytes);
        }
    }
}
