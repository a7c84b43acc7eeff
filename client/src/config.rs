//! What a rank asks its loader for ([`LoaderConfig`]): the dataset and
//! version, the plan (its kind, seed, world size, rank, batch, shuffle,
//! drop_last) and how the loader works (lookahead, threads, mappings kept,
//! memory, reconnect time).

use crate::hostbuf::HostMemory;
use crate::local::DEFAULT_MAPPING_CACHE_BYTES;
use crate::resume::{PlanKind, ResumeState};
use granary_proto::{DatasetVersion, GlobalParams, PlanParams, Shuffle, Walk};

/// What a rank asks for.
#[derive(Clone, Debug)]
pub struct LoaderConfig {
    /// Dataset name.
    pub dataset: String,
    /// The dataset version to read; `None`: the node's current version
    /// when the loader is made (then pinned: [`Loader::version`]). A
    /// version the node no longer serves is
    /// [`ClientError::VersionGone`]. Default: `None`.
    pub version: Option<DatasetVersion>,
    /// The job's seed.
    pub seed: u64,
    /// This rank.
    pub rank: u32,
    /// Number of data-parallel ranks.
    pub world_size: u32,
    /// Rows per batch.
    pub batch_size: u32,
    /// Shuffle settings. Default: windows of 4 shards.
    pub shuffle: Shuffle,
    /// Drop rows that do not fill a batch on every rank. Default: false.
    pub drop_last: bool,
    /// The plan walked. [`PlanKind::Global`] gives every world size that
    /// divides its global batch the same global order, so a job resumes on
    /// another number of ranks; `batch_size` is then the global batch over
    /// the world size (the loader sets it). Default: [`PlanKind::Rank`].
    pub plan: PlanKind,
    /// Batches assembled ahead of the consumer. Default: 2.
    pub prefetch_batches: usize,
    /// Threads that assemble batches (0: choose from the machine, see
    /// [`default_assembly_threads`]). Up to `prefetch_batches +
    /// assembly_threads - 1` batches are queued or being assembled, so
    /// memory grows by one batch per thread. Default: 0.
    pub assembly_threads: usize,
    /// Bytes of chunk mappings a [`LocalSource`] made by [`Loader::connect`]
    /// keeps for later epochs (0 keeps none; see [`LocalSource::mapping_cache`]).
    /// A kept mapping holds its chunk's memory after the node evicts it, so
    /// this bounds what one rank can hold on to. Default: 1 GiB.
    pub mapping_cache_bytes: u64,
    /// Memory batches are assembled into. Default: the heap; with the
    /// `cuda` feature, [`crate::cuda::GpuFeed::host_memory`] makes it
    /// page-locked, and the feed copies assembled batches to the device
    /// straight from it.
    pub host_memory: HostMemory,
    /// How long [`Loader::connect`]'s connection keeps reconnecting to a
    /// node that restarts, before the epoch fails with
    /// [`ClientError::NodeGone`]; zero fails at once. Default 30 s.
    pub reconnect: std::time::Duration,
}

/// The assembly threads a rank gets by default: the machine's cores shared
/// by the ranks on this host (`LOCAL_WORLD_SIZE`, as torchrun sets it; 1
/// when unset), at least 1 and at most 8 (past that, memory bandwidth, not
/// threads, bounds assembly).
pub fn default_assembly_threads() -> usize {
    let local_ranks =
        std::env::var("LOCAL_WORLD_SIZE").ok().and_then(|v| v.trim().parse::<usize>().ok()).filter(|&n| n > 0);
    default_assembly_threads_for(local_ranks.unwrap_or(1))
}

/// The default assembly threads of one of `local_ranks` ranks on this host:
/// its share of the cores, at least 1 and at most 8.
pub fn default_assembly_threads_for(local_ranks: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (cores / local_ranks.max(1)).clamp(1, 8)
}

impl LoaderConfig {
    /// Rank `rank` of `world_size` in the global plan of `global_batch` rows
    /// over `partitions` canonical partitions, other settings as
    /// [`LoaderConfig::new`]'s.
    pub fn global(dataset: impl Into<String>, global_batch: u32, partitions: u32, world_size: u32, rank: u32) -> Self {
        Self {
            world_size,
            rank,
            plan: PlanKind::Global { global_batch, partitions },
            ..Self::new(dataset, global_batch / world_size.max(1))
        }
    }

    /// Defaults for a single rank: seed 0, shuffle windows of 4 shards, keep
    /// the last partial batch, 2 batches ahead, assembly threads chosen from
    /// the machine, 1 GiB of kept chunk mappings.
    pub fn new(dataset: impl Into<String>, batch_size: u32) -> Self {
        Self {
            dataset: dataset.into(),
            version: None,
            seed: 0,
            rank: 0,
            world_size: 1,
            batch_size,
            shuffle: Shuffle::Windowed { window_shards: 4 },
            drop_last: false,
            plan: PlanKind::Rank,
            prefetch_batches: 2,
            assembly_threads: 0,
            mapping_cache_bytes: DEFAULT_MAPPING_CACHE_BYTES,
            host_memory: HostMemory::Heap,
            reconnect: crate::local::DEFAULT_RECONNECT,
        }
    }

    /// The configuration that reads what `state` was saved from: its
    /// dataset, version and plan parameters, with the other settings at
    /// their defaults (set them after). With the global plan, set
    /// `world_size` and `rank` to the job's now: any world size dividing
    /// the global batch continues the same global steps.
    pub fn resuming(state: &ResumeState) -> Self {
        Self {
            version: Some(state.version),
            seed: state.seed,
            rank: state.rank,
            world_size: state.world_size,
            shuffle: state.shuffle,
            drop_last: state.drop_last,
            plan: state.plan,
            ..Self::new(state.dataset.clone(), state.batch_size)
        }
    }

    /// The assembly threads this configuration asks for (0 resolved).
    pub fn threads(&self) -> usize {
        if self.assembly_threads == 0 { default_assembly_threads() } else { self.assembly_threads }
    }

    /// The walk of `epoch` from batch `start`: the rank plan of
    /// [`LoaderConfig::params`], or this rank's slice of the global plan.
    pub fn walk(&self, epoch: u64, start: u64) -> Walk {
        match self.plan {
            PlanKind::Rank => Walk::Rank { params: self.params(epoch), start },
            PlanKind::Global { global_batch, partitions } => Walk::Global {
                params: GlobalParams {
                    seed: self.seed,
                    epoch,
                    global_batch,
                    partitions,
                    shuffle: self.shuffle,
                    drop_last: self.drop_last,
                },
                world_size: self.world_size,
                rank: self.rank,
                start,
            },
        }
    }

    /// The rank plan's parameters for `epoch`.
    pub fn params(&self, epoch: u64) -> PlanParams {
        PlanParams {
            seed: self.seed,
            epoch,
            world_size: self.world_size,
            rank: self.rank,
            batch_size: self.batch_size,
            shuffle: self.shuffle,
            drop_last: self.drop_last,
        }
    }
}
