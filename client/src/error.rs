//! Errors a trainer sees.

use granary_proto::wire::ErrorKind;
use granary_proto::{ChunkError, DatasetVersion, PlanError, ShardId};
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
    /// The node closed the connection and did not take a new one within
    /// the reconnect time ([`crate::LocalSource::reconnect_within`]).
    #[error("the node at {path} went away and did not come back within {waited:?}: {source}")]
    NodeGone {
        /// Socket path.
        path: PathBuf,
        /// How long this client kept reconnecting.
        waited: std::time::Duration,
        /// The last reason a connection failed.
        source: std::io::Error,
    },
    /// The node and this client share no version of the local protocol
    /// (they are builds too far apart): the message names both and the
    /// side to upgrade.
    #[error(
        "the node at {path} speaks local protocol {node}, this client {client}: no version in common; {}",
        if client.current < node.current { "upgrade granary in the trainer" } else { "upgrade the node" }
    )]
    Version {
        /// Socket path.
        path: PathBuf,
        /// What this client speaks.
        client: granary_proto::version::Speaks,
        /// What the node speaks.
        node: granary_proto::version::Speaks,
    },
    /// The node answered with something this client does not understand,
    /// or something that contradicts what it said before.
    #[error("protocol error from the node: {0}")]
    Protocol(#[from] ProtocolError),
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
    #[error("dataset {dataset:?} is not served here (served: {})", if served.is_empty() { "none".to_string() } else { served.join(", ") })]
    UnknownDataset {
        /// The name asked for.
        dataset: String,
        /// The datasets the source serves.
        served: Vec<String>,
    },
    /// The dataset is served, but not the version asked for (a job pinned
    /// a version that was replaced, and the source no longer has it).
    #[error("dataset {dataset:?} version {} is not served here (current: {})", version.to_hex(), current.map_or("none".to_string(), |c| c.to_hex()))]
    VersionGone {
        /// The dataset.
        dataset: String,
        /// The version asked for.
        version: DatasetVersion,
        /// The version the source serves under that name now.
        current: Option<DatasetVersion>,
    },
    /// A saved resume state that this loader would read differently.
    #[error(transparent)]
    ResumeMismatch(#[from] crate::resume::ResumeMismatch),
    /// A position after the end of its epoch.
    #[error("cannot resume at batch {batch} of epoch {epoch}: the epoch has {batches} batches")]
    PositionPastEnd {
        /// Epoch.
        epoch: u64,
        /// Batch asked for.
        batch: u64,
        /// Batches in the epoch.
        batches: u64,
    },
    /// The caller asked a batch for a tensor it does not have, or as the
    /// wrong type: a usage error, never a delivery failure.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// The background producer stopped unexpectedly.
    #[error("batch producer stopped: {0}")]
    Producer(#[from] ProducerError),
    /// The GPU path failed: see [`GpuError`] for the cause.
    #[error("GPU: {0}")]
    Gpu(#[from] GpuError),
}

/// What was wrong with the node's answer: a broken frame, a reply of the
/// wrong kind, or a chunk that contradicts the dataset's description. Not
/// retryable: the node or the client is at fault, not the moment.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// Another thread panicked mid-call; the connection may hold half a
    /// frame, so it is not used again.
    #[error("the connection is poisoned by a thread that panicked mid-call")]
    Poisoned,
    /// An earlier error left the connection in the middle of a reply.
    #[error("the connection to the node at {} is out of step after an earlier error; connect again", path.display())]
    OutOfStep {
        /// The node's socket.
        path: PathBuf,
    },
    /// A frame broke the length rules.
    #[error("{what} {error}")]
    Frame {
        /// "request" or "reply".
        what: &'static str,
        /// The codec's reason.
        error: granary_proto::frame::FrameError,
    },
    /// The reply does not decode.
    #[error("reply: {0}")]
    Decode(#[from] granary_proto::wire::FrameError),
    /// A reply of another kind than the request asks for.
    #[error("asked {asked}, the node replied {replied}")]
    Unexpected {
        /// The request.
        asked: &'static str,
        /// The reply's kind.
        replied: &'static str,
    },
    /// The node described another dataset than the one asked for.
    #[error("asked to describe dataset {asked:?}, the node described {described:?}")]
    WrongDataset {
        /// The name asked for.
        asked: String,
        /// The name described.
        described: String,
    },
    /// The node described another version than the one asked for.
    #[error("asked to describe version {} of dataset {dataset:?}, the node described {}", asked.to_hex(), described.to_hex())]
    WrongVersion {
        /// The dataset.
        dataset: String,
        /// The version asked for.
        asked: DatasetVersion,
        /// The version described.
        described: DatasetVersion,
    },
    /// A chunk reply came without its memory file.
    #[error("chunk reply for {shard} carried no descriptor")]
    NoDescriptor {
        /// The shard.
        shard: ShardId,
    },
    /// The chunk's announced length contradicts the dataset's layout.
    #[error("the node announced {announced} bytes for {shard}; the dataset's layout gives {expected}")]
    ChunkLength {
        /// The shard.
        shard: ShardId,
        /// Bytes announced.
        announced: u64,
        /// Bytes the layout gives.
        expected: u64,
    },
    /// Where no layout is known, the chunk's announced length is over the
    /// cap.
    #[error("the node announced {announced} bytes for {shard}, over {cap}")]
    ChunkTooLarge {
        /// The shard.
        shard: ShardId,
        /// Bytes announced.
        announced: u64,
        /// The cap.
        cap: u64,
    },
    /// The memory file is not sealed against writes and resizing.
    #[error("chunk file for {shard} is not sealed against writes and resizing (seals {seals:#x})")]
    Unsealed {
        /// The shard.
        shard: ShardId,
        /// The seals it has (`F_GET_SEALS` bits).
        seals: u32,
    },
    /// The memory file's size is not the announced length.
    #[error("chunk file for {shard} is {size} bytes, the reply said {len}")]
    FileSize {
        /// The shard.
        shard: ShardId,
        /// The file's size.
        size: i64,
        /// The announced length.
        len: u64,
    },
    /// A chunk's rows or tensors are not the ones the dataset's description
    /// (which the plan used) gives.
    #[error(
        "chunk {shard} has {rows} rows and tensors {tensors:?}; the dataset description says {expected_rows} rows and {expected_tensors:?}"
    )]
    ChunkShape {
        /// The shard.
        shard: ShardId,
        /// Rows in the chunk.
        rows: u64,
        /// Tensor names in the chunk.
        tensors: Vec<String>,
        /// Rows the description gives.
        expected_rows: u64,
        /// Tensor names the description gives.
        expected_tensors: Vec<String>,
    },
    /// A batch of this many rows would not fit the address space.
    #[error("a batch of {rows} rows overflows the address space")]
    BatchTooLarge {
        /// Rows in the batch.
        rows: usize,
    },
}

/// Why the background producer of batches stopped.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProducerError {
    /// A loader thread ended without sending its result.
    #[error("a loader thread ended early")]
    ThreadEnded,
    /// Assembling a batch panicked (a chunk inconsistent with the plan
    /// that validation missed); that batch is this error.
    #[error("assembling batch {batch} of epoch {epoch} panicked")]
    AssemblyPanicked {
        /// The epoch.
        epoch: u64,
        /// The batch's index in the epoch.
        batch: u64,
    },
    /// A fault injected by a test.
    #[error("injected: {0}")]
    Injected(&'static str),
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
    /// A dense view of a jagged tensor, or a jagged view of a dense one.
    #[error("{}", if *jagged {
        format!("tensor {tensor:?} is jagged (a variable number of values per row): read it with batch.jagged() or batch.bytes()")
    } else {
        format!("tensor {tensor:?} is dense (the same shape every row): read it with batch.tensor()")
    })]
    Jagged {
        /// Tensor name.
        tensor: String,
        /// Whether the tensor is jagged.
        jagged: bool,
    },
}

