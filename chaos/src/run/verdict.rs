//! The invariants of a chaos run, judged from what the run observed (pure:
//! tested without processes).
//!
//! - `stream`: every rank's digest of every epoch equals the fault-free
//!   single-node reference (nothing lost, repeated, reordered or corrupt).
//! - `rank_error`: no trainer rank fails while its node runs.
//! - `progress`: every rank finishes its epochs within the seed's time.
//! - `remote_reads`: the cluster reads the dataset from remote storage
//!   once, plus what the schedule allows: a killed node's shards are read
//!   by their next owner and again by the node when they move back, and
//!   a live owner that its peers cannot reach (stopped, cut off) may cost
//!   the same; the bytes of answers the store cut short are read again; a
//!   voter fault, datagram noise, a 503 or a slow answer allow nothing.
//! - `linearizable`: the coordinator client's registrations and listings
//!   fit a grow-only set in real-time order (no acknowledged write lost,
//!   no read that goes back).
//! - `memory`: no node's footprint (resident anonymous and file memory,
//!   plus the chunk memory files it holds) ever sampled above its budget
//!   (RAM tier and guest area plus a tenth, its loads in flight, and a
//!   process allowance).
//! - `log`: no process log holds a panic or an internal error.
//! - `clean_stop`: every process stops cleanly at the end (ranks exit 0,
//!   nodes and voters exit 0 after SIGTERM).

use super::job::Job;
use super::schedule::{Fault, Schedule};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Details kept per invariant; the rest are counted.
const DETAILS_PER_INVARIANT: usize = 8;

/// Remote reads above the bound that are still accepted, as a share of
/// the dataset: footers read by more than one node, and the rounding of a
/// row group's bytes.
pub const REMOTE_SLACK: f64 = 0.05;

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which invariant.
    pub invariant: &'static str,
    /// What was seen.
    pub detail: String,
}

/// What a seed's run saw.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// (rank, epoch) -> digest of every epoch a rank finished.
    pub digests: BTreeMap<(u32, u64), String>,
    /// (rank, epoch, message) of every rank that failed while its node ran.
    pub rank_errors: Vec<(u32, u64, String)>,
    /// Set when ranks had not finished in time: which and where.
    pub stuck: Option<String>,
    /// Processes that did not stop cleanly, and counters that could not be
    /// read.
    pub unclean: Vec<String>,
    /// Log lines with a panic or an internal error, as `file:line: text`.
    pub log_hits: Vec<String>,
    /// Remote bytes read by every node in every life.
    pub remote_bytes: u64,
    /// Bytes the store sent in answers it cut short (read again after).
    pub wasted_bytes: u64,
    /// The coordinator client's history, judged.
    pub lin: Option<super::lin::LinReport>,
    /// Chunk entries damaged on SSD by the schedule.
    pub ssd_damaged: u64,
    /// Each node's largest sampled footprint, over all its lives.
    pub memory: BTreeMap<u64, NodeMemory>,
    /// A node's memory budget in bytes (0: not judged).
    pub memory_budget: u64,
    /// Peer chunks the nodes found to differ from their own conversion
    /// (every life).
    pub peer_mismatched: u64,
}

/// A node's memory at its largest sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NodeMemory {
    /// Resident anonymous + file memory + chunk memory files held.
    pub peak_footprint: u64,
    /// Resident anonymous memory at that sample.
    pub rss_anon: u64,
    /// Resident file-backed memory at that sample.
    pub rss_file: u64,
    /// Chunk memory files held at that sample (`NodeStats::chunk_memory_bytes`).
    pub chunk_memory: u64,
    /// Samples taken.
    pub samples: u64,
}

impl NodeMemory {
    /// Takes one sample into account.
    pub fn sample(&mut self, rss_anon: u64, rss_file: u64, chunk_memory: u64) {
        self.samples += 1;
        let footprint = rss_anon + rss_file + chunk_memory;
        if footprint > self.peak_footprint {
            *self = NodeMemory { peak_footprint: footprint, rss_anon, rss_file, chunk_memory, samples: self.samples };
        }
    }
}

/// A node's memory budget: its RAM tier and guest area plus a tenth (the
/// tiers' accounting is by chunk bytes, memory files round up to pages),
/// `loads` chunks of at most `largest_chunk` bytes in flight, each up to
/// three times its size while it is decoded, and `process` bytes for the
/// process itself (code, runtime, QUIC, buffers).
pub fn memory_budget(ram_bytes: u64, guest_bytes: u64, loads: u64, largest_chunk: u64, process: u64) -> u64 {
    (ram_bytes + guest_bytes) / 10 * 11 + loads * 3 * largest_chunk + process
}

impl Observed {
    /// Adds the lines of `path` that show a panic or an internal error.
    pub fn scan_log(&mut self, path: &Path) {
        let Ok(text) = std::fs::read_to_string(path) else { return };
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        self.log_hits.extend(bad_lines(&text).map(|(n, l)| format!("{name}:{n}: {}", l.trim())));
    }
}

