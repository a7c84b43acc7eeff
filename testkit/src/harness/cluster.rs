//! [`LocalCluster`]: coordinator voters and N node daemons on loopback,
//! serving a generated dataset, with the calls demos and benchmarks make on
//! it (start, stop and kill nodes and voters, wait for placement, sum
//! counters).

use super::child::log_tail;
use super::coordinator::{CoordinatorProcess, VoterSpec, reserve_tcp_port, reserve_udp_port};
use super::node::NodeProcess;
use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod node_toml;

/// How to start a [`LocalCluster`].
#[derive(Clone, Debug)]
pub struct LocalClusterSpec {
    /// Coordinator voters (1 or more; 3 for a cluster that survives one).
    pub voters: u32,
    /// Node daemons.
    pub nodes: u32,
    /// RAM tier per node.
    pub ram_bytes: u64,
    /// Guest area per node (copies of chunks other nodes own).
    pub guest_bytes: u64,
    /// SSD tier per node; None: RAM only.
    pub ssd_bytes: Option<u64>,
    /// Prefetch budget per rank.
    pub prefetch_bytes: u64,
    /// Concurrent shard loads per node.
    pub loads: usize,
    /// Converter threads per node.
    pub convert_threads: usize,
    /// Simulated remote storage per node: (latency ms, bandwidth bytes/s).
    /// Each node has its own link to the store.
    pub throttle: Option<(u64, u64)>,
    /// Node lease on the coordinator.
    pub lease_ms: u64,
    /// The dataset's source URL; None: `file://DATA/`.
    pub source: Option<String>,
    /// object_store options for reading it (node `[remote]`, voter
    /// `--remote-option`), e.g. an S3 endpoint and keys.
    pub remote: std::collections::BTreeMap<String, String>,
    /// Hosts made of network namespaces (empty: every process on
    /// loopback): voter i and node i run in host i's namespace, on its
    /// address, at fixed ports ([`VOTER_PORT`], [`PEER_PORT`]).
    pub hosts: Vec<NetHost>,
    /// Nodes' `[cluster.fabric] hold_linger_ms`; None: the default.
    pub hold_linger_ms: Option<u64>,
    /// Voters' `--version-retention-s`; None: the default.
    pub version_retention_s: Option<u64>,
    /// Voters' `--snapshot-entries` and `--keep-log-entries`; None: the
    /// defaults (a snapshot every 1,000 entries).
    pub snapshot_entries: Option<(u64, u64)>,
    /// Every voter and node serves Prometheus metrics on a loopback TCP
    /// port ([`LocalCluster::voter_metrics`], [`LocalCluster::node_metrics`]).
    pub metrics: bool,
    /// Nodes' `[cluster.fabric] verify_peer_chunks`; None: the default.
    pub verify_peer_chunks: Option<f64>,
    /// A node whose daemon another executable runs (with the same `node
    /// --config FILE` arguments), in every life: `granary-chaos run`'s
    /// byzantine peer (`granary-chaos node`).
    pub node_exe: Option<(u64, PathBuf)>,
    /// The view (TOML) the dataset is registered with; None: the
    /// generator's ([`crate::datagen::VIEW_TOML`]).
    pub view: Option<String>,
    /// Nodes speaking the build before's peer protocol (`peer_protocol = 4`).
    pub previous_peer_protocol: Vec<u64>,
}

/// A host made of a network namespace (see `granary_chaos::netns`).
#[derive(Clone, Debug)]
pub struct NetHost {
    /// The namespace's name.
    pub netns: String,
    /// Its address.
    pub ip: std::net::Ipv4Addr,
}

/// A voter's port on a [`NetHost`].
pub const VOTER_PORT: u16 = 7100;
/// A node's peer port on a [`NetHost`].
pub const PEER_PORT: u16 = 7101;

impl Default for LocalClusterSpec {
    fn default() -> Self {
        Self {
            voters: 1,
            nodes: 3,
            ram_bytes: 1 << 30,
            guest_bytes: 1 << 30,
            ssd_bytes: None,
            prefetch_bytes: 256 << 20,
            loads: 4,
            convert_threads: 2,
            throttle: None,
            lease_ms: 1500,
            source: None,
            remote: std::collections::BTreeMap::new(),
            hosts: Vec::new(),
            hold_linger_ms: None,
            version_retention_s: None,
            snapshot_entries: None,
            metrics: false,
            verify_peer_chunks: None,
            node_exe: None,
            view: None,
            previous_peer_protocol: Vec::new(),
        }
    }
}

