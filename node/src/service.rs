//! The node's core: datasets, the chunk tier, single flight, prefetch.
//!
//! [`Node::chunk`] is the one way to get a chunk: RAM tier, then SSD tier,
//! then a load (remote read, decode, convert into a sealed memory file).
//! Concurrent requests for one shard, from any number of trainers or from
//! prefetch, share one load: the first request registers a watch channel in
//! `inflight` and spawns the load; later ones wait on the channel. A load
//! publishes its chunk to waiters first, then inserts it into the tier, and
//! only then leaves `inflight`, so there is never a moment when a finished
//! shard is in neither place (which would cost a second remote read).
//!
//! The decisions are pure and tested on their own: who may join a load
//! ([`granary_node_core::flight`]), where a load gets its chunk
//! ([`granary_node_core::route`]), and what to prefetch
//! ([`granary_node_core::prefetch`]); this file executes them, with its children, one
//! concern each: `fetch` runs a load's route, `peer_check` decides what a
//! chunk from a peer becomes (a guest copy, or verified), `peers` answers
//! other nodes (chunks, handoffs, footers), `versions` opens, publishes,
//! describes and closes dataset versions, and `follow` prefetches along one
//! rank's plan ([`Follower`]: the shard order of the same plan the trainer
//! computes, kept loading up to `prefetch_bytes` ahead of the last shard the
//! trainer asked for; after the epoch's own shards come the next epochs').

use crate::config::NodeConfig;
use crate::dataset::{Dataset, OpenError};
use crate::error::FetchError;
use crate::fabric::owners::Cluster;

mod budget;
mod fetch;
mod follow;
mod peer_check;
mod peers;
mod reuse;
mod standing;
mod versions;
use crate::holds::HoldRegistry;
use crate::load;
use crate::remote::{Remote, RemoteCounters, Throttle};
use crate::shm::SealedChunk;
use crate::tier::{ChunkKey, ChunkTier, GuestArea, HitTier, SsdConfig, TierError};
pub use follow::Follower;
use futures::FutureExt;
use granary_node_core::engine::{Admitted, Engine};
use granary_node_core::flight::Asker;
use granary_proto::wire::NodeStats;
use granary_proto::{DatasetVersion, ShardId};
pub use standing::ClusterStanding;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, Semaphore, watch};
use tracing::Instrument;

/// Epochs after the current one whose shards a rank's prefetch may fetch,
/// budget permitting.
pub const PREFETCH_EPOCHS_AHEAD: u64 = 3;

/// A fetch result shared by every waiter of one load.
pub type Shared = Result<Arc<SealedChunk>, Arc<FetchError>>;

#[derive(Default)]
struct Counters {
    conversions: AtomicU64,
    converted_bytes: AtomicU64,
    ram_hits: AtomicU64,
    ssd_hits: AtomicU64,
    misses: AtomicU64,
    joined: AtomicU64,
    corrupt: AtomicU64,
    prefetched: AtomicU64,
    /// Prefetch loads started and not yet finished (a gauge).
    prefetching: AtomicU64,
    peer_fetched: AtomicU64,
    peer_fetched_bytes: AtomicU64,
    peer_failures: AtomicU64,
    peer_served: AtomicU64,
    peer_refused: AtomicU64,
    guest_hits: AtomicU64,
    peer_verified: AtomicU64,
    peer_mismatched: AtomicU64,
    /// Shards served from another version's chunk of the same content.
    reused: AtomicU64,
}

