//! `granary doctor`'s measurements and its verdict, as pure code: which
//! stage bounds a job's throughput, from two snapshots of cumulative clocks
//! taken a few seconds apart.
//!
//! Each rank's loader keeps [`RankTimes`] (the trainer waiting inside
//! `next()`, the trainer's own step between calls, the loader waiting for
//! chunks, assembly) and reports them to its node; the node keeps
//! [`NodeStages`] (remote reads, queueing for a converter, conversion, peer
//! fetches). [`diagnose`] takes the differences over the window and names
//! one stage:
//!
//! 1. no rank read a batch: [`Stage::Idle`];
//! 2. no rank waits in `next()` for a quarter of its time: the trainer
//!    bounds the job ([`Stage::Trainer`]), nothing in Granary would help;
//! 3. the rank that waits most: its assembly threads busier than its loader
//!    waits for chunks: [`Stage::Assembly`];
//! 4. else the loader waits for chunks: the node's largest stage over the
//!    window (remote read, conversion with its queue, peer fetch), or, when
//!    the node loads almost nothing, the node itself ([`Stage::Node`]:
//!    chunks come from its tiers, slowly).

use serde::{Deserialize, Serialize};

/// One rank's loader clocks, cumulative since it started (nanoseconds).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct RankTimes {
    /// Batches handed to the trainer.
    pub batches: u64,
    /// Time the trainer waited inside `next()` for a batch.
    pub waiting_ns: u64,
    /// Time between `next()` calls: the trainer's own step.
    pub training_ns: u64,
    /// Time the loader waited for chunks from its source.
    pub chunk_wait_ns: u64,
    /// Time spent assembling batches, summed over the assembly threads.
    pub assembly_ns: u64,
    /// Assembly threads (1: the loader's own thread assembles).
    pub assembly_threads: u32,
}

/// A rank's report to its node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct RankReport {
    /// The dataset it reads.
    pub dataset: String,
    /// Its rank.
    pub rank: u32,
    /// Ranks in its job.
    pub world: u32,
    /// Which loader: drawn when it is made, so two jobs on one host with
    /// the same rank and world keep their clocks apart.
    pub loader: u64,
    /// Its clocks.
    pub times: RankTimes,
}

/// The node's stage clocks, cumulative since it started (nanoseconds; a
/// stage's time sums over the loads running it at once).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct NodeStages {
    /// Reading row groups (and footers) from remote storage.
    pub remote_read_ns: u64,
    /// Loads waiting for a converter thread.
    pub convert_wait_ns: u64,
    /// Decoding and converting.
    pub convert_ns: u64,
    /// Fetching chunks from the nodes that own them.
    pub peer_fetch_ns: u64,
    /// Shards read and converted here.
    pub loads: u64,
    /// Bytes read from remote storage.
    pub remote_bytes: u64,
    /// Trainer chunk requests answered.
    pub chunk_requests: u64,
    /// Time those requests took, from asking to the chunk in hand.
    pub chunk_request_ns: u64,
}

/// The node settings a verdict names.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct NodeSettings {
    /// `max_concurrent_loads`.
    pub max_concurrent_loads: u32,
    /// Converter threads.
    pub convert_threads: u32,
    /// CPU cores the node sees.
    pub cores: u32,
    /// `prefetch_bytes`.
    pub prefetch_bytes: u64,
}

/// What the node answers `granary doctor`.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub struct DoctorSnapshot {
    /// The node's monotonic clock (nanoseconds since it started).
    pub at_ns: u64,
    /// Its stage clocks.
    pub stages: NodeStages,
    /// Its settings.
    pub settings: NodeSettings,
    /// The last report of each rank it serves (ranks silent for a minute
    /// are dropped).
    pub ranks: Vec<RankReport>,
}

/// The stage that bounds throughput.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// No rank read a batch in the window.
    Idle,
    /// The trainers' own steps.
    Trainer,
    /// Batch assembly in the loader.
    Assembly,
    /// Reads from remote storage.
    RemoteRead,
    /// Conversion on the node (and the queue for its threads).
    Conversion,
    /// Chunks fetched from the nodes that own them.
    PeerFetch,
    /// The node answering from its tiers.
    Node,
}

impl Stage {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Trainer => "trainer",
            Self::Assembly => "assembly",
            Self::RemoteRead => "remote read",
            Self::Conversion => "conversion",
            Self::PeerFetch => "peer fetch",
            Self::Node => "node",
        }
    }
}

/// One rank over the window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankShare {
    /// Its dataset.
    pub dataset: String,
    /// Its rank.
    pub rank: u32,
    /// Batches per second.
    pub batches_per_s: f64,
    /// Share of its time spent waiting inside `next()`.
    pub waiting: f64,
    /// Share of its time spent in its own step.
    pub training: f64,
    /// Share of the window its loader waited for chunks.
    pub chunk_wait: f64,
    /// Share of the window each assembly thread was busy (on average).
    pub assembly_busy: f64,
    /// Its assembly threads.
    pub assembly_threads: u32,
}

