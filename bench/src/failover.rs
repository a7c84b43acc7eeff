//! `granary bench failover`: a coordinator group of real processes on
//! loopback; each round SIGKILLs the leader and measures the time until the
//! survivors elect a new leader and until a write commits, then restarts the
//! killed voter. At the end every voter is killed and restarted at once, and
//! every write acknowledged during the run must still be there.
//!
//! The clients measuring a round know only the survivors, with a 100 ms
//! bound per attempt, so the numbers describe the group, not a client
//! waiting out a dead connection.

use anyhow::{Context, Result, bail};
use granary_net::api::{ApiRequest, ApiResponse, ClusterStatus};
use granary_net::client::{ClientOptions, CoordinatorClient};
use granary_net::tls::{self, Identity};
use granary_proto::NodeId;
use granary_testkit::harness::{CoordinatorProcess, VoterSpec, reserve_udp_port};
use serde::Serialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Knobs of the failover benchmark.
#[derive(Clone, Debug)]
pub struct FailoverOpts {
    /// Voters in the group (3 or 5).
    pub voters: u64,
    /// Leader kills.
    pub rounds: u32,
    /// Election timeout lower bound (the upper bound is 1.25 times it).
    pub election_timeout_ms: u64,
    /// Leader heartbeat interval.
    pub heartbeat_ms: u64,
}

impl Default for FailoverOpts {
    fn default() -> Self {
        Self { voters: 3, rounds: 5, election_timeout_ms: 500, heartbeat_ms: 100 }
    }
}

/// One leader kill.
#[derive(Clone, Debug, Serialize)]
pub struct FailoverRound {
    /// Always "failover_round".
    pub scenario: &'static str,
    /// Round number.
    pub round: u32,
    /// The voter killed.
    pub killed: u64,
    /// The voter that took over.
    pub new_leader: u64,
    /// From the kill to a status answer naming another leader.
    pub elected_ms: f64,
    /// From the kill to a committed write.
    pub committed_ms: f64,
}

/// The last line.
#[derive(Clone, Debug, Serialize)]
pub struct FailoverSummary {
    /// Always "failover".
    pub scenario: &'static str,
    /// Voters.
    pub voters: u64,
    /// Rounds.
    pub rounds: u32,
    /// Election timeout lower bound.
    pub election_timeout_ms: u64,
    /// Median over rounds.
    pub elected_ms_median: f64,
    /// Median over rounds.
    pub committed_ms_median: f64,
    /// Worst round.
    pub committed_ms_max: f64,
    /// Worst round over the election timeout (target ≤ 2).
    pub committed_over_election_timeout_max: f64,
    /// Writes acknowledged during the run.
    pub writes_acknowledged: usize,
    /// Of those, found after every voter was killed and restarted.
    pub writes_found_after_restart: usize,
    /// Acknowledged writes not found (node ids registered); must be empty.
    pub writes_missing: Vec<u64>,
}

struct Group {
    exe: PathBuf,
    dir: PathBuf,
    certs: PathBuf,
    specs: Vec<VoterSpec>,
    extra: Vec<String>,
    procs: Vec<Option<CoordinatorProcess>>,
}

impl Group {
    fn start(&mut self, id: u64) -> Result<()> {
        let spec = &self.specs[(id - 1) as usize];
        let log = self.dir.join(format!("voter-{id}.log"));
        let p = CoordinatorProcess::spawn(
            &self.exe,
            spec,
            &self.specs,
            &self.certs,
            &self.extra,
            &log,
            Duration::from_secs(30),
        )?;
        self.procs[(id - 1) as usize] = Some(p);
        Ok(())
    }

    fn kill(&mut self, id: u64) {
        if let Some(p) = self.procs[(id - 1) as usize].take() {
            p.kill();
        }
    }

    fn client(&self, name: &str, except: Option<u64>) -> Result<CoordinatorClient> {
        let identity = Identity::load(&self.certs, name)?;
        let addrs: Vec<SocketAddr> = self.specs.iter().filter(|s| Some(s.id) != except).map(|s| s.addr).collect();
        let options = ClientOptions {
            deadline: Duration::from_secs(20),
            connect_timeout: Duration::from_millis(200),
            backoff: Duration::from_millis(10),
            attempt_timeout: Duration::from_millis(100),
        };
        Ok(CoordinatorClient::new(&identity, addrs, options)?)
    }
}

async fn status(c: &CoordinatorClient) -> Result<ClusterStatus> {
    match c.call(&ApiRequest::Status).await? {
        (_, ApiResponse::Status(s)) => Ok(s),
        (_, other) => bail!("status answered {other:?}"),
    }
}

