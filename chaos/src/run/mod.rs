//! `granary-chaos run`: the real processes under a seeded fault schedule.
//!
//! A job (a generated dataset, trainer ranks on every node, several epochs)
//! first runs on one node alone, without faults: its batch digests are the
//! reference. Then each seed starts a fresh cluster (3 coordinator voters,
//! N node daemons, each with its own throttled link to a fault-injecting
//! S3 store on loopback ([`store::FaultStore`]), a [`RelayHandle`] between
//! the nodes' peer endpoints), runs the same job,
//! fires the faults [`schedule::draw`] gives for the seed, and judges the run
//! with [`verdict`]: every rank's digests equal the reference, remote reads
//! stay within what the schedule allows, no process log shows a panic or an
//! internal error, every process stops cleanly.
//!
//! A node kill takes its trainer ranks with it (one host): they are started
//! again with the node and run their unfinished epochs from the start, as a
//! job restarted from an epoch checkpoint would.
//!
//! ## Files
//! `schedule` (pure: seed to faults) and `verdict` (pure: what was seen to
//! violations) stand alone; `store` is the S3 store and its fault layer;
//! this file is the shell that runs processes.

pub mod lin;
pub mod powerfs;
pub mod schedule;
pub mod ssdfs;
pub mod store;
pub mod verdict;

use crate::relay::{LinkFaults, ProcessId, RelayConfig, RelayHandle, Reorder};
use anyhow::{Context, Result, anyhow, bail};
use granary_proto::rng::{Rng, seed_of};
use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::{
    ClusterCounters, LocalCluster, LocalClusterSpec, TrainerEvent, TrainerProcess, proc_memory, run_epoch, spawn_ranks,
};
use schedule::{Fault, Schedule, Target, VoterPick};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use store::{FaultStore, StoreCounts};
use verdict::{Observed, Violation};

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

    fn world(&self) -> u32 {
        self.nodes * self.ranks_per_node
    }

    /// The arguments of trainer rank `rank` of this job, on the node whose
    /// trainer socket is `socket`.
    pub fn rank_args(&self, socket: &Path, rank: u32) -> Vec<String> {
        let mut a = granary_testkit::harness::rank_args(socket, rank, self.world());
        a.extend(self.trainer_args());
        a
    }

    fn trainer_args(&self) -> Vec<String> {
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
const SNAPSHOT_ENTRIES: u64 = 40;
/// ...and keep this many entries behind a snapshot.
const KEEP_LOG_ENTRIES: u64 = 5;

/// Each node's SSD tier.
const SSD_BYTES: u64 = 96 << 20;

/// How long a `corrupt_ssd` fault waits for the node to have a chunk on
/// SSD before it kills the node and damages what is there.
const CORRUPT_WAIT: Duration = Duration::from_secs(5);

/// How long a node armed to die at a write into its SSD tier may go
/// without one before it is killed plainly (its restart waits for the
/// kill). A debug build under strace writes its first chunks slowly: in one
/// CI run seed 9's node 1 had not made its second write 6 s after the
/// fault began, while its cold epoch took 32 s.
const SSD_WRITE_WAIT: Duration = Duration::from_secs(15);

/// Loads a node runs at once (`max_concurrent_loads`).
const LOADS: usize = 2;

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
const BUCKET: &str = "chaos";
/// The dataset's prefix in it.
const PREFIX: &str = "ads";
/// The prefix of the small dataset the coordinator client registers.
const LIN_PREFIX: &str = "lin";

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the runtime of the relay and the store")
}

/// The job every seed runs, with its fault-free reference.
#[derive(Clone, Debug)]
pub struct Job {
    /// The store's folder (buckets are its sub-folders).
    pub store_root: PathBuf,
    /// The dataset's folder.
    pub data: PathBuf,
    /// Parquet bytes of the dataset.
    pub source_bytes: u64,
    /// (rank, epoch) -> digest of the batch checksums, from one node
    /// alone without faults.
    pub reference: BTreeMap<(u32, u64), String>,
    /// Seconds the reference took for all epochs.
    pub reference_secs: f64,
    /// Bytes of the converted dataset (the reference node's chunk memory
    /// at the end, every chunk in RAM).
    pub converted_bytes: u64,
    /// Shards (row groups) of the dataset.
    pub shards: u64,
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

/// What one seed did and how it was judged.
#[derive(Clone, Debug, Serialize)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Its schedule.
    pub schedule: Schedule,
    /// Fault events fired, by kind.
    pub by_fault: BTreeMap<String, u64>,
    /// Peer chunks the nodes found forged (differing from their own
    /// conversion), every life counted.
    pub peer_mismatched: u64,
    /// Peers the nodes running at the end had quarantined, summed.
    pub peers_quarantined: u64,
    /// Wall time from the first epoch's start to the last rank's end.
    pub secs: f64,
    /// When the last rank finished each epoch, seconds from the start.
    pub epoch_ends: Vec<f64>,
    /// Remote bytes read by the cluster over the dataset's bytes.
    pub remote_ratio: f64,
    /// What the schedule allows of it.
    pub remote_bound: f64,
    /// Shards converted, all nodes, all lives.
    pub conversions: u64,
    /// Trainer ranks started again after their node was killed.
    pub rank_restarts: u64,
    /// Chunk entries damaged on SSD. foyer's entry checksum turns a
    /// damaged entry into a miss (the node reads the shard again); the
    /// streams matching the reference show none was served.
    pub ssd_damaged: u64,
    /// Where the nodes' SSD tiers lived: `tmpfs` (a filesystem of their
    /// own, which the fill fault fills), or why not.
    pub ssd_fs: String,
    /// Bytes the fill faults took of the nodes' SSD filesystems.
    pub ssd_filled: u64,
    /// Nodes killed at a write into their SSD tier.
    pub ssd_write_kills: u64,
    /// What the voters' data folders were: `fuse` (folders that lose what
    /// was not synced when a voter's power is cut), or why not.
    pub voter_fs: String,
    /// Voters whose power was cut.
    pub power_cuts: u64,
    /// Bytes of the voters' files that held writes not synced when their
    /// power was cut (each back to its synced image).
    pub power_cut_unsynced_bytes: u64,
    /// Syncs the power-cut voters' folders had seen before their cut (the
    /// log's commits, the vote, snapshots): what the cut kept.
    pub power_cut_syncs: u64,
    /// Power cuts that came between a write and its sync (the voter was
    /// caught in a write whose answer was held back, then killed).
    pub power_cuts_mid_write: u64,
    /// Faults that could not be injected as drawn and what was done
    /// instead (a plain kill and restart), with why.
    pub not_injected: Vec<String>,

