//! Errors a trainer sees.

use granary_proto::wire::ErrorKind;
use granary_proto::{ChunkError, PlanError, ShardId};
use std::path::PathBuf;
use thiserror::Error;

/// Why the client could not deliver a batch. [`ClientError::is_retryable`]
/// tells a failure that asking again may fix (the node restarting, a peer
/// or remote storage unavailable) from one that it will not (bad input,
/// bad parameters, a protocol violation, a misuse of a batch).
#[derive(Debug, Error)]
#[non_exhaustive]
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
    /// The caller asked a batch for a tensor it does not have, or as the
    /// wrong type: a usage error, never a delivery failure.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// The background producer stopped unexpectedly.
    #[error("batch producer stopped: {0}")]
    Producer(String),
    /// The GPU path failed (no driver, out of memory...).
    #[error("GPU: {0}")]
    Gpu(String),
}

/// A batch was asked for a tensor it does not hold, or as a type it is not:
/// the caller's mistake, apart from every delivery failure.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TensorError {
    /// A tensor name the view does not declare.
    #[error("no tensor {0:?} in this batch")]
    Unknown(String),
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
}

impl ClientError {
    /// Whether asking again (after a pause, or after reconnecting) may
    /// succeed: the node unreachable or gone mid-request, or a failure the
    /// node reports as unavailable (a peer, remote storage, memory); a
    /// chunk that failed validation (the next fetch may bring a good one).
    /// False for what will fail the same way again: bad input or
    /// parameters, an unknown dataset, a protocol violation, a misused
    /// batch, a stopped producer, the GPU.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Connect { .. } | ClientError::Io(_) | ClientError::Chunk { .. } => true,
            ClientError::Node { kind, .. } => *kind == ErrorKind::Unavailable,
            ClientError::Protocol(_)
            | ClientError::Plan(_)
            | ClientError::UnknownDataset(_)
            | ClientError::Tensor(_)
            | ClientError::Producer(_)
            | ClientError::Gpu(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trainer_can_tell_retry_from_give_up() {
        let node = |kind| ClientError::Node { kind, message: "m".into() };
        assert!(node(ErrorKind::Unavailable).is_retryable());
        assert!(!node(ErrorKind::BadInput).is_retryable());
        assert!(!node(ErrorKind::BadRequest).is_retryable());
        assert!(ClientError::Io(std::io::Error::from(std::io::ErrorKind::BrokenPipe)).is_retryable());
        assert!(!ClientError::Tensor(TensorError::Unknown("x".into())).is_retryable());
        assert!(!ClientError::Plan(PlanError::ZeroBatch).is_retryable());
        assert!(!ClientError::Protocol("bad frame".into()).is_retryable());
    }
}
