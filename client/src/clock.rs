//! A rank's loader clocks ([`RankTimes`]): where its time goes, kept as
//! cumulative atomics by the loader's threads and handed to the node about
//! twice a second for `granary doctor`.
//!
//! - waiting: the trainer inside `next()`, waiting for a batch;
//! - training: the trainer between `next()` calls (its own step);
//! - chunk wait: the loader's walker waiting for chunks from the source;
//! - assembly: the assembly threads (or the walker) copying rows.

use granary_proto::doctor::RankTimes;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a rank reports its clocks to the node, at most.
pub(crate) const REPORT_EVERY: Duration = Duration::from_millis(500);

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// An id no other loader on the host is likely to have: the process, a
/// count of loaders made in it, and the time, hashed.
fn loader_id() -> u64 {
    static MADE: AtomicU64 = AtomicU64::new(0);
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let parts = [u64::from(std::process::id()), MADE.fetch_add(1, Ordering::Relaxed), nanos(since_epoch)];
    let bytes: Vec<u8> = parts.iter().flat_map(|p| p.to_le_bytes()).collect();
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

/// The clocks of one rank's loader, shared by its threads.
#[derive(Debug)]
pub(crate) struct RankClock {
    batches: AtomicU64,
    waiting_ns: AtomicU64,
    training_ns: AtomicU64,
    chunk_wait_ns: AtomicU64,
    assembly_ns: AtomicU64,
    assembly_threads: u32,
    /// Tells this loader's reports from another's with the same rank.
    id: u64,
    /// When the last `next()` returned (training runs from then), and when
    /// the clocks were last reported.
    marks: Mutex<Marks>,
}

#[derive(Debug)]
struct Marks {
    returned: Option<Instant>,
    reported: Instant,
}

impl RankClock {
    pub(crate) fn new(assembly_threads: usize) -> Self {
        Self {
            batches: AtomicU64::new(0),
            waiting_ns: AtomicU64::new(0),
            training_ns: AtomicU64::new(0),
            chunk_wait_ns: AtomicU64::new(0),
            assembly_ns: AtomicU64::new(0),
            assembly_threads: u32::try_from(assembly_threads.max(1)).unwrap_or(u32::MAX),
            id: loader_id(),
            marks: Mutex::new(Marks { returned: None, reported: Instant::now() }),
        }
    }

    fn marks(&self) -> std::sync::MutexGuard<'_, Marks> {
        // Plain timestamps: a panic elsewhere cannot leave them half-written.
        self.marks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `next()` was called at `now`: the trainer's step since the last
    /// return ends.
    pub(crate) fn asked(&self, now: Instant) {
        if let Some(returned) = self.marks().returned {
            self.training_ns.fetch_add(nanos(now.saturating_duration_since(returned)), Ordering::Relaxed);
        }
    }

    /// `next()` asked at `asked` returns a batch (or not) now; true when
    /// the clocks are due to be reported (then [`Self::reported`] once they
    /// were).
    pub(crate) fn returned(&self, asked: Instant, batch: bool) -> bool {
        let now = Instant::now();
        self.waiting_ns.fetch_add(nanos(now.saturating_duration_since(asked)), Ordering::Relaxed);
        if batch {
            self.batches.fetch_add(1, Ordering::Relaxed);
        }
        let mut marks = self.marks();
        marks.returned = Some(now);
        now.saturating_duration_since(marks.reported) >= REPORT_EVERY
    }

    /// The clocks reached the node now.
    pub(crate) fn reported(&self) {
        self.marks().reported = Instant::now();
    }

    /// An epoch ended: the time until the next one's first `next()`
    /// (evaluation, a checkpoint) is not the trainer's step.
    pub(crate) fn epoch_ended(&self) {
        self.marks().returned = None;
    }

    /// The walker waited `took` for a chunk.
    pub(crate) fn chunk_wait(&self, took: Duration) {
        self.chunk_wait_ns.fetch_add(nanos(took), Ordering::Relaxed);
    }

    /// One batch assembled in `took`.
    pub(crate) fn assembly(&self, took: Duration) {
        self.assembly_ns.fetch_add(nanos(took), Ordering::Relaxed);
    }

    /// This loader's id in its reports.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The clocks now.
    pub(crate) fn times(&self) -> RankTimes {
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RankTimes {
            batches: ld(&self.batches),
            waiting_ns: ld(&self.waiting_ns),
            training_ns: ld(&self.training_ns),
            chunk_wait_ns: ld(&self.chunk_wait_ns),
            assembly_ns: ld(&self.assembly_ns),
            assembly_threads: self.assembly_threads,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_runs_inside_next_and_training_between_calls() {
        let clock = RankClock::new(2);
        let t0 = Instant::now();
        clock.asked(t0);
        // The first call has no step before it.
        assert_eq!(clock.times().training_ns, 0);
        clock.returned(t0, true);
        let later = Instant::now() + Duration::from_millis(30);
        clock.asked(later);
        let t = clock.times();
        assert!(t.training_ns >= 30_000_000, "{t:?}");
        assert_eq!((t.batches, t.assembly_threads), (1, 2));
        // The time between two epochs is not a step.
        clock.epoch_ended();
        clock.asked(Instant::now() + Duration::from_millis(30));
        assert_eq!(clock.times().training_ns, t.training_ns);
        clock.chunk_wait(Duration::from_millis(5));
        clock.assembly(Duration::from_millis(7));
        let t = clock.times();
        assert_eq!((t.chunk_wait_ns, t.assembly_ns), (5_000_000, 7_000_000));
    }

    #[test]
    fn loaders_have_ids_of_their_own() {
        assert_ne!(RankClock::new(1).id(), RankClock::new(1).id());
    }

    #[test]
    fn reports_are_due_at_most_every_half_second() {
        let clock = RankClock::new(1);
        let t0 = Instant::now();
        assert!(!clock.returned(t0, true), "not at once");
        clock.marks().reported = Instant::now() - REPORT_EVERY;
        assert!(clock.returned(Instant::now(), true), "due after half a second");
        assert!(clock.returned(Instant::now(), true), "and still due until one was sent");
        clock.reported();
        assert!(!clock.returned(Instant::now(), true), "then not again at once");
    }
}