    /// What the object store injected.
    pub store: StoreCounts,
    /// The coordinator client's history and its verdict.
    pub lin: lin::LinReport,
    /// Datagrams the relay dropped (faults and partitions).
    pub relay_dropped: u64,
    /// Datagrams the relay sent twice.
    pub relay_duplicated: u64,
    /// Datagrams the links' bandwidth cap held back or dropped.
    pub relay_throttled: u64,
    /// Datagrams the relay passed, by kind of link: `node-node`,
    /// `node-voter` (either way), `voter-voter`, `client-voter`.
    pub relay_links: BTreeMap<&'static str, u64>,
    /// Datagrams from the operator's tools, passed without faults.
    pub relay_outsiders: u64,
    /// Datagrams dropped for coming from an address the relay does not
    /// expect there (a reply to an operator's tool that has exited, whose
    /// port the relay has since bound again).
    pub relay_unknown: u64,
    /// Voters a voter fault hit, in order ("leader" picks resolved).
    pub voters_hit: Vec<u64>,
    /// Each node's RAM tier and guest area.
    pub tiers: Tiers,
    /// A node's memory budget.
    pub memory_budget: u64,
    /// Each node's largest sampled footprint.
    pub memory: BTreeMap<u64, verdict::NodeMemory>,
    /// What broke an invariant; empty when the seed passed.
    pub violations: Vec<Violation>,
    /// Where its processes' logs are.
    pub dir: PathBuf,
}

/// One rank's state in a seed's run.
struct Rank {
    proc: Option<TrainerProcess>,
    /// Waiting for its Ready line after a (re)start.
    starting: bool,
    /// The first epoch it has not finished.
    next_epoch: u64,
    finished: bool,
    /// Failed while its node ran: it is not started again.
    lost: bool,
}

/// What a scheduled action does.
#[derive(Clone, Copy)]
enum Edge {
    Start,
    End,
}

