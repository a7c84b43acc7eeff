//! `bench cluster`'s `two_jobs` scenario (issue 32): two training jobs on
//! the same dataset version at once, on one cluster, with nothing in
//! common but the data. Job A walks the rank plan (`ranks_per_node` ranks
//! on every node, batch `batch_size`, seed 3); job B walks the global plan
//! (one rank per node, global batches of `batch_size` × nodes over as many
//! canonical partitions, another seed). Both jobs' epochs run at the same
//! time. What the cluster reads and converts is measured: every shard
//! should be read from remote storage and converted once per cluster for
//! both jobs (`remote_read_ratio` ≈ 1, `conversions_per_shard` = 1).

use crate::report::ratio;
use anyhow::{Result, anyhow};
use granary_client::{ChunkSource, LocalSource};
use granary_testkit::harness::{LocalCluster, LocalClusterSpec, run_epoch, spawn_ranks};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the two jobs cost the cluster.
#[derive(Clone, Debug, Serialize)]
pub struct TwoJobsScenario {
    /// `two_jobs`.
    pub scenario: &'static str,
    /// Node daemons.
    pub nodes: u32,
    /// Job A's ranks (the rank plan).
    pub ranks_rank_plan: u32,
    /// Job B's ranks (the global plan).
    pub ranks_global_plan: u32,
    /// Job B's global batch.
    pub global_batch: u32,
    /// Rows both jobs received per epoch (twice the dataset).
    pub rows_per_epoch: Vec<u64>,
    /// Seconds per epoch, both jobs at once.
    pub epoch_secs: Vec<f64>,
    /// Remote bytes over all epochs / dataset bytes (target ≤ 1.01).
    pub remote_read_ratio: f64,
    /// Conversions in the whole cluster / shards (target 1).
    pub conversions_per_shard: f64,
}

/// The settings the scenario takes from `bench cluster`'s.
#[derive(Clone, Debug)]
pub struct TwoJobsSpec {
    /// The cluster: the other scenarios' (`bench cluster`).
    pub cluster: LocalClusterSpec,
    /// Job A's ranks per node.
    pub ranks_per_node: u32,
    /// Job A's batch; job B's global batch is this times the nodes.
    pub batch_size: u32,
    /// Epochs of both jobs.
    pub epochs: u64,
}

/// Runs the two jobs on a fresh cluster in `dir`.
pub fn run(exe: &Path, dir: &Path, data: &Path, opts: TwoJobsSpec, source_bytes: u64) -> Result<TwoJobsScenario> {
    let nodes = opts.cluster.nodes;
    let cluster = LocalCluster::start(exe, dir, data, opts.cluster)?;
    let world_a = nodes * opts.ranks_per_node;
    let sockets_a: Vec<PathBuf> = (0..world_a).map(|r| cluster.socket((r / opts.ranks_per_node) as u64 + 1)).collect();
    let args_a: Vec<String> = ["--batch-size", &opts.batch_size.to_string(), "--seed", "3"].map(String::from).into();
    let sockets_b: Vec<PathBuf> = (0..nodes).map(|r| cluster.socket(u64::from(r) + 1)).collect();
    let global_batch = opts.batch_size * nodes;
    let args_b: Vec<String> = [
        "--global-batch",
        &global_batch.to_string(),
        "--partitions",
        &nodes.to_string(),
        "--seed",
        "11",
        "--window",
        "2",
    ]
    .map(String::from)
    .into();
    let (mut ranks, _) = spawn_ranks(exe, &sockets_a, &args_a)?;
    let (job_b, _) = spawn_ranks(exe, &sockets_b, &args_b)?;
    ranks.extend(job_b);
    let (mut rows_per_epoch, mut epoch_secs) = (Vec::new(), Vec::new());
    for epoch in 0..opts.epochs {
        let out = run_epoch(&mut ranks, epoch, Duration::from_secs(600), |_, _| {})
            .map_err(|e| anyhow!("{e:#}\n{}", cluster.log_tails()))?;
        rows_per_epoch.push(out.rows);
        epoch_secs.push(out.secs);
    }
    for t in ranks {
        t.finish(Duration::from_secs(30))?;
    }
    let counters = cluster.total_stats()?;
    let shards = LocalSource::connect(cluster.socket(1))?.describe("ads", None)?.shards.len();
    Ok(TwoJobsScenario {
        scenario: "two_jobs",
        nodes,
        ranks_rank_plan: world_a,
        ranks_global_plan: nodes,
        global_batch,
        rows_per_epoch,
        epoch_secs,
        remote_read_ratio: ratio(counters.remote_bytes as f64, source_bytes as f64),
        conversions_per_shard: ratio(counters.conversions as f64, shards as f64),
    })
}
