//! `granary bench cluster`: the peer fabric against its bounds, in one run.
//!
//! Scenarios, all on one generated dataset:
//! - `nodes` (for each count in `node_counts`): a [`LocalCluster`] of that
//!   many node daemons, each with its own throttled link to remote storage,
//!   `ranks_per_node` trainer ranks on each, `epochs` epochs. Epoch 0 is
//!   cold; the rest are warm. Reports remote bytes over the dataset size,
//!   the cold epoch against the bound dataset bytes / (nodes × per-node
//!   bandwidth), warm rows/s per rank and peer bytes.
//! - `single_node_same_world`: one node daemon serving as many ranks as the
//!   largest cluster has. It is the baseline of `warm_vs_single_node`: on a
//!   machine that runs every process of the cluster, comparing with a
//!   single node that serves fewer ranks would measure CPU sharing, not the
//!   fabric.
//! - `transfer`: chunk bytes on loopback, four ways taking turns round
//!   after round (medians reported), with the same chunk sizes and the same
//!   concurrency ([`FabricConfig::max_fetches_per_peer`]): `peer` (this process fetches
//!   the dataset's chunks from a node daemon with the node's own
//!   [`PeerLink`]: request frame, tier lookup, chunk bytes received into the
//!   shared-memory file the node keeps and hands out, validation),
//!   `quic_raw` (a bare quinn stream per chunk into a fresh heap buffer,
//!   with the same TLS identities and transport settings, from a server
//!   process of its own, `granary bench quic-serve`: the same process
//!   layout as `peer`), `quic_raw_in_process` (the same with the server in
//!   this process, reported for comparison) and `tcp_raw` (a kernel TCP
//!   connection per concurrent slot, server in this process).
//! - `two_jobs`: two jobs on the largest cluster at once, the rank plan and
//!   the global plan, other seeds and world sizes: what the cluster reads
//!   and converts for both ([`crate::two_jobs`]).

use crate::report::{Conditions, CpuSample, CpuShares, median, ratio};
use anyhow::{Context, Result, anyhow};
use granary_client::{ChunkSource, LocalSource};
use granary_net::tls::{self, ALPN_PEER, Identity, Role};
use granary_node::fabric::{FabricConfig, PeerLink};
use granary_proto::{AlignedBuf, ShardId};
use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::{ClusterCounters, LocalCluster, LocalClusterSpec, run_epoch, spawn_ranks};
use serde::Serialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterOpts {
    /// Rows in the generated dataset.
    pub rows: u64,
    /// Files.
    pub files: u32,
    /// Rows per row group (shard).
    pub row_group_rows: u64,
    /// Rows per batch.
    pub batch_size: u32,
    /// Epochs per cluster (the first is cold).
    pub epochs: u64,
    /// Remote latency per request.
    pub latency_ms: u64,
    /// Remote bandwidth of each node's link.
    pub bandwidth_bytes_per_s: u64,
    /// Cluster sizes to run.
    pub node_counts: Vec<u32>,
    /// Trainer ranks per node.
    pub ranks_per_node: u32,
    /// RAM tier (and guest area) per node.
    pub ram_bytes: u64,
    /// Rounds over the dataset's chunks in the transfer scenario.
    pub transfer_rounds: u32,
    /// Work folder to keep (dataset, node configs and logs); a temporary
    /// folder removed at the end when `None`.
    pub keep_dir: Option<PathBuf>,
}

impl Default for ClusterOpts {
    fn default() -> Self {
        Self {
            rows: 400_000,
            files: 8,
            row_group_rows: 10_000,
            batch_size: 1024,
            epochs: 3,
            latency_ms: 20,
            bandwidth_bytes_per_s: 25 << 20,
            node_counts: vec![1, 2, 4],
            ranks_per_node: 1,
            ram_bytes: 1 << 30,
            transfer_rounds: 5,
            keep_dir: None,
        }
    }
}