/// Runs one seed in `cfg.work/seed-N` and judges it. An error means the
/// harness itself could not run (a process did not start); what the system
/// did wrong is in [`SeedReport::violations`].
pub fn run_seed(cfg: &RunConfig, job: &Job, seed: u64) -> Result<SeedReport> {
    let dir = cfg.work.join(format!("seed-{seed}"));
    // An earlier run stopped by a signal leaves its SSD filesystems
    // mounted: detach them before the folder goes.
    ssdfs::detach_stale(&dir);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    let mut schedule = schedule::draw(seed, cfg.target());
    let rt = runtime()?;
    let store = rt.block_on(FaultStore::start(&job.store_root, seed))?;
    let tiers = Tiers::for_job(job);
    let mut spec = cfg.spec(cfg.nodes, cfg.voters, &store, Some(tiers));
    // A byzantine node forges what it sends its peers in every life; every
    // node verifies every peer chunk.
    let mut byzantine_not_injected = None;
    match (schedule.byzantine, &cfg.forger) {
        (Some(node), Some(forger)) => {
            spec.node_exe = Some((node, forger.clone()));
            spec.verify_peer_chunks = Some(1.0);
        }
        (Some(node), None) => {
            schedule.byzantine = None;
            byzantine_not_injected = Some(format!("byzantine node {node}: no granary-chaos binary to run it"));
        }
        (None, _) => {}
    }
    let mut cluster = LocalCluster::plan(&cfg.exe, &dir, &job.data, spec)?;
    let ids = cluster.node_ids();
    let pids = Pids { nodes: cfg.nodes, voters: cfg.voters };
    // Every QUIC link goes through the relay: node to node, node to voter,
    // voter to voter, and the chaos client to the voters (sockets bound
    // now, so the relay knows their addresses). The operator's tools
    // (`granary status`, `dataset add`) pass outside the faults.
    let lin_endpoints = {
        let _rt = rt.enter();
        lin::LinClients::bind(2)?
    };
    let lin_addrs = lin_endpoints.addrs()?;
    let mut processes: Vec<SocketAddr> = ids.iter().map(|&id| cluster.peer_listen(id)).collect();
    processes.extend(cluster.voter_ids().iter().map(|&v| cluster.voter_listen(v)));
    processes.push(lin_addrs[0]);
    let mut relay_cfg = RelayConfig::new(seed, processes);
    relay_cfg.processes[pids.lin().0 as usize].sends_from = lin_addrs[1..].to_vec();
    relay_cfg.default_faults = link_faults(&schedule);
    relay_cfg.pass_outsiders = true;
    let relay = rt.block_on(RelayHandle::start(relay_cfg)).context("starting the relay")?;
    for &id in &ids {
        let front = relay.front(pids.node(id)).ok_or_else(|| anyhow!("relay has no front for node {id}"))?;
        cluster.set_advertise(id, front);
    }
    for v in cluster.voter_ids() {
        let front = relay.front(pids.voter(v)).ok_or_else(|| anyhow!("relay has no front for voter {v}"))?;
        cluster.set_voter_advertise(v, front);
    }
    // A seed that cuts a voter's power runs every voter on a folder that
    // can lose what was not synced (the leader is picked when it comes).
    let voter_disks = powerfs::VoterDisks::mount(
        &dir,
        &cluster.voter_ids(),
        schedule.events.iter().any(|e| matches!(e.fault, Fault::PowerCutVoter { .. })),
    );
    cluster.start_voters()?;
    let ssd_mounts = match ssdfs::tmpfs_available(&dir) {
        Ok(()) => Ok(ssdfs::SsdMounts::mount(&dir, &ids, SSD_BYTES)?),
        Err(why) => Err(why),
    };
    cluster.start_nodes()?;

    let world = cfg.world();
    let node_of = |rank: u32| u64::from(rank / cfg.ranks_per_node) + 1;
    let spawn_rank = |rank: u32| -> Result<TrainerProcess> {
        let a = cfg.rank_args(&cluster_socket(&dir, node_of(rank)), rank);
        let log = dir.join(format!("rank-{rank}.log"));
        TrainerProcess::spawn_logged(&cfg.exe, rank, cfg.ranks_per_node as usize, &a, &log)
    };
    let mut ranks: Vec<Rank> = Vec::new();
    for rank in 0..world {
        ranks.push(Rank { proc: Some(spawn_rank(rank)?), starting: true, next_epoch: 0, finished: false, lost: false });
    }
    // Every rank ready before the clock starts: the schedule counts from
    // the first epoch.
    for (r, rank) in ranks.iter_mut().enumerate() {
        let p = rank.proc.as_mut().ok_or_else(|| anyhow!("rank {r} missing"))?;
        match p.next_event(Duration::from_secs(120))? {
            TrainerEvent::Ready { .. } => {}
            other => bail!("rank {r}: expected ready, got {other:?}"),
        }
        rank.starting = false;
        p.start_epoch(0)?;
    }

    let mut actions: Vec<(Duration, usize, Edge)> = Vec::new();
    for (i, e) in schedule.events.iter().enumerate() {
        actions.push((e.at, i, Edge::Start));
        actions.push((e.at + e.fault.duration(), i, Edge::End));
    }
    actions.sort_by_key(|a| a.0);
    let mut actions = std::collections::VecDeque::from(actions);

    let mut obs = Observed { memory_budget: tiers.memory_budget(job), ..Observed::default() };
    let mut ssd = SsdFaults {
        mounts: ssd_mounts.as_ref().ok(),
        fs: "tmpfs".into(),
        filled: 0,
        write_kills: 0,
        voter_disks,
        not_injected: Vec::new(),
        armed: Vec::new(),
    };
    if let Err(why) = &ssd_mounts {
        ssd.fs = format!("the work folder's filesystem (no tmpfs: {why})");
    }
    let mut stopped: BTreeSet<u64> = BTreeSet::new();
    let mut sampled = Instant::now();
    let mut retired = ClusterCounters::default();
    let mut voters_hit: BTreeMap<usize, u64> = BTreeMap::new();
    let mut by_fault: BTreeMap<String, u64> = BTreeMap::new();
    if schedule.byzantine.is_some() {
        by_fault.insert("byzantine_peer".into(), 1);
    }
    ssd.not_injected.extend(byzantine_not_injected);
    let mut rank_restarts = 0;
    let mut epoch_ends: Vec<f64> = Vec::new();
    let lin = {
        let _rt = rt.enter();
        let voters = cluster.coordinators().iter().map(|a| a.parse()).collect::<Result<Vec<_>, _>>()?;
        lin::LinClients::start(
            lin_endpoints,
            cluster.certs(),
            voters,
            seed,
            format!("s3://{BUCKET}/{LIN_PREFIX}/"),
            datagen::view(),
        )?
    };
    store.set_faults(schedule.store);
    let t0 = Instant::now();
    let mut timed_out = false;

    loop {
        while actions.front().is_some_and(|a| a.0 <= t0.elapsed()) {
            let Some((_, i, edge)) = actions.pop_front() else { break };
            let fault = schedule.events[i].fault;
            if let Edge::Start = edge {
                *by_fault.entry(fault.kind().to_string()).or_insert(0) += 1;
            }
            if let (Fault::KillInSsdWrite { node, .. }, Edge::End) = (fault, edge)
                && ssd.armed.iter().any(|a| a.kill.node == node)
            {
                // The restart comes after the kill (the write may come
                // late in a slow build): look again shortly.
                let at = t0.elapsed() + Duration::from_millis(20);
                let pos = actions.iter().position(|a| a.0 > at).unwrap_or(actions.len());
                actions.insert(pos, (at, i, edge));
                continue;
            }
            if let Fault::StopNode { node, .. } = fault {
                match edge {
                    Edge::Start => stopped.insert(node),
                    Edge::End => stopped.remove(&node),
                };
            }
            if let (Some(node), Edge::Start) = (fault.host_killed(), edge) {
                // The host goes down: its ranks first (killed on drop).
                for (r, rank) in ranks.iter_mut().enumerate() {
                    if node_of(r as u32) == node {
                        rank.proc = None;
                    }
                }
            }
            apply(&mut cluster, &relay, pids, seed, fault, edge, i, &mut voters_hit, &mut retired, &mut obs, &mut ssd)?;
            if let (Some(node), Edge::End) = (fault.host_killed(), edge) {
                for (r, rank) in ranks.iter_mut().enumerate() {
                    if node_of(r as u32) == node && !rank.finished && !rank.lost {
                        rank.proc = Some(spawn_rank(r as u32)?);
                        rank.starting = true;
                        rank_restarts += 1;
                    }
                }
            }
        }
        ssd.poll_armed(&mut cluster, &mut retired, &mut obs, false);
        for (r, rank) in ranks.iter_mut().enumerate() {
            let r = r as u32;
            let Some(p) = rank.proc.as_mut() else { continue };
            loop {
                let ev = match p.try_event() {
                    Ok(Some(ev)) => ev,
                    Ok(None) => break,
                    Err(e) => TrainerEvent::Error { rank: r, message: format!("{e:#}") },
                };
                match ev {
                    TrainerEvent::Ready { .. } if rank.starting => {
                        rank.starting = false;
                        p.start_epoch(rank.next_epoch)?;
                    }
                    TrainerEvent::Progress { .. } => {}
                    TrainerEvent::Epoch { epoch, digest, .. } => {
                        obs.digests.insert((r, epoch), digest);
                        let e = epoch as usize;
                        if epoch_ends.len() <= e {
                            epoch_ends.resize(e + 1, 0.0);
                        }
                        epoch_ends[e] = f64::max(epoch_ends[e], t0.elapsed().as_secs_f64());
                        rank.next_epoch = epoch + 1;
                        if rank.next_epoch < cfg.epochs {
                            p.start_epoch(rank.next_epoch)?;
                        } else {
                            rank.finished = true;
                        }
                    }
                    TrainerEvent::Error { message, .. } => {
                        obs.rank_errors.push((r, rank.next_epoch, message));
                        rank.proc = None;
                        rank.lost = true;
                        break;
                    }
                    other => {
                        obs.rank_errors.push((r, rank.next_epoch, format!("unexpected event {other:?}")));
                        rank.proc = None;
                        rank.lost = true;
                        break;
                    }
                }
            }
        }
        if sampled.elapsed() >= MEMORY_SAMPLE_EVERY {
            sampled = Instant::now();
            for &id in ids.iter().filter(|id| !stopped.contains(id)) {
                sample_memory(&cluster, id, &mut obs);
            }
        }
        if ranks.iter().all(|r| r.finished || r.lost) {
            break;
        }
        if t0.elapsed() > cfg.seed_timeout {
            timed_out = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let secs = t0.elapsed().as_secs_f64();
    // Whatever is still scheduled ends now: nodes restarted, continued,
    // links healed, voters back.
    while let Some((_, i, edge)) = actions.pop_front() {
        if let Edge::End = edge {
            let fault = schedule.events[i].fault;
            apply(&mut cluster, &relay, pids, seed, fault, edge, i, &mut voters_hit, &mut retired, &mut obs, &mut ssd)?;
        }
    }
    let lin_report = rt.block_on(lin.finish());
    obs.lin = Some(lin_report.clone());
    if timed_out {
        let stuck: Vec<String> = ranks
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.finished)
            .map(|(i, r)| format!("rank {i} in epoch {}", r.next_epoch))
            .collect();
        obs.stuck = Some(format!("after {:?}: {}", cfg.seed_timeout, stuck.join(", ")));
    }

    // The end: ranks exit, counters are read, every process stops.
    for (r, rank) in ranks.iter_mut().enumerate() {
        if let Some(p) = rank.proc.take()
            && rank.finished
            && let Err(e) = p.finish(Duration::from_secs(30))
        {
            obs.unclean.push(format!("rank {r}: {e:#}"));
        }
    }
    let mut total = retired;
    match cluster.total_stats() {
        Ok(now) => add(&mut total, &now),
        Err(e) => obs.unclean.push(format!("reading node counters: {e:#}")),
    }
    for id in ids.iter().copied() {
        if let Err(e) = cluster.terminate(id) {
            obs.unclean.push(format!("node {id}: {e:#}"));
        }
    }
    for v in cluster.voter_ids() {
        if cluster.voter_running(v)
            && let Err(e) = cluster.terminate_voter(v)
        {
            obs.unclean.push(format!("voter {v}: {e:#}"));
        }
    }
    let relay_stats = relay.stats();
    rt.block_on(relay.shutdown());
    let store_counts = store.counts();
    drop(store);
    for (kind, n) in [
        // One condition for the whole run (its datagrams: relay_throttled).
        ("link_cap", u64::from(schedule.noise.bandwidth_mib > 0)),
        ("store_error", store_counts.errors),
        ("store_slow", store_counts.slowed),
        ("store_short", store_counts.shortened),
        ("store_stall", store_counts.stalled),
    ] {
        if n > 0 {
            by_fault.insert(kind.to_string(), n);
        }
    }
    obs.wasted_bytes = store_counts.wasted_bytes;
    let mut logs = cluster.logs();
    logs.extend((0..world).map(|r| dir.join(format!("rank-{r}.log"))));
    for log in &logs {
        obs.scan_log(log);
    }
    obs.remote_bytes = total.remote_bytes;
    obs.peer_mismatched = total.peer_mismatched;
    let violations = verdict::judge(&obs, job, &schedule, cfg.nodes, cfg.epochs);
    let links = relay_stats.links.values();
    let mut relay_links: BTreeMap<&'static str, u64> = BTreeMap::new();
    for (l, c) in &relay_stats.links {
        *relay_links.entry(pids.link_kind(l.from, l.to)).or_insert(0) += c.sent;
    }
    Ok(SeedReport {
        seed,
        remote_ratio: total.remote_bytes as f64 / job.source_bytes.max(1) as f64,
        remote_bound: verdict::remote_bound(&schedule, cfg.nodes, cfg.epochs)
            + store_counts.wasted_bytes as f64 / job.source_bytes.max(1) as f64,
        store: store_counts,
        lin: lin_report,
        conversions: total.conversions,
        rank_restarts,
        ssd_damaged: obs.ssd_damaged,
        ssd_fs: ssd.fs.clone(),
        ssd_filled: ssd.filled,
        ssd_write_kills: ssd.write_kills,
        voter_fs: ssd.voter_disks.fs.clone(),
        power_cuts: ssd.voter_disks.cuts,
        power_cut_unsynced_bytes: ssd.voter_disks.unsynced_bytes,
        power_cut_syncs: ssd.voter_disks.syncs,
        power_cuts_mid_write: ssd.voter_disks.mid_write,
        not_injected: ssd.not_injected.clone(),
        tiers,
        memory_budget: obs.memory_budget,
        memory: obs.memory.clone(),
        relay_dropped: links.clone().map(|l| l.dropped + l.partitioned).sum(),
        relay_duplicated: links.clone().map(|l| l.duplicated).sum(),
        relay_throttled: links.map(|l| l.throttled + l.throttle_dropped).sum(),
        relay_links,
        relay_outsiders: relay_stats.outsiders,
        relay_unknown: relay_stats.unknown_source,
        voters_hit: voters_hit.into_values().collect(),
        schedule,
        by_fault,
        peer_mismatched: total.peer_mismatched,
        peers_quarantined: total.peers_quarantined,
        secs,
        epoch_ends,
        violations,
        dir,
    })
}

/// Removes the SSD folders of a seed's nodes (`dir/node-*/ssd`), which
/// hold most of its bytes; its logs stay.
pub fn remove_ssd_files(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with("node-") {
            let _ = std::fs::remove_dir_all(e.path().join("ssd"));
        }
    }
}

