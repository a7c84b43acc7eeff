//! `granary-chaos hosts`: issue 14's two cost targets on hosts made of
//! network namespaces ([`crate::netns`]), not loopback. Three hosts, each
//! with a coordinator voter and a node daemon; two trainer ranks per node;
//! three epochs of a 40-shard dataset whose remote reads go through each
//! node's own throttled link. One node is stopped (SIGSTOP, then SIGCONT),
//! or its host's link is taken down and brought back, for S seconds early
//! in the cold epoch; the same job runs before without the fault, on the
//! same hosts, and the two are compared:
//!
//! - the cold epoch takes at most S + one lease longer;
//! - every rank's batch stream is the same as without the fault;
//! - conversions beyond the fault-free run's are at most what the fault
//!   exposed: the shards the faulted node had converted or was converting
//!   when the fault began (the others cannot reach those copies);
//! - the warm epochs convert nothing and read nothing remote.

use crate::netns::{self, Hosts};
use anyhow::{Context, Result, anyhow, bail};
use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::{ClusterCounters, LocalCluster, LocalClusterSpec, run_epoch, spawn_ranks};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The fault of a hosts run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostFault {
    /// SIGSTOP the node, then SIGCONT.
    Stop,
    /// Take the node's host link down (its voter and node are cut off from
    /// every other process), then bring it up.
    Partition,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct HostsConfig {
    /// The `granary` binary.
    pub exe: PathBuf,
    /// Where the dataset and each run's processes live.
    pub work: PathBuf,
    /// The fault.
    pub fault: HostFault,
    /// How long it lasts.
    pub fault_for: Duration,
    /// When it begins, from the start of the cold epoch.
    pub fault_at: Duration,
    /// The node it hits (1-based; its host is the same index).
    pub node: u64,
    /// Rows of the generated dataset, and per row group (one shard).
    pub rows: u64,
    /// Rows per row group.
    pub row_group_rows: u64,
    /// Rows per batch.
    pub batch_size: u32,
    /// Each node's link to remote storage: bytes/s, and latency per
    /// request.
    pub bandwidth: u64,
    /// Latency per remote request.
    pub latency_ms: u64,
    /// Node lease on the coordinator.
    pub lease_ms: u64,
    /// Epochs of the job.
    pub epochs: u64,
}

/// Nodes, voters and hosts.
const HOSTS: u32 = 3;
/// Trainer ranks per node.
const RANKS_PER_NODE: u32 = 2;
/// Loads a node runs at once.
const LOADS: usize = 2;

impl HostsConfig {
    /// The defaults of `granary-chaos hosts`: node 3 hit for 6 s from 1.5 s
    /// into the cold epoch; 40 shards over 1 MiB/s links.
    pub fn new(exe: PathBuf, work: PathBuf, fault: HostFault) -> Self {
        Self {
            exe,
            work,
            fault,
            fault_for: Duration::from_secs(6),
            fault_at: Duration::from_millis(1500),
            node: 3,
            rows: 80_000,
            row_group_rows: 2_000,
            batch_size: 500,
            bandwidth: 1 << 20,
            latency_ms: 10,
            lease_ms: 3_000,
            epochs: 3,
        }
    }

    fn spec(&self, hosts: &Hosts) -> LocalClusterSpec {
        LocalClusterSpec {
            voters: HOSTS,
            nodes: HOSTS,
            ram_bytes: 512 << 20,
            guest_bytes: 512 << 20,
            ssd_bytes: None,
            prefetch_bytes: 64 << 20,
            loads: LOADS,
            convert_threads: 1,
            throttle: Some((self.latency_ms, self.bandwidth)),
            lease_ms: self.lease_ms,
            hosts: hosts.hosts().to_vec(),
            ..LocalClusterSpec::default()
        }
    }
}

/// One run of the job.
#[derive(Clone, Debug, Default, Serialize)]
pub struct JobRun {
    /// Seconds per epoch (start to the last rank's end).
    pub epoch_secs: Vec<f64>,
    /// Conversions per epoch, summed over the nodes.
    pub conversions: Vec<u64>,
    /// Remote bytes per epoch, summed over the nodes.
    pub remote_bytes: Vec<u64>,
    /// The faulted node's conversions when the fault began (shards it held
    /// or was loading; None without a fault).
    pub exposed: Option<u64>,
    /// (rank, epoch) -> digest of the rank's batch checksums.
    #[serde(skip)]
    pub digests: BTreeMap<(u32, u64), String>,
}

/// A fault against the same job without it.
#[derive(Clone, Debug, Serialize)]
pub struct HostsReport {
    /// The fault.
    pub fault: HostFault,
    /// Its length, seconds.
    pub fault_secs: f64,
    /// The lease, seconds.
    pub lease_secs: f64,
    /// Shards of the dataset.
    pub shards: u64,
    /// Without the fault.
    pub calm: JobRun,
    /// With it.
    pub faulted: JobRun,
    /// Every rank's batch stream was the same in both runs.
    pub same_streams: bool,
}

impl HostsReport {
    /// Extra seconds of cold epoch.
    pub fn extra_cold_secs(&self) -> f64 {
        self.faulted.epoch_secs[0] - self.calm.epoch_secs[0]
    }

    /// What the target allows: the fault and one lease.
    pub fn allowed_secs(&self) -> f64 {
        self.fault_secs + self.lease_secs
    }

    /// Conversions beyond the fault-free run's.
    pub fn extra_conversions(&self) -> i64 {
        self.faulted.conversions.iter().sum::<u64>() as i64 - self.calm.conversions.iter().sum::<u64>() as i64
    }

    /// Conversions and remote bytes in the faulted run's warm epochs.
    pub fn warm(&self) -> (u64, u64) {
        (self.faulted.conversions.iter().skip(1).sum(), self.faulted.remote_bytes.iter().skip(1).sum())
    }

    /// The targets missed, in words (empty: all met).
    pub fn missed(&self) -> Vec<String> {
        let mut m = Vec::new();
        if !self.same_streams {
            m.push("a rank's batch stream differs from the fault-free run's".into());
        }
        if self.extra_cold_secs() > self.allowed_secs() {
            m.push(format!(
                "the cold epoch took {:.1} s longer, over the fault and a lease ({:.1} s)",
                self.extra_cold_secs(),
                self.allowed_secs()
            ));
        }
        let exposed = self.faulted.exposed.unwrap_or(0) as i64;
        if self.extra_conversions() > exposed {
            m.push(format!(
                "{} conversions beyond the fault-free run's, more than the {exposed} shards the node held or was loading",
                self.extra_conversions()
            ));
        }
        let (c, b) = self.warm();
        if c > 0 || b > 0 {
            m.push(format!("the warm epochs converted {c} shards and read {b} bytes remote"));
        }
        m
    }
}

/// Runs the job without the fault, then with it, on three fresh hosts;
/// `say` hears progress.
pub fn run(cfg: &HostsConfig, say: &mut dyn FnMut(&str)) -> Result<HostsReport> {
    if !(1..=u64::from(HOSTS)).contains(&cfg.node) {
        bail!("node {} does not exist: nodes are 1 to {HOSTS}", cfg.node);
    }
    let hosts = Hosts::create(HOSTS as usize).context("making hosts of network namespaces")?;
    let data = cfg.work.join("data");
    if !data.exists() {
        say(&format!("generating {} rows ({} shards)", cfg.rows, cfg.rows.div_ceil(cfg.row_group_rows)));
        let spec = GenSpec { rows: cfg.rows, files: 4, row_group_rows: cfg.row_group_rows, ..GenSpec::default() };
        datagen::generate(&data, &spec, |_| {}).context("generating the dataset")?;
    }
    say("the job without the fault");
    let calm = run_job(cfg, &hosts, &data, None)?;
    say(&format!("the job with node {} {}", cfg.node, describe(cfg)));
    let faulted = run_job(cfg, &hosts, &data, Some(cfg.fault))?;
    let same_streams = calm.digests == faulted.digests && !calm.digests.is_empty();
    Ok(HostsReport {
        fault: cfg.fault,
        fault_secs: cfg.fault_for.as_secs_f64(),
        lease_secs: cfg.lease_ms as f64 / 1e3,
        shards: cfg.rows.div_ceil(cfg.row_group_rows),
        calm,
        faulted,
        same_streams,
    })
}

fn describe(cfg: &HostsConfig) -> String {
    let what = match cfg.fault {
        HostFault::Stop => "stopped",
        HostFault::Partition => "cut off (its host's link down)",
    };
    format!(
        "{what} for {:.1} s from {:.1} s into the cold epoch",
        cfg.fault_for.as_secs_f64(),
        cfg.fault_at.as_secs_f64()
    )
}

fn diff(a: &ClusterCounters, b: &ClusterCounters) -> (u64, u64) {
    (a.conversions.saturating_sub(b.conversions), a.remote_bytes.saturating_sub(b.remote_bytes))
}

/// One run of the job on a fresh cluster on `hosts`, with `fault`.
fn run_job(cfg: &HostsConfig, hosts: &Hosts, data: &std::path::Path, fault: Option<HostFault>) -> Result<JobRun> {
    let name = if fault.is_some() { "faulted" } else { "calm" };
    let dir = cfg.work.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    let cluster = LocalCluster::start(&cfg.exe, &dir, data, cfg.spec(hosts))?;
    let world = HOSTS * RANKS_PER_NODE;
    let sockets: Vec<PathBuf> = (0..world).map(|r| cluster.socket(u64::from(r / RANKS_PER_NODE) + 1)).collect();
    let args: Vec<String> = ["--batch-size", &cfg.batch_size.to_string(), "--seed", "2026", "--prefetch-batches", "2"]
        .map(String::from)
        .into();
    let (mut ranks, _) = spawn_ranks(&cfg.exe, &sockets, &args)?;
    let mut out = JobRun::default();
    let mut before = cluster.total_stats()?;
    for epoch in 0..cfg.epochs {
        // The fault runs on its own thread, on the clock of the cold
        // epoch, whatever the ranks do meanwhile.
        let injector = match (fault, epoch) {
            (Some(f), 0) => Some(inject(cfg, hosts, &cluster, f)?),
            _ => None,
        };
        let result = run_epoch(&mut ranks, epoch, Duration::from_secs(300), |_, _| {});
        let exposed = match injector {
            Some(t) => Some(t.join().map_err(|_| anyhow!("the fault thread panicked"))??),
            None => None,
        };
        let o = result.map_err(|e| anyhow!("{name} run, epoch {epoch}: {e:#}\n{}", cluster.log_tails()))?;
        if exposed.is_some() {
            out.exposed = exposed;
        }
        // Loads of the epoch that outlast its last rank (prefetch, a peer's
        // request) finish before it is counted: they belong to it.
        let now = settled_stats(&cluster)?;
        let (c, b) = diff(&now, &before);
        before = now;
        out.epoch_secs.push(o.secs);
        out.conversions.push(c);
        out.remote_bytes.push(b);
        for (rank, d) in o.digests {
            out.digests.insert((rank, epoch), d);
        }
    }
    for t in ranks {
        t.finish(Duration::from_secs(30))?;
    }
    Ok(out)
}

/// The cluster's counters once no node has a load in flight (at most
/// 30 s). A load's remote bytes are counted when they arrive and its
/// conversion when it ends, seconds later on a throttled link: a quiet
/// spell in the counters is not the end of the loads.
fn settled_stats(cluster: &LocalCluster) -> Result<ClusterCounters> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let now = cluster.total_stats()?;
        if now.loads_in_flight == 0 || Instant::now() > until {
            return Ok(now);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts the fault's thread: at `fault_at` it reads the node's counters
/// (what it holds or loads: exposed by the fault), applies the
/// fault, and after `fault_for` lifts it. Returns the exposed count.
fn inject(
    cfg: &HostsConfig,
    hosts: &Hosts,
    cluster: &LocalCluster,
    fault: HostFault,
) -> Result<std::thread::JoinHandle<Result<u64>>> {
    let node = cfg.node;
    let pid = cluster.node_pid(node).ok_or_else(|| anyhow!("node {node} is not running"))?;
    let link = hosts.link((node - 1) as usize).ok_or_else(|| anyhow!("no host for node {node}"))?.to_string();
    let socket = cluster.socket(node);
    let (at, len) = (cfg.fault_at, cfg.fault_for);
    let started = Instant::now();
    Ok(std::thread::spawn(move || -> Result<u64> {
        std::thread::sleep(at.saturating_sub(started.elapsed()));
        let stats = granary_client::LocalSource::connect(&socket)
            .and_then(|s| s.stats())
            .with_context(|| format!("reading node {node}'s counters"))?;
        // Loads it started that did not bring a peer's copy: converted
        // (held), or in flight (converting, or queued for a load permit).
        let exposed = stats.misses.saturating_sub(stats.peer_fetched);
        match fault {
            HostFault::Stop => signal(pid, libc::SIGSTOP)?,
            HostFault::Partition => netns::set_link(&link, false)?,
        }
        std::thread::sleep(len);
        match fault {
            HostFault::Stop => signal(pid, libc::SIGCONT)?,
            HostFault::Partition => netns::set_link(&link, true)?,
        }
        Ok(exposed)
    }))
}

fn signal(pid: u32, sig: i32) -> Result<()> {
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    if unsafe { libc::kill(pid as i32, sig) } != 0 {
        bail!("signal {sig} to {pid}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}