/// One cluster size.
#[derive(Clone, Debug, Serialize)]
pub struct NodesScenario {
    /// `nodes` or `single_node_same_world`.
    pub scenario: &'static str,
    /// Node daemons.
    pub nodes: u32,
    /// Trainer ranks in all.
    pub ranks: u32,
    /// Seconds per epoch.
    pub epoch_secs: Vec<f64>,
    /// Epoch 0 over dataset bytes / (nodes × per-node bandwidth).
    pub cold_vs_bound: f64,
    /// The machine's CPU time by kind during epoch 0 and during the warm
    /// epochs (every process of the run shares the machine).
    pub cpu_cold: Option<CpuShares>,
    /// See `cpu_cold`.
    pub cpu_warm: Option<CpuShares>,
    /// Rows per second per rank over the warm epochs.
    pub warm_rows_per_s_per_rank: f64,
    /// Remote bytes over all epochs / dataset bytes.
    pub remote_read_ratio: f64,
    /// Chunk bytes fetched from peers over all epochs.
    pub peer_bytes: u64,
    /// Share of chunk requests answered from a node's own tiers, last epoch.
    pub last_epoch_local_hit_share: f64,
    /// Counters at the end.
    pub counters: ClusterCounters,
}

/// Chunk transfer throughput between two processes.
#[derive(Clone, Debug, Serialize)]
pub struct TransferScenario {
    /// `transfer`.
    pub scenario: &'static str,
    /// Chunks per round and way.
    pub chunks: usize,
    /// Bytes per round and way.
    pub bytes: u64,
    /// Concurrent requests.
    pub concurrency: usize,
    /// Rounds; the four ways take turns in each.
    pub rounds: u32,
    /// Peer fabric, median over rounds, MB/s (10^6).
    pub peer_mb_s: f64,
    /// Bare quinn streams from a server process, median, MB/s.
    pub quic_raw_mb_s: f64,
    /// Bare quinn streams from a server in the measuring process, median,
    /// MB/s (the baseline before the server had a process of its own).
    pub quic_raw_in_process_mb_s: f64,
    /// Kernel TCP, median, MB/s.
    pub tcp_raw_mb_s: f64,
    /// Each round, peer fabric.
    pub peer_rounds_mb_s: Vec<f64>,
    /// Each round, bare quinn from a server process.
    pub quic_raw_rounds_mb_s: Vec<f64>,
    /// Each round, bare quinn in this process.
    pub quic_raw_in_process_rounds_mb_s: Vec<f64>,
    /// Each round, kernel TCP.
    pub tcp_raw_rounds_mb_s: Vec<f64>,
    /// Path MTU the bare quinn connection reached (UDP payload bytes).
    pub quic_mtu: u16,
}

/// The last line.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterSummary {
    /// `summary`.
    pub scenario: &'static str,
    /// The largest cluster.
    pub nodes: u32,
    /// Its remote bytes over 3 epochs / dataset bytes (target ≤ 1.01).
    pub remote_read_ratio: f64,
    /// Its cold epoch over the bound (target ≤ 1.25).
    pub cold_vs_bound: f64,
    /// Peer fetch throughput / bare quinn (target ≥ 0.8).
    pub peer_vs_quic_raw: f64,
    /// Peer fetch throughput / kernel TCP.
    pub peer_vs_tcp_raw: f64,
    /// Its warm rows/s per rank / one node serving as many ranks (target ≥ 0.9).
    pub warm_vs_single_node: f64,
    /// Two jobs at once on a cluster of that size (the rank plan and the
    /// global plan): remote bytes over the dataset's (target ≤ 1.01).
    pub two_jobs_remote_read_ratio: f64,
    /// Their conversions per shard (target 1).
    pub two_jobs_conversions_per_shard: f64,
    /// Dataset bytes (Parquet).
    pub source_bytes: u64,
    /// Per-node remote bandwidth.
    pub bandwidth_bytes_per_s: u64,
    /// Where it ran.
    pub conditions: Conditions,
}

/// Every scenario's line, in order.
#[derive(Clone, Debug)]
pub struct ClusterReport {
    /// Cluster sizes, then the single-node baseline.
    pub nodes: Vec<NodesScenario>,
    /// Transfer throughput.
    pub transfer: TransferScenario,
    /// Two jobs at once on the largest cluster.
    pub two_jobs: crate::two_jobs::TwoJobsScenario,
    /// Summary.
    pub summary: ClusterSummary,
}

