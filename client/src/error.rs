//! Errors a trainer sees.

use granary_proto::wire::ErrorKind;
use granary_proto::{ChunkError, PlanError, ShardId};
use std::path::PathBuf;
use thiserror::Error;

/// Why the client could not deliver a batch.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The node's socket could not be reached.
    #[error("cannot connect to the node at {path}: {source}")]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The connection to the node failed mid-request; the node may be gone.
    #[error("connection to the node failed: {0}")]
    Io(#[from] std::io::Error),
    /// The node answered with something this client does not understand.
    #[error("protocol error from the node: {0}")]
    Protocol(String),
    /// The node reported a failure.
    #[error("node refused: {message}")]
    Node {
        /// Kind of failure; `Unavailable` may succeed on retry.
        kind: ErrorKind,
        /// The node's message, naming file, row group or column.
        message: String,
    },
    /// A chunk failed validation; it was not used.
    #[error("chunk for shard {shard} is invalid: {source}")]
    Chunk {
        /// The shard.
        shard: ShardId,
        /// What was wrong.
        source: ChunkError,
    },
    /// The plan parameters are impossible.
    #[error("invalid plan: {0}")]
    Plan(#[from] PlanError),
    /// The dataset is unknown to the source.
    #[error("dataset {0:?} is not served here")]
    UnknownDataset(String),
    /// A tensor name the view does not declare.
    #[error("no tensor {0:?} in this batch")]
    UnknownTensor(String),
    /// A typed view asked for the wrong element type.
    #[error("tensor {tensor:?} holds {have}, not {want}")]
    DType {
        /// Tensor name.
        tensor: String,
        /// Requested dtype.
        want: &'static str,
        /// Stored dtype.
        have: &'static str,
    },
    /// The background producer stopped unexpectedly.
    #[error("batch producer stopped: {0}")]
    Producer(String),
    /// The GPU path failed (no driver, out of memory...).
    #[error("GPU: {0}")]
    Gpu(String),
}
