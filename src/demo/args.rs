//! The flags of `granary demo`, shared by the single-node and the cluster
//! demo (some apply to one of them only, as their help says).

use clap::Args;

/// Demo options; every default is the embedded local default.
#[derive(Args, Clone, Debug)]
pub(crate) struct DemoArgs {
    /// Rows in the generated dataset.
    #[arg(long, default_value_t = 400_000)]
    pub rows: u64,
    /// Parquet files.
    #[arg(long, default_value_t = 8)]
    pub files: u32,
    /// Rows per row group (one shard).
    #[arg(long, default_value_t = 10_000)]
    pub row_group_rows: u64,
    /// Trainer processes (single node).
    #[arg(long, default_value_t = 4)]
    pub ranks: u32,
    /// Node daemons; 2 or more runs a cluster with a coordinator.
    #[arg(long, default_value_t = 1)]
    pub nodes: u32,
    /// Trainer ranks per node daemon (cluster).
    #[arg(long, default_value_t = 2)]
    pub ranks_per_node: u32,
    /// Epochs.
    #[arg(long, default_value_t = 3)]
    pub epochs: u64,
    /// Rows per batch.
    #[arg(long, default_value_t = 1024)]
    pub batch_size: u32,
    /// Remote latency per request, ms.
    #[arg(long, default_value_t = 20)]
    pub latency_ms: u64,
    /// Remote bandwidth shared by all requests (of one node), MiB/s.
    #[arg(long, default_value_t = 200)]
    pub bandwidth_mib: u64,
    /// RAM tier, MiB.
    #[arg(long, default_value_t = 1024)]
    pub ram_mib: u64,
    /// Also generate list and byte columns (`hist`, `cats`, `blob`) and
    /// serve them as jagged tensors: each rank receives every row's values
    /// and row offsets, and the determinism replay covers them.
    #[arg(long)]
    pub jagged: bool,
    /// Elastic determinism: ranks walk the global plan; 4 ranks run the
    /// first third of an epoch, 2 ranks resume from a rank's saved state
    /// for the second, 3 ranks for the rest; checks that every row came
    /// exactly once and in the order of an uninterrupted 1-rank run. With
    /// `--nodes N` ≥ 2 the ranks read through a cluster of N nodes.
    #[arg(long)]
    pub elastic: bool,
    /// Rows of a global step (`--elastic`): divisible by 4, 2 and 3.
    #[arg(long, default_value_t = 1200)]
    pub global_batch: u32,
    /// Canonical partitions of the global plan (`--elastic`).
    #[arg(long, default_value_t = 4)]
    pub partitions: u32,
    /// A dataset that changes every day: a cluster (4 nodes unless
    /// `--nodes` says 2 or more) serves `--days` days named by a brace
    /// range, warm; the next day lands and the window moves by one; the
    /// new version's epoch converts only the new day, and a job of the old
    /// version reads on from the tiers.
    #[arg(long)]
    pub daily: bool,
    /// Days in the window (`--daily`).
    #[arg(long, default_value_t = 10)]
    pub days: u32,
    /// Print JSON lines instead of tables and bars.
    #[arg(long)]
    pub json: bool,
}