/// Runs every scenario; `say` receives one line per step.
pub fn run(exe: &Path, opts: &ClusterOpts, mut say: impl FnMut(&str)) -> Result<ClusterReport> {
    if !opts.node_counts.iter().any(|&n| n >= 2) {
        return Err(anyhow!(
            "the cluster sizes {:?} include none of 2 or more nodes, which the transfer scenario needs",
            opts.node_counts
        ));
    }
    if opts.node_counts.contains(&0) {
        return Err(anyhow!("a cluster needs at least one node"));
    }
    let temp;
    let work: &Path = match &opts.keep_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            if std::fs::read_dir(dir)?.next().is_some() {
                return Err(anyhow!("{} is not empty; --keep-dir wants an empty or new folder", dir.display()));
            }
            dir
        }
        None => {
            temp = tempfile::tempdir()?;
            temp.path()
        }
    };
    let data = work.join("data");
    say(&format!("generating {} rows", opts.rows));
    let spec = GenSpec {
        seed: 9,
        rows: opts.rows,
        files: opts.files,
        row_group_rows: opts.row_group_rows,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    let source_bytes = datagen::generate(&data, &spec, |_| {})?.bytes;
    let largest = opts.node_counts.iter().copied().max().unwrap_or(1);
    let mut scenarios = Vec::new();
    let mut transfer = None;
    for &n in &opts.node_counts {
        say(&format!("{n} node(s), {} rank(s) each, {} epochs", opts.ranks_per_node, opts.epochs));
        let dir = work.join(format!("nodes-{n}"));
        let (s, cluster) = nodes_scenario(exe, &dir, &data, opts, n, opts.ranks_per_node, source_bytes, "nodes")?;
        scenarios.push(s);
        if n >= 2 && transfer.is_none() {
            say("transfer: peer fetch, bare quinn, kernel TCP");
            transfer = Some(transfer_scenario(exe, &cluster, opts.transfer_rounds)?);
        }
    }
    let world = largest * opts.ranks_per_node;
    say(&format!("one node serving {world} ranks (baseline of warm_vs_single_node)"));
    let (single, _) =
        nodes_scenario(exe, &work.join("single"), &data, opts, 1, world, source_bytes, "single_node_same_world")?;
    say(&format!("two jobs at once on {largest} node(s): the rank plan and the global plan"));
    let spec = crate::two_jobs::TwoJobsSpec {
        cluster: cluster_spec(opts, largest),
        ranks_per_node: opts.ranks_per_node,
        batch_size: opts.batch_size,
        epochs: opts.epochs,
    };
    let two_jobs = crate::two_jobs::run(exe, &work.join("two-jobs"), &data, spec, source_bytes)?;
    let transfer = transfer.ok_or_else(|| anyhow!("no cluster of 2 or more nodes ran"))?;
    let big = scenarios.iter().find(|s| s.nodes == largest).ok_or_else(|| anyhow!("no cluster ran"))?;
    let summary = ClusterSummary {
        scenario: "summary",
        nodes: largest,
        remote_read_ratio: big.remote_read_ratio,
        cold_vs_bound: big.cold_vs_bound,
        peer_vs_quic_raw: ratio(transfer.peer_mb_s, transfer.quic_raw_mb_s),
        peer_vs_tcp_raw: ratio(transfer.peer_mb_s, transfer.tcp_raw_mb_s),
        warm_vs_single_node: ratio(big.warm_rows_per_s_per_rank, single.warm_rows_per_s_per_rank),
        two_jobs_remote_read_ratio: two_jobs.remote_read_ratio,
        two_jobs_conversions_per_shard: two_jobs.conversions_per_shard,
        source_bytes,
        bandwidth_bytes_per_s: opts.bandwidth_bytes_per_s,
        conditions: Conditions::current(),
    };
    scenarios.push(single);
    Ok(ClusterReport { nodes: scenarios, transfer, two_jobs, summary })
}

/// The cluster every scenario runs on: `nodes` node daemons with the
/// run's RAM tier and throttled links, one voter.
fn cluster_spec(opts: &ClusterOpts, nodes: u32) -> LocalClusterSpec {
    LocalClusterSpec {
        voters: 1,
        nodes,
        ram_bytes: opts.ram_bytes,
        guest_bytes: opts.ram_bytes,
        ssd_bytes: None,
        prefetch_bytes: 256 << 20,
        loads: 4,
        convert_threads: 2,
        throttle: Some((opts.latency_ms, opts.bandwidth_bytes_per_s)),
        lease_ms: 3000,
        ..LocalClusterSpec::default()
    }
}

/// CPU shares between marks `i` and `i + 1`, when both were read.
fn interval(marks: &[Option<CpuSample>], i: usize) -> Option<CpuShares> {
    match (marks.get(i), marks.get(i + 1)) {
        (Some(Some(a)), Some(Some(b))) => Some(b.since(a)),
        _ => None,
    }
}

