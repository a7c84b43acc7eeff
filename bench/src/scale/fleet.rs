//! `bench scale`'s fleet: nodes as real nodes meet the voters (issue 42).
//!
//! Each of `nodes` simulated nodes is its own identity (a certificate
//! bound to its node id, from `certs init --nodes N`), its own UDP socket
//! on its own loopback address (127.0.X.Y: a voter budgets handshakes per
//! source address, and real nodes have one each), and its own
//! [`CoordinatorClient`] with a node's options; it does what a node's
//! membership does at a node's cadence: registers, heartbeats three times
//! a lease, keeps its delta placement watch open, and holds the dataset's
//! version once it is registered. Each watch decodes its first message
//! (the whole placement) and reads the updates after it without applying
//! them: a node applies its own on its own CPU, while a thousand here
//! would share this process's two threads, each update copying the
//! placement's node list (O(nodes) per update, per watcher), and measure
//! this process rather than the voters. The
//! watch and the holds are handles sharing the heartbeats' connections
//! ([`CoordinatorClient::sharing`]), as in the node.
//!
//! After a steady state of `steady`, the leader is killed; the run waits
//! until every node has had a heartbeat accepted (or registered again)
//! after the kill and has its watch open again with a first message.
//!
//! Not modelled: a node's manifest fetches when a version appears (pieces,
//! measured by the scale run's registration and storm) and its peer
//! traffic.

use super::{Voters, scrape, status, view};
use anyhow::{Context, Result, bail};
use granary_net::api::{ApiRequest, ApiResponse};
use granary_net::client::{ClientError, ClientOptions, CoordinatorClient};
use granary_net::pki::{SplitPlan, init_split};
use granary_net::tls::Identity;
use granary_proto::{DatasetVersion, NodeId};
use serde::Serialize;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Knobs of the fleet.
#[derive(Clone, Debug)]
pub struct FleetOpts {
    /// Nodes, each its own identity, socket and connection.
    pub nodes: u64,
    /// Row groups of the dataset they watch.
    pub row_groups: u64,
    /// The steady state before the leader kill.
    pub steady: Duration,
    /// The voters' election timeout (lower bound).
    pub election_timeout_ms: u64,
    /// The node lease.
    pub lease_ms: u64,
}

/// The fleet's figures (`"scenario":"fleet"`).
#[derive(Clone, Debug, Serialize)]
pub struct FleetRun {
    /// Always "fleet".
    pub scenario: &'static str,
    /// Nodes, each its own identity, socket and connection.
    pub real_nodes: u64,
    /// Row groups of the dataset.
    pub row_groups: u64,
    /// Every node registered, from the first registration sent.
    pub register_all_s: f64,
    /// Raft terms that began between the first leader and the steady state
    /// (0: the join moved no leadership).
    pub terms_during_join: u64,
    /// From the dataset's registration until the watches' bytes stood
    /// still (every node had its placement).
    pub fanout_s: f64,
    /// The steady state measured.
    pub steady_s: f64,
    /// Heartbeats sent in the steady state.
    pub heartbeats: u64,
    /// Of them, those not accepted (an error, or the lease lost).
    pub heartbeats_failed: u64,
    /// Heartbeats not accepted, by why (steady state and failover).
    pub heartbeat_failures: std::collections::BTreeMap<String, u64>,
    /// Registrations after the first, over the whole run (a lease lost).
    pub reregistrations: u64,
    /// The most connections one node identity held at the leader (sampled
    /// every second of the steady state; at most the voters).
    pub leader_connections_per_node: u64,
    /// Node identities connected to the leader (at the end of the steady
    /// state).
    pub leader_connected_nodes: u64,
    /// Node connections at the followers then (0: each node holds one, to
    /// the leader).
    pub follower_node_connections: u64,
    /// Handshakes the leader refused (its handshake budget spent) and
    /// connections it closed after their handshake (a cap reached), from
    /// the voters' start to the end of the steady state.
    pub leader_handshakes_refused: u64,
    /// See `leader_handshakes_refused`.
    pub leader_connections_refused: u64,
    /// The leader's CPU over the steady state, in cores.
    pub leader_cpu_cores: f64,
    /// The leader's peak RSS by the end of the steady state.
    pub leader_rss_bytes: u64,
    /// From the leader kill until every node had a heartbeat accepted (or a
    /// registration) by the new leader.
    pub reregister_after_failover_s: f64,
    /// From the kill until every node had its watch open again, with the
    /// whole placement.
    pub rewatch_after_failover_s: f64,
    /// Heartbeats not accepted from the kill to the end (retried within
    /// the lease).
    pub heartbeats_failed_in_failover: u64,
    /// Node connections at the new leader after the failover, per node at
    /// most.
    pub new_leader_connections_per_node: u64,
    /// Bytes of placement updates every watch received after its first
    /// message, over the whole run, per node.
    pub watch_update_bytes_per_node: u64,
}