/// How long a power cut waits for the voter's next write to catch it
/// between the write and its sync (a voter writes at each append: the
/// coordinator client registers datasets throughout).
const POWER_CUT_WAIT: Duration = Duration::from_secs(2);

/// How often the nodes' memory is sampled.
const MEMORY_SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// One memory sample of node `id` if it runs (a sample it cannot answer,
/// as while it starts, is skipped).
fn sample_memory(cluster: &LocalCluster, id: u64, obs: &mut Observed) {
    let Some(pid) = cluster.node_pid(id) else { return };
    let (Ok(mem), Ok(stats)) = (proc_memory(pid), cluster.stats(id)) else { return };
    obs.memory.entry(id).or_default().sample(mem.rss_anon, mem.rss_file, stats.chunk_memory_bytes);
}

fn cluster_socket(dir: &Path, node: u64) -> PathBuf {
    dir.join(format!("node-{node}")).join("node.sock")
}

/// The relay's process ids: nodes first, then voters, then the chaos
/// client.
#[derive(Clone, Copy)]
struct Pids {
    nodes: u32,
    voters: u32,
}

impl Pids {
    /// Node `id`.
    fn node(&self, id: u64) -> ProcessId {
        ProcessId((id - 1) as u32)
    }

    /// Voter `id`.
    fn voter(&self, id: u64) -> ProcessId {
        ProcessId(self.nodes + (id - 1) as u32)
    }

