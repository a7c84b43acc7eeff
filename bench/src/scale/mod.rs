//! `granary bench scale`: where the coordinator's walls are for a dataset
//! of many row groups on many nodes (issue 31).
//!
//! One run: a synthetic store of `files` Parquet files holding `row_groups`
//! one-row row groups of one column (real footers, almost no data, so the
//! run measures the coordinator and not the disk); three voters as
//! processes; `nodes` simulated nodes (light clients in this process)
//! registering and heartbeating; then the dataset registered; then one
//! follower stopped and restarted behind the leader's purged log (it
//! installs a snapshot); one node leaving
//! (its heartbeats stop) and one joining; then a leader kill. Every figure
//! is measured, none derived from a model:
//! - `register_s`: the `dataset add` call, against `footers_s`, the same
//!   footer reads in this process (the bound registration cannot beat);
//! - `log_entry_max_bytes`: the voters' `log_entry_max_bytes` metric;
//! - `snapshot_bytes`: the leader's snapshot file holding the version;
//! - `snapshot_install_s`: a follower stopped until the leader purged
//!   its log past what the follower holds, from its restart to it having
//!   applied what the leader had (it installs a snapshot), and
//!   `snapshot_install_rss_bytes`, its peak RSS then;
//! - `voter_rss_bytes`: the largest peak RSS (`VmHWM`) of the voters;
//! - `replace_s`: a leave (from its lease running out to the status showing
//!   it gone) and a join (the registration's commit);
//! - `api_p99_ms`: heartbeats answered while those two happen;
//! - `watch_bytes_per_node`: what a node's placement watch (asking for
//!   deltas) receives for the leave, against the moved shards' entries
//!   (and against one node's share of them); `watch_whole_bytes` is its
//!   first message, the whole placement;
//! - `failover_s`: from the leader kill to a committed write;
//! - `watch_storm_s`: then every node re-opening its watch on the new
//!   leader at once, until the last has the whole placement (`storm.rs`),
//!   with the leader's peak RSS before and after.
//!
//! Then the fleet (`fleet.rs`): nodes that meet the voters as real nodes
//! do, each its own identity, address and connection, at a node's cadence,
//! through a steady state and a leader kill.

use anyhow::{Context, Result, bail};
use granary_net::api::{ApiRequest, ApiResponse, ClusterStatus, PlacementReport};
use granary_net::client::{ClientOptions, CoordinatorClient};
use granary_net::frame::encode_frame;
use granary_net::tls::{self, Identity};
use granary_proto::{DType, NodeId, TensorSpec, View};
use granary_testkit::harness::{CoordinatorProcess, VoterSpec, peak_rss, reserve_tcp_port, reserve_udp_port};
use serde::Serialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod fleet;
mod store;
mod storm;
mod summary;

pub use fleet::{FleetOpts, FleetRun, run as run_fleet};
pub use summary::ScaleSummary;

/// Knobs of one scale run.
#[derive(Clone, Debug)]
pub struct ScaleOpts {
    /// Row groups in the dataset.
    pub row_groups: u64,
    /// Files they are spread over.
    pub files: u64,
    /// Simulated nodes.
    pub nodes: u64,
    /// Election timeout lower bound of the voters.
    pub election_timeout_ms: u64,
    /// Node lease; heartbeats go every quarter of it.
    pub lease_ms: u64,
}

