//! The node's Prometheus metrics ([`registry`]), served by
//! `granary_net::metrics` on the address `node.toml` names (`metrics`).
//!
//! Counters and gauges are the node's own (`granary stats`), read at each
//! scrape by a collector, so nothing is counted twice. The latency
//! histograms are observed where the work happens: a trainer's chunk
//! request (from asking to the chunk in hand), one row group read and
//! converted, and one chunk fetched from its owner. Histograms of chunk
//! requests and conversions carry the dataset's name, so their counts are
//! the per-dataset request and conversion counts.

use crate::Node;
use granary_proto::doctor::{NodeStages, RankReport, RankTimes};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
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
    chunk_requests: Family<DatasetLabel, Histogram>,
    conversions: Family<DatasetLabel, Histogram>,
    peer_fetches: Histogram,
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

/// Every metric of `node`, named `granary_node_*`.
pub fn registry(node: &Node) -> Registry {
    let mut r = Registry::with_prefix("granary_node");
    let t = node.timings();
    r.register_with_unit(
        "chunk_request",
        "Trainer chunk requests, from asking to the chunk in hand, by dataset",
        Unit::Seconds,
        t.chunk_requests.clone(),
    );
    r.register_with_unit(
        "conversion",
        "Row groups read from remote storage and converted into chunks, by dataset",
        Unit::Seconds,
        t.conversions.clone(),
    );
    r.register_with_unit(
        "peer_fetch",
        "Chunks fetched from the node that owns them",
        Unit::Seconds,
        t.peer_fetches.clone(),
    );
    r.register_collector(Box::new(NodeCollector { node: node.clone() }));
    r
}

/// Reads the node's counters at each scrape.
struct NodeCollector {
    node: Node,
}

impl std::fmt::Debug for NodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeCollector")
    }
}

use granary_net::metrics::const_counter as counter;

/// A gauge of a count or size the node keeps unsigned.
fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<&Unit>, v: u64) -> std::fmt::Result {
    granary_net::metrics::const_gauge(enc, name, help, unit, i64::try_from(v).unwrap_or(i64::MAX))
}

impl Collector for NodeCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let s = self.node.stats();
        let bytes = Some(&Unit::Bytes);
        let e = &mut enc;
        counter(e, "remote_read", "Bytes read from remote storage (footers and row groups)", bytes, s.remote_bytes)?;
        counter(e, "remote_requests", "Requests made to remote storage", None, s.remote_requests)?;
        counter(e, "remote_footers", "Parquet footers read from remote storage", None, s.remote_footers)?;
        counter(e, "peer_footers", "Parquet footers received from the peer that reads them", None, s.peer_footers)?;
        counter(e, "conversions", "Shards converted", None, s.conversions)?;
        counter(e, "converted", "Converted bytes produced", bytes, s.converted_bytes)?;
        counter(e, "ram_hits", "Chunk requests answered from the RAM tier", None, s.ram_hits)?;
        counter(e, "ssd_hits", "Chunk requests answered from the SSD tier", None, s.ssd_hits)?;
        counter(
            e,
            "guest_hits",
            "Chunk requests answered from guest copies of other nodes' shards",
            None,
            s.guest_hits,
        )?;
        counter(e, "misses", "Chunk requests that started a load (a peer fetch or a conversion)", None, s.misses)?;
        counter(e, "joined", "Chunk requests that waited for a load already under way", None, s.joined)?;
        counter(
            e,
            "corrupt_entries",
            "SSD entries that failed validation and were read again",
            None,
            s.corrupt_entries,
        )?;
        counter(e, "prefetched", "Chunks prefetched ahead of a request", None, s.prefetched)?;
        counter(e, "peer_fetched", "Chunks fetched from their owner over the peer fabric", None, s.peer_fetched)?;
        counter(e, "peer_fetched", "Bytes of chunks fetched from their owner", bytes, s.peer_fetched_bytes)?;
        counter(e, "peer_failures", "Peer fetches that failed", None, s.peer_failures)?;
        counter(e, "peer_served", "Chunk requests from other nodes answered", None, s.peer_served)?;
        counter(
            e,
            "peer_refused",
            "Peer requests refused: the placement gives the shard to another node",
            None,
            s.peer_refused,
        )?;
        counter(
            e,
            "peer_verified",
            "Peer chunks converted here too and found the same (verify_peer_chunks)",
            None,
            s.peer_verified,
        )?;
        counter(
            e,
            "peer_mismatched",
            "Peer chunks that differed from this node's own conversion (peer quarantined)",
            None,
            s.peer_mismatched,
        )?;
        gauge(e, "peers_quarantined", "Peers quarantined for a chunk that differed", None, s.peers_quarantined)?;
        gauge(e, "chunk_memory", "Bytes of chunks held in memory files", bytes, s.chunk_memory_bytes)?;
        gauge(e, "guest", "Bytes of guest copies held", bytes, s.guest_bytes)?;
        gauge(
            e,
            "loads_in_flight",
            "Loads under way: reading and converting, fetching, or queued",
            None,
            s.loads_in_flight,
        )?;
        let depth = self.node.prefetch_in_flight();
        gauge(e, "prefetch_in_flight", "Prefetch loads under way along the ranks' plans", None, depth)?;

        let served = self.node.served_versions();
        let current: std::collections::BTreeSet<String> = served.iter().map(|(n, _)| n.clone()).collect();
        let g = ConstGauge::new(1i64);
        let mut family = enc.encode_descriptor(
            "dataset_served",
            "Datasets this node serves (1 per dataset and version)",
            None,
            g.metric_type(),
        )?;
        for (name, version) in &served {
            #[derive(EncodeLabelSet, Debug, Clone, Hash, PartialEq, Eq)]
            struct Served {
                dataset: String,
                version: String,
            }
            g.encode(family.encode_family(&Served { dataset: name.clone(), version: version.to_string() })?)?;
        }
        let failed = self.node.failed_datasets();
        let mut family = enc.encode_descriptor(
            "dataset_failed",
            "Configured datasets this node could not open (the reason is in its log)",
            None,
            g.metric_type(),
        )?;
        for name in failed.keys().filter(|n| !current.contains(*n)) {
            g.encode(family.encode_family(&DatasetLabel { dataset: name.clone() })?)?;
        }
        Ok(())
    }
}