    /// The chaos client.
    fn lin(&self) -> ProcessId {
        ProcessId(self.nodes + self.voters)
    }

    /// Every process.
    fn all(&self) -> impl Iterator<Item = ProcessId> {
        (0..=self.nodes + self.voters).map(ProcessId)
    }

    /// What kind of link joins `a` and `b` (either way).
    fn link_kind(&self, a: ProcessId, b: ProcessId) -> &'static str {
        let class = |p: ProcessId| match p.0 {
            n if n < self.nodes => 0,
            n if n < self.nodes + self.voters => 1,
            _ => 2,
        };
        match (class(a).min(class(b)), class(a).max(class(b))) {
            (0, 0) => "node-node",
            (0, 1) => "node-voter",
            (1, 1) => "voter-voter",
            (1, 2) => "client-voter",
            _ => "other",
        }
    }

    /// Cuts `p` off every other process.
    fn isolate(&self, relay: &RelayHandle, p: ProcessId) -> Result<()> {
        for other in self.all().filter(|&o| o != p) {
            relay.partition(p, other, false)?;
        }
        Ok(())
    }
}

fn add(t: &mut ClusterCounters, s: &ClusterCounters) {
    t.remote_bytes += s.remote_bytes;
    t.conversions += s.conversions;
    t.peer_fetched += s.peer_fetched;
    t.peer_fetched_bytes += s.peer_fetched_bytes;
    t.peer_failures += s.peer_failures;
    t.local_hits += s.local_hits;
    t.misses += s.misses;
    t.joined += s.joined;
    t.peer_mismatched += s.peer_mismatched;
    t.peers_quarantined += s.peers_quarantined;
}