/// Why the GPU path failed, by cause, so a trainer can fall back to the CPU
/// when there is no driver, or fix a setting when a batch does not fit.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GpuError {
    /// The batch has a jagged tensor, which the feed does not copy yet.
    #[error(
        "tensor {tensor:?} is jagged: the GPU feed copies dense tensors only so far; copy its values and offsets \
         yourself (Batch::jagged), or give it pad_to in the view to make it dense"
    )]
    Jagged {
        /// The jagged tensor.
        tensor: String,
    },
    /// No CUDA driver could be loaded: not a GPU host, or `libcuda` is not
    /// on the library path.
    #[error(
        "no CUDA driver (libcuda) found: install the NVIDIA driver or add the directory holding \
         libcuda.so to LD_LIBRARY_PATH (the `cuda` feature loads it at run time)"
    )]
    NoDriver,
    /// The device asked for does not exist.
    #[error("CUDA device {ordinal} does not exist: the driver reports {devices} device(s)")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices the driver reports.
        devices: usize,
    },
    /// A driver call failed.
    #[error("{what}: {code}")]
    Driver {
        /// What was being done.
        what: String,
        /// The driver's error name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        code: String,
    },
    /// The driver wrapper panicked (a driver missing a symbol it expects).
    #[error("the CUDA driver wrapper panicked while {what}: {message}")]
    Panicked {
        /// What was being done.
        what: String,
        /// The panic's message.
        message: String,
    },
    /// A batch, a tensor or a setting does not fit the feed's buffers.
    #[error("{0}")]
    Buffers(String),
}

impl ClientError {
    /// Whether asking again may succeed: the node unreachable or gone
    /// mid-request (retry with a new `LocalSource` or `Loader`: a connection
    /// an error left out of step refuses further calls), or a failure the
    /// node reports as unavailable (a peer, remote storage, memory). False
    /// for what will fail the same way again: bad input or parameters, an
    /// unknown dataset, a chunk that failed validation (the node holds the
    /// same bytes), a protocol violation, a misused batch, a stopped
    /// producer, the GPU.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Connect { .. } | ClientError::Io(_) | ClientError::NodeGone { .. } => true,
            ClientError::Node { kind, .. } => *kind == ErrorKind::Unavailable,
            ClientError::Chunk { .. }
            | ClientError::Protocol(_)
            | ClientError::Plan(_)
            | ClientError::UnknownDataset { .. }
            | ClientError::VersionGone { .. }
            | ClientError::Version { .. }
            | ClientError::ResumeMismatch(_)
            | ClientError::PositionPastEnd { .. }
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
        assert!(!ClientError::Protocol(ProtocolError::Poisoned).is_retryable());
    }

    #[test]
    fn a_trainer_can_tell_no_gpu_from_a_batch_that_does_not_fit() {
        let no_driver = ClientError::from(GpuError::NoDriver);
        assert!(matches!(no_driver, ClientError::Gpu(GpuError::NoDriver)));
        assert!(no_driver.to_string().contains("LD_LIBRARY_PATH"), "{no_driver}");
        let oom = GpuError::Driver { what: "allocating 1 GiB".into(), code: "CUDA_ERROR_OUT_OF_MEMORY".into() };
        assert_eq!(oom.to_string(), "allocating 1 GiB: CUDA_ERROR_OUT_OF_MEMORY");
        assert!(!ClientError::from(oom).is_retryable());
    }
}