/// What each node reports.
#[derive(Default)]
struct Tally {
    /// Heartbeats sent and failed, counted while `counting`.
    beats: AtomicU64,
    failed: AtomicU64,
    registrations: AtomicU64,
    /// Bytes of placement updates the watches received after their first
    /// messages.
    watch_bytes: AtomicU64,
    /// Heartbeats not accepted while counting, by why.
    reasons: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Per node: the last accepted heartbeat or registration, and the
    /// last watch open, as instants from `epoch` in microseconds.
    renewed: Vec<AtomicU64>,
    watched: Vec<AtomicU64>,
    counting: AtomicBool,
}

fn micros(epoch: Instant) -> u64 {
    epoch.elapsed().as_micros() as u64
}

/// The leader's CPU time (user + system), from /proc.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th fields of the line.
    let rest = stat.rsplit_once(')').context("stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse::<f64>().ok()).context("utime")?
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).context("stime")?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks / hz)
}

/// One node's life: register, heartbeat, hold, re-register on a lost lease.
async fn node_life(
    client: Arc<CoordinatorClient>,
    node: u64,
    lease: Duration,
    version: Arc<Mutex<Option<(String, DatasetVersion)>>>,
    tally: Arc<Tally>,
    epoch: Instant,
) {
    let i = (node - 1) as usize;
    let holds = Arc::new(client.sharing(ClientOptions::default()));
    let addr = format!("127.0.{}.{}:7100", node / 250, node % 250 + 1);
    // One token per registration, repeated by its retries (as the node).
    let mut token = node << 20;
    loop {
        let reg = ApiRequest::RegisterNode {
            node: NodeId(node),
            addr: addr.clone(),
            ram_bytes: 1 << 30,
            ssd_bytes: 0,
            registration: token,
        };
        let incarnation = match client.call(&reg).await {
            Ok((_, ApiResponse::Registered { incarnation, .. })) => incarnation,
            _ => {
                tokio::time::sleep(granary_net::backoff::pause(
                    Duration::from_millis(500),
                    1,
                    granary_net::backoff::jitter_unit(),
                ))
                .await;
                continue;
            }
        };
        token += 1;
        tally.registrations.fetch_add(1, Ordering::Relaxed);
        tally.renewed[i].store(micros(epoch), Ordering::Relaxed);
        let mut held = false;
        let mut beat = tokio::time::interval(lease / 3);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        beat.tick().await;
        loop {
            beat.tick().await;
            // Holds go in their own task, as the node's do: a slow commit
            // never holds back a heartbeat.
            let known = if held { None } else { version.lock().unwrap_or_else(|p| p.into_inner()).clone() };
            if let Some(v) = known {
                held = true;
                let holds = holds.clone();
                let req = ApiRequest::HoldVersions { node: NodeId(node), incarnation, versions: vec![v] };
                tokio::spawn(async move {
                    while !matches!(
                        holds.call(&req).await,
                        Ok((_, ApiResponse::VersionsHeld { .. })) | Ok((_, ApiResponse::LeaseLost { .. }))
                    ) {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                });
            }
            let sent = micros(epoch);
            let r = client.call(&ApiRequest::Heartbeat { node: NodeId(node), incarnation }).await;
            let counting = tally.counting.load(Ordering::Relaxed);
            if counting {
                tally.beats.fetch_add(1, Ordering::Relaxed);
            }
            let failure = match r {
                Ok((_, ApiResponse::HeartbeatAccepted { .. })) => {
                    tally.renewed[i].store(sent, Ordering::Relaxed);
                    None
                }
                Ok((_, ApiResponse::LeaseLost { .. })) => Some("lease lost".to_string()),
                Ok((_, other)) => {
                    Some(format!("answered {}", format!("{other:?}").chars().take(40).collect::<String>()))
                }
                Err(ClientError::Unavailable { last, .. }) if last.contains("quorum") => {
                    Some("no quorum heard recently".to_string())
                }
                Err(ClientError::Unavailable { last, .. }) if last.contains("no answer within") => {
                    Some("no answer in time".to_string())
                }
                Err(ClientError::Unavailable { last, .. }) => Some(format!(
                    "unavailable: {}",
                    last.split(": ").skip(1).collect::<Vec<_>>().join(": ").chars().take(60).collect::<String>()
                )),
                Err(e) => Some(e.to_string().chars().take(60).collect()),
            };
            if let Some(why) = failure {
                if counting {
                    tally.failed.fetch_add(1, Ordering::Relaxed);
                    *tally.reasons.lock().unwrap_or_else(|p| p.into_inner()).entry(why.clone()).or_default() += 1;
                }
                if why == "lease lost" {
                    break;
                }
            }
        }
    }
}

/// One node's placement watch: open, decode every message, open again.
async fn node_watch(client: CoordinatorClient, node: u64, tally: Arc<Tally>, epoch: Instant) {
    let i = (node - 1) as usize;
    let mut failed = 0u32;
    loop {
        match client.watch_placement(0).await {
            Ok(mut w) => {
                failed = 0;
                // The first message (the whole placement) was decoded at
                // the open; the updates after it are read, not applied (see
                // the module docs).
                tally.watched[i].store(micros(epoch), Ordering::Relaxed);
                while let Ok(Some(n)) = w.skip_next().await {
                    tally.watch_bytes.fetch_add(n, Ordering::Relaxed);
                }
            }
            Err(_) => {
                failed = failed.saturating_add(1);
                let base = Duration::from_millis(500);
                tokio::time::sleep(granary_net::backoff::pause(base, failed, granary_net::backoff::jitter_unit()))
                    .await;
            }
        }
    }
}

/// Node connections at the voter whose metrics are at `metrics`: (all,
/// most per node, nodes connected).
fn node_connections(metrics: SocketAddr) -> (u64, u64, u64) {
    let all = scrape(metrics, "granary_coordinator_connections{role=\"node\"}").unwrap_or(0);
    let most = scrape(metrics, "granary_coordinator_connections_most_per_node").unwrap_or(0);
    let nodes = scrape(metrics, "granary_coordinator_connected_nodes").unwrap_or(0);
    (all, most, nodes)
}

/// Runs the fleet with the `granary` binary at `exe`.
pub fn run(exe: &Path, opts: &FleetOpts, mut say: impl FnMut(&str)) -> Result<FleetRun> {
    if opts.nodes == 0 || opts.nodes > 60_000 {
        bail!("the fleet takes 1 to 60,000 nodes");
    }
    let tmp = tempfile::tempdir()?;
    let files = (opts.row_groups / 50).max(1);
    let store = tmp.path().join("store");
    super::store::generate(&store, files, opts.row_groups.max(files))?;
    let source = format!("file://{}/", store.display());
    say(&format!("fleet: issuing {} node certificates, each bound to its node id", opts.nodes));
    let root = tmp.path().join("certs");
    init_split(&root, SplitPlan { nodes: opts.nodes, voters: 3, unbound: false })?;
    let hosts = root.join("hosts");
    let mut voters = Voters::new(exe, tmp.path(), &hosts, opts.election_timeout_ms, opts.lease_ms, &[])?;
    for id in 1..=3 {
        voters.start(id)?;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let _runtime = rt.enter();
    let admin_id = Identity::load_in(&root.join("admin"), None, "admin")?.0;
    let addrs: Vec<SocketAddr> = voters.specs.iter().map(|s| s.addr).collect();
    let admin = CoordinatorClient::new(
        &admin_id,
        addrs.clone(),
        ClientOptions {
            deadline: Duration::from_secs(600),
            attempt_timeout: Duration::from_secs(600),
            ..Default::default()
        },
    )?;
    let first_term = rt.block_on(async {
        let t = Instant::now();
        loop {
            match status(&admin).await {
                Ok(s) if s.leader.is_some() => return Ok(s.term),
                _ if t.elapsed() > Duration::from_secs(30) => bail!("no leader within 30 s"),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })?;

    let epoch = Instant::now();
    let tally = Arc::new(Tally {
        renewed: (0..opts.nodes).map(|_| AtomicU64::new(0)).collect(),
        watched: (0..opts.nodes).map(|_| AtomicU64::new(0)).collect(),
        ..Tally::default()
    });
    let version = Arc::new(Mutex::new(None));
    let lease = Duration::from_millis(opts.lease_ms);
    // A node's membership options (node/src/membership.rs).
    let node_options = ClientOptions {
        deadline: Duration::from_millis(1500),
        connect_timeout: Duration::from_millis(500),
        attempt_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    say(&format!("fleet: {} nodes join (each its own address, certificate and connection)", opts.nodes));
    let t = Instant::now();
    for n in 1..=opts.nodes {
        let identity = Identity::load_in(&hosts.join(format!("node-{n}")), None, "node")?.0;
        let bind: SocketAddr = format!("127.0.{}.{}:0", n / 250, n % 250 + 1).parse()?;
        let endpoint = granary_net::transport::endpoint(bind, None)?;
        let client = Arc::new(CoordinatorClient::on_endpoint(endpoint, &identity, addrs.clone(), node_options)?);
        let watch = client.sharing(ClientOptions::default());
        rt.spawn(node_life(client, n, lease, version.clone(), tally.clone(), epoch));
        rt.spawn(node_watch(watch, n, tally.clone(), epoch));
    }
    let all = |f: &dyn Fn(usize) -> bool| (0..opts.nodes as usize).all(f);
    let registered = || (0..opts.nodes as usize).filter(|&i| tally.renewed[i].load(Ordering::Relaxed) > 0).count();
    let mut told = Instant::now();
    while !all(&|i| tally.renewed[i].load(Ordering::Relaxed) > 0) {
        if t.elapsed() > Duration::from_secs(600) {
            bail!("the fleet did not register within 600 s ({} of {} registered)", registered(), opts.nodes);
        }
        if told.elapsed() > Duration::from_secs(10) {
            say(&format!("fleet: {} of {} nodes registered", registered(), opts.nodes));
            told = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let register_all_s = t.elapsed().as_secs_f64();
    say(&format!("fleet: every node registered in {register_all_s:.1} s; registering the dataset"));
    let add = ApiRequest::AddDataset { name: "fleet".into(), source, view: view(), progress: false };
    match rt.block_on(admin.call(&add))? {
        (_, ApiResponse::DatasetAdded { summary, .. }) => {
            *version.lock().unwrap_or_else(|p| p.into_inner()) = Some(("fleet".to_string(), summary.version));
        }
        (_, other) => bail!("dataset add answered {other:?}"),
    }
    // The steady state starts once every watch has the dataset's
    // placement: the watches' bytes stand still for a second.
    let added = Instant::now();
    let mut last = (tally.watch_bytes.load(Ordering::Relaxed), Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = tally.watch_bytes.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() >= Duration::from_secs(1) {
            break;
        }
        if added.elapsed() > Duration::from_secs(600) {
            bail!("the watches did not settle within 600 s of the dataset's registration");
        }
    }
    let fanout_s = last.1.saturating_duration_since(added).as_secs_f64();
    say(&format!("fleet: every watch had the dataset's placement {fanout_s:.1} s after its registration"));

    say(&format!("fleet: steady state for {:.0} s", opts.steady.as_secs_f64()));
    // The leader now (the join may have moved it: its term is reported).
    let s = rt.block_on(status(&admin))?;
    let (leader, term_after_join) = (s.leader.context("no leader after the join")?, s.term);
    let pid = voters.procs[(leader - 1) as usize].as_ref().map(|p| p.pid()).context("the leader's process")?;
    let leader_metrics = voters.metrics[(leader - 1) as usize];
    tally.counting.store(true, Ordering::Relaxed);
    let (cpu0, t0) = (cpu_seconds(pid)?, Instant::now());
    let mut most = 0;
    while t0.elapsed() < opts.steady {
        most = most.max(node_connections(leader_metrics).1);
        std::thread::sleep(Duration::from_secs(1));
    }
    tally.counting.store(false, Ordering::Relaxed);
    let steady_s = t0.elapsed().as_secs_f64();
    let leader_cpu_cores = (cpu_seconds(pid)? - cpu0) / steady_s;
    let leader_rss_bytes = voters.peak_rss_of(leader);
    let (heartbeats, heartbeats_failed) = (tally.beats.load(Ordering::Relaxed), tally.failed.load(Ordering::Relaxed));
    let (_, _, leader_connected_nodes) = node_connections(leader_metrics);
    let leader_handshakes_refused = scrape(leader_metrics, "granary_coordinator_handshakes_refused_total").unwrap_or(0);
    let leader_connections_refused =
        scrape(leader_metrics, "granary_coordinator_connections_refused_total").unwrap_or(0);
    let follower_node_connections: u64 =
        (1..=3).filter(|&id| id != leader).map(|id| node_connections(voters.metrics[(id - 1) as usize]).0).sum();
    say(&format!(
        "fleet: {heartbeats} heartbeats, {heartbeats_failed} failed; at most {most} connection(s) per node at the \
         leader, {follower_node_connections} node connections at the followers; {leader_handshakes_refused} \
         handshakes and {leader_connections_refused} connections refused; leader {leader_cpu_cores:.2} cores, peak \
         RSS {} MiB",
        leader_rss_bytes >> 20
    ));

    say(&format!("fleet: killing the leader (voter {leader})"));
    tally.counting.store(true, Ordering::Relaxed);
    let failed_before = tally.failed.load(Ordering::Relaxed);
    let killed = micros(epoch);
    let kill = Instant::now();
    voters.kill(leader);
    let mut renewed_at = None;
    let mut watched_at = None;
    while renewed_at.is_none() || watched_at.is_none() {
        if renewed_at.is_none() && all(&|i| tally.renewed[i].load(Ordering::Relaxed) > killed) {
            renewed_at = Some(kill.elapsed().as_secs_f64());
        }
        if watched_at.is_none() && all(&|i| tally.watched[i].load(Ordering::Relaxed) > killed) {
            watched_at = Some(kill.elapsed().as_secs_f64());
        }
        if kill.elapsed() > Duration::from_secs(600) {
            bail!("the fleet did not come back within 600 s of the leader kill");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    tally.counting.store(false, Ordering::Relaxed);
    let heartbeats_failed_in_failover = tally.failed.load(Ordering::Relaxed) - failed_before;
    let new_leader = rt.block_on(status(&admin))?.leader.context("no leader after the kill")?;
    // Redirected connections close as the nodes find the new leader.
    std::thread::sleep(Duration::from_secs(2));
    let (_, new_most, _) = node_connections(voters.metrics[(new_leader - 1) as usize]);
    let reregistrations = tally.registrations.load(Ordering::Relaxed).saturating_sub(opts.nodes);
    voters.stop_all(tmp, &mut say);
    Ok(FleetRun {
        scenario: "fleet",
        real_nodes: opts.nodes,
        row_groups: opts.row_groups,
        register_all_s,
        terms_during_join: term_after_join.saturating_sub(first_term),
        fanout_s,
        steady_s,
        heartbeats,
        heartbeats_failed,
        reregistrations,
        heartbeat_failures: tally.reasons.lock().unwrap_or_else(|p| p.into_inner()).clone(),
        leader_connections_per_node: most,
        leader_connected_nodes,
        follower_node_connections,
        leader_handshakes_refused,
        leader_connections_refused,
        leader_cpu_cores,
        leader_rss_bytes,
        reregister_after_failover_s: renewed_at.unwrap_or(f64::NAN),
        rewatch_after_failover_s: watched_at.unwrap_or(f64::NAN),
        heartbeats_failed_in_failover,
        new_leader_connections_per_node: new_most,
        watch_update_bytes_per_node: tally.watch_bytes.load(Ordering::Relaxed) / opts.nodes,
    })
}