fn link_faults(s: &Schedule) -> LinkFaults {
    let n = s.noise;
    LinkFaults {
        drop: n.drop,
        duplicate: n.duplicate,
        delay: crate::relay::DelayRange {
            min: Duration::from_millis(n.delay_ms),
            max: Duration::from_millis(n.delay_ms),
        },
        reorder: (n.reorder > 0.0).then_some(Reorder {
            probability: n.reorder,
            after_datagrams: 3,
            timeout: Duration::from_millis(20),
        }),
        bandwidth: (n.bandwidth_mib > 0).then_some(crate::relay::Bandwidth {
            bytes_per_sec: n.bandwidth_mib << 20,
            burst_bytes: 64 << 10,
            max_queue: Duration::from_millis(200),
        }),
    }
}

/// The chunk entries in the SSD folder `dir`, found by the chunk magic:
/// (file, offset, length).
fn ssd_entries(dir: &Path) -> Result<Vec<(PathBuf, usize, usize)>> {
    let mut entries: Vec<(PathBuf, usize, usize)> = Vec::new();
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(d) => d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect(),
        Err(_) => return Ok(entries), // nothing written yet
    };
    files.sort();
    let magic = granary_proto::chunk::MAGIC;
    for f in files {
        let bytes = std::fs::read(&f).with_context(|| format!("reading {}", f.display()))?;
        let mut at = 0;
        while let Some(i) = bytes[at..].windows(magic.len()).position(|w| w == magic) {
            let start = at + i;
            let len = bytes
                .get(start + 24..start + 32)
                .and_then(|b| b.try_into().ok())
                .map_or(0, |b: [u8; 8]| u64::from_le_bytes(b) as usize);
            if len > 0 && start + len <= bytes.len() {
                entries.push((f.clone(), start, len));
            }
            at = start + magic.len();
        }
    }
    Ok(entries)
}

/// Flips one byte in each of up to `flips` chunk entries found in the SSD
/// folder `dir` (entries are found by the chunk magic; which entries and
/// which byte come from `seed`). Returns how many were damaged.
fn damage_ssd(dir: &Path, seed: u64, flips: u32) -> Result<u64> {
    let mut r = Rng::new(seed);
    let mut entries = ssd_entries(dir)?;
    let mut damaged = 0;
    for _ in 0..flips {
        if entries.is_empty() {
            break;
        }
        let (file, start, len) = entries.swap_remove(r.below(entries.len() as u64) as usize);
        let at = (start + r.below(len as u64) as usize) as u64;
        use std::io::{Read, Seek, SeekFrom, Write};
        let mut h = std::fs::OpenOptions::new().read(true).write(true).open(&file)?;
        let mut b = [0u8; 1];
        h.seek(SeekFrom::Start(at))?;
        h.read_exact(&mut b)?;
        b[0] ^= 1 << r.below(8);
        h.seek(SeekFrom::Start(at))?;
        h.write_all(&b)?;
        damaged += 1;
    }
    Ok(damaged)
}