/// A cluster of real processes on loopback: coordinator voters 1..=V and
/// node daemons 1..=N with `[cluster]` configs and no `[[dataset]]`,
/// serving the generated dataset, which is registered as `ads` on the
/// coordinator: each node opens it when the placement watch lists it.
/// Everything is stopped on drop.
///
/// A node binds its peer endpoint on a reserved port ([`Self::peer_listen`])
/// and advertises that port unless told otherwise
/// ([`LocalCluster::set_advertise`], for a relay in between).
pub struct LocalCluster {
    exe: PathBuf,
    dir: PathBuf,
    certs: PathBuf,
    spec: LocalClusterSpec,
    voter_specs: Vec<VoterSpec>,
    /// The address voters and nodes reach voter id - 1 at (its listening
    /// address unless a relay is in between).
    voter_advertise: Vec<std::net::SocketAddr>,
    voters: Vec<Option<CoordinatorProcess>>,
    /// The dataset registered as `ads` by [`Self::start_voters`].
    data: PathBuf,
    /// Peer listening address per node id - 1, kept across restarts.
    listen: Vec<std::net::SocketAddr>,
    /// Peer address advertised per node id - 1.
    advertise: Vec<std::net::SocketAddr>,
    nodes: Vec<Option<NodeProcess>>,
    /// Metrics endpoints of voters (id - 1), then of nodes (id - 1), when
    /// the spec asks for them.
    voter_metrics: Vec<std::net::SocketAddr>,
    node_metrics: Vec<std::net::SocketAddr>,
}

impl LocalCluster {
    /// Creates certificates, starts the voters, registers `data` as `ads`,
    /// starts the nodes and waits until each knows the placement of all of
    /// them.
    pub fn start(exe: &Path, dir: &Path, data: &Path, spec: LocalClusterSpec) -> Result<Self> {
        let mut c = Self::prepare(exe, dir, data, spec)?;
        c.start_nodes()?;
        Ok(c)
    }

    /// [`LocalCluster::start`] up to the nodes: certificates, voters, the
    /// dataset, reserved peer ports; no node runs yet.
    pub fn prepare(exe: &Path, dir: &Path, data: &Path, spec: LocalClusterSpec) -> Result<Self> {
        let mut c = Self::plan(exe, dir, data, spec)?;
        c.start_voters()?;
        Ok(c)
    }

    /// Certificates and reserved addresses; no process runs yet. Then
    /// [`Self::start_voters`] and [`Self::start_nodes`] (with
    /// [`Self::set_voter_advertise`] and [`Self::set_advertise`] before,
    /// for a relay in between).
    pub fn plan(exe: &Path, dir: &Path, data: &Path, spec: LocalClusterSpec) -> Result<Self> {
        if spec.voters == 0 {
            bail!("a cluster needs at least one coordinator voter");
        }
        let certs = dir.join("certs");
        granary_net::tls::init_cluster(&certs).context("creating cluster certificates")?;
        // Each node its own certificate, bound to its id (the coordinator
        // refuses node certificates that name none).
        for id in 1..=u64::from(spec.nodes) {
            granary_net::tls::issue_bound(&certs, granary_net::tls::Role::Node, &format!("node-{id}"), Some(id))
                .with_context(|| format!("issuing node {id}'s certificate"))?;
        }
        // And each voter (Raft refuses coordinator certificates that name
        // no voter id).
        for id in 1..=u64::from(spec.voters) {
            let name = format!("coordinator-{id}");
            granary_net::tls::issue_bound(&certs, granary_net::tls::Role::Coordinator, &name, Some(id))
                .with_context(|| format!("issuing voter {id}'s certificate"))?;
        }
        if !spec.hosts.is_empty() && (spec.voters as usize > spec.hosts.len() || spec.nodes as usize > spec.hosts.len())
        {
            bail!("{} hosts cannot hold {} voters and {} nodes", spec.hosts.len(), spec.voters, spec.nodes);
        }
        let on_host = |i: usize, port: u16| -> Result<std::net::SocketAddr> {
            match spec.hosts.get(i) {
                Some(h) => Ok(std::net::SocketAddr::from((h.ip, port))),
                None => reserve_udp_port(),
            }
        };
        let voter_specs = (1..=spec.voters as u64)
            .map(|id| {
                let addr = on_host((id - 1) as usize, VOTER_PORT)?;
                Ok(VoterSpec { id, addr, data_dir: dir.join(format!("voter-{id}")), name: None })
            })
            .collect::<Result<Vec<_>>>()?;
        let listen = (0..spec.nodes as usize).map(|i| on_host(i, PEER_PORT)).collect::<Result<Vec<_>>>()?;
        let metrics_ports = |n: u32| -> Result<Vec<std::net::SocketAddr>> {
            if spec.metrics { (0..n).map(|_| reserve_tcp_port()).collect() } else { Ok(Vec::new()) }
        };
        let (voter_metrics, node_metrics) = (metrics_ports(spec.voters)?, metrics_ports(spec.nodes)?);
        Ok(Self {
            voter_metrics,
            node_metrics,
            exe: exe.to_path_buf(),
            dir: dir.to_path_buf(),
            certs,
            voters: voter_specs.iter().map(|_| None).collect(),
            voter_advertise: voter_specs.iter().map(|v| v.addr).collect(),
            voter_specs,
            data: data.to_path_buf(),
            advertise: listen.clone(),
            listen,
            nodes: (0..spec.nodes).map(|_| None).collect(),
            spec,
        })
    }