#[allow(clippy::too_many_arguments)]
fn nodes_scenario(
    exe: &Path,
    dir: &Path,
    data: &Path,
    opts: &ClusterOpts,
    nodes: u32,
    ranks_per_node: u32,
    source_bytes: u64,
    scenario: &'static str,
) -> Result<(NodesScenario, LocalCluster)> {
    let cluster = LocalCluster::start(exe, dir, data, cluster_spec(opts, nodes))?;
    let world = nodes * ranks_per_node;
    let sockets: Vec<PathBuf> = (0..world).map(|r| cluster.socket((r / ranks_per_node) as u64 + 1)).collect();
    let args: Vec<String> = ["--batch-size", &opts.batch_size.to_string(), "--seed", "3", "--prefetch-batches", "2"]
        .map(String::from)
        .into();
    let (mut ranks, _) = spawn_ranks(exe, &sockets, &args)?;
    let mut epoch_secs = Vec::new();
    let (mut warm_rows, mut warm_secs) = (0u64, 0f64);
    let mut before = ClusterCounters::default();
    let mut last_share = 0.0;
    let mut cpu_marks = vec![CpuSample::now()];
    for epoch in 0..opts.epochs {
        let out = run_epoch(&mut ranks, epoch, Duration::from_secs(600), |_, _| {})
            .map_err(|e| anyhow!("{e:#}\n{}", cluster.log_tails()))?;
        epoch_secs.push(out.secs);
        if epoch > 0 {
            warm_rows += out.rows;
            warm_secs += out.secs;
        }
        if epoch == 0 || epoch + 1 == opts.epochs {
            cpu_marks.push(CpuSample::now());
        }
        let now = cluster.total_stats()?;
        last_share = now.local_hit_share(&before);
        before = now;
    }
    for t in ranks {
        t.finish(Duration::from_secs(30))?;
    }
    let bound = source_bytes as f64 / (nodes as f64 * opts.bandwidth_bytes_per_s as f64);
    let s = NodesScenario {
        scenario,
        nodes,
        ranks: world,
        cold_vs_bound: ratio(epoch_secs.first().copied().unwrap_or(0.0), bound),
        cpu_cold: interval(&cpu_marks, 0),
        cpu_warm: interval(&cpu_marks, 1),
        warm_rows_per_s_per_rank: ratio(warm_rows as f64, warm_secs) / world as f64,
        remote_read_ratio: ratio(before.remote_bytes as f64, source_bytes as f64),
        peer_bytes: before.peer_fetched_bytes,
        last_epoch_local_hit_share: last_share,
        counters: before,
        epoch_secs,
    };
    Ok((s, cluster))
}

/// Fetches every chunk node 1 serves, `rounds` times, four ways.
fn transfer_scenario(exe: &Path, cluster: &LocalCluster, rounds: u32) -> Result<TransferScenario> {
    let src = LocalSource::connect(cluster.socket(1))?;
    let info = src.describe("ads", None)?;
    let version = info.version;
    // Each shard with its chunk's length from the layout, which a fetch
    // checks the owner's announcement against.
    let shards = info
        .shards
        .iter()
        .map(|s| {
            let layout = granary_proto::ChunkLayout::new(version, s.shard, s.rows, &info.tensors)?;
            Ok((s.shard, layout.total_len() as u64))
        })
        .collect::<Result<Vec<(ShardId, u64)>>>()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    // The bench fetches as a node of its own: node 1 serves only node
    // certificates bound to a node id.
    let name = "node-bench";
    tls::issue_bound(cluster.certs(), tls::Role::Node, name, Some(u64::from(u32::MAX)))
        .context("issuing the bench's node certificate")?;
    let identity = Identity::load(cluster.certs(), name).context("loading the bench's node certificate")?;
    let node_addr = cluster.peer_addr(1);
    let fabric = FabricConfig::default();
    let concurrency = fabric.max_fetches_per_peer;
    rt.block_on(async move {
        // peer: node 1's chunks through the fabric. A first round makes
        // sure node 1 holds every chunk (it converts what it lacks), and
        // gives the sizes for the raw ways.
        let endpoint = tls::endpoint("127.0.0.1:0".parse()?, None)?;
        let link = Arc::new(PeerLink::new(endpoint, &identity, &fabric)?);
        let sizes = peer_round(&link, node_addr, version, &shards, concurrency).await?;
        let bytes: u64 = sizes.iter().sum();
        let max_chunk = sizes.iter().copied().max().unwrap_or(0);
        let server_process = RawQuicProcess::spawn(exe, cluster.certs(), max_chunk)?;
        let quic = RawQuicClient::connect(&identity, server_process.addr).await?;
        let local_server = RawQuicServer::start(&identity, max_chunk)?;
        let quic_local = RawQuicClient::connect(&identity, local_server.addr()?).await?;
        // The ways take turns, round after round, so that a burst of other
        // load on this shared machine hits them alike.
        let (mut peer, mut raw, mut raw_local, mut tcp) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mb = |secs: f64| ratio(bytes as f64 / 1e6, secs);
        for _ in 0..rounds {
            let start = Instant::now();
            peer_round(&link, node_addr, version, &shards, concurrency).await?;
            peer.push(mb(start.elapsed().as_secs_f64()));
            raw.push(mb(quic.round(&sizes, concurrency).await?));
            raw_local.push(mb(quic_local.round(&sizes, concurrency).await?));
            tcp.push(mb(tcp_raw(&sizes, concurrency).await?));
        }
        let quic_mtu = quic.close();
        quic_local.close();
        local_server.close();
        drop(server_process);
        Ok(TransferScenario {
            scenario: "transfer",
            chunks: sizes.len(),
            bytes,
            concurrency,
            rounds,
            peer_mb_s: median(&peer),
            quic_raw_mb_s: median(&raw),
            quic_raw_in_process_mb_s: median(&raw_local),
            tcp_raw_mb_s: median(&tcp),
            quic_mtu,
            peer_rounds_mb_s: peer,
            quic_raw_rounds_mb_s: raw,
            quic_raw_in_process_rounds_mb_s: raw_local,
            tcp_raw_rounds_mb_s: tcp,
        })
    })
}