/// Lines (1-based number, text) of `text` that show a panic or an
/// internal error.
pub fn bad_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().filter_map(|(i, l)| {
        let lower = l.to_ascii_lowercase();
        (lower.contains("panicked") || lower.contains("internal error")).then_some((i + 1, l))
    })
}

/// The remote reads `schedule` allows over `epochs`, as a multiple of the
/// dataset. A byzantine seed verifies every peer chunk, one remote read
/// each, and a verified guest copy that is evicted is fetched and
/// verified again: up to one dataset more per epoch.
pub fn remote_bound(schedule: &Schedule, nodes: u32, epochs: u64) -> f64 {
    let share = 1.0 / f64::from(nodes.max(1));
    let verified = if schedule.byzantine.is_some() { epochs as f64 } else { 0.0 };
    1.0 + verified
        + schedule
            .events
            .iter()
            .map(|e| match e.fault {
                Fault::KillNode { .. }
                | Fault::CorruptSsd { .. }
                | Fault::FillSsd { .. }
                | Fault::KillInSsdWrite { .. } => 2.0 * share,
                f if f.hides_an_owner() => 2.0 * share,
                _ => 0.0,
            })
            .sum::<f64>()
}

/// Every violation in `obs`.
pub fn judge(obs: &Observed, job: &Job, schedule: &Schedule, nodes: u32, epochs: u64) -> Vec<Violation> {
    let mut out: Vec<Violation> = Vec::new();
    let mut push = |invariant: &'static str, details: Vec<String>| {
        let n = details.len();
        for d in details.into_iter().take(DETAILS_PER_INVARIANT) {
            out.push(Violation { invariant, detail: d });
        }
        if n > DETAILS_PER_INVARIANT {
            out.push(Violation { invariant, detail: format!("and {} more", n - DETAILS_PER_INVARIANT) });
        }
    };
    let mut stream = Vec::new();
    for (&(rank, epoch), want) in job.reference.iter().filter(|((_, e), _)| *e < epochs) {
        match obs.digests.get(&(rank, epoch)) {
            None => stream.push(format!("rank {rank} epoch {epoch}: never delivered")),
            Some(got) if got != want => {
                stream.push(format!("rank {rank} epoch {epoch}: batches differ from the reference ({got} != {want})"))
            }
            Some(_) => {}
        }
    }
    push("stream", stream);
    push("rank_error", obs.rank_errors.iter().map(|(r, e, m)| format!("rank {r} failed in epoch {e}: {m}")).collect());
    push("progress", obs.stuck.iter().cloned().collect());
    let ratio = obs.remote_bytes as f64 / job.source_bytes.max(1) as f64;
    let bound = remote_bound(schedule, nodes, epochs) + obs.wasted_bytes as f64 / job.source_bytes.max(1) as f64;
    if ratio > bound + REMOTE_SLACK {
        push(
            "remote_reads",
            vec![format!("read {ratio:.2}x the dataset from remote storage; this schedule allows {bound:.2}x")],
        );
    }
    if let Some(l) = obs.lin.as_ref().filter(|l| l.verdict == "not linearizable") {
        push(
            "linearizable",
            vec![format!(
                "the coordinator's dataset registrations and listings ({} ops, {} acknowledged): {}",
                l.ops,
                l.acknowledged,
                l.detail.as_deref().unwrap_or("no order fits")
            )],
        );
    }
    if obs.memory_budget > 0 {
        let mut memory = Vec::new();
        for node in 1..=u64::from(nodes) {
            match obs.memory.get(&node) {
                None => memory.push(format!("node {node}: never sampled")),
                Some(m) if m.peak_footprint > obs.memory_budget => memory.push(format!(
                    "node {node} held {} MiB (resident {} MiB anonymous + {} MiB file, {} MiB of chunk memory files) \
                     over its budget of {} MiB",
                    m.peak_footprint >> 20,
                    m.rss_anon >> 20,
                    m.rss_file >> 20,
                    m.chunk_memory >> 20,
                    obs.memory_budget >> 20
                )),
                Some(_) => {}
            }
        }
        push("memory", memory);
    }
    if let Some(node) = schedule.byzantine
        && obs.peer_mismatched == 0
    {
        push("byzantine", vec![format!("node {node} forged every chunk it sent its peers, and no node caught one")]);
    }
    push("log", obs.log_hits.clone());
    push("clean_stop", obs.unclean.clone());
    out
}

#[cfg(test)]
mod tests {
    use super::super::schedule::{Event, Noise};
    use super::*;
    use std::time::Duration;

    fn job() -> Job {
        let reference = (0..2u32).flat_map(|r| (0..2u64).map(move |e| ((r, e), format!("d{r}{e}")))).collect();
        Job {
            store_root: "store".into(),
            data: "data".into(),
            source_bytes: 1000,
            reference,
            reference_secs: 1.0,
            converted_bytes: 2000,
            shards: 4,
        }
    }

    fn schedule(faults: &[Fault]) -> Schedule {
        let events = faults.iter().map(|&fault| Event { at: Duration::from_secs(1), fault }).collect();
        Schedule { seed: 1, events, noise: Noise::default(), store: Default::default(), byzantine: None }
    }