async fn register(c: &CoordinatorClient, node: u64) -> Result<()> {
    let req = ApiRequest::RegisterNode {
        node: NodeId(node),
        addr: format!("10.0.0.1:{node}"),
        ram_bytes: 1 << 30,
        ssd_bytes: 0,
        // Unique per write, so a retried attempt is not a second write.
        registration: node,
    };
    match c.call(&req).await? {
        (_, ApiResponse::Registered { .. }) => Ok(()),
        (_, other) => bail!("register answered {other:?}"),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

/// Runs the benchmark with the `granary` binary at `exe`; `say` gets one
/// line of progress per step, `round` each round's result.
pub fn run(
    exe: &Path,
    opts: &FailoverOpts,
    mut say: impl FnMut(&str),
    mut on_round: impl FnMut(&FailoverRound),
) -> Result<FailoverSummary> {
    if !matches!(opts.voters, 3 | 5) {
        bail!("--voters must be 3 or 5 (a leader kill needs a surviving majority)");
    }
    let tmp = tempfile::tempdir()?;
    let certs = tmp.path().join("certs");
    tls::init_cluster(&certs)?;
    for id in 1..=opts.voters {
        tls::issue_bound(&certs, tls::Role::Coordinator, &format!("coordinator-{id}"), Some(id))?;
    }
    let specs = (1..=opts.voters)
        .map(|id| {
            Ok(VoterSpec {
                id,
                addr: reserve_udp_port()?,
                data_dir: tmp.path().join(format!("voter-{id}")),
                name: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let extra = vec![
        "--election-timeout-ms".into(),
        opts.election_timeout_ms.to_string(),
        "--heartbeat-ms".into(),
        opts.heartbeat_ms.to_string(),
        // No lease expiries during the run: the registrations are only writes.
        "--lease-ms".into(),
        "3600000".into(),
        // Many simulated nodes register with the one `node` certificate.
        "--allow-unbound-node-certs".into(),
    ];
    let mut g = Group {
        exe: exe.to_path_buf(),
        dir: tmp.path().to_path_buf(),
        certs,
        procs: specs.iter().map(|_| None).collect(),
        specs,
        extra,
    };
    say(&format!("starting {} voters", opts.voters));
    for id in 1..=opts.voters {
        g.start(id)?;
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // Clients bind their UDP sockets on this runtime.
    let _runtime = rt.enter();
    let mut acknowledged = Vec::new();
    let mut rounds = Vec::new();
    for round in 0..opts.rounds {
        let all = g.client("node", None)?;
        let leader = rt.block_on(async {
            let s = status(&all).await?;
            let l = s.leader.context("no leader")?;
            // A write before the kill: the group is steady.
            register(&all, 1_000 + u64::from(round)).await?;
            Ok::<_, anyhow::Error>(l)
        })?;
        acknowledged.push(1_000 + u64::from(round));
        all.close();
        let survivors = g.client("node", Some(leader))?;
        let t0 = Instant::now();
        g.kill(leader);
        let (new_leader, elected, committed) = rt.block_on(async {
            let (new_leader, elected) = loop {
                match status(&survivors).await {
                    Ok(s) if s.leader.is_some_and(|l| l != leader) => {
                        break (s.leader.unwrap_or_default(), t0.elapsed());
                    }
                    _ if t0.elapsed() > Duration::from_secs(30) => bail!("no new leader within 30 s"),
                    _ => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            };
            register(&survivors, 2_000 + u64::from(round)).await?;
            Ok((new_leader, elected, t0.elapsed()))
        })?;
        acknowledged.push(2_000 + u64::from(round));
        survivors.close();
        let r = FailoverRound {
            scenario: "failover_round",
            round,
            killed: leader,
            new_leader,
            elected_ms: elected.as_secs_f64() * 1e3,
            committed_ms: committed.as_secs_f64() * 1e3,
        };
        on_round(&r);
        rounds.push(r);
        g.start(leader)?;
        // Let the restarted voter catch up before the next kill.
        std::thread::sleep(Duration::from_millis(4 * opts.election_timeout_ms));
    }
    say("killing every voter at once and restarting them");
    for id in 1..=opts.voters {
        g.kill(id);
    }
    for id in 1..=opts.voters {
        g.start(id)?;
    }
    let all = g.client("admin", None)?;
    let missing: Vec<u64> = rt.block_on(async {
        let s = status(&all).await?;
        Ok::<_, anyhow::Error>(
            acknowledged.iter().copied().filter(|&n| !s.nodes.iter().any(|x| x.node == NodeId(n))).collect(),
        )
    })?;
    all.close();
    for id in 1..=opts.voters {
        g.kill(id);
    }
    if !missing.is_empty() || std::env::var_os("GRANARY_BENCH_KEEP").is_some() {
        // Keep the voters' folders and logs for diagnosis.
        let kept = tmp.keep();
        say(&format!("missing writes: {missing:?}; voter folders and logs kept in {}", kept.display()));
    }
    let committed: Vec<f64> = rounds.iter().map(|r| r.committed_ms).collect();
    let committed_ms_max = committed.iter().copied().fold(0.0, f64::max);
    Ok(FailoverSummary {
        scenario: "failover",
        voters: opts.voters,
        rounds: opts.rounds,
        election_timeout_ms: opts.election_timeout_ms,
        elected_ms_median: median(rounds.iter().map(|r| r.elected_ms).collect()),
        committed_ms_median: median(committed),
        committed_ms_max,
        committed_over_election_timeout_max: committed_ms_max / opts.election_timeout_ms as f64,
        writes_acknowledged: acknowledged.len(),
        writes_found_after_restart: acknowledged.len() - missing.len(),
        writes_missing: missing,
    })
}