/// The node's stages over the window, in seconds of work per second (a
/// stage run by several loads at once can exceed 1).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageLoad {
    /// Remote reads.
    pub remote_read: f64,
    /// Waiting for a converter thread.
    pub convert_wait: f64,
    /// Converting.
    pub conversion: f64,
    /// Peer fetches.
    pub peer_fetch: f64,
    /// Remote storage throughput, bytes per second.
    pub remote_bytes_per_s: f64,
    /// Mean trainer chunk request, milliseconds.
    pub chunk_request_ms: f64,
}

/// The verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// The stage that bounds throughput.
    pub stage: Stage,
    /// One sentence with the numbers behind it.
    pub verdict: String,
    /// The setting that would help, or why none would.
    pub advice: String,
    /// The window, seconds.
    pub window_s: f64,
    /// Every rank that reported in the window, the starving one first.
    pub ranks: Vec<RankShare>,
    /// The node's stages.
    pub node: StageLoad,
}

/// Below this share of its time waiting in `next()`, a rank is not starved.
pub const STARVED: f64 = 0.25;

/// Below this share of the loader's chunk waits, the node's loading stages
/// are not what it waits for (chunks come from the tiers).
const LOADING: f64 = 0.1;

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn pct(share: f64) -> String {
    format!("{:.0}%", (share * 100.0).clamp(0.0, 100.0))
}