    fn clean() -> Observed {
        Observed { digests: job().reference, remote_bytes: 1000, ..Observed::default() }
    }

    #[test]
    fn a_clean_run_passes() {
        assert_eq!(judge(&clean(), &job(), &schedule(&[]), 3, 2), vec![]);
    }

    #[test]
    fn a_lost_or_changed_epoch_breaks_the_stream() {
        let mut o = clean();
        o.digests.remove(&(1, 1));
        o.digests.insert((0, 1), "other".into());
        let v = judge(&o, &job(), &schedule(&[]), 3, 2);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v.iter().all(|v| v.invariant == "stream"));
        assert!(v[0].detail.starts_with("rank 0 epoch 1: batches differ"), "{v:?}");
        assert_eq!(v[1].detail, "rank 1 epoch 1: never delivered");
    }

    #[test]
    fn remote_reads_are_bounded_by_the_faults_that_allow_them() {
        let kill = Fault::KillNode { node: 2, down: Duration::from_secs(1) };
        let voter = Fault::KillVoter { pick: super::super::schedule::VoterPick::Leader, down: Duration::from_secs(1) };
        let mut o = clean();
        o.remote_bytes = 1600;
        assert_eq!(judge(&o, &job(), &schedule(&[voter]), 3, 2)[0].invariant, "remote_reads");
        assert_eq!(judge(&o, &job(), &schedule(&[kill]), 3, 2), vec![]);
        o.remote_bytes = 1000 + 667 + 60;
        assert_eq!(judge(&o, &job(), &schedule(&[kill]), 3, 2).len(), 1);
        assert!((remote_bound(&schedule(&[kill, voter]), 4, 3) - 1.5).abs() < 1e-9);
    }

    #[test]
    fn a_forger_must_be_caught_and_verification_may_read_a_dataset_an_epoch() {
        let byzantine = Schedule { byzantine: Some(3), ..schedule(&[]) };
        let v = judge(&clean(), &job(), &byzantine, 3, 2);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].invariant, "byzantine");
        assert!(v[0].detail.contains("node 3 forged"), "{v:?}");
        let caught = Observed { peer_mismatched: 4, remote_bytes: 2900, ..clean() };
        assert_eq!(judge(&caught, &job(), &byzantine, 3, 2), vec![], "1 + 2 epochs of verification");
        assert!((remote_bound(&byzantine, 3, 2) - 3.0).abs() < 1e-9);
    }

    #[test]
    fn a_node_over_its_memory_budget_is_named_and_an_unsampled_one_too() {
        let mut o = clean();
        o.memory_budget = 100 << 20;
        let mut m = NodeMemory::default();
        m.sample(30 << 20, 10 << 20, 50 << 20);
        m.sample(20 << 20, 10 << 20, 10 << 20);
        assert_eq!((m.peak_footprint, m.chunk_memory, m.samples), (90 << 20, 50 << 20, 2));
        o.memory.insert(1, m);
        o.memory.insert(2, m);
        let v = judge(&o, &job(), &schedule(&[]), 2, 2);
        assert_eq!(v, vec![]);
        m.sample(40 << 20, 10 << 20, 60 << 20);
        o.memory.insert(2, m);
        let v = judge(&o, &job(), &schedule(&[]), 3, 2);
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(v[0].invariant, "memory");
        assert_eq!(
            v[0].detail,
            "node 2 held 110 MiB (resident 40 MiB anonymous + 10 MiB file, 60 MiB of chunk memory files) over its budget of 100 MiB"
        );
        assert_eq!(v[1].detail, "node 3: never sampled");
        assert_eq!(memory_budget(100, 0, 2, 10, 5), 110 + 60 + 5);
    }

    #[test]
    fn panics_and_internal_errors_in_logs_are_found_and_named() {
        let text = "INFO ok\nthread 'x' panicked at src/a.rs:1:2\nERROR Internal error: boom\nWARN retry\n";
        let hits: Vec<(usize, &str)> = bad_lines(text).collect();
        assert_eq!(hits.iter().map(|h| h.0).collect::<Vec<_>>(), vec![2, 3]);
        let mut o = clean();
        for i in 0..10 {
            o.log_hits.push(format!("node-1.log:{i}: panicked"));
        }
        let v = judge(&o, &job(), &schedule(&[]), 3, 2);
        assert_eq!(v.len(), DETAILS_PER_INVARIANT + 1);
        assert_eq!(v.last().map(|v| v.detail.as_str()), Some("and 2 more"));
    }

    #[test]
    fn rank_errors_stuck_ranks_and_unclean_stops_are_violations() {
        let mut o = clean();
        o.rank_errors.push((1, 0, "node gone".into()));
        o.stuck = Some("rank 1 in epoch 0".into());
        o.unclean.push("node 2: exited with signal 6".into());
        let kinds: Vec<&str> = judge(&o, &job(), &schedule(&[]), 3, 2).iter().map(|v| v.invariant).collect();
        assert_eq!(kinds, vec!["rank_error", "progress", "clean_stop"]);
    }
}