    /// Starts every voter and registers the dataset as `ads`.
    pub fn start_voters(&mut self) -> Result<()> {
        for id in self.voter_ids() {
            self.start_voter(id)?;
        }
        let data = self.data.clone();
        self.add_dataset("ads", &data)
    }

    /// Voter `id`'s metrics endpoint, if the spec asked for them.
    pub fn voter_metrics(&self, id: u64) -> Option<std::net::SocketAddr> {
        self.voter_metrics.get((id as usize).checked_sub(1)?).copied()
    }

    /// Node `id`'s metrics endpoint, if the spec asked for them.
    pub fn node_metrics(&self, id: u64) -> Option<std::net::SocketAddr> {
        self.node_metrics.get((id as usize).checked_sub(1)?).copied()
    }

    /// The address voter `id` binds.
    pub fn voter_listen(&self, id: u64) -> std::net::SocketAddr {
        self.voter_specs[(id - 1) as usize].addr
    }

    /// Makes voter `id` known to the other voters, the nodes and the tools
    /// at `addr` (a relay's front for it) from their next start on; it
    /// keeps binding [`Self::voter_listen`]. Set before the voters first
    /// start: the group's membership keeps the addresses it began with.
    pub fn set_voter_advertise(&mut self, id: u64, addr: std::net::SocketAddr) {
        self.voter_advertise[(id - 1) as usize] = addr;
    }

    /// Starts every node that is not running and waits until each knows
    /// the placement of all of them.
    pub fn start_nodes(&mut self) -> Result<()> {
        for id in self.node_ids() {
            if self.nodes[(id - 1) as usize].is_none() {
                self.start_node(id)?;
            }
        }
        let all = self.node_ids();
        self.wait_placement(&all, self.spec.nodes, 1, Duration::from_secs(60))
    }

    /// Voter ids, 1..=V.
    pub fn voter_ids(&self) -> Vec<u64> {
        (1..=self.spec.voters as u64).collect()
    }

    /// Voter `id`'s log file (every life of it, appended).
    pub fn voter_log(&self, id: u64) -> PathBuf {
        self.dir.join(format!("voter-{id}.log"))
    }

    /// The process id of voter `id`, if it runs.
    pub fn voter_pid(&self, id: u64) -> Option<u32> {
        self.voters.get((id - 1) as usize).and_then(Option::as_ref).map(CoordinatorProcess::pid)
    }

    /// Whether voter `id` runs (as far as this handle knows).
    pub fn voter_running(&self, id: u64) -> bool {
        self.voters.get((id - 1) as usize).is_some_and(Option::is_some)
    }