/// SIGKILLs node `node`, its counters read first (they die with it).
fn kill_node(cluster: &mut LocalCluster, node: u64, retired: &mut ClusterCounters, obs: &mut Observed) {
    match cluster.stats(node) {
        Ok(s) => {
            retired.remote_bytes += s.remote_bytes;
            retired.conversions += s.conversions;
            retired.peer_mismatched += s.peer_mismatched;
        }
        Err(e) => obs.unclean.push(format!("reading node {node}'s counters before the kill: {e:#}")),
    }
    cluster.kill(node);
}

/// A node armed to die at a write into its SSD tier, with its counters as
/// last read (they die with it).
struct Arming {
    kill: ssdfs::ArmedKill,
    last: (u64, u64),
    read_at: Instant,
}

/// The state of a seed's SSD faults.
struct SsdFaults<'a> {
    /// The nodes' filesystems, if they could be mounted.
    mounts: Option<&'a ssdfs::SsdMounts>,
    /// What [`SeedReport::ssd_fs`] says.
    fs: String,
    filled: u64,
    write_kills: u64,
    /// The voters' folders, for power cuts.
    voter_disks: powerfs::VoterDisks,
    not_injected: Vec<String>,
    armed: Vec<Arming>,
}

impl SsdFaults<'_> {
    /// Resolves the armed kills that are done: killed at the write, or
    /// (after [`SSD_WRITE_WAIT`], or at once with `now`) killed plainly.
    fn poll_armed(&mut self, cluster: &mut LocalCluster, retired: &mut ClusterCounters, obs: &mut Observed, now: bool) {
        let mut i = 0;
        while i < self.armed.len() {
            let a = &mut self.armed[i];
            let node = a.kill.node;
            let state = a.kill.poll(if now { Duration::ZERO } else { SSD_WRITE_WAIT });
            match state {
                ssdfs::Armed::Waiting => {
                    if a.read_at.elapsed() >= Duration::from_millis(50) {
                        a.read_at = Instant::now();
                        if let Ok(s) = cluster.stats(node) {
                            a.last = (s.remote_bytes, s.conversions);
                        }
                    }
                    i += 1;
                }
                ssdfs::Armed::Killed => {
                    let a = self.armed.swap_remove(i);
                    retired.remote_bytes += a.last.0;
                    retired.conversions += a.last.1;
                    self.write_kills += 1;
                    drop(a);
                    // Reaps it.
                    cluster.kill(node);
                }
                ssdfs::Armed::Missed(why) => {
                    drop(self.armed.swap_remove(i));
                    self.not_injected.push(format!("kill_in_ssd_write on node {node}: killed plainly: {why}"));
                    kill_node(cluster, node, retired, obs);
                }
            }
        }
    }
}

