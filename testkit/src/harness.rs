//! Real processes for demos and benchmarks: the node daemon and trainer
//! ranks, started from the `granary` binary, stopped by handle, every wait
//! bounded.

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// The last 20 lines of a child's log file (empty if unreadable), without
/// backtrace frames, and with the error a child exited with (`Error: …`
/// and its causes, as `main` prints it) always included: with
/// `RUST_BACKTRACE` set, the frames alone would fill the tail.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    tail_of(&text)
}

fn tail_of(text: &str) -> String {
    let is_frame = |l: &str| {
        let t = l.trim_start();
        t.starts_with("at ")
            || t.split_once(": ").is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let lines: Vec<&str> = text.lines().filter(|l| !is_frame(l)).collect();
    let mut start = lines.len().saturating_sub(20);
    if let Some(err) = lines.iter().rposition(|l| l.starts_with("Error: ")) {
        start = start.min(err);
    }
    lines[start..].join("\n")
}

/// A child's environment: errors a child returns from `main` print without
/// a backtrace even where `RUST_BACKTRACE` is set (panics keep theirs).
fn quiet_errors(cmd: &mut Command) -> &mut Command {
    cmd.env("RUST_LIB_BACKTRACE", "0")
}

/// A node daemon child process.
pub struct NodeProcess {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl NodeProcess {
    /// Starts `exe node --config config` and waits (up to `timeout`) until its
    /// socket accepts connections.
    pub fn spawn(exe: &Path, config: &Path, socket: &Path, log: &Path, timeout: Duration) -> Result<Self> {
        let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let child = quiet_errors(&mut Command::new(exe))
            .arg("node")
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {} node", exe.display()))?;
        let mut node = Self { child, socket: socket.to_path_buf(), log: log.to_path_buf() };
        let deadline = Instant::now() + timeout;
        loop {
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return Ok(node);
            }
            if let Some(status) = node.child.try_wait()? {
                bail!("node exited with {status} before serving:\n{}", node.log_tail());
            }
            if Instant::now() > deadline {
                bail!("node did not serve {} within {timeout:?}:\n{}", socket.display(), node.log_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The last lines of the daemon's log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// Asks the daemon to stop (SIGTERM: it finishes writing its SSD tier)
    /// and waits up to `timeout` for it to exit.
    pub fn terminate(mut self, timeout: Duration) -> Result<()> {
        // SAFETY: kill(2) on our own child, which has not been reaped (we
        // hold its handle), so the pid is still ours.
        let rc = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        if rc != 0 {
            bail!("SIGTERM to node {}: {}", self.child.id(), std::io::Error::last_os_error());
        }
        let deadline = Instant::now() + timeout;
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                bail!("node did not stop within {timeout:?} of SIGTERM:\n{}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Stops the daemon (SIGKILL through its handle) and reaps it.
    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Memory of a process, from /proc/PID/status, in bytes.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ProcMemory {
    /// Anonymous resident memory.
    pub rss_anon: u64,
    /// File-backed resident memory.
    pub rss_file: u64,
    /// Resident shared memory (memory files the process touched).
    pub rss_shmem: u64,
}

/// Reads /proc/PID/status.
pub fn proc_memory(pid: u32) -> Result<ProcMemory> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    Ok(ProcMemory { rss_anon: field("RssAnon:"), rss_file: field("RssFile:"), rss_shmem: field("RssShmem:") })
}

/// One line a trainer rank prints on stdout.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TrainerEvent {
    /// Connected and planned; waiting for `epoch N` lines on stdin.
    Ready {
        /// Rank.
        rank: u32,
        /// Batches per epoch.
        batches: u64,
    },
    /// Progress within an epoch.
    Progress {
        /// Rank.
        rank: u32,
        /// Epoch.
        epoch: u64,
        /// Batches done.
        done: u64,
    },
    /// An epoch finished.
    Epoch {
        /// Rank.
        rank: u32,
        /// Epoch.
        epoch: u64,
        /// Rows delivered.
        rows: u64,
        /// Tensor bytes delivered.
        bytes: u64,
        /// Seconds from the `epoch` command to the last batch.
        secs: f64,
        /// Hash of the sequence of batch checksums, hex.
        digest: String,
    },
    /// The rank failed.
    Error {
        /// Rank.
        rank: u32,
        /// What failed.
        message: String,
    },
}

/// A trainer rank child process.
pub struct TrainerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    events: Receiver<Result<TrainerEvent, String>>,
    /// The rank.
    pub rank: u32,
}

impl TrainerProcess {
    /// Starts `exe trainer ARGS` as one of `local_world` ranks on this host
    /// (`LOCAL_WORLD_SIZE`, as torchrun sets it: the loader shares the
    /// host's cores among them); the reader thread parses its stdout.
    pub fn spawn(exe: &Path, rank: u32, local_world: usize, args: &[String]) -> Result<Self> {
        let mut child = quiet_errors(&mut Command::new(exe))
            .arg("trainer")
            .args(args)
            .env("LOCAL_WORLD_SIZE", local_world.max(1).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting trainer rank {rank}"))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("trainer stdout missing"))?;
        let stdin = child.stdin.take();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let ev = serde_json::from_str::<TrainerEvent>(&line).map_err(|e| format!("{e}: {line}"));
                if tx.send(ev).is_err() {
                    break;
                }
            }
        });
        Ok(Self { child, stdin, events: rx, rank })
    }

    /// Tells the rank to run `epoch`.
    pub fn start_epoch(&mut self, epoch: u64) -> Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| anyhow!("trainer stdin closed"))?;
        writeln!(stdin, "epoch {epoch}")?;
        stdin.flush()?;
        Ok(())
    }

    /// The next event, waiting at most `timeout`.
    pub fn next_event(&self, timeout: Duration) -> Result<TrainerEvent> {
        match self.events.recv_timeout(timeout) {
            Ok(Ok(ev)) => Ok(ev),
            Ok(Err(line)) => bail!("rank {} printed an unreadable line: {line}", self.rank),
            Err(RecvTimeoutError::Timeout) => bail!("rank {} said nothing for {timeout:?}", self.rank),
            Err(RecvTimeoutError::Disconnected) => bail!("rank {} exited", self.rank),
        }
    }

    /// Closes stdin (the rank exits) and waits for it, bounded.
    pub fn finish(mut self, timeout: Duration) -> Result<()> {
        drop(self.stdin.take());
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return if status.success() { Ok(()) } else { Err(anyhow!("rank {} exited with {status}", self.rank)) };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        bail!("rank {} did not exit within {timeout:?}", self.rank)
    }
}

impl Drop for TrainerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reserves a loopback UDP port by binding and releasing it. Coordinators
/// need fixed ports (a voter's address is part of the replicated
/// membership, so a restarted voter must return to it).
pub fn reserve_udp_port() -> Result<std::net::SocketAddr> {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").context("binding a UDP port")?;
    Ok(s.local_addr()?)
}

/// How to start one coordinator voter.
#[derive(Clone, Debug)]
pub struct VoterSpec {
    /// Voter id.
    pub id: u64,
    /// Its address.
    pub addr: std::net::SocketAddr,
    /// Its data folder.
    pub data_dir: PathBuf,
}

/// A coordinator voter child process.
pub struct CoordinatorProcess {
    child: Child,
    id: u64,
    log: PathBuf,
}

impl CoordinatorProcess {
    /// Starts `exe coordinator --json` for `me` in the group `voters`, with
    /// `certs` and any `extra` arguments, and waits (up to `timeout`) for its
    /// ready line.
    pub fn spawn(
        exe: &Path,
        me: &VoterSpec,
        voters: &[VoterSpec],
        certs: &Path,
        extra: &[String],
        log: &Path,
        timeout: Duration,
    ) -> Result<Self> {
        let peers = voters.iter().map(|v| format!("{}={}", v.id, v.addr)).collect::<Vec<_>>().join(",");
        // Appended, so a restarted voter's log follows its previous life's.
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let mut child = quiet_errors(&mut Command::new(exe))
            .args(["coordinator", "--json", "--id", &me.id.to_string(), "--listen", &me.addr.to_string()])
            .args(["--peers", &peers])
            .arg("--data-dir")
            .arg(&me.data_dir)
            .arg("--certs")
            .arg(certs)
            .args(extra)
            .env("GRANARY_LOG", std::env::var("GRANARY_LOG").unwrap_or_else(|_| "info,openraft=warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {} coordinator", exe.display()))?;
        let stdout = child.stdout.take().context("coordinator stdout")?;
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let mut p = Self { child, id: me.id, log: log.to_path_buf() };
        let line = match rx.recv_timeout(timeout) {
            Ok(l) if !l.is_empty() => l,
            _ => bail!("voter {} did not report ready within {timeout:?}:\n{}", me.id, p.log_tail()),
        };
        let ready: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("voter {} ready line {line:?}", me.id))?;
        if ready["addr"] != me.addr.to_string() {
            let _ = p.child.kill();
            bail!("voter {} serves on {} instead of {}", me.id, ready["addr"], me.addr);
        }
        Ok(p)
    }

    /// Voter id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// SIGKILL through the handle, then reap.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for CoordinatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How to start a [`LocalCluster`].
#[derive(Clone, Debug)]
pub struct LocalClusterSpec {
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
}

impl Default for LocalClusterSpec {
    fn default() -> Self {
        Self {
            nodes: 3,
            ram_bytes: 1 << 30,
            guest_bytes: 1 << 30,
            ssd_bytes: None,
            prefetch_bytes: 256 << 20,
            loads: 4,
            convert_threads: 2,
            throttle: None,
            lease_ms: 1500,
        }
    }
}

/// A cluster of real processes on loopback: one coordinator voter and node
/// daemons 1..=N with `[cluster]` configs and no `[[dataset]]`, serving the
/// generated dataset, which is registered as `ads` on the coordinator: each
/// node opens it when the placement watch lists it. Everything is stopped
/// on drop.
pub struct LocalCluster {
    exe: PathBuf,
    dir: PathBuf,
    certs: PathBuf,
    spec: LocalClusterSpec,
    coordinator: std::net::SocketAddr,
    _voter: CoordinatorProcess,
    /// Peer address per node id - 1, kept across restarts.
    advertise: Vec<std::net::SocketAddr>,
    nodes: Vec<Option<NodeProcess>>,
}

impl LocalCluster {
    /// Creates certificates, starts the voter, registers `data` as `ads`,
    /// starts the nodes and waits until each knows the placement of all of
    /// them.
    pub fn start(exe: &Path, dir: &Path, data: &Path, spec: LocalClusterSpec) -> Result<Self> {
        let certs = dir.join("certs");
        granary_net::tls::init_cluster(&certs).context("creating cluster certificates")?;
        let voter = VoterSpec { id: 1, addr: reserve_udp_port()?, data_dir: dir.join("voter-1") };
        let extra: Vec<String> = ["--lease-ms", &spec.lease_ms.to_string(), "--election-timeout-ms", "300"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let proc = CoordinatorProcess::spawn(
            exe,
            &voter,
            std::slice::from_ref(&voter),
            &certs,
            &extra,
            &dir.join("voter-1.log"),
            Duration::from_secs(30),
        )?;
        add_dataset(exe, voter.addr, &certs, dir, "ads", data).map_err(|e| anyhow!("{e:#}\n{}", proc.log_tail()))?;
        let advertise = (0..spec.nodes).map(|_| reserve_udp_port()).collect::<Result<Vec<_>>>()?;
        let mut c = Self {
            exe: exe.to_path_buf(),
            dir: dir.to_path_buf(),
            certs,
            coordinator: voter.addr,
            _voter: proc,
            advertise,
            nodes: (0..spec.nodes).map(|_| None).collect(),
            spec,
        };
        for id in 1..=c.spec.nodes as u64 {
            c.start_node(id)?;
        }
        let all: Vec<u64> = (1..=c.spec.nodes as u64).collect();
        c.wait_placement(&all, c.spec.nodes, 1, Duration::from_secs(60))?;
        Ok(c)
    }

    /// Registers the Parquet files in `data` as dataset `name` (the
    /// generator's view) on the coordinator.
    pub fn add_dataset(&self, name: &str, data: &Path) -> Result<()> {
        add_dataset(&self.exe, self.coordinator, &self.certs, &self.dir, name, data)
    }

    /// Node ids, 1..=N.
    pub fn node_ids(&self) -> Vec<u64> {
        (1..=self.spec.nodes as u64).collect()
    }

    fn node_dir(&self, id: u64) -> PathBuf {
        self.dir.join(format!("node-{id}"))
    }

    /// Node `id`'s Unix socket.
    pub fn socket(&self, id: u64) -> PathBuf {
        self.node_dir(id).join("node.sock")
    }

    /// Node `id`'s log file.
    pub fn log(&self, id: u64) -> PathBuf {
        self.dir.join(format!("node-{id}.log"))
    }

    /// The last lines of node `id`'s log.
    pub fn log_tail(&self, id: u64) -> String {
        log_tail(&self.log(id))
    }

    /// The coordinator's address.
    pub fn coordinator(&self) -> std::net::SocketAddr {
        self.coordinator
    }

    /// The cluster's certificate folder.
    pub fn certs(&self) -> &Path {
        &self.certs
    }

    /// Node `id`'s peer (QUIC) address.
    pub fn peer_addr(&self, id: u64) -> std::net::SocketAddr {
        self.advertise[(id - 1) as usize]
    }

    /// The node.toml of node `id`.
    fn node_toml(&self, id: u64) -> String {
        let s = &self.spec;
        let dir = self.node_dir(id);
        let mut t = format!(
            "socket = {:?}\nram_bytes = {}\nguest_bytes = {}\nprefetch_bytes = {}\nmax_concurrent_loads = {}\nconvert_threads = {}\n",
            self.socket(id),
            s.ram_bytes,
            s.guest_bytes,
            s.prefetch_bytes,
            s.loads,
            s.convert_threads
        );
        if let Some(ssd) = s.ssd_bytes {
            // Blocks of an eighth of the tier (at most the default 64 MiB):
            // small test tiers stay small on disk, where it is reserved.
            let block = (ssd / 8 / 4096 * 4096).clamp(8192, 64 << 20);
            t += &format!("ssd_dir = {:?}\nssd_bytes = {ssd}\nssd_block_bytes = {block}\n", dir.join("ssd"));
        }
        if let Some((latency_ms, bw)) = s.throttle {
            t += &format!("\n[throttle]\nlatency_ms = {latency_ms}\nbandwidth_bytes_per_s = {bw}\n");
        }
        t += &format!(
            "\n[cluster]\ncoordinators = [\"{}\"]\ncerts = {:?}\nnode_id = {id}\nadvertise = \"{}\"\n",
            self.coordinator,
            self.certs,
            self.peer_addr(id)
        );
        // No [[dataset]]: the node opens what the coordinator lists.
        t
    }

    /// Starts (or restarts) node `id` and waits until its socket serves.
    pub fn start_node(&mut self, id: u64) -> Result<()> {
        let dir = self.node_dir(id);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let config = dir.join("node.toml");
        std::fs::write(&config, self.node_toml(id))?;
        let p = NodeProcess::spawn(&self.exe, &config, &self.socket(id), &self.log(id), Duration::from_secs(60))?;
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
        }
        Ok(t)
    }
}

/// `granary dataset add NAME --source file://DATA/` with the generator's view.
fn add_dataset(
    exe: &Path,
    coordinator: std::net::SocketAddr,
    certs: &Path,
    dir: &Path,
    name: &str,
    data: &Path,
) -> Result<()> {
    let view = dir.join("view.toml");
    std::fs::write(&view, crate::datagen::VIEW_TOML)?;
    let out = Command::new(exe)
        .args(["dataset", "add", name, "--source", &format!("file://{}/", data.display())])
        .arg("--view")
        .arg(&view)
        .args(["--coordinators", &coordinator.to_string(), "--cert-name", "admin", "--timeout-ms", "30000"])
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

/// Starts one trainer per entry of `sockets` (rank i on `sockets[i]`) with
/// the common `args`, and waits for each to be ready. Returns the ranks and
/// the batches per epoch.
pub fn spawn_ranks(exe: &Path, sockets: &[PathBuf], args: &[String]) -> Result<(Vec<TrainerProcess>, u64)> {
    let world = sockets.len();
    let mut ranks = Vec::with_capacity(world);
    for (r, socket) in sockets.iter().enumerate() {
        let mut a = vec![
            "--socket".to_string(),
            socket.display().to_string(),
            "--rank".into(),
            r.to_string(),
            "--world".into(),
            world.to_string(),
        ];
        a.extend_from_slice(args);
        let local = sockets.iter().filter(|s| *s == socket).count();
        ranks.push(TrainerProcess::spawn(exe, r as u32, local, &a)?);
    }
    let mut batches = 0;
    for t in &ranks {
        match t.next_event(Duration::from_secs(120))? {
            TrainerEvent::Ready { batches: b, .. } => batches = b,
            TrainerEvent::Error { message, .. } => bail!("rank {} failed: {message}", t.rank),
            other => bail!("rank {}: unexpected event {other:?}", t.rank),
        }
    }
    Ok((ranks, batches))
}

/// One epoch over a set of ranks.
#[derive(Clone, Debug, Default)]
pub struct EpochOutcome {
    /// Rows delivered over all ranks.
    pub rows: u64,
    /// Tensor bytes delivered over all ranks.
    pub bytes: u64,
    /// Wall time from the start command to the last rank's end.
    pub secs: f64,
    /// Rank -> digest of its batch checksums.
    pub digests: BTreeMap<u32, String>,
}

/// Runs `epoch` on every rank at once and waits for all of them; `progress`
/// sees (rank, batches done).
pub fn run_epoch(
    ranks: &mut [TrainerProcess],
    epoch: u64,
    timeout: Duration,
    mut progress: impl FnMut(u32, u64),
) -> Result<EpochOutcome> {
    let start = Instant::now();
    for t in ranks.iter_mut() {
        t.start_epoch(epoch)?;
    }
    let mut out = EpochOutcome::default();
    for t in ranks.iter() {
        loop {
            match t.next_event(timeout)? {
                TrainerEvent::Progress { done, .. } => progress(t.rank, done),
                TrainerEvent::Epoch { rows, bytes, digest, .. } => {
                    out.rows += rows;
                    out.bytes += bytes;
                    out.digests.insert(t.rank, digest);
                    break;
                }
                TrainerEvent::Error { message, .. } => bail!("rank {} failed: {message}", t.rank),
                other => bail!("rank {}: unexpected event {other:?}", t.rank),
            }
        }
    }
    out.secs = start.elapsed().as_secs_f64();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::tail_of;

    #[test]
    fn a_log_tail_keeps_the_error_and_drops_backtrace_frames() {
        let mut log =
            String::from("INFO starting\nError: ssd folder /x: no space\n\nCaused by:\n    full\n\nStack backtrace:\n");
        for i in 0..40 {
            log += &format!("  {i}: some::frame\n             at ./src/x.rs:{i}:5\n");
        }
        let tail = tail_of(&log);
        assert!(tail.contains("Error: ssd folder /x: no space"), "{tail}");
        assert!(tail.contains("full") && !tail.contains("some::frame") && !tail.contains("at ./src"), "{tail}");
        // The error stays in the tail however much was logged after it.
        let later: String = (0..30).map(|i| format!("INFO shutting down {i}\n")).collect();
        let tail = tail_of(&format!("Error: refused\n{later}"));
        assert!(tail.starts_with("Error: refused") && tail.ends_with("down 29"), "{tail}");
        let plain: String = (0..30).map(|i| format!("line {i}\n")).collect();
        assert_eq!(tail_of(&plain).lines().count(), 20);
        assert!(tail_of(&plain).starts_with("line 10"));
    }
}