/// One run's figures (`"scenario":"scale"`).
#[derive(Clone, Debug, Serialize)]
pub struct ScaleRun {
    /// Always "scale".
    pub scenario: &'static str,
    /// Row groups registered.
    pub row_groups: u64,
    /// Files.
    pub files: u64,
    /// Simulated nodes.
    pub nodes: u64,
    /// Writing the synthetic store (not part of any figure).
    pub generate_s: f64,
    /// Registering the simulated nodes (no dataset yet).
    pub nodes_register_s: f64,
    /// Reading every footer in this process: the bound of `register_s`.
    pub footers_s: f64,
    /// The `dataset add` call.
    pub register_s: f64,
    /// The largest log entry any voter appended.
    pub log_entry_max_bytes: u64,
    /// The leader's snapshot file once it holds the version.
    pub snapshot_bytes: u64,
    /// `snapshot_bytes` over `row_groups`.
    pub snapshot_bytes_per_row_group: f64,
    /// A follower behind the leader's purged log, from its restart to
    /// having applied what the leader had.
    pub snapshot_install_s: f64,
    /// That follower's peak RSS once it caught up: a fresh process that
    /// received, decoded and installed the snapshot, then applied the rest.
    pub snapshot_install_rss_bytes: u64,
    /// The largest peak RSS of the voters.
    pub voter_rss_bytes: u64,
    /// A leave: from the lease running out to the status showing the node
    /// gone.
    pub replace_leave_s: f64,
    /// A join: the registration's commit.
    pub replace_join_s: f64,
    /// Heartbeats answered during the leave and the join: 99th percentile.
    pub api_p99_ms: f64,
    /// The slowest of them.
    pub api_max_ms: f64,
    /// Heartbeats over the whole run that failed.
    pub heartbeats_failed: u64,
    /// Heartbeats over the whole run.
    pub heartbeats: u64,
    /// Shards whose owner the leave changed.
    pub moved_shards: u64,
    /// Bytes of the watch's first message: the whole placement (every
    /// shard's owner, every node's status).
    pub watch_whole_bytes: u64,
    /// Bytes a node's watch receives for the leave (the updates from the
    /// placement before it to the one after).
    pub watch_bytes_per_node: u64,
    /// `watch_bytes_per_node` over the moved shards' entries (moved shards,
    /// at the bytes a `DescribePlacement` entry takes): every node learns
    /// every moved shard's owner, since its trainers read every shard
    /// through it. Target ≤ 2.
    pub watch_bytes_per_node_over_moved: f64,
    /// `watch_bytes_per_node` over one node's share of those entries (the
    /// moved entries over the nodes left), as issue 31 first stated it.
    pub watch_bytes_per_node_over_share: f64,
    /// From the leader kill to a committed write.
    pub failover_s: f64,
    /// `failover_s` over the election timeout.
    pub failover_vs_election_timeout: f64,
    /// Then every node's watch re-opened on the new leader at once: until
    /// the last watcher had the whole placement.
    pub watch_storm_s: f64,
    /// Until half of them had it.
    pub watch_storm_p50_s: f64,
    /// Dials refused and tried again meanwhile (every watcher here dials
    /// from one address; a voter takes 32 handshakes from one address at a
    /// time).
    pub watch_storm_redials: u64,
    /// Watches refused or ended before their first message, opened again.
    pub watch_storm_reopens: u64,
    /// The new leader's peak RSS before the storm.
    pub watch_storm_leader_rss_before_bytes: u64,
    /// Its peak RSS after it.
    pub watch_storm_leader_rss_bytes: u64,
}

struct Voters {
    exe: PathBuf,
    dir: PathBuf,
    certs: PathBuf,
    specs: Vec<VoterSpec>,
    metrics: Vec<SocketAddr>,
    extra: Vec<String>,
    procs: Vec<Option<CoordinatorProcess>>,
}