struct Inner {
    /// Datasets by name (their current version) and every version opened;
    /// a cluster node adds the coordinator's datasets while it runs.
    datasets: std::sync::RwLock<BTreeMap<String, Arc<Dataset>>>,
    by_version: std::sync::RwLock<BTreeMap<DatasetVersion, Arc<Dataset>>>,
    /// Options and throttle for remote storage of datasets opened later.
    remote_options: BTreeMap<String, String>,
    throttle: Option<Arc<Throttle>>,
    tier: ChunkTier,
    /// Which chunk the tier holds for each content ([`crate::content`]).
    content: crate::content::ContentIndex,
    guests: GuestArea,
    /// Every load in flight ([`granary_node_core::engine`]).
    engine: Mutex<Engine<ChunkKey, Pending, crate::fabric::PeerError>>,
    loads: Semaphore,
    /// KiB of memory loads in progress may take ([`load::memory_admission`]).
    load_memory: Semaphore,
    /// The load budget now: what `load_memory` holds in all, in bytes.
    /// Configured (`load_memory_bytes`), it stays; by default it follows
    /// the node's own memory ([`Node::follow_own_memory`]).
    load_memory_bytes: std::sync::atomic::AtomicU64,
    load_budget_follows_memory: bool,
    /// What the trainers' mapping advice is reckoned from, as the node
    /// runs ([`Node::mapping_advice`]).
    advice: AdviceInputs,
    converts: Arc<Semaphore>,
    counters: Counters,
    /// Latency histograms for the metrics endpoint.
    timings: crate::timings::Timings,
    /// Stage clocks and rank reports for `granary doctor`.
    stages: crate::timings::StageClock,
    /// The settings `granary doctor` names.
    settings: granary_proto::doctor::NodeSettings,
    remote: Arc<RemoteCounters>,
    prefetch_bytes: u64,
    max_plan_bytes: u64,
    socket_limits: crate::SocketLimits,
    /// Set once the node joins a cluster: where non-owned shards come from.
    cluster: std::sync::OnceLock<Arc<Cluster>>,
    /// True once a cluster node has opened every dataset of a placement
    /// (a node without a cluster knows its datasets from the start).
    datasets_known: tokio::sync::watch::Sender<bool>,
    /// Versions trainers asked for by name and version that a cluster
    /// node does not serve (a job pinned a version this node never
    /// opened, say after a restart): the placement follower asks the
    /// coordinator for them.
    wanted: Mutex<Vec<(String, DatasetVersion)>>,
    wanted_added: tokio::sync::Notify,
    /// Counts the follower's answers to `wanted`.
    wanted_answered: tokio::sync::watch::Sender<u64>,
    /// Of the versions the follower was last asked for, those the
    /// coordinator does not know: a describe waiting on one returns at once.
    wanted_gone: Mutex<Vec<(String, DatasetVersion)>>,
    /// The versions this node's trainers follow (a cluster node holds them
    /// at the coordinator).
    holds: Arc<HoldRegistry>,
    /// Configured datasets that could not be opened at start, and why.
    failed: BTreeMap<String, String>,
}

/// How long a trainer's describe of a pinned version waits for the
/// coordinator's manifest of it.
const VERSION_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the trainers' mapping advice is reckoned from
/// ([`load::mapping_advice_now`]).
struct AdviceInputs {
    /// `trainer_mapping_bytes` as configured: the advice, whatever else.
    fixed: Option<u64>,
    /// The machine's memory or, when lower, the node's cgroup limit.
    memory: Option<u64>,
    /// The RAM tier and the guest area.
    tiers_bytes: u64,
    /// The trainers the node expects.
    max_ranks: u32,
    /// The loaders following a plan now ([`Node::loader_started`]).
    loaders: std::sync::atomic::AtomicU32,
}

/// A running node (cheap to clone).
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

/// The node could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// A dataset could not be opened.
    #[error("dataset {name:?}: {source}")]
    Dataset {
        /// Dataset name.
        name: String,
        /// Cause.
        source: Box<OpenError>,
    },
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The tier could not be opened.
    #[error(transparent)]
    Tier(#[from] TierError),
    /// The async runtime of an embedded node could not be built.
    #[error("cannot start the node's runtime: {0}")]
    Runtime(std::io::Error),
}