/// Fetches every shard once from `addr`, `concurrency` at a time; returns
/// the chunk sizes in shard order.
async fn peer_round(
    link: &Arc<PeerLink>,
    addr: SocketAddr,
    version: granary_proto::DatasetVersion,
    shards: &[(ShardId, u64)],
    concurrency: usize,
) -> Result<Vec<u64>> {
    let sem = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, &(shard, expected_len)) in shards.iter().enumerate() {
        let permit = sem.clone().acquire_owned().await?;
        let link = link.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let buf = link
                .fetch(
                    addr,
                    0,
                    version,
                    shard,
                    &granary_proto::chunk::Expected::Len(expected_len),
                    Duration::from_secs(120),
                )
                .await?;
            Ok::<_, anyhow::Error>((i, buf.len() as u64))
        });
    }
    let mut sizes = vec![0; shards.len()];
    while let Some(r) = tasks.join_next().await {
        let (i, n) = r??;
        sizes[i] = n;
    }
    Ok(sizes)
}

/// A bare quinn server with the node's TLS identity and transport
/// settings: on each new stream the client sends the size it wants, the
/// server answers that many bytes from one shared buffer (as shared `Bytes`
/// slices, as the node sends its chunks).
struct RawQuicServer {
    endpoint: quinn::Endpoint,
    serving: tokio::task::JoinHandle<()>,
}

impl RawQuicServer {
    /// Serves on 127.0.0.1:0 on the current runtime.
    fn start(identity: &Identity, max_chunk: u64) -> Result<Self> {
        let endpoint = tls::server_endpoint(identity, "127.0.0.1:0".parse()?, identity.server_config(&[ALPN_PEER])?)?;
        let payload = bytes::Bytes::from(vec![0x5au8; max_chunk as usize]);
        let serving = tokio::spawn({
            let endpoint = endpoint.clone();
            async move {
                while let Some(incoming) = endpoint.accept().await {
                    let payload = payload.clone();
                    tokio::spawn(async move {
                        let Ok(conn) = incoming.await else { return };
                        while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                            let payload = payload.clone();
                            tokio::spawn(async move {
                                let mut len = [0u8; 8];
                                if recv.read_exact(&mut len).await.is_ok() {
                                    let n = (u64::from_le_bytes(len) as usize).min(payload.len());
                                    let _ = send.write_chunk(payload.slice(..n)).await;
                                    let _ = send.finish();
                                }
                            });
                        }
                    });
                }
            }
        });
        Ok(Self { endpoint, serving })
    }

    fn addr(&self) -> Result<SocketAddr> {
        Ok(self.endpoint.local_addr()?)
    }

    fn close(self) {
        self.endpoint.close(0u32.into(), b"done");
        self.serving.abort();
    }
}

