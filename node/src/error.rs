//! Errors of the node, one enum per boundary.

use granary_proto::wire::ErrorKind;
use granary_proto::{DatasetVersion, ShardId};
use thiserror::Error;

pub use granary_source::error::{RemoteError, SchemaError, SourceError};

/// The data does not fit the view, or a value cannot be converted.
#[derive(Debug, Error, PartialEq)]
#[error("{file} row group {row_group} column {column:?}: {problem}")]
pub struct ConvertError {
    /// Object path of the file.
    pub file: String,
    /// Row group index.
    pub row_group: usize,
    /// The column (or tensor, when no single column is at fault).
    pub column: String,
    /// What is wrong.
    pub problem: String,
}

fn not_served(
    dataset: &str,
    version: &Option<DatasetVersion>,
    current: &Option<DatasetVersion>,
    served: &[String],
) -> String {
    match (version, current) {
        (Some(v), Some(c)) => {
            format!("dataset {dataset:?} version {} is not served here (current: {})", v.to_hex(), c.to_hex())
        }
        _ => format!(
            "dataset {dataset:?} is not served here (served: {})",
            if served.is_empty() { "none".to_string() } else { served.join(", ") }
        ),
    }
}

/// A chunk request failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FetchError {
    /// A trainer asked to describe a dataset, or a version of one, that
    /// this node does not serve.
    #[error("{}", not_served(dataset, version, current, served))]
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
    /// A dataset of the node's config that could not be opened when the
    /// node started (it serves the others).
    #[error("dataset {dataset:?} is configured on this node but could not be opened: {reason}")]
    DatasetFailed {
        /// The dataset.
        dataset: String,
        /// Why, naming file, tensor and column where the cause does.
        reason: String,
    },
    /// A request named a dataset version this node does not serve.
    #[error("dataset version {} is not served by this node", .0.to_hex())]
    UnknownVersion(DatasetVersion),
    /// The shard is not part of the dataset version.
    #[error("shard {0} is not part of the dataset")]
    UnknownShard(ShardId),
    /// Reading remote storage failed.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// Conversion failed: the data does not fit the view.
    #[error(transparent)]
    Convert(#[from] ConvertError),
    /// Shared memory could not be created.
    #[error("shared memory for shard {shard}: {source}")]
    Memory {
        /// The shard.
        shard: ShardId,
        /// The system error.
        source: std::io::Error,
    },
    /// A shard whose load alone would take more memory than the node lets
    /// loads in progress take.
    #[error(
        "{site}: loading it takes about {estimate} bytes (its column chunks, decoded arrays and chunk), over this \
         node's budget of {budget} bytes for loads in progress (load_memory_bytes in node.toml): raise it, or write \
         smaller row groups"
    )]
    LoadTooLarge {
        /// "FILE row group N".
        site: String,
        /// The load's estimate.
        estimate: u64,
        /// The node's budget.
        budget: u64,
    },
    /// A `Follow` whose plan would make the node hold more bytes at once
    /// than its limit allows.
    #[error(
        "planning this rank would hold up to {} bytes at once ({} batches of {batch_size} rows, a shuffle window \
         of {} entries), over this node's limit of {limit} bytes (max_plan_bytes in node.toml): use a larger \
         batch_size or a smaller window_shards / window_batches",
        cost.bytes, cost.batches, cost.window_entries
    )]
    PlanTooLarge {
        /// What the plan would cost ([`granary_proto::plan_cost`]).
        cost: granary_proto::PlanCost,
        /// Rows per batch.
        batch_size: u32,
        /// The node's limit.
        limit: u64,
    },
    /// The plan parameters of a `Follow` are impossible.
    #[error("cannot follow the plan: {0}")]
    Plan(#[from] granary_proto::PlanError),
    /// The dataset version has no file of this index (a peer asked for the
    /// footer of a file that does not exist).
    #[error("the dataset version has no file {0}")]
    UnknownFile(u64),
    /// The load this request waited on ended without a result (its task
    /// was dropped), or the lookup never settled.
    #[error("the load of {shard} ended without a result")]
    LoadLost {
        /// The shard.
        shard: ShardId,
    },
    /// The node is shutting down: its load or conversion slots are closed.
    #[error("the node is shutting down")]
    ShuttingDown(#[source] tokio::sync::AcquireError),
    /// The manifest's tensors give no valid chunk layout for the shard.
    #[error("no chunk layout for {shard}: {source}")]
    Layout {
        /// The shard.
        shard: ShardId,
        /// Why.
        source: granary_proto::ChunkError,
    },
    /// A blocking task (planning, decoding and converting) panicked or was
    /// cancelled.
    #[error("{what} failed: {source}")]
    Task {
        /// What the task did.
        what: &'static str,
        /// The runtime's error.
        source: tokio::task::JoinError,
    },
    /// A trainer asked for a dataset before this cluster node has joined
    /// (issue 48): it does not know the datasets yet. Unavailable, so the
    /// trainer asks again.
    #[error("this node is not in the cluster yet ({reason}): it learns the datasets once it joins; ask again")]
    NotJoined {
        /// Why not ([`granary_node_core::health::NotReady`], in words).
        reason: String,
    },
    /// A peer asked for a shard this node is itself fetching from that
    /// peer: their placements disagree for now.
    #[error("this node is itself fetching {shard} from the node asking for it; ask again when placement settles")]
    Forwarding {
        /// The shard.
        shard: ShardId,
    },
    /// A peer asked this node, as the shard's owner, for a shard that this
    /// node's placement (no older than the peer's) gives to another node,
    /// or gave to one while the load waited to read it: the peer asks that
    /// node (reading it here would read it twice).
    #[error("{shard} is not this node's: its placement names {owner} the owner; ask it")]
    NotOwner {
        /// The shard.
        shard: ShardId,
        /// Its owner now.
        owner: granary_proto::NodeId,
    },
    /// A peer asked for the footer of a file whose first row group this
    /// node believes another node owns: its placement disagrees with the
    /// asker's for now, and answering would mean asking a third node (or
    /// the asker) in turn.
    #[error("this node does not read the footer of file {file}: by its placement {owner} does")]
    NotFooterOwner {
        /// File index in the manifest.
        file: u32,
        /// The owner this node knows.
        owner: granary_proto::NodeId,
    },
    /// No source delivered the chunk: the peers asked first, then remote
    /// storage.
    #[error("no source delivered {shard}: peers tried: {}; then remote storage: {source}", joined(tried))]
    NoSource {
        /// The shard.
        shard: ShardId,
        /// Each peer turned to, and the error it gave no chunk with.
        tried: Vec<granary_node_core::route::Tried<crate::fabric::PeerError>>,
        /// Why reading remote storage here failed.
        source: Box<FetchError>,
    },
}

/// Each of `tried`, as words, `; ` between them.
fn joined<T: std::fmt::Display>(tried: &[T]) -> String {
    tried.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

impl FetchError {
    /// How a trainer should treat this failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            FetchError::NotServed { .. }
            | FetchError::UnknownVersion(_)
            | FetchError::UnknownShard(_)
            | FetchError::Plan(_)
            | FetchError::PlanTooLarge { .. } => ErrorKind::BadRequest,
            FetchError::Convert(_)
            | FetchError::DatasetFailed { .. }
            | FetchError::LoadTooLarge { .. }
            | FetchError::Remote(RemoteError::Parquet { .. })
            | FetchError::Remote(RemoteError::Changed { .. }) => ErrorKind::BadInput,
            FetchError::NoSource { source, .. } => source.kind(),
            _ => ErrorKind::Unavailable,
        }
    }
}

impl From<SourceError> for FetchError {
    fn from(e: SourceError) -> Self {
        match e {
            SourceError::Remote(e) => FetchError::Remote(e),
            SourceError::UnknownShard(shard) => FetchError::UnknownShard(shard),
            SourceError::UnknownFile(file) => FetchError::UnknownFile(file as u64),
        }
    }
}