impl Voters {
    /// Three voters (not started) with their folders in `dir`, certificates
    /// from `certs`, reserved ports, and these times and `extra` flags.
    fn new(exe: &Path, dir: &Path, certs: &Path, election_ms: u64, lease_ms: u64, extra: &[&str]) -> Result<Self> {
        let specs = (1..=3)
            .map(|id| {
                Ok(VoterSpec { id, addr: reserve_udp_port()?, data_dir: dir.join(format!("voter-{id}")), name: None })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut flags: Vec<String> =
            vec!["--election-timeout-ms".into(), election_ms.to_string(), "--lease-ms".into(), lease_ms.to_string()];
        flags.extend(extra.iter().map(|f| f.to_string()));
        Ok(Self {
            exe: exe.to_path_buf(),
            dir: dir.to_path_buf(),
            certs: certs.to_path_buf(),
            metrics: (0..3).map(|_| reserve_tcp_port()).collect::<Result<_>>()?,
            specs,
            extra: flags,
            procs: (0..3).map(|_| None).collect(),
        })
    }

    fn start(&mut self, id: u64) -> Result<()> {
        let i = (id - 1) as usize;
        let mut extra = self.extra.clone();
        extra.extend(["--metrics".to_string(), self.metrics[i].to_string()]);
        let log = self.dir.join(format!("voter-{id}.log"));
        let p = CoordinatorProcess::spawn(
            &self.exe,
            &self.specs[i],
            &self.specs,
            &self.certs,
            &extra,
            &log,
            Duration::from_secs(60),
        )?;
        self.procs[i] = Some(p);
        Ok(())
    }

    /// Stops every voter; with `GRANARY_BENCH_KEEP` set, keeps `tmp` (the
    /// voters' folders and logs) and says where.
    fn stop_all(&mut self, tmp: tempfile::TempDir, say: &mut impl FnMut(&str)) {
        for id in 1..=3 {
            self.kill(id);
        }
        if std::env::var_os("GRANARY_BENCH_KEEP").is_some() {
            let kept = tmp.keep();
            say(&format!("voter folders and logs kept in {}", kept.display()));
        }
    }

    fn kill(&mut self, id: u64) {
        if let Some(p) = self.procs[(id - 1) as usize].take() {
            p.kill();
        }
    }

    /// A client of the voters (`only` one of them), each call bounded by
    /// `deadline` and each attempt at one voter by `attempt`.
    fn client(
        &self,
        name: &str,
        only: Option<u64>,
        deadline: Duration,
        attempt: Duration,
    ) -> Result<CoordinatorClient> {
        let identity = Identity::load(&self.certs, name)?;
        let addrs = self.specs.iter().filter(|s| only.is_none_or(|o| s.id == o)).map(|s| s.addr).collect();
        let options = ClientOptions {
            deadline,
            connect_timeout: Duration::from_millis(200).min(attempt),
            backoff: Duration::from_millis(10),
            attempt_timeout: attempt,
        };
        Ok(CoordinatorClient::new(&identity, addrs, options)?)
    }

    /// Voter `id`'s `VmHWM` (0 when it is not running).
    fn peak_rss_of(&self, id: u64) -> u64 {
        self.procs[(id - 1) as usize].as_ref().and_then(|p| peak_rss(p.pid()).ok()).unwrap_or(0)
    }

    /// The largest `VmHWM` of the running voters.
    fn peak_rss(&self) -> u64 {
        self.procs.iter().flatten().filter_map(|p| peak_rss(p.pid()).ok()).max().unwrap_or(0)
    }
}

/// A sample's value from a voter's `/metrics` (plain HTTP/1.0): the line
/// that is `sample` (a name, with its labels where it has any) and a value.
fn scrape(addr: SocketAddr, sample: &str) -> Result<u64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    text.lines()
        .filter_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .find_map(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .with_context(|| format!("{addr} exports no {sample}"))
}

fn view() -> View {
    View { tensors: vec![TensorSpec::new("x", DType::F32, &["x"])] }
}

/// Heartbeats of the simulated nodes: each beats every quarter lease; each
/// answer's time and latency are kept.
struct Beats {
    stopped: Vec<AtomicBool>,
    /// (sent, latency, ok)
    log: Mutex<Vec<(Instant, Duration, bool)>>,
    last_ok: Vec<Mutex<Option<Instant>>>,
    done: AtomicBool,
}

async fn beat(client: Arc<CoordinatorClient>, beats: Arc<Beats>, node: u64, incarnation: u64, every: Duration) {
    let i = (node - 1) as usize;
    // Spread the nodes over the period.
    tokio::time::sleep(every.mul_f64((node % 97) as f64 / 97.0)).await;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !beats.done.load(Ordering::Relaxed) {
        tick.tick().await;
        if beats.stopped[i].load(Ordering::Relaxed) {
            continue;
        }
        let sent = Instant::now();
        let r = client.call(&ApiRequest::Heartbeat { node: NodeId(node), incarnation }).await;
        let ok = matches!(r, Ok((_, ApiResponse::HeartbeatAccepted { .. })));
        if ok {
            *beats.last_ok[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(sent);
        }
        beats.log.lock().unwrap_or_else(|p| p.into_inner()).push((sent, sent.elapsed(), ok));
    }
}

async fn register(c: &CoordinatorClient, node: u64) -> Result<u64> {
    let req = ApiRequest::RegisterNode {
        node: NodeId(node),
        addr: format!("10.0.{}.{}:7100", node / 250, node % 250),
        ram_bytes: 1 << 30,
        ssd_bytes: 0,
        registration: node,
    };
    match c.call(&req).await? {
        (_, ApiResponse::Registered { incarnation, .. }) => Ok(incarnation),
        (_, other) => bail!("register answered {other:?}"),
    }
}

async fn status(c: &CoordinatorClient) -> Result<ClusterStatus> {
    match c.call(&ApiRequest::Status).await? {
        (_, ApiResponse::Status(s)) => Ok(s),
        (_, other) => bail!("status answered {other:?}"),
    }
}

async fn placement(c: &CoordinatorClient) -> Result<(PlacementReport, u64)> {
    match c.call(&ApiRequest::DescribePlacement { name: "scale".into(), version: None }).await? {
        (_, r @ ApiResponse::Placement(_)) => {
            let bytes = encode_frame(&r)?.len() as u64;
            let ApiResponse::Placement(p) = r else { unreachable!("matched above") };
            Ok((p, bytes))
        }
        (_, other) => bail!("placement answered {other:?}"),
    }
}

fn p99(mut v: Vec<f64>) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len()) - 1;
    (v[i], v[v.len() - 1])
}

/// Runs one scale run with the `granary` binary at `exe`; `say` gets one
/// line of progress per step.
pub fn run(exe: &Path, opts: &ScaleOpts, mut say: impl FnMut(&str)) -> Result<ScaleRun> {
    if opts.files == 0 || opts.row_groups < opts.files || opts.nodes < 3 {
        bail!("need at least one row group per file and 3 nodes");
    }
    let tmp = tempfile::tempdir()?;
    let store = tmp.path().join("store");
    say(&format!("writing {} row groups in {} files", opts.row_groups, opts.files));
    let t = Instant::now();
    store::generate(&store, opts.files, opts.row_groups)?;
    let generate_s = t.elapsed().as_secs_f64();
    let source = format!("file://{}/", store.display());

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let _runtime = rt.enter();
    say("reading every footer in this process (the bound of registration)");
    let t = Instant::now();
    let remote = granary_source::remote::Remote::open(
        &source,
        &Default::default(),
        None,
        Arc::new(granary_source::remote::RemoteCounters::default()),
    )?;
    let dataset = rt.block_on(granary_source::dataset::Dataset::open("scale", remote, view()))?;
    let footers_s = t.elapsed().as_secs_f64();
    let version = dataset.manifest.version(&view());
    drop(dataset);

    let certs = tmp.path().join("certs");
    tls::init_cluster(&certs)?;
    for id in 1..=3 {
        tls::issue_bound(&certs, tls::Role::Coordinator, &format!("coordinator-{id}"), Some(id))?;
    }
    let mut voters = Voters::new(
        exe,
        tmp.path(),
        &certs,
        opts.election_timeout_ms,
        opts.lease_ms,
        &[
            // Snapshots as a deployment takes them, and a log kept short
            // behind them, so the stopped follower must install one.
            "--snapshot-entries",
            "1000",
            "--keep-log-entries",
            "10",
            "--allow-unbound-node-certs",
        ],
    )?;
    say("starting 3 voters");
    for id in 1..=3 {
        voters.start(id)?;
    }
    let admin = voters.client("admin", None, Duration::from_secs(3600), Duration::from_secs(3600))?;
    let nodes = Arc::new(voters.client("node", None, Duration::from_secs(10), Duration::from_secs(1))?);
    let leader = rt.block_on(async {
        let t = Instant::now();
        loop {
            match status(&admin).await {
                Ok(s) if s.leader.is_some() => return s.leader.context("leader"),
                _ if t.elapsed() > Duration::from_secs(30) => bail!("no leader within 30 s"),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })?;
    let elected = Instant::now();

    say(&format!("registering {} nodes", opts.nodes));
    let t = Instant::now();
    let incarnations: Vec<u64> = rt.block_on(async {
        use futures::StreamExt;
        futures::stream::iter(1..=opts.nodes)
            .map(|n| {
                let c = nodes.clone();
                async move { register(&c, n).await }
            })
            .buffered(16)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<Vec<_>>>()
    })?;
    let nodes_register_s = t.elapsed().as_secs_f64();
    let beats = Arc::new(Beats {
        stopped: (0..opts.nodes + 1).map(|_| AtomicBool::new(false)).collect(),
        log: Mutex::new(Vec::new()),
        last_ok: (0..opts.nodes + 1).map(|_| Mutex::new(None)).collect(),
        done: AtomicBool::new(false),
    });
    let every = Duration::from_millis(opts.lease_ms / 4);
    for (i, inc) in incarnations.iter().enumerate() {
        rt.spawn(beat(nodes.clone(), beats.clone(), i as u64 + 1, *inc, every));
    }

    say(&format!("registering the dataset ({} row groups)", opts.row_groups));
    let t = Instant::now();
    let add = ApiRequest::AddDataset { name: "scale".into(), source, view: view(), progress: false };
    match rt.block_on(admin.call(&add))? {
        (_, ApiResponse::DatasetAdded { summary, .. }) if summary.version == version => {}
        (_, other) => bail!("dataset add answered {other:?}"),
    }
    let register_s = t.elapsed().as_secs_f64();

    say("waiting for a snapshot of the leader to cover the registration");
    let leader_metrics = voters.metrics[(leader - 1) as usize];
    let registered = scrape(leader_metrics, "granary_coordinator_applied_index")?;
    let snap = voters.specs[(leader - 1) as usize].data_dir.join("snapshot.json");
    let mut spare = 0u64;
    // Snapshots follow log entries, and heartbeats are none: write entries
    // that change no placement (the weight of a node id no node has) until
    // one is taken.
    while scrape(leader_metrics, "granary_coordinator_snapshot_index").unwrap_or(0) < registered {
        let weight = ApiRequest::SetNodeWeight { node: NodeId(u64::MAX), weight: Some(1 + spare % 2) };
        spare += 1;
        rt.block_on(admin.call(&weight))?;
        if spare > 10_000 {
            bail!("no snapshot covered index {registered} after 10,000 entries");
        }
    }
    let snapshot_bytes = std::fs::metadata(&snap).with_context(|| format!("{}", snap.display()))?.len();

    let follower = (1..=3).find(|&id| id != leader).unwrap_or(1);
    let metrics = voters.metrics[(follower - 1) as usize];
    say(&format!("stopping voter {follower} until the leader's log no longer holds what it lacks"));
    let behind = scrape(metrics, "granary_coordinator_applied_index")?;
    voters.kill(follower);
    // Entries that change no placement, until the leader purged past the
    // stopped voter's last entry: it must then install a snapshot. (A
    // voter whose folder is wiped must rejoin under a new id: a Raft voter
    // may not forget what it acknowledged.)
    while scrape(leader_metrics, "granary_coordinator_purged_index").unwrap_or(0) <= behind {
        let weight = ApiRequest::SetNodeWeight { node: NodeId(u64::MAX), weight: Some(1 + spare % 2) };
        spare += 1;
        rt.block_on(admin.call(&weight))?;
        if spare > 10_000 {
            bail!("the leader did not purge its log past {behind} after 10,000 entries");
        }
    }
    rt.block_on(admin.call(&ApiRequest::SetNodeWeight { node: NodeId(u64::MAX), weight: None }))?;
    let target = scrape(leader_metrics, "granary_coordinator_applied_index")?;
    say(&format!("restarting voter {follower} (it installs the snapshot)"));
    let t = Instant::now();
    voters.start(follower)?;
    // Its own view, from its metrics (a status request would be answered
    // through the leader).
    loop {
        match scrape(metrics, "granary_coordinator_applied_index") {
            Ok(applied) if applied >= target => break,
            _ if t.elapsed() > Duration::from_secs(600) => bail!("voter {follower} did not catch up in 600 s"),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let snapshot_install_s = t.elapsed().as_secs_f64();
    let snapshot_install_rss_bytes = voters.peak_rss_of(follower);

    // A new leader grants every live node a grace of one lease at its
    // first lease tick (crate `granary_coordinator::leases`), renewals it
    // accepted before that tick included: a leave measured inside that
    // window would count the grace.
    let settled = elected + Duration::from_millis(2 * opts.lease_ms);
    std::thread::sleep(settled.saturating_duration_since(Instant::now()));
    let (before, _) = rt.block_on(placement(&admin))?;
    // A node's watch, asking for deltas: the whole placement first.
    let mut watch = rt.block_on(nodes.watch_placement(0))?;
    let first = rt.block_on(watch.next_placement())?.context("the watch ended before its first message")?;
    if first.tables.is_empty() {
        bail!("the watch's first message carries no owner table");
    }
    let watch_whole_bytes = watch.bytes_received();
    let leaver = opts.nodes;
    say(&format!("node {leaver} leaves (its heartbeats stop)"));
    beats.stopped[(leaver - 1) as usize].store(true, Ordering::Relaxed);
    let last =
        beats.last_ok[(leaver - 1) as usize].lock().unwrap_or_else(|p| p.into_inner()).unwrap_or_else(Instant::now);
    let expires = last + Duration::from_millis(opts.lease_ms);
    let window_start = expires;
    let gone = rt.block_on(async {
        loop {
            let s = status(&admin).await?;
            if s.nodes.iter().any(|n| n.node == NodeId(leaver) && !n.live) {
                return Ok::<_, anyhow::Error>(Instant::now());
            }
            if last.elapsed() > Duration::from_secs(600) {
                bail!("node {leaver} still live 600 s after its last heartbeat");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })?;
    let replace_leave_s = gone.saturating_duration_since(expires).as_secs_f64();
    let (after, owners_bytes) = rt.block_on(placement(&admin))?;
    // Updates until the watch stands at the leave's epoch, with the owners
    // DescribePlacement gives.
    let known = rt.block_on(async {
        loop {
            match watch.next_placement().await? {
                Some(p) if p.view.placement_epoch >= after.placement_epoch => return Ok::<_, anyhow::Error>(p),
                Some(_) => continue,
                None => bail!("the watch ended"),
            }
        }
    })?;
    let table = known.tables.get(&after.version).context("no owner table for the version after the leave")?;
    if table.owners.len() != after.owners.len() || after.owners.iter().zip(&table.owners).any(|(a, &o)| a.2 != o) {
        bail!("the watch's owners after the leave differ from DescribePlacement's");
    }
    let watch_bytes_per_node = watch.bytes_received() - watch_whole_bytes;
    let moved_shards = before.owners.iter().zip(&after.owners).filter(|(a, b)| a.2 != b.2).count() as u64;
    let entry_bytes = owners_bytes as f64 / after.owners.len().max(1) as f64;
    let moved_bytes = moved_shards as f64 * entry_bytes;
    let share_bytes = moved_bytes / (opts.nodes - 1) as f64;

    say(&format!("node {} joins", opts.nodes + 1));
    let t = Instant::now();
    let joined = rt.block_on(register(&nodes, opts.nodes + 1))?;
    let replace_join_s = t.elapsed().as_secs_f64();
    let window_end = Instant::now();
    rt.spawn(beat(nodes.clone(), beats.clone(), opts.nodes + 1, joined, every));
    let (api_p99_ms, api_max_ms) = {
        let log = beats.log.lock().unwrap_or_else(|p| p.into_inner());
        p99(log
            .iter()
            .filter(|(sent, lat, _)| *sent + *lat >= window_start && *sent <= window_end)
            .map(|(_, lat, _)| lat.as_secs_f64() * 1e3)
            .collect())
    };

    let leader = rt.block_on(status(&admin))?.leader.context("no leader")?;
    say(&format!("killing the leader (voter {leader})"));
    // As `bench failover`: a client of the survivors only, 100 ms an
    // attempt; the write commits an entry and re-places nothing (the
    // weight of a node id no node has).
    let survivors: Vec<SocketAddr> = voters.specs.iter().filter(|s| s.id != leader).map(|s| s.addr).collect();
    let writer = CoordinatorClient::new(
        &Identity::load(&certs, "admin")?,
        survivors,
        ClientOptions {
            deadline: Duration::from_secs(20),
            connect_timeout: Duration::from_millis(200),
            backoff: Duration::from_millis(10),
            attempt_timeout: Duration::from_millis(100),
        },
    )?;
    let survivor_ids: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
    let rss_before_kill = voters.peak_rss();
    let t = Instant::now();
    voters.kill(leader);
    rt.block_on(async {
        loop {
            let req = ApiRequest::SetNodeWeight { node: NodeId(u64::MAX), weight: Some(3) };
            match writer.call(&req).await {
                Ok((_, ApiResponse::WeightSet { .. })) => return Ok(()),
                _ if t.elapsed() > Duration::from_secs(120) => bail!("no write committed within 120 s of the kill"),
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    })?;
    let failover_s = t.elapsed().as_secs_f64();
    let voter_rss_bytes = voters.peak_rss().max(rss_before_kill);

    let new_leader = rt.block_on(status(&admin))?.leader.context("no leader after the kill")?;
    say(&format!("every node re-opens its watch on the new leader (voter {new_leader}) at once"));
    storm::issue_certs(&certs, opts.nodes)?;
    let rss_before_storm = voters.peak_rss_of(new_leader);
    let storm = rt.block_on(storm::run(&certs, voters.specs[(new_leader - 1) as usize].addr, opts.nodes))?;
    let rss_after_storm = voters.peak_rss_of(new_leader);
    say(&format!(
        "{} watchers had the whole placement ({} bytes) within {:.2} s ({} dials and {} watches tried again); leader \
         peak RSS {} MB -> {} MB",
        opts.nodes,
        storm.whole_bytes,
        storm.all_s,
        storm.redials,
        storm.reopens,
        rss_before_storm >> 20,
        rss_after_storm >> 20
    ));
    let log_entry_max_bytes = survivor_ids
        .iter()
        .filter_map(|&id| scrape(voters.metrics[(id - 1) as usize], "granary_coordinator_log_entry_max_bytes").ok())
        .max()
        .unwrap_or(0);
    beats.done.store(true, Ordering::Relaxed);
    let (heartbeats, heartbeats_failed) = {
        let log = beats.log.lock().unwrap_or_else(|p| p.into_inner());
        (log.len() as u64, log.iter().filter(|b| !b.2).count() as u64)
    };
    voters.stop_all(tmp, &mut say);
    Ok(ScaleRun {
        scenario: "scale",
        row_groups: opts.row_groups,
        files: opts.files,
        nodes: opts.nodes,
        generate_s,
        nodes_register_s,
        footers_s,
        register_s,
        log_entry_max_bytes,
        snapshot_bytes,
        snapshot_bytes_per_row_group: snapshot_bytes as f64 / opts.row_groups as f64,
        snapshot_install_s,
        snapshot_install_rss_bytes,
        voter_rss_bytes,
        replace_leave_s,
        replace_join_s,
        api_p99_ms,
        api_max_ms,
        heartbeats_failed,
        heartbeats,
        moved_shards,
        watch_whole_bytes,
        watch_bytes_per_node,
        watch_bytes_per_node_over_moved: watch_bytes_per_node as f64 / moved_bytes.max(1e-9),
        watch_bytes_per_node_over_share: watch_bytes_per_node as f64 / share_bytes.max(1e-9),
        failover_s,
        failover_vs_election_timeout: failover_s * 1e3 / opts.election_timeout_ms as f64,
        watch_storm_s: storm.all_s,
        watch_storm_p50_s: storm.p50_s,
        watch_storm_redials: storm.redials,
        watch_storm_reopens: storm.reopens,
        watch_storm_leader_rss_before_bytes: rss_before_storm,
        watch_storm_leader_rss_bytes: rss_after_storm,
    })
}