/// `granary bench quic-serve`: a [`RawQuicServer`] in a process of its own,
/// as a peer node is, so that the bare-quinn baseline of the transfer
/// scenario has the same process layout as the peer fetch. Prints its
/// address as the first line of stdout and serves until stdin closes.
pub fn serve_raw_quic(certs: &Path, max_chunk: u64) -> Result<()> {
    use std::io::{Read, Write};
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        let identity = Identity::load(certs, "node").context("loading the node certificate")?;
        let server = RawQuicServer::start(&identity, max_chunk)?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", server.addr()?)?;
        out.flush()?;
        drop(out);
        tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        })
        .await?;
        server.close();
        Ok(())
    })
}

/// A `granary bench quic-serve` child process.
struct RawQuicProcess {
    child: std::process::Child,
    addr: SocketAddr,
}

impl RawQuicProcess {
    fn spawn(exe: &Path, certs: &Path, max_chunk: u64) -> Result<Self> {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let mut child = Command::new(exe)
            .args(["bench", "quic-serve", "--bytes", &max_chunk.to_string()])
            .arg("--certs")
            .arg(certs)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {} bench quic-serve", exe.display()))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("quic-serve has no stdout"))?;
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line)?;
        let addr = line.trim().parse().with_context(|| format!("quic-serve printed {line:?}, not an address"));
        // Owned before the parse can fail, so that Drop stops the child.
        let mut proc = Self { child, addr: SocketAddr::from(([127, 0, 0, 1], 0)) };
        proc.addr = addr?;
        Ok(proc)
    }
}

impl Drop for RawQuicProcess {
    fn drop(&mut self) {
        // Closing stdin asks it to stop; kill if it does not.
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One connection to a bare quinn server.
struct RawQuicClient {
    endpoint: quinn::Endpoint,
    conn: quinn::Connection,
}

impl RawQuicClient {
    async fn connect(identity: &Identity, addr: SocketAddr) -> Result<Self> {
        let endpoint = tls::endpoint("127.0.0.1:0".parse()?, None)?;
        let conn = endpoint.connect_with(identity.client_config(ALPN_PEER)?, addr, Role::Node.server_name())?.await?;
        Ok(Self { endpoint, conn })
    }

    /// Seconds to move `work` (chunk sizes), one stream per chunk,
    /// `concurrency` at a time, each into a fresh heap buffer.
    async fn round(&self, work: &[u64], concurrency: usize) -> Result<f64> {
        let sem = Arc::new(tokio::sync::Semaphore::new(concurrency));
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for &n in work {
            let permit = sem.clone().acquire_owned().await?;
            let conn = self.conn.clone();
            tasks.spawn(async move {
                let _permit = permit;
                let (mut send, mut recv) = conn.open_bi().await?;
                send.write_all(&n.to_le_bytes()).await?;
                let _ = send.finish();
                let mut buf = AlignedBuf::zeroed(n as usize);
                recv.read_exact(buf.as_mut_slice()).await?;
                Ok::<_, anyhow::Error>(())
            });
        }
        while let Some(r) = tasks.join_next().await {
            r??;
        }
        Ok(start.elapsed().as_secs_f64())
    }

    /// Closes the connection; returns the path MTU it reached.
    fn close(self) -> u16 {
        let mtu = self.conn.stats().path.current_mtu;
        self.conn.close(0u32.into(), b"done");
        self.endpoint.close(0u32.into(), b"done");
        mtu
    }
}

/// Seconds to move `work` over kernel TCP on loopback: `concurrency`
/// connections, each asking for one chunk at a time.
async fn tcp_raw(work: &[u64], concurrency: usize) -> Result<f64> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let max = work.iter().copied().max().unwrap_or(0) as usize;
    let payload = Arc::new(vec![0x5au8; max]);
    let serving = tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let payload = payload.clone();
            tokio::spawn(async move {
                let mut len = [0u8; 8];
                while sock.read_exact(&mut len).await.is_ok() {
                    let n = (u64::from_le_bytes(len) as usize).min(payload.len());
                    if sock.write_all(&payload[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let queue = Arc::new(std::sync::Mutex::new(work.to_vec()));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let queue = queue.clone();
        tasks.spawn(async move {
            let mut sock = tokio::net::TcpStream::connect(addr).await?;
            sock.set_nodelay(true)?;
            loop {
                let next = queue.lock().map_err(|_| anyhow!("queue lock"))?.pop();
                let Some(n) = next else { return Ok::<_, anyhow::Error>(()) };
                sock.write_all(&n.to_le_bytes()).await?;
                let mut buf = AlignedBuf::zeroed(n as usize);
                sock.read_exact(buf.as_mut_slice()).await?;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let secs = start.elapsed().as_secs_f64();
    serving.abort();
    Ok(secs)
}