impl Node {
    /// Opens the tier and every configured dataset (reading their footers).
    pub async fn start(cfg: &NodeConfig) -> Result<Node, StartError> {
        let remote_counters = Arc::new(RemoteCounters::default());
        let throttle = cfg.throttle.map(|t| Arc::new(Throttle::new(t)));
        let mut opened = Vec::with_capacity(cfg.datasets.len());
        // A dataset that cannot be opened (a bad view, an unreachable
        // source) is reported and left out; the others are served. Only a
        // node that could open none of its datasets refuses to start.
        let mut failed: Vec<(String, StartError)> = Vec::new();
        for d in &cfg.datasets {
            let dataset_err =
                |source: OpenError| StartError::Dataset { name: d.name.clone(), source: Box::new(source) };
            let open = async {
                let view = d.view().map_err(StartError::Config)?;
                let remote = Remote::open(&d.source, &cfg.remote, throttle.clone(), remote_counters.clone())
                    .map_err(|e| dataset_err(e.into()))?;
                Dataset::open(&d.name, remote, view).await.map_err(dataset_err)
            };
            match open.await {
                Ok(ds) => opened.push((d.name.as_str(), Arc::new(ds))),
                Err(e) => {
                    tracing::error!(dataset = %d.name, error = %e, "dataset not served: it could not be opened");
                    failed.push((d.name.clone(), e));
                }
            }
        }
        if opened.is_empty() && !failed.is_empty() {
            return Err(failed.swap_remove(0).1);
        }
        let failed: BTreeMap<String, String> = failed.into_iter().map(|(n, e)| (n, e.to_string())).collect();
        let ssd = cfg.ssd_dir.as_ref().map(|dir| SsdConfig {
            dir: dir.clone(),
            capacity_bytes: cfg.ssd_bytes,
            block_bytes: cfg.ssd_block_bytes,
        });
        let tier = ChunkTier::open(cfg.ram_bytes, ssd).await?;
        let threads =
            cfg.convert_threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())).max(1);
        let guest_bytes = cfg.guest_bytes.unwrap_or(cfg.ram_bytes / 4);
        let tiers_bytes = cfg.ram_bytes.saturating_add(guest_bytes);
        let load_memory_bytes = cfg.load_memory_bytes.unwrap_or_else(|| load::default_load_memory(tiers_bytes));
        let advice = AdviceInputs {
            fixed: cfg.trainer_mapping_bytes,
            memory: match load::process_memory() {
                (Some(m), Some(c)) => Some(m.min(c)),
                (m, c) => m.or(c),
            },
            tiers_bytes,
            max_ranks: cfg.max_ranks,
            loaders: std::sync::atomic::AtomicU32::new(0),
        };
        let node = Node {
            inner: Arc::new(Inner {
                datasets: std::sync::RwLock::new(BTreeMap::new()),
                by_version: std::sync::RwLock::new(BTreeMap::new()),
                remote_options: cfg.remote.clone(),
                throttle,
                tier,
                content: match &cfg.ssd_dir {
                    // A slot for every 256 KiB of the SSD tier.
                    Some(dir) => crate::content::ContentIndex::open(dir, cfg.ssd_bytes >> 18),
                    None => crate::content::ContentIndex::in_memory(),
                },
                guests: GuestArea::new(guest_bytes),
                engine: Mutex::new(Engine::new(crate::fabric::FabricConfig::default().timing())),
                loads: Semaphore::new(cfg.max_concurrent_loads.max(1)),
                load_memory: Semaphore::new(
                    usize::try_from(load_memory_bytes.div_ceil(1024))
                        .unwrap_or(Semaphore::MAX_PERMITS)
                        .min(Semaphore::MAX_PERMITS),
                ),
                load_memory_bytes: std::sync::atomic::AtomicU64::new(load_memory_bytes),
                load_budget_follows_memory: cfg.load_memory_bytes.is_none(),
                advice,
                converts: Arc::new(Semaphore::new(threads)),
                counters: Counters::default(),
                timings: Default::default(),
                stages: Default::default(),
                settings: granary_proto::doctor::NodeSettings {
                    max_concurrent_loads: u32::try_from(cfg.max_concurrent_loads.max(1)).unwrap_or(u32::MAX),
                    convert_threads: u32::try_from(threads).unwrap_or(u32::MAX),
                    cores: std::thread::available_parallelism()
                        .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX)),
                    prefetch_bytes: cfg.prefetch_bytes,
                },
                remote: remote_counters,
                prefetch_bytes: cfg.prefetch_bytes,
                max_plan_bytes: cfg.max_plan_bytes,
                socket_limits: cfg.socket_limits(),
                cluster: std::sync::OnceLock::new(),
                datasets_known: tokio::sync::watch::Sender::new(false),
                wanted: Mutex::new(Vec::new()),
                wanted_added: tokio::sync::Notify::new(),
                wanted_answered: tokio::sync::watch::Sender::new(0),
                wanted_gone: Mutex::new(Vec::new()),
                holds: Arc::new(HoldRegistry::default()),
                failed,
            }),
        };
        for (name, ds) in opened {
            node.publish(name, ds);
        }
        node.spawn_budget_loop();
        Ok(node)
    }

    /// Configured datasets that could not be opened at start, with why.
    pub fn failed_datasets(&self) -> &BTreeMap<String, String> {
        &self.inner.failed
    }

    /// Prefetch loads under way: the depth of the prefetch along the
    /// ranks' plans (a gauge for the metrics endpoint).
    pub(crate) fn prefetch_in_flight(&self) -> u64 {
        self.inner.counters.prefetching.load(Ordering::Relaxed)
    }

    /// Keeps a rank's loader clocks for `granary doctor`, in `slot` (a
    /// trainer connection's: each holds one, so reports cannot pile up).
    pub fn report(&self, slot: u64, report: granary_proto::doctor::RankReport) {
        self.inner.stages.report(slot, report);
    }

    /// The local socket's limits (node.toml's `max_connections`,
    /// `idle_timeout_ms`, `write_timeout_ms`).
    pub fn socket_limits(&self) -> crate::SocketLimits {
        self.inner.socket_limits
    }

    /// What `granary doctor` reads: the stage clocks, the settings and the
    /// ranks' last reports.
    pub fn doctor_snapshot(&self) -> granary_proto::doctor::DoctorSnapshot {
        let (at_ns, mut stages, ranks) = self.inner.stages.read();
        stages.remote_bytes = self.inner.remote.bytes.load(Ordering::Relaxed);
        granary_proto::doctor::DoctorSnapshot { at_ns, stages, settings: self.inner.settings, ranks }
    }

    /// The latency histograms the metrics endpoint shows.
    pub(crate) fn timings(&self) -> &crate::timings::Timings {
        &self.inner.timings
    }

    /// Bytes the RAM tier and the guest area may hold.
    pub fn tiers_bytes(&self) -> u64 {
        self.inner.advice.tiers_bytes
    }

    /// The most bytes of chunk mappings each trainer should keep beyond
    /// what this node holds, now: the memory left beside the tiers, the
    /// load budget and the node's own structures as measured, shared among
    /// the ranks expected or the loaders connected, whichever are more
    /// ([`load::mapping_advice_now`]); sent with every description.
    pub(crate) fn mapping_advice(&self) -> u64 {
        let a = &self.inner.advice;
        if let Some(fixed) = a.fixed {
            return fixed;
        }
        let taken_kib =
            self.load_budget().div_ceil(1024).saturating_sub(self.inner.load_memory.available_permits() as u64);
        let overhead = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| load::measured_overhead(&status, taken_kib.saturating_mul(1024)))
            .unwrap_or(0);
        let now = load::Budgeted {
            overhead,
            ranks: a.max_ranks,
            loaders: a.loaders.load(std::sync::atomic::Ordering::Relaxed),
        };
        load::mapping_advice_now(a.memory, a.tiers_bytes, self.load_budget(), now)
    }

    /// A trainer's connection started following a plan: one more loader
    /// shares the mapping advice (until [`Self::loader_ended`]).
    pub(crate) fn loader_started(&self) {
        self.inner.advice.loaders.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// A loader's connection ended.
    pub(crate) fn loader_ended(&self) {
        let _ = self.inner.advice.loaders.fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |n| Some(n.saturating_sub(1)),
        );
    }

    /// Loaders following a plan on this node now.
    pub fn loaders(&self) -> u32 {
        self.inner.advice.loaders.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counters since start.
    pub fn stats(&self) -> NodeStats {
        let c = &self.inner.counters;
        NodeStats {
            remote_bytes: self.inner.remote.bytes.load(Ordering::Relaxed),
            remote_requests: self.inner.remote.requests.load(Ordering::Relaxed),
            remote_footers: self.inner.remote.footers.load(Ordering::Relaxed),
            peer_footers: self.inner.remote.peer_footers.load(Ordering::Relaxed),
            conversions: c.conversions.load(Ordering::Relaxed),
            converted_bytes: c.converted_bytes.load(Ordering::Relaxed),
            ram_hits: c.ram_hits.load(Ordering::Relaxed),
            ssd_hits: c.ssd_hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            joined: c.joined.load(Ordering::Relaxed),
            corrupt_entries: c.corrupt.load(Ordering::Relaxed),
            prefetched: c.prefetched.load(Ordering::Relaxed),
            chunk_memory_bytes: crate::shm::live_chunk_bytes(),
            peer_fetched: c.peer_fetched.load(Ordering::Relaxed),
            peer_fetched_bytes: c.peer_fetched_bytes.load(Ordering::Relaxed),
            peer_failures: c.peer_failures.load(Ordering::Relaxed),
            peer_served: c.peer_served.load(Ordering::Relaxed),
            peer_refused: c.peer_refused.load(Ordering::Relaxed),
            guest_hits: c.guest_hits.load(Ordering::Relaxed),
            guest_bytes: self.inner.guests.usage_bytes(),
            peer_verified: c.peer_verified.load(Ordering::Relaxed),
            peer_mismatched: c.peer_mismatched.load(Ordering::Relaxed),
            peers_quarantined: self.inner.cluster.get().map_or(0, |c| c.quarantined() as u64),
            loads_in_flight: self.engine().len() as u64,
        }
    }

    /// The versions this node's trainers follow.
    pub(crate) fn holds(&self) -> Arc<HoldRegistry> {
        self.inner.holds.clone()
    }

    /// Joins a cluster: from now on a shard another live node owns is
    /// fetched from that owner. False if the node already joined one.
    pub fn join_cluster(&self, cluster: Arc<Cluster>) -> bool {
        let timing = cluster.config().timing();
        let joined = self.inner.cluster.set(cluster).is_ok();
        if joined {
            self.engine().set_timing(timing);
        }
        joined
    }

    /// Waits (up to 30 s) for loads in flight to reach the SSD tier, if
    /// the node has one, then
    /// flushes and closes it, so a clean stop loses no converted chunk.
    pub async fn close(&self) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        // Loads in flight are waited for only to put their chunks on SSD;
        // a RAM-only node would wait for nothing it keeps (and a load
        // waiting for a placement that no longer changes, this node having
        // left, could hold the stop for the whole reroute wait).
        while self.inner.tier.has_ssd() {
            let pending = self.engine().len();
            if pending == 0 {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                tracing::warn!(pending, "closing with loads still in flight; their chunks are not on SSD");
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        self.inner.tier.close().await;
    }

    /// The chunk of `shard` in `version`: from RAM, SSD, or one shared load.
    pub async fn chunk(&self, version: DatasetVersion, shard: ShardId) -> Shared {
        let started = std::time::Instant::now();
        let chunk = self.chunk_from(version, shard, Asker::Trainer).await;
        let took = started.elapsed();
        self.inner.stages.chunk_request(took);
        if let Ok(ds) = self.dataset(version) {
            self.inner.timings.chunk_request(&ds.name, took);
        }
        chunk
    }

    /// Prefetch for a later epoch: like [`Node::chunk`], but a guest copy
    /// it brings is kept at low priority (evicted before any copy an epoch
    /// in progress needs) until something asks for it now.
    pub async fn chunk_ahead(&self, version: DatasetVersion, shard: ShardId) -> Shared {
        self.chunk_from(version, shard, Asker::Ahead).await
    }

    /// The chunk for `asker`: from the tiers, or by joining or starting a
    /// load as [`admit`] decides.
    async fn chunk_from(&self, version: DatasetVersion, shard: ShardId, asker: Asker) -> Shared {
        let ahead = !asker.wants_now();
        let key = ChunkKey { version, shard };
        // A guest copy is a peer's chunk, unverified: this node's trainers
        // may read it, but it is never passed on to another node (a
        // forgery would spread), which gets this node's own.
        let guests_too = !matches!(asker, Asker::Peer { .. });
        // `contains` may be stale (an entry evicted or dropped from disk
        // between the checks), so the re-check below is retried a bounded
        // number of times before loading anyway.
        for attempt in 0..3 {
            if let Some(chunk) = self.inner.guests.get(key, !ahead).filter(|_| guests_too) {
                self.inner.counters.guest_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(chunk);
            }
            match self.inner.tier.get(key).await {
                Ok(Some((chunk, tier))) => {
                    let c = &self.inner.counters;
                    match tier {
                        HitTier::Ram => c.ram_hits.fetch_add(1, Ordering::Relaxed),
                        HitTier::Ssd => c.ssd_hits.fetch_add(1, Ordering::Relaxed),
                    };
                    return Ok(chunk);
                }
                Ok(None) => {}
                Err(e) => {
                    self.inner.counters.corrupt.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(shard = %shard, error = %e, "corrupt SSD entry removed; reading the shard again");
                }
            }
            let mut rx = {
                let view = self.view();
                let mut engine = self.engine();
                let finished = || self.inner.tier.contains(key) || (guests_too && self.inner.guests.contains(key));
                let mut started = None;
                let shell = || {
                    let (tx, rx) = watch::channel(None);
                    let read_here = Arc::new(tokio::sync::Notify::new());
                    started = Some((tx, read_here.clone()));
                    Pending { rx, read_here }
                };
                let admitted = engine.request(key, asker, attempt < 2, finished, &view, shell);
                let pending = engine.shell(key);
                match (admitted, pending) {
                    (Admitted::LookAgain, _) => continue,
                    (Admitted::Refused { .. }, _) => return Err(Arc::new(FetchError::Forwarding { shard })),
                    (Admitted::NotOwner(owner), _) => {
                        self.inner.counters.peer_refused.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(shard = %shard, %owner, asker = ?asker,
                            "a peer asked this node for a shard its placement gives to another node: refused");
                        return Err(Arc::new(FetchError::NotOwner { shard, owner }));
                    }
                    (Admitted::Joined, Some(pending)) => {
                        self.inner.counters.joined.fetch_add(1, Ordering::Relaxed);
                        pending.rx.clone()
                    }
                    (Admitted::JoinedAndLeftAsk, Some(pending)) => {
                        // Stop asking, read it here (see `granary_node_core::flight`).
                        self.inner.counters.joined.fetch_add(1, Ordering::Relaxed);
                        pending.read_here.notify_one();
                        pending.rx.clone()
                    }
                    (Admitted::Started, Some(pending)) => {
                        let rx = pending.rx.clone();
                        drop(engine);
                        let Some((tx, read_here)) = started else {
                            // `request` made the shell when it started the load.
                            return Err(Arc::new(FetchError::LoadLost { shard }));
                        };
                        self.inner.counters.misses.fetch_add(1, Ordering::Relaxed);
                        let node = self.clone();
                        // Every line the load logs carries its dataset, version and shard.
                        let dataset = self.dataset(version).map(|d| d.name.clone()).unwrap_or_default();
                        let span = tracing::info_span!("load", dataset = %dataset, version = %version, shard = %shard);
                        tokio::spawn(async move { node.load_and_publish(key, tx, read_here).await }.instrument(span));
                        rx
                    }
                    (Admitted::Joined | Admitted::JoinedAndLeftAsk | Admitted::Started, None) => {
                        return Err(Arc::new(FetchError::LoadLost { shard }));
                    }
                }
            };
            return match rx.wait_for(Option::is_some).await {
                Ok(v) => v.clone().unwrap_or_else(|| Err(Arc::new(FetchError::LoadLost { shard }))),
                Err(_) => Err(Arc::new(FetchError::LoadLost { shard })),
            };
        }
        // The last attempt never `continue`s, so the loop returns above.
        Err(Arc::new(FetchError::LoadLost { shard }))
    }

    /// Runs the load of `key` and publishes its result to every waiter.
    async fn load_and_publish(self, key: ChunkKey, tx: watch::Sender<Option<Shared>>, read_here: Arc<Notify>) {
        // Whatever happens below, even a panic, the load must leave the
        // engine, or every later request for it would wait forever.
        let _leave = InflightGuard { node: &self, key };
        // The Parquet decoder can panic on hostile page headers; a panic is
        // turned into an error naming the shard instead of killing the task.
        let result = match AssertUnwindSafe(self.load(key, read_here)).catch_unwind().await {
            Ok(r) => r,
            Err(panic) => Err(load::panicked(&self.site(key), &*panic)),
        };
        let (result, guest) = match result {
            Ok((chunk, guest)) => (Ok(Arc::new(chunk)), guest),
            Err(e) => (Err(Arc::new(e)), false),
        };
        match &result {
            Err(e) if matches!(**e, FetchError::NotOwner { .. }) => {
                tracing::info!(shard = %key.shard, "a peer asked for a shard that moved on; it asks the new owner: {e}")
            }
            Err(e) => tracing::warn!(shard = %key.shard, error = %e, "loading shard failed"),
            Ok(_) => {}
        }
        let _ = tx.send(Some(result.clone()));
        if let Ok(chunk) = result {
            // A chunk fetched from its owner is a guest copy: kept apart,
            // never in the owned tier, never on SSD.
            if guest {
                self.inner.guests.insert(key, chunk, !self.engine().wanted_now(key));
            } else {
                self.inner.tier.insert(key, chunk).await;
                self.record_content(key);
            }
        }
    }

    /// "FILE row group N" for a shard, for error messages.
    fn site(&self, key: ChunkKey) -> String {
        match self
            .dataset(key.version)
            .ok()
            .and_then(|d| d.files.get(key.shard.file as usize).map(|f| f.path.to_string()))
        {
            Some(path) => format!("{path} row group {}", key.shard.row_group),
            None => key.shard.to_string(),
        }
    }

    /// Reads one row group and converts it into a sealed chunk
    /// ([`crate::load`]), counting the conversion. `peer_footer`: the
    /// file's footer may come from the peer that reads it for the cluster
    /// (false when verifying a peer's chunk).
    async fn convert_here(
        &self,
        key: ChunkKey,
        permit: tokio::sync::SemaphorePermit<'_>,
        peer_footer: bool,
    ) -> Result<SealedChunk, FetchError> {
        // An older version's chunk of the same content, restamped: no
        // read, no conversion.
        if let Some(chunk) = self.reused(key).await {
            return Ok(chunk);
        }
        let ds = self.dataset(key.version)?;
        // Memory first: a load that does not fit beside the others waits;
        // one that could never fit is refused, naming its sizes.
        let (_, rg) = ds.locate(key.shard)?;
        let compressed = ds.manifest.files[key.shard.file as usize].row_groups[rg].compressed_bytes;
        let estimate = load::load_memory_estimate(compressed, ds.chunk_len_estimate(key.shard));
        let budget = self.load_budget();
        let Some(kib) = load::memory_admission(estimate, budget) else {
            return Err(FetchError::LoadTooLarge { site: self.site(key), estimate, budget });
        };
        let _memory = self.reserve_load_memory(kib).await.map_err(FetchError::ShuttingDown)?;
        let peer = if peer_footer { self.footer_from_peer(key.version, key.shard.file) } else { None };
        let started = std::time::Instant::now();
        let chunk = load::read_and_convert(&ds, key, peer, permit, &self.inner.converts, &self.inner.stages)
            .instrument(tracing::debug_span!("convert"))
            .await?;
        self.inner.timings.conversion(&ds.name, started.elapsed());
        let c = &self.inner.counters;
        c.conversions.fetch_add(1, Ordering::Relaxed);
        c.converted_bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        tracing::debug!(shard = %key.shard, bytes = chunk.len(), "shard converted");
        Ok(chunk)
    }

    /// True when a load of `shard` would bring a new guest copy: another
    /// live node owns it, or a former owner would hand it over (a peer's
    /// chunk is a guest until verified), and no copy is held yet.
    fn arrives_as_guest(&self, version: DatasetVersion, shard: ShardId) -> bool {
        let key = ChunkKey { version, shard };
        self.inner
            .cluster
            .get()
            .is_some_and(|c| c.owner(version, shard).is_some() || c.handed_from(version, shard).is_some())
            && !self.inner.guests.contains(key)
    }
}

/// The shell's part of a load in flight (the engine keeps the rest): the
/// channel its waiters watch, and the signal to leave an ask.
pub(super) struct Pending {
    rx: watch::Receiver<Option<Shared>>,
    /// Told when the engine leaves the load's ask ([`Admitted::JoinedAndLeftAsk`],
    /// [`Engine::placement_changed`]): stop asking, read it here.
    read_here: Arc<Notify>,
}

/// Ends a load in the engine when dropped.
struct InflightGuard<'a> {
    node: &'a Node,
    key: ChunkKey,
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.node.engine().finish(self.key);
    }
}