/// The verdict over the window between `before` and `after` (two snapshots
/// of the same node, `after` taken later).
pub fn diagnose(before: &DoctorSnapshot, after: &DoctorSnapshot) -> Diagnosis {
    if after.at_ns <= before.at_ns {
        // The node's clock went back: it restarted between the snapshots,
        // and its counters with it.
        return Diagnosis {
            stage: Stage::Idle,
            verdict: "the node restarted while it was measured: its clocks started again".to_string(),
            advice: "measure again".to_string(),
            window_s: 0.0,
            ranks: Vec::new(),
            node: StageLoad::default(),
        };
    }
    let window_ns = after.at_ns - before.at_ns;
    let window = secs(window_ns);
    let d = |f: fn(&NodeStages) -> u64| secs(f(&after.stages).saturating_sub(f(&before.stages)));
    let requests = after.stages.chunk_requests.saturating_sub(before.stages.chunk_requests);
    let node = StageLoad {
        remote_read: d(|s| s.remote_read_ns) / window,
        convert_wait: d(|s| s.convert_wait_ns) / window,
        conversion: d(|s| s.convert_ns) / window,
        peer_fetch: d(|s| s.peer_fetch_ns) / window,
        remote_bytes_per_s: after.stages.remote_bytes.saturating_sub(before.stages.remote_bytes) as f64 / window,
        chunk_request_ms: if requests == 0 { 0.0 } else { d(|s| s.chunk_request_ns) * 1e3 / requests as f64 },
    };
    let mut ranks: Vec<RankShare> = after
        .ranks
        .iter()
        .filter_map(|a| {
            let b = before
                .ranks
                .iter()
                .find(|b| b.loader == a.loader && b.dataset == a.dataset && b.rank == a.rank && b.world == a.world)
                .map(|b| b.times)
                .unwrap_or_default();
            let t = a.times;
            let delta = |f: fn(&RankTimes) -> u64| f(&t).saturating_sub(f(&b));
            let (waiting, training) = (secs(delta(|t| t.waiting_ns)), secs(delta(|t| t.training_ns)));
            let batches = delta(|t| t.batches);
            if batches == 0 && waiting == 0.0 {
                return None;
            }
            let spent = (waiting + training).max(f64::MIN_POSITIVE);
            let threads = t.assembly_threads.max(1);
            Some(RankShare {
                dataset: a.dataset.clone(),
                rank: a.rank,
                batches_per_s: batches as f64 / window,
                waiting: waiting / spent,
                training: training / spent,
                chunk_wait: secs(delta(|t| t.chunk_wait_ns)) / window,
                assembly_busy: secs(delta(|t| t.assembly_ns)) / f64::from(threads) / window,
                assembly_threads: threads,
            })
        })
        .collect();
    ranks.sort_by(|a, b| b.waiting.total_cmp(&a.waiting).then(a.rank.cmp(&b.rank)));
    let s = after.settings;
    let (stage, verdict, advice) = match ranks.first() {
        None => (
            Stage::Idle,
            format!("no rank read a batch from this node in {window:.1} s"),
            "start the trainers first, or measure for longer (--seconds)".to_string(),
        ),
        Some(r) if r.waiting < STARVED => (
            Stage::Trainer,
            format!(
                "the trainers bound throughput: rank {} (the one that waits most) spends {} of its time in its own step and waits {} for batches",
                r.rank,
                pct(r.training),
                pct(r.waiting)
            ),
            "nothing in Granary would help: batches are ready before the trainer asks".to_string(),
        ),
        Some(r) if r.assembly_busy > r.chunk_wait => (
            Stage::Assembly,
            format!(
                "rank {} waits {} of its time for batches of dataset {} while its {} assembly thread{} {} busy {} of the time and its loader waits for chunks {}",
                r.rank,
                pct(r.waiting),
                r.dataset,
                r.assembly_threads,
                if r.assembly_threads == 1 { "" } else { "s" },
                if r.assembly_threads == 1 { "is" } else { "are" },
                pct(r.assembly_busy),
                pct(r.chunk_wait)
            ),
            format!(
                "raise assembly_threads (now {}), or larger batches of block-shuffled views (Shuffle::Blocks) skip the copy",
                r.assembly_threads
            ),
        ),
        Some(r) => {
            let conversion = node.conversion + node.convert_wait;
            let loading = node.remote_read + conversion + node.peer_fetch;
            let waits =
                format!("rank {} waits {} of its time for chunks of dataset {}", r.rank, pct(r.waiting), r.dataset);
            if loading < LOADING * r.chunk_wait.max(f64::MIN_POSITIVE) {
                (
                    Stage::Node,
                    format!(
                        "{waits}, yet the node loads almost nothing: its chunk requests take {:.1} ms on average from its tiers",
                        node.chunk_request_ms
                    ),
                    "the node is short of CPU: give it cores of its own, or fewer ranks per node".to_string(),
                )
            } else if node.remote_read >= conversion && node.remote_read >= node.peer_fetch {
                (
                    Stage::RemoteRead,
                    format!(
                        "{waits}: the node spends {:.1} s of every second reading remote storage ({:.1} MB/s)",
                        node.remote_read,
                        node.remote_bytes_per_s / 1e6
                    ),
                    format!(
                        "the remote link bounds it: raise max_concurrent_loads (now {}) for more reads at once, and prefetch_bytes (now {} MiB) to read further ahead; an SSD tier keeps later epochs off the link",
                        s.max_concurrent_loads,
                        s.prefetch_bytes >> 20
                    ),
                )
            } else if conversion >= node.peer_fetch {
                (
                    Stage::Conversion,
                    format!(
                        "{waits}: the node spends {:.1} s of every second converting and {:.1} s queued for a converter",
                        node.conversion, node.convert_wait
                    ),
                    format!(
                        "conversion bounds it: convert_threads = {} on {} cores{}",
                        s.convert_threads,
                        s.cores,
                        if s.convert_threads < s.cores {
                            "; raise convert_threads"
                        } else {
                            "; every core converts already: a RAM tier that holds the dataset converts it once"
                        }
                    ),
                )
            } else {
                (
                    Stage::PeerFetch,
                    format!("{waits}: the node spends {:.1} s of every second fetching chunks from their owners", node.peer_fetch),
                    "the peer links bound it: check the network between nodes and the owners' load (granary doctor on them)"
                        .to_string(),
                )
            }
        }
    };
    Diagnosis { stage, verdict, advice, window_s: window, ranks, node }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn rank(rank: u32, times: RankTimes) -> RankReport {
        RankReport { dataset: "ads".into(), rank, world: 2, loader: 7, times }
    }

    fn snapshot(at: u64, stages: NodeStages, ranks: Vec<RankReport>) -> DoctorSnapshot {
        let settings =
            NodeSettings { max_concurrent_loads: 4, convert_threads: 1, cores: 2, prefetch_bytes: 256 << 20 };
        DoctorSnapshot { at_ns: at, stages, settings, ranks }
    }

    /// Two ranks over a 4 s window; rank 1's times given per second.
    fn window(
        waiting: f64,
        chunk_wait: f64,
        assembly: f64,
        threads: u32,
        stages: NodeStages,
    ) -> (DoctorSnapshot, DoctorSnapshot) {
        let per = |share: f64| (share * 4.0 * S as f64) as u64;
        let r1 = RankTimes {
            batches: 400,
            waiting_ns: per(waiting),
            training_ns: per(1.0 - waiting),
            chunk_wait_ns: per(chunk_wait),
            assembly_ns: per(assembly) * u64::from(threads),
            assembly_threads: threads,
        };
        let r0 = RankTimes { waiting_ns: per(waiting) / 2, training_ns: per(1.0 - waiting / 2.0), ..r1 };
        let before =
            snapshot(10 * S, NodeStages::default(), vec![rank(0, RankTimes::default()), rank(1, RankTimes::default())]);
        (before, snapshot(14 * S, stages, vec![rank(0, r0), rank(1, r1)]))
    }

    #[test]
    fn no_batches_is_idle() {
        let b = snapshot(S, NodeStages::default(), vec![rank(0, RankTimes { batches: 5, ..Default::default() })]);
        let a = snapshot(3 * S, NodeStages::default(), b.ranks.clone());
        let d = diagnose(&b, &a);
        assert_eq!(d.stage, Stage::Idle, "{d:?}");
        assert!(d.ranks.is_empty());
    }

    #[test]
    fn ranks_that_rarely_wait_are_trainer_bound() {
        let (b, a) = window(0.1, 0.05, 0.2, 2, NodeStages::default());
        let d = diagnose(&b, &a);
        assert_eq!(d.stage, Stage::Trainer, "{d:?}");
        assert!(d.verdict.contains("rank 1") && d.verdict.contains("90%"), "{}", d.verdict);
        assert!((d.window_s - 4.0).abs() < 1e-9);
        assert_eq!(d.ranks[0].rank, 1, "the rank that waits most first");
        assert!((d.ranks[0].batches_per_s - 100.0).abs() < 1e-9);
    }

    #[test]
    fn busy_assembly_threads_bound_a_starved_rank() {
        let (b, a) = window(0.6, 0.05, 0.95, 2, NodeStages::default());
        let d = diagnose(&b, &a);
        assert_eq!(d.stage, Stage::Assembly, "{d:?}");
        assert!(d.verdict.contains("2 assembly threads are busy 95%"), "{}", d.verdict);
        assert!(d.advice.contains("assembly_threads (now 2)"), "{}", d.advice);
    }

    #[test]
    fn a_rank_waiting_for_chunks_is_bound_by_the_nodes_largest_stage() {
        let stages = |remote: u64, wait: u64, convert: u64, peer: u64| NodeStages {
            remote_read_ns: remote * S / 10,
            convert_wait_ns: wait * S / 10,
            convert_ns: convert * S / 10,
            peer_fetch_ns: peer * S / 10,
            loads: 40,
            remote_bytes: 40 << 20,
            chunk_requests: 80,
            chunk_request_ns: 80 * S / 50,
        };
        let (b, a) = window(0.7, 0.8, 0.1, 2, stages(30, 1, 4, 0));
        let d = diagnose(&b, &a);
        assert_eq!(d.stage, Stage::RemoteRead, "{d:?}");
        assert!(d.verdict.contains("0.8 s of every second reading remote storage (10.5 MB/s)"), "{}", d.verdict);
        assert!(d.advice.contains("max_concurrent_loads (now 4)") && d.advice.contains("256 MiB"), "{}", d.advice);

        let (b, a) = window(0.7, 0.8, 0.1, 2, stages(2, 10, 30, 0));
        let d = diagnose(&b, &a);
        assert_eq!(d.stage, Stage::Conversion, "{d:?}");
        assert!(d.advice.contains("convert_threads = 1 on 2 cores; raise convert_threads"), "{}", d.advice);

        let (b, a) = window(0.7, 0.8, 0.1, 2, stages(1, 0, 1, 20));
        assert_eq!(diagnose(&b, &a).stage, Stage::PeerFetch);

        // Waiting for chunks while the node loads nothing: its tiers are slow.
        let (b, a) = window(0.7, 0.8, 0.1, 2, stages(0, 0, 0, 0));
        let d = diagnose(&b, &a);
        assert_eq!(d.stage, Stage::Node, "{d:?}");
        assert!(d.verdict.contains("20.0 ms on average"), "{}", d.verdict);
    }

    #[test]
    fn another_loader_with_the_same_rank_is_another_rank() {
        // A second job's rank 1 (another loader) appears in the window: its
        // clocks are not taken as the first job's rank 1 going backwards.
        let (b, mut a) = window(0.6, 0.05, 0.95, 2, NodeStages::default());
        let mut other = a.ranks[1].clone();
        other.loader = 8;
        a.ranks.push(other);
        let d = diagnose(&b, &a);
        assert_eq!(d.ranks.len(), 3, "{d:?}");
        assert!(d.ranks.iter().all(|r| r.batches_per_s > 0.0), "{d:?}");
    }

    #[test]
    fn a_rank_first_seen_in_the_window_counts_from_zero_and_clocks_never_run_backwards() {
        let (mut b, a) = window(0.7, 0.05, 0.9, 1, NodeStages::default());
        b.ranks.clear();
        assert_eq!(diagnose(&b, &a).stage, Stage::Assembly);
        // A node restarted between the snapshots: nothing underflows, and
        // the verdict says so.
        let d = diagnose(&a, &b);
        assert_eq!(d.stage, Stage::Idle);
        assert!(d.verdict.contains("restarted"), "{}", d.verdict);
    }
}
