//! What a chaos run is configured with: the job and cluster
//! ([`RunConfig`]), the tiers a node gets, and the settings every seed
//! shares.

use super::job::Job;
use super::schedule::Target;
use super::store::FaultStore;
use super::verdict;
use anyhow::{Context, Result, anyhow};
use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::LocalClusterSpec;
use granary_testkit::harness::{LocalCluster, run_epoch, spawn_ranks};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use std::time::Instant;

/// A chaos run's job and cluster.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The `granary` binary.
    pub exe: PathBuf,
    /// Where the dataset, the reference and each seed's processes live.
    pub work: PathBuf,
    /// Node daemons.
    pub nodes: u32,
    /// Coordinator voters.
    pub voters: u32,
    /// Trainer ranks per node.
    pub ranks_per_node: u32,
    /// Epochs of the job.
    pub epochs: u64,
    /// Rows of the generated dataset.
    pub rows: u64,
    /// Rows per row group (one shard).
    pub row_group_rows: u64,
    /// Rows per batch.
    pub batch_size: u32,
    /// Each node's link to the store: bandwidth, bytes/s.
    pub bandwidth: u64,
    /// Each node's link to the store: latency per request.
    pub latency_ms: u64,
    /// Faults start within this time of the first epoch's start.
    pub horizon: Duration,
    /// Process and network fault events per seed at most (an SSD fault of
    /// the filesystem or of a write may come on top).
    pub max_faults: u32,
    /// A seed that has not finished its epochs after this long fails.
    pub seed_timeout: Duration,
    /// Node lease on the coordinator.
    pub lease_ms: u64,
    /// The executable of a seed's byzantine node (`granary-chaos node`);
    /// None: a byzantine node drawn is not injected (`not_injected` says
    /// so), as when the cluster is driven as a library.
    pub forger: Option<PathBuf>,
}

impl RunConfig {
    /// The defaults of `granary-chaos run`: 3 voters, 3 nodes with 2 ranks
    /// each, 3 epochs of a 24-shard dataset over 4 MiB/s links.
    pub fn new(exe: PathBuf, work: PathBuf) -> Self {
        Self {
            exe,
            work,
            nodes: 3,
            voters: 3,
            ranks_per_node: 2,
            epochs: 3,
            rows: 48_000,
            row_group_rows: 2_000,
            batch_size: 500,
            bandwidth: 4 << 20,
            latency_ms: 10,
            horizon: Duration::from_secs(4),
            max_faults: 3,
            seed_timeout: Duration::from_secs(180),
            lease_ms: 1500,
            forger: None,
        }
    }

    /// What a schedule may aim at.
    pub fn target(&self) -> Target {
        Target { nodes: self.nodes, voters: self.voters, horizon: self.horizon, max_faults: self.max_faults }
    }

    pub(super) fn world(&self) -> u32 {
        self.nodes * self.ranks_per_node
    }

    /// The arguments of trainer rank `rank` of this job, on the node whose
    /// trainer socket is `socket`.
    pub fn rank_args(&self, socket: &Path, rank: u32) -> Vec<String> {
        let mut a = granary_testkit::harness::rank_args(socket, rank, self.world());
        a.extend(self.trainer_args());
        a
    }

    pub(super) fn trainer_args(&self) -> Vec<String> {
        ["--batch-size", &self.batch_size.to_string(), "--seed", "2026", "--prefetch-batches", "2"]
            .map(String::from)
            .into()
    }

    /// The cluster of the reference (`tiers` None: tiers that hold
    /// everything) or of a seed (`tiers`: its RAM tier and guest area).
    pub fn spec(&self, nodes: u32, voters: u32, store: &FaultStore, tiers: Option<Tiers>) -> LocalClusterSpec {
        let tiers = tiers.unwrap_or(Tiers { ram_bytes: 512 << 20, guest_bytes: 512 << 20 });
        LocalClusterSpec {
            source: Some(format!("s3://{BUCKET}/{PREFIX}/")),
            remote: store.options(),
            voters,
            nodes,
            ram_bytes: tiers.ram_bytes,
            guest_bytes: tiers.guest_bytes,
            // An SSD tier: a killed node recovers from it, and it can be
            // damaged.
            ssd_bytes: Some(SSD_BYTES),
            prefetch_bytes: 64 << 20,
            loads: LOADS,
            convert_threads: 1,
            throttle: Some((self.latency_ms, self.bandwidth)),
            lease_ms: self.lease_ms,
            // Snapshots every few dozen entries, and a short log behind
            // them: a seed's few hundred entries make several, and a voter
            // back from a kill or a power cut is often sent one (the path
            // where a cut-short install once left a voter that could not
            // start).
            snapshot_entries: Some((SNAPSHOT_ENTRIES, KEEP_LOG_ENTRIES)),
            ..LocalClusterSpec::default()
        }
    }
}

/// Voters snapshot their state every this many log entries in a seed...
pub(super) const SNAPSHOT_ENTRIES: u64 = 40;
/// ...and keep this many entries behind a snapshot.
pub(super) const KEEP_LOG_ENTRIES: u64 = 5;

