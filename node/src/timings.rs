//! What a node measures as it works, apart from its counters: the latency
//! histograms of chunk requests, conversions and peer fetches
//! ([`Timings`], exported by [`crate::metrics`]), and the stage clocks and
//! rank reports `granary doctor` reads ([`StageClock`]). Split from
//! `metrics.rs` so the service and the loads that observe them do not
//! import the exporter that reads the service.

use granary_proto::doctor::{NodeStages, RankReport, RankTimes};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The label of per-dataset metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DatasetLabel {
    /// The dataset's name.
    pub dataset: String,
}

/// Chunk requests: 0.1 ms (a RAM hit) to ~6.5 s (a load behind a slow link).
fn request_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 17))
}

/// Loads and peer fetches: 1 ms to ~65 s.
fn load_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// The latency histograms a node observes (cheap to clone: clones share).
#[derive(Clone, Debug)]
pub(crate) struct Timings {
    pub(crate) chunk_requests: Family<DatasetLabel, Histogram>,
    pub(crate) conversions: Family<DatasetLabel, Histogram>,
    pub(crate) peer_fetches: Histogram,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            chunk_requests: Family::new_with_constructor(request_buckets),
            conversions: Family::new_with_constructor(load_buckets),
            peer_fetches: load_buckets(),
        }
    }
}

impl Timings {
    /// One trainer chunk request of `dataset`, answered after `took`.
    pub(crate) fn chunk_request(&self, dataset: &str, took: Duration) {
        self.chunk_requests.get_or_create(&DatasetLabel { dataset: dataset.to_string() }).observe(took.as_secs_f64());
    }

    /// One row group of `dataset` read and converted in `took`.
    pub(crate) fn conversion(&self, dataset: &str, took: Duration) {
        self.conversions.get_or_create(&DatasetLabel { dataset: dataset.to_string() }).observe(took.as_secs_f64());
    }

    /// One chunk fetched from its owner in `took`.
    pub(crate) fn peer_fetch(&self, took: Duration) {
        self.peer_fetches.observe(took.as_secs_f64());
    }
}

/// The node's stage clocks for `granary doctor` (cumulative nanoseconds)
/// and its ranks' last reports.
#[derive(Debug)]
pub(crate) struct StageClock {
    started: Instant,
    remote_read_ns: AtomicU64,
    convert_wait_ns: AtomicU64,
    convert_ns: AtomicU64,
    peer_fetch_ns: AtomicU64,
    loads: AtomicU64,
    chunk_requests: AtomicU64,
    chunk_request_ns: AtomicU64,
    /// The last report in each slot (a trainer connection's), and when it
    /// came: at most [`MAX_REPORT_SLOTS`].
    ranks: Mutex<HashMap<u64, (Instant, RankKey, RankTimes)>>,
}

/// Report slots kept at most: past it the slot heard from the longest ago
/// is dropped. Live connections hold one each; the rest are connections
/// gone within the last [`RANK_SILENT`].
const MAX_REPORT_SLOTS: usize = 4096;

/// A rank: its loader, dataset, rank and world size.
type RankKey = (u64, String, u32, u32);

/// A rank silent this long is left out of the doctor's snapshot.
const RANK_SILENT: Duration = Duration::from_secs(60);

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Default for StageClock {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            remote_read_ns: AtomicU64::new(0),
            convert_wait_ns: AtomicU64::new(0),
            convert_ns: AtomicU64::new(0),
            peer_fetch_ns: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            chunk_requests: AtomicU64::new(0),
            chunk_request_ns: AtomicU64::new(0),
            ranks: Mutex::new(HashMap::new()),
        }
    }
}

impl StageClock {
    /// One load's stages: reading from remote storage, waiting for a
    /// converter thread, converting.
    pub(crate) fn load(&self, read: Duration, wait: Duration, convert: Duration) {
        self.remote_read_ns.fetch_add(nanos(read), Ordering::Relaxed);
        self.convert_wait_ns.fetch_add(nanos(wait), Ordering::Relaxed);
        self.convert_ns.fetch_add(nanos(convert), Ordering::Relaxed);
        self.loads.fetch_add(1, Ordering::Relaxed);
    }

    /// One peer fetch (answered or not).
    pub(crate) fn peer_fetch(&self, took: Duration) {
        self.peer_fetch_ns.fetch_add(nanos(took), Ordering::Relaxed);
    }

    /// One trainer chunk request.
    pub(crate) fn chunk_request(&self, took: Duration) {
        self.chunk_requests.fetch_add(1, Ordering::Relaxed);
        self.chunk_request_ns.fetch_add(nanos(took), Ordering::Relaxed);
    }

    /// Keeps a rank's report in `slot`, replacing the slot's last one.
    pub(crate) fn report(&self, slot: u64, r: RankReport) {
        let mut ranks = self.ranks.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        ranks.retain(|_, (at, _, _)| now.duration_since(*at) < RANK_SILENT);
        ranks.insert(slot, (now, (r.loader, r.dataset, r.rank, r.world), r.times));
        if ranks.len() > MAX_REPORT_SLOTS
            && let Some(oldest) = ranks.iter().min_by_key(|(s, (at, _, _))| (*at, **s)).map(|(s, _)| *s)
        {
            ranks.remove(&oldest);
        }
    }

    /// Nanoseconds since the node started, the clocks and the ranks heard
    /// from within the last minute (by dataset, then rank).
    pub(crate) fn read(&self) -> (u64, NodeStages, Vec<RankReport>) {
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let stages = NodeStages {
            remote_read_ns: ld(&self.remote_read_ns),
            convert_wait_ns: ld(&self.convert_wait_ns),
            convert_ns: ld(&self.convert_ns),
            peer_fetch_ns: ld(&self.peer_fetch_ns),
            loads: ld(&self.loads),
            remote_bytes: 0,
            chunk_requests: ld(&self.chunk_requests),
            chunk_request_ns: ld(&self.chunk_request_ns),
        };
        let now = Instant::now();
        let ranks = self.ranks.lock().unwrap_or_else(|p| p.into_inner());
        // A rank that reconnected reported in two slots: its latest counts.
        let mut latest: BTreeMap<&RankKey, (Instant, RankTimes)> = BTreeMap::new();
        for (at, key, times) in ranks.values().filter(|(at, _, _)| now.duration_since(*at) < RANK_SILENT) {
            if latest.get(key).is_none_or(|(was, _)| at > was) {
                latest.insert(key, (*at, *times));
            }
        }
        let mut out: Vec<RankReport> = latest
            .into_iter()
            .map(|((loader, dataset, rank, world), (_, times))| RankReport {
                dataset: dataset.clone(),
                rank: *rank,
                world: *world,
                loader: *loader,
                times,
            })
            .collect();
        out.sort_by(|a, b| (&a.dataset, a.rank).cmp(&(&b.dataset, b.rank)));
        (nanos(now.duration_since(self.started)), stages, out)
    }
}