fn signal(pid: u32, sig: i32) -> Result<()> {
    // SAFETY: kill(2) on a child the cluster handle holds and has not
    // reaped, so the pid is still that child's.
    if unsafe { libc::kill(pid as i32, sig) } != 0 {
        bail!("signal {sig} to {pid}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The running voter `pick` names now, if any.
fn pick_voter(cluster: &LocalCluster, pick: VoterPick) -> Result<Option<u64>> {
    let running: Vec<u64> = cluster.voter_ids().into_iter().filter(|&v| cluster.voter_running(v)).collect();
    let leader = cluster.leader(Duration::from_secs(2))?;
    Ok(match pick {
        VoterPick::Leader => leader.filter(|l| running.contains(l)).or(running.first().copied()),
        VoterPick::Follower => running.iter().copied().find(|&v| Some(v) != leader),
    })
}

/// Fires one edge of a fault.
#[allow(clippy::too_many_arguments)]
fn apply(
    cluster: &mut LocalCluster,
    relay: &RelayHandle,
    pids: Pids,
    seed: u64,
    fault: Fault,
    edge: Edge,
    index: usize,
    voters_hit: &mut BTreeMap<usize, u64>,
    retired: &mut ClusterCounters,
    obs: &mut Observed,
    ssd: &mut SsdFaults,
) -> Result<()> {
    match (fault, edge) {
        (Fault::KillNode { node, .. } | Fault::CorruptSsd { node, .. } | Fault::FillSsd { node, .. }, Edge::Start) => {
            if let Fault::CorruptSsd { .. } = fault {
                // A damaged SSD needs something on it: wait (a bounded
                // while) for the node's first chunk there. A debug build's
                // node can take longer than the fault's offset to write one.
                // Its counters first (cheap), then the folder (a scan).
                let until = Instant::now() + CORRUPT_WAIT;
                while cluster.stats(node).map_or(0, |s| s.conversions) == 0 && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(50));
                }
                let dir = cluster.node_ssd(node);
                while ssd_entries(&dir)?.is_empty() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            kill_node(cluster, node, retired, obs);
            if let Fault::CorruptSsd { flips, .. } = fault {
                let damaged = damage_ssd(&cluster.node_ssd(node), seed_of(&[seed, index as u64]), flips)?;
                obs.ssd_damaged += damaged;
            }
            if let Fault::FillSsd { .. } = fault {
                match ssd.mounts.and_then(|m| m.node(node)) {
                    Some(fs) => ssd.filled += fs.fill()?,
                    None => ssd
                        .not_injected
                        .push(format!("fill_ssd on node {node}: killed and restarted without filling: {}", ssd.fs)),
                }
            }
        }
        (Fault::KillInSsdWrite { node, nth, .. }, Edge::Start) => {
            let armed = match cluster.node_pid(node) {
                Some(pid) => ssdfs::ArmedKill::arm(node, pid, &cluster.node_ssd(node), nth),
                None => Err("the node was not running".to_string()),
            };
            match armed {
                Ok(kill) => {
                    let last = cluster.stats(node).map(|s| (s.remote_bytes, s.conversions)).unwrap_or_default();
                    ssd.armed.push(Arming { kill, last, read_at: Instant::now() });
                }
                Err(why) => {
                    ssd.not_injected.push(format!("kill_in_ssd_write on node {node}: killed plainly: {why}"));
                    kill_node(cluster, node, retired, obs);
                }
            }
        }
        (
            Fault::KillNode { node, .. }
            | Fault::CorruptSsd { node, .. }
            | Fault::FillSsd { node, .. }
            | Fault::KillInSsdWrite { node, .. },
            Edge::End,
        ) => {
            if ssd.armed.iter().any(|a| a.kill.node == node) {
                // Not resolved yet: now it is (killed at the write, or
                // plainly).
                ssd.poll_armed(cluster, retired, obs, true);
            }
            // A node that does not start again is the system's failure,
            // not the harness's: judged (its ranks fail too), and the
            // soak goes on.
            if !cluster.node_running(node)
                && let Err(e) = cluster.start_node(node)
            {
                obs.unclean.push(format!("node {node} did not start again after {}: {e:#}", fault.kind()));
            }
        }
        (Fault::StopNode { node, .. }, edge) => {
            if let Some(p) = cluster.node_pid(node) {
                signal(p, if let Edge::Start = edge { libc::SIGSTOP } else { libc::SIGCONT })?;
            }
        }
        (Fault::KillVoter { pick, .. }, Edge::Start) => {
            if let Some(v) = pick_voter(cluster, pick)? {
                cluster.kill_voter(v);
                voters_hit.insert(index, v);
            }
        }
        (Fault::PowerCutVoter { pick, .. }, Edge::Start) => {
            if let Some(v) = pick_voter(cluster, pick)? {
                // The cut comes between a write and its sync where one
                // comes soon: the write is made and its answer held back,
                // the voter gets SIGKILL, and only then is the write
                // answered (a process killed inside a FUSE request that
                // the server holds cannot die until it is answered). The
                // kill then waits for the process to die: nothing writes
                // when the power goes.
                if ssd.voter_disks.catch_write(v, POWER_CUT_WAIT) {
                    ssd.voter_disks.mid_write += 1;
                    if let Some(p) = cluster.voter_pid(v) {
                        signal(p, libc::SIGKILL)?;
                    }
                    ssd.voter_disks.let_go(v);
                }
                cluster.kill_voter(v);
                if let Err(why) = ssd.voter_disks.cut(v) {
                    ssd.not_injected.push(format!("{} on voter {v}: killed plainly: {why}", fault.kind()));
                }
                voters_hit.insert(index, v);
            }
        }
        (Fault::PowerCutVoter { .. }, Edge::End) => {
            // A voter that does not start again on what its disk kept is
            // the system's failure, judged like a node's.
            if let Some(&v) = voters_hit.get(&index)
                && !cluster.voter_running(v)
                && let Err(e) = cluster.start_voter(v)
            {
                obs.unclean.push(format!("voter {v} did not start again after {}: {e:#}", fault.kind()));
            }
        }
        (Fault::StopVoter { pick, .. }, Edge::Start) => {
            if let Some(v) = pick_voter(cluster, pick)? {
                if let Some(p) = cluster.voter_pid(v) {
                    signal(p, libc::SIGSTOP)?;
                }
                voters_hit.insert(index, v);
            }
        }
        (Fault::StopVoter { .. }, Edge::End) => {
            if let Some(p) = voters_hit.get(&index).and_then(|&v| cluster.voter_pid(v)) {
                signal(p, libc::SIGCONT)?;
            }
        }
        (Fault::KillVoter { .. }, Edge::End) => {
            if let Some(&v) = voters_hit.get(&index)
                && !cluster.voter_running(v)
            {
                cluster.start_voter(v)?;
            }
        }
        (Fault::CutPair { a, b, .. }, Edge::Start) => relay.partition(pids.node(a), pids.node(b), false)?,
        (Fault::IsolateNode { node, .. }, Edge::Start) => {
            for other in cluster.node_ids() {
                if other != node {
                    relay.partition(pids.node(node), pids.node(other), false)?;
                }
            }
        }
        (Fault::CutHost { node, .. }, Edge::Start) => pids.isolate(relay, pids.node(node))?,
        (Fault::IsolateVoter { pick, .. }, Edge::Start) => {
            if let Some(v) = pick_voter(cluster, pick)? {
                pids.isolate(relay, pids.voter(v))?;
                voters_hit.insert(index, v);
            }
        }
        (
            Fault::CutPair { .. } | Fault::IsolateNode { .. } | Fault::CutHost { .. } | Fault::IsolateVoter { .. },
            Edge::End,
        ) => relay.heal(),
    }
    Ok(())
}