    /// Starts (or restarts) voter `id` on its address and data folder.
    pub fn start_voter(&mut self, id: u64) -> Result<()> {
        let i = (id - 1) as usize;
        let mut extra: Vec<String> = ["--lease-ms", &self.spec.lease_ms.to_string(), "--election-timeout-ms", "300"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        for (k, v) in &self.spec.remote {
            extra.push("--remote-option".into());
            extra.push(format!("{k}={v}"));
        }
        if let Some(s) = self.spec.version_retention_s {
            extra.extend(["--version-retention-s".to_string(), s.to_string()]);
        }
        if let Some((every, keep)) = self.spec.snapshot_entries {
            extra.extend(["--snapshot-entries".to_string(), every.to_string()]);
            extra.extend(["--keep-log-entries".to_string(), keep.to_string()]);
        }
        if let Some(m) = self.voter_metrics(id) {
            extra.extend(["--metrics".to_string(), m.to_string()]);
        }
        let netns = self.spec.hosts.get(i).map(|h| h.netns.clone());
        // Others are named by the address they are reached at.
        let peers: Vec<VoterSpec> = self
            .voter_specs
            .iter()
            .zip(&self.voter_advertise)
            .map(|(v, &addr)| VoterSpec { addr, ..v.clone() })
            .collect();
        let p = CoordinatorProcess::spawn_in(
            netns.as_deref(),
            &self.exe,
            &self.voter_specs[i],
            &peers,
            &self.certs,
            &extra,
            &self.voter_log(id),
            Duration::from_secs(30),
        )?;
        self.voters[i] = Some(p);
        Ok(())
    }

    /// SIGKILLs voter `id`.
    pub fn kill_voter(&mut self, id: u64) {
        if let Some(p) = self.voters.get_mut((id - 1) as usize).and_then(Option::take) {
            p.kill();
        }
    }

    /// Stops voter `id` cleanly (SIGTERM) and waits for it.
    pub fn terminate_voter(&mut self, id: u64) -> Result<()> {
        match self.voters.get_mut((id - 1) as usize).and_then(Option::take) {
            Some(p) => p.terminate(Duration::from_secs(30)),
            None => bail!("voter {id} is not running"),
        }
    }

    /// The voter that a `granary status` answer names as leader, if one
    /// answers within `timeout`.
    pub fn leader(&self, timeout: Duration) -> Result<Option<u64>> {
        let out = Command::new(&self.exe)
            .args(["status", "--json", "--cert-name", "admin"])
            .args(["--coordinators", &self.coordinators().join(",")])
            .args(["--timeout-ms", &timeout.as_millis().to_string()])
            .arg("--certs")
            .arg(&self.certs)
            .env("GRANARY_LOG", "error")
            .output()
            .context("running `granary status`")?;
        if !out.status.success() {
            return Ok(None);
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("reading `granary status --json`")?;
        Ok(v["leader"].as_u64())
    }

    /// Every voter's address as nodes and tools reach it, as `host:port`.
    pub fn coordinators(&self) -> Vec<String> {
        self.voter_advertise.iter().map(|a| a.to_string()).collect()
    }

    /// Registers the Parquet files in `data` as dataset `name` (the spec's
    /// view, or the generator's) on the coordinator.
    pub fn add_dataset(&self, name: &str, data: &Path) -> Result<()> {
        let source = self.spec.source.clone().unwrap_or_else(|| format!("file://{}/", data.display()));
        self.add_source(name, &source)
    }

    /// Registers the Parquet files `source` names (a URL, with globs or
    /// brace ranges) as dataset `name`.
    pub fn add_source(&self, name: &str, source: &str) -> Result<()> {
        let view = self.spec.view.as_deref().unwrap_or(crate::datagen::VIEW_TOML);
        add_dataset(&self.exe, &self.coordinators(), &self.certs, &self.dir, name, source, view).map_err(|e| {
            let tails: Vec<String> = self.voter_ids().iter().map(|&v| log_tail(&self.voter_log(v))).collect();
            anyhow!("{e:#}\n{}", tails.join("\n"))
        })
    }

    /// The registered datasets, as `granary dataset ls --json` prints them.
    pub fn datasets(&self) -> Result<Vec<granary_net::api::DatasetSummary>> {
        self.admin_json(&["dataset", "ls"])
    }

    /// The cluster's status, as `granary status --json` prints it.
    pub fn status(&self) -> Result<granary_net::api::ClusterStatus> {
        self.admin_json(&["status"])
    }

    /// What the admin command `args` prints with `--json`.
    fn admin_json<T: serde::de::DeserializeOwned>(&self, args: &[&str]) -> Result<T> {
        let out = Command::new(&self.exe)
            .args(args)
            .args(["--json", "--cert-name", "admin", "--timeout-ms", "10000"])
            .args(["--coordinators", &self.coordinators().join(",")])
            .arg("--certs")
            .arg(&self.certs)
            .env("GRANARY_LOG", "warn")
            .output()
            .context("running `granary dataset ls`")?;
        if !out.status.success() {
            bail!("granary {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        }
        serde_json::from_slice(&out.stdout).with_context(|| format!("reading `granary {} --json`", args.join(" ")))
    }

    /// Node ids, 1..=N.
    pub fn node_ids(&self) -> Vec<u64> {
        (1..=self.spec.nodes as u64).collect()
    }

    /// Node `id`'s folder: its node.toml, socket and SSD tier.
    pub fn node_dir(&self, id: u64) -> PathBuf {
        self.dir.join(format!("node-{id}"))
    }

    /// Node `id`'s SSD folder (used when the spec gives it an SSD tier).
    pub fn node_ssd(&self, id: u64) -> PathBuf {
        self.node_dir(id).join("ssd")
    }

    /// Node `id`'s Unix socket.
    pub fn socket(&self, id: u64) -> PathBuf {
        self.node_dir(id).join("node.sock")
    }

    /// Node `id`'s log file (its current life; see [`Self::logs`]).
    pub fn log(&self, id: u64) -> PathBuf {
        self.dir.join(format!("node-{id}.log"))
    }

    /// Every log this cluster's processes wrote: each node's lives
    /// (`node-ID.log`, earlier ones `node-ID.N.log`) and each voter's.
    pub fn logs(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        out.retain(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            (name.starts_with("node-") || name.starts_with("voter-")) && name.ends_with(".log")
        });
        out.sort();
        out
    }

    /// The process id of node `id`, if it runs.
    pub fn node_pid(&self, id: u64) -> Option<u32> {
        self.nodes.get((id - 1) as usize).and_then(Option::as_ref).map(NodeProcess::pid)
    }

    /// Whether node `id` runs (as far as this handle knows).
    pub fn node_running(&self, id: u64) -> bool {
        self.node_pid(id).is_some()
    }

    /// The last lines of node `id`'s log.
    pub fn log_tail(&self, id: u64) -> String {
        log_tail(&self.log(id))
    }

    /// The last lines of every node's log, each under `node ID:`: what an
    /// error of a run on the cluster shows.
    pub fn log_tails(&self) -> String {
        self.node_ids().iter().map(|&id| format!("node {id}:\n{}", self.log_tail(id))).collect::<Vec<_>>().join("\n")
    }

    /// The first coordinator voter's address.
    pub fn coordinator(&self) -> std::net::SocketAddr {
        self.voter_advertise[0]
    }

    /// The cluster's certificate folder.
    pub fn certs(&self) -> &Path {
        &self.certs
    }

    /// Node `id`'s advertised peer (QUIC) address.
    pub fn peer_addr(&self, id: u64) -> std::net::SocketAddr {
        self.advertise[(id - 1) as usize]
    }

    /// The address node `id` binds its peer endpoint on.
    pub fn peer_listen(&self, id: u64) -> std::net::SocketAddr {
        self.listen[(id - 1) as usize]
    }

    /// Makes node `id` advertise `addr` (a relay's front for it) from its
    /// next start on; it keeps binding [`Self::peer_listen`].
    pub fn set_advertise(&mut self, id: u64, addr: std::net::SocketAddr) {
        self.advertise[(id - 1) as usize] = addr;
    }

    /// Starts (or restarts) node `id` and waits until its socket serves.
    pub fn start_node(&mut self, id: u64) -> Result<()> {
        let dir = self.node_dir(id);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let config = dir.join("node.toml");
        std::fs::write(&config, self.node_toml(id))?;
        // A restarted node's earlier life keeps its log, as node-ID.N.log.
        let log = self.log(id);
        if log.exists() {
            let n = (1..).find(|n| !self.dir.join(format!("node-{id}.{n}.log")).exists()).unwrap_or(0);
            std::fs::rename(&log, self.dir.join(format!("node-{id}.{n}.log")))
                .with_context(|| format!("keeping {}", log.display()))?;
        }
        let netns = self.spec.hosts.get((id - 1) as usize).map(|h| h.netns.clone());
        let exe = match &self.spec.node_exe {
            Some((node, exe)) if *node == id => exe,
            _ => &self.exe,
        };
        let p = NodeProcess::spawn_in(
            netns.as_deref(),
            exe,
            &config,
            &self.socket(id),
            &self.log(id),
            Duration::from_secs(60),
        )?;
        self.nodes[(id - 1) as usize] = Some(p);
        Ok(())
    }

    /// Stops node `id` cleanly (SIGTERM) and waits for it.
    pub fn terminate(&mut self, id: u64) -> Result<()> {
        match self.nodes.get_mut((id - 1) as usize).and_then(Option::take) {
            Some(p) => p.terminate(Duration::from_secs(30)),
            None => bail!("node {id} is not running"),
        }
    }

    /// SIGKILLs node `id`.
    pub fn kill(&mut self, id: u64) {
        if let Some(p) = self.nodes.get_mut((id - 1) as usize).and_then(Option::take) {
            p.stop();
        }
    }

    /// Waits until each of `ids` logs that it knows a placement of `peers`
    /// live nodes and `versions` dataset versions.
    pub fn wait_placement(&self, ids: &[u64], peers: u32, versions: u32, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let want = format!("peers={peers} ");
        let want_versions = format!("versions={versions}");
        for &id in ids {
            loop {
                let text = std::fs::read_to_string(self.log(id)).unwrap_or_default();
                if text
                    .lines()
                    .any(|l| l.contains("placement known") && l.contains(&want) && l.contains(&want_versions))
                {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "node {id} did not learn a placement of {peers} nodes within {timeout:?}:\n{}",
                        log_tail(&self.log(id))
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Node `id`'s counters.
    pub fn stats(&self, id: u64) -> Result<granary_proto::wire::NodeStats> {
        use granary_client::LocalSource;
        let src = LocalSource::connect(self.socket(id)).with_context(|| format!("connecting to node {id}"))?;
        Ok(src.stats()?)
    }

    /// Counters of every running node, summed.
    pub fn total_stats(&self) -> Result<ClusterCounters> {
        let mut t = ClusterCounters::default();
        for id in self.node_ids() {
            if self.nodes[(id - 1) as usize].is_none() {
                continue;
            }
            let s = self.stats(id)?;
            t.remote_bytes += s.remote_bytes;
            t.conversions += s.conversions;
            t.peer_fetched += s.peer_fetched;
            t.peer_fetched_bytes += s.peer_fetched_bytes;
            t.peer_failures += s.peer_failures;
            t.local_hits += s.ram_hits + s.ssd_hits + s.guest_hits;
            t.misses += s.misses;
            t.joined += s.joined;
            t.loads_in_flight += s.loads_in_flight;
            t.peer_mismatched += s.peer_mismatched;
            t.peers_quarantined += s.peers_quarantined;
        }
        Ok(t)
    }
}

/// `granary dataset add NAME --source SOURCE` with the view `view_toml`.
fn add_dataset(
    exe: &Path,
    coordinators: &[String],
    certs: &Path,
    dir: &Path,
    name: &str,
    source: &str,
    view_toml: &str,
) -> Result<()> {
    let view = dir.join("view.toml");
    std::fs::write(&view, view_toml)?;
    let out = Command::new(exe)
        .args(["dataset", "add", name, "--source", source])
        .arg("--view")
        .arg(&view)
        .args(["--coordinators", &coordinators.join(","), "--cert-name", "admin", "--timeout-ms", "30000"])
        .arg("--certs")
        .arg(certs)
        .env("GRANARY_LOG", "warn")
        .output()
        .context("running `granary dataset add`")?;
    if !out.status.success() {
        bail!("dataset add {name} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// Counters summed over a cluster's running nodes.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ClusterCounters {
    /// Bytes read from remote storage.
    pub remote_bytes: u64,
    /// Shards converted.
    pub conversions: u64,
    /// Chunks fetched from peers.
    pub peer_fetched: u64,
    /// Bytes of chunks fetched from peers.
    pub peer_fetched_bytes: u64,
    /// Peer fetches that failed.
    pub peer_failures: u64,
    /// Chunk requests answered from a node's own RAM, SSD or guest area.
    pub local_hits: u64,
    /// Chunk requests that started a load (a peer fetch or a conversion).
    pub misses: u64,
    /// Chunk requests that waited for a load already in flight.
    pub joined: u64,
    /// Loads in flight now, on all nodes (a gauge).
    pub loads_in_flight: u64,
    /// Peer chunks that differed from a node's own conversion.
    pub peer_mismatched: u64,
    /// Peers quarantined, summed over the nodes (a gauge).
    pub peers_quarantined: u64,
}

impl ClusterCounters {
    /// The share of chunk requests answered from the node's own RAM, SSD
    /// or guest area, from `before` to `self`.
    pub fn local_hit_share(&self, before: &ClusterCounters) -> f64 {
        let hits = self.local_hits.saturating_sub(before.local_hits) as f64;
        let all =
            hits + self.misses.saturating_sub(before.misses) as f64 + self.joined.saturating_sub(before.joined) as f64;
        if all == 0.0 { 0.0 } else { hits / all }
    }
}