/// Each node's SSD tier.
pub(super) const SSD_BYTES: u64 = 96 << 20;

/// How long a `corrupt_ssd` fault waits for the node to have a chunk on
/// SSD before it kills the node and damages what is there.
pub(super) const CORRUPT_WAIT: Duration = Duration::from_secs(5);

/// How long a node armed to die at a write into its SSD tier may go
/// without one before it is killed plainly (its restart waits for the
/// kill). A debug build under strace writes its first chunks slowly: in one
/// CI run seed 9's node 1 had not made its second write 6 s after the
/// fault began, while its cold epoch took 32 s.
pub(super) const SSD_WRITE_WAIT: Duration = Duration::from_secs(15);

/// Loads a node runs at once (`max_concurrent_loads`).
pub(super) const LOADS: usize = 2;

/// A node's RAM tier and guest area.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Tiers {
    /// `ram_bytes`.
    pub ram_bytes: u64,
    /// `guest_bytes`.
    pub guest_bytes: u64,
}

impl Tiers {
    /// Tiers smaller than what a node sees of the job, so chunks are
    /// evicted and the memory budget is tested near its edge: the RAM
    /// tier holds half of the converted dataset (a node owns a third of
    /// it), the guest area a quarter (a node reads two thirds from peers).
    pub fn for_job(job: &Job) -> Self {
        let floor = 8 << 20;
        Tiers { ram_bytes: (job.converted_bytes / 2).max(floor), guest_bytes: (job.converted_bytes / 4).max(floor) }
    }

    /// A node's memory budget with these tiers (see
    /// [`verdict::memory_budget`]): the node's loads in flight, chunks of
    /// at most twice the average, and 96 MiB for the process.
    pub fn memory_budget(&self, job: &Job) -> u64 {
        let largest = 2 * job.converted_bytes.div_ceil(job.shards.max(1));
        verdict::memory_budget(self.ram_bytes, self.guest_bytes, LOADS as u64, largest, 96 << 20)
    }
}

/// The store's bucket (a folder under [`Job::store_root`]).
pub(super) const BUCKET: &str = "chaos";
/// The dataset's prefix in it.
pub(super) const PREFIX: &str = "ads";
/// The prefix of the small dataset the coordinator client registers.
pub(super) const LIN_PREFIX: &str = "lin";

pub(super) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the runtime of the relay and the store")
}

/// Generates the dataset and runs the reference: every rank of the job on
/// one node, no faults. `say` hears what is going on.
pub fn prepare(cfg: &RunConfig, say: &mut dyn FnMut(&str)) -> Result<Job> {
    // A kept folder of an earlier run: start over (only the folders a run
    // makes are removed).
    for old in ["store", "reference"] {
        let dir = cfg.work.join(old);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
    }
    let store_root = cfg.work.join("store");
    let data = store_root.join(BUCKET).join(PREFIX);
    say(&format!("generating {} rows ({} shards)", cfg.rows, cfg.rows.div_ceil(cfg.row_group_rows)));
    let spec = GenSpec { rows: cfg.rows, files: 4, row_group_rows: cfg.row_group_rows, ..GenSpec::default() };
    let report = datagen::generate(&data, &spec, |_| {}).context("generating the dataset")?;
    // The small dataset the coordinator client registers under new names.
    let lin = GenSpec { rows: 1000, files: 1, row_group_rows: 1000, ..GenSpec::default() };
    datagen::generate(&store_root.join(BUCKET).join(LIN_PREFIX), &lin, |_| {})
        .context("generating the small dataset")?;
    say("reference run: one node, every rank, no faults");
    let started = Instant::now();
    let rt = runtime()?;
    let store = rt.block_on(FaultStore::start(&store_root, 0))?;
    let cluster = LocalCluster::start(&cfg.exe, &cfg.work.join("reference"), &data, cfg.spec(1, 1, &store, None))?;
    let sockets: Vec<PathBuf> = (0..cfg.world()).map(|_| cluster.socket(1)).collect();
    let (mut ranks, _) = spawn_ranks(&cfg.exe, &sockets, &cfg.trainer_args())?;
    let mut reference = BTreeMap::new();
    for epoch in 0..cfg.epochs {
        let out = run_epoch(&mut ranks, epoch, Duration::from_secs(300), |_, _| {})
            .map_err(|e| anyhow!("reference epoch {epoch}: {e:#}\n{}", cluster.log_tail(1)))?;
        for (rank, d) in out.digests {
            reference.insert((rank, epoch), d);
        }
    }
    let converted_bytes = cluster.stats(1).context("reading the reference node's counters")?.chunk_memory_bytes;
    for t in ranks {
        t.finish(Duration::from_secs(30))?;
    }
    drop(cluster);
    drop(store);
    Ok(Job {
        store_root,
        data,
        source_bytes: report.bytes,
        reference,
        reference_secs: started.elapsed().as_secs_f64(),
        converted_bytes,
        shards: cfg.rows.div_ceil(cfg.row_group_rows),
    })
}
