//! Executing a seed's faults on the running cluster: kills, stops, power
//! cuts, SSD damage and write traps, link faults, and what the seed samples
//! while they run (process ids, memory, counters of retired nodes).

use super::config::{CORRUPT_WAIT, SSD_WRITE_WAIT};
use super::schedule::{Fault, Schedule, VoterPick};
use super::verdict::Observed;
use super::{powerfs, ssdfs};
use crate::relay::{LinkFaults, ProcessId, RelayHandle, Reorder};
use anyhow::{Context, Result, bail};
use granary_proto::rng::{Rng, seed_of};
use granary_testkit::harness::{ClusterCounters, LocalCluster, proc_memory};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
pub(super) const POWER_CUT_WAIT: Duration = Duration::from_secs(2);

/// How often the nodes' memory is sampled.
pub(super) const MEMORY_SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// One memory sample of node `id` if it runs (a sample it cannot answer,
/// as while it starts, is skipped).
pub(super) fn sample_memory(cluster: &LocalCluster, id: u64, obs: &mut Observed) {
    let Some(pid) = cluster.node_pid(id) else { return };
    let (Ok(mem), Ok(stats)) = (proc_memory(pid), cluster.stats(id)) else { return };
    obs.memory.entry(id).or_default().sample(mem.rss_anon, mem.rss_file, stats.chunk_memory_bytes);
}

pub(super) fn cluster_socket(dir: &Path, node: u64) -> PathBuf {
    dir.join(format!("node-{node}")).join("node.sock")
}

/// The relay's process ids: nodes first, then voters, then the chaos
/// client.
#[derive(Clone, Copy)]
pub(super) struct Pids {
    pub(super) nodes: u32,
    pub(super) voters: u32,
}

impl Pids {
    /// Node `id`.
    pub(super) fn node(&self, id: u64) -> ProcessId {
        ProcessId((id - 1) as u32)
    }

    /// Voter `id`.
    pub(super) fn voter(&self, id: u64) -> ProcessId {
        ProcessId(self.nodes + (id - 1) as u32)
    }

    /// The chaos client.
    pub(super) fn lin(&self) -> ProcessId {
        ProcessId(self.nodes + self.voters)
    }

    /// Every process.
    pub(super) fn all(&self) -> impl Iterator<Item = ProcessId> {
        (0..=self.nodes + self.voters).map(ProcessId)
    }

    /// What kind of link joins `a` and `b` (either way).
    pub(super) fn link_kind(&self, a: ProcessId, b: ProcessId) -> &'static str {
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
    pub(super) fn isolate(&self, relay: &RelayHandle, p: ProcessId) -> Result<()> {
        for other in self.all().filter(|&o| o != p) {
            relay.partition(p, other, false)?;
        }
        Ok(())
    }
}

pub(super) fn add(t: &mut ClusterCounters, s: &ClusterCounters) {
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

pub(super) fn link_faults(s: &Schedule) -> LinkFaults {
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
pub(super) fn ssd_entries(dir: &Path) -> Result<Vec<(PathBuf, usize, usize)>> {
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
pub(super) fn damage_ssd(dir: &Path, seed: u64, flips: u32) -> Result<u64> {
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
pub(super) fn kill_node(cluster: &mut LocalCluster, node: u64, retired: &mut ClusterCounters, obs: &mut Observed) {
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
pub(super) struct Arming {
    pub(super) kill: ssdfs::ArmedKill,
    pub(super) last: (u64, u64),
    pub(super) read_at: Instant,
}

/// The state of a seed's SSD faults.
pub(super) struct SsdFaults<'a> {
    /// The nodes' filesystems, if they could be mounted.
    pub(super) mounts: Option<&'a ssdfs::SsdMounts>,
    /// What [`SeedReport::ssd_fs`] says.
    pub(super) fs: String,
    pub(super) filled: u64,
    pub(super) write_kills: u64,
    /// The voters' folders, for power cuts.
    pub(super) voter_disks: powerfs::VoterDisks,
    pub(super) not_injected: Vec<String>,
    pub(super) armed: Vec<Arming>,
}

impl SsdFaults<'_> {
    /// Resolves the armed kills that are done: killed at the write, or
    /// (after [`SSD_WRITE_WAIT`], or at once with `now`) killed plainly.
    pub(super) fn poll_armed(
        &mut self,
        cluster: &mut LocalCluster,
        retired: &mut ClusterCounters,
        obs: &mut Observed,
        now: bool,
    ) {
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

pub(super) fn signal(pid: u32, sig: i32) -> Result<()> {
    // SAFETY: kill(2) on a child the cluster handle holds and has not
    // reaped, so the pid is still that child's.
    if unsafe { libc::kill(pid as i32, sig) } != 0 {
        bail!("signal {sig} to {pid}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The running voter `pick` names now, if any.
pub(super) fn pick_voter(cluster: &LocalCluster, pick: VoterPick) -> Result<Option<u64>> {
    let running: Vec<u64> = cluster.voter_ids().into_iter().filter(|&v| cluster.voter_running(v)).collect();
    let leader = cluster.leader(Duration::from_secs(2))?;
    Ok(match pick {
        VoterPick::Leader => leader.filter(|l| running.contains(l)).or(running.first().copied()),
        VoterPick::Follower => running.iter().copied().find(|&v| Some(v) != leader),
    })
}

/// Fires one edge of a fault.
#[allow(clippy::too_many_arguments)]
pub(super) fn apply(
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

/// What a scheduled action does.
#[derive(Clone, Copy)]
pub(super) enum Edge {
    Start,
    End,
}
