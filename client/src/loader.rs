//! The loader: plan, fetch, assemble, in that order, one epoch at a time.
//!
//! [`Loader::epoch`] walks the rank's plan locally (a [`Cursor`] of the rank
//! plan or of the rank's slice of the global plan, [`PlanKind`]: a shuffle
//! window of rows at a time, never the whole epoch's) on one background
//! *walker* thread: it fetches each chunk when a batch first needs it and
//! drops it after the last batch that reads it, so at most a shuffle window
//! of chunks is held (with [`Shuffle::Blocks`](granary_proto::Shuffle::Blocks), the chunks of a group of
//! `window_batches` batches: a shard's rows are spread over its group). Each
//! batch is then either
//! - a **view**: the batch is one contiguous run of rows of one chunk (a
//!   block-shuffled or unshuffled batch that does not cross a shard boundary
//!   or hold a padding row; a shuffled batch only by chance), handed out in
//!   place, nothing copied; or
//! - **assembled** ([`crate::assemble`]) into pooled buffers, by the walker
//!   itself when `assembly_threads` is 1, or by a pool of that many
//!   assembler threads, several batches at once: up to `prefetch_batches +
//!   assembly_threads - 1` batches are queued or being assembled.
//!
//! Order is kept by construction, not by sorting: the walker puts each
//! batch's slot into one bounded queue in plan order *before* the batch is
//! assembled, and the consumer takes slots from that queue and waits on
//! each in turn. Threads only decide *when* work happens, never *what* is
//! produced: a batch's bytes are a pure function of the plan, whatever the
//! thread count (tested over 1, 2, 4 and 8 threads).
//!
//! A loader reads one dataset version: the one its configuration names, or
//! the node's current one when it names none, pinned when the loader is
//! made. Its resume state ([`ResumeState`], from [`EpochStream::state`] or
//! [`Loader::state_at`]) carries that version, every plan parameter and the
//! position; [`Loader::resume_from`] continues at exactly that batch, and
//! refuses a state the loader would read differently.

use crate::assemble::{Runs, assemble};
use crate::batch::{Batch, Storage};
use crate::clock::RankClock;
pub use crate::config::{LoaderConfig, default_assembly_threads, default_assembly_threads_for};
use crate::error::{ClientError, ProducerError, ProtocolError};
use crate::hostbuf::{BufferPool, HostBuf, Placement, pack_values};
use crate::local::LocalSource;
pub use crate::position::Position;
use crate::resume::PlanKind;
use crate::resume::ResumeState;
use crate::source::{Chunk, ChunkSource};
use granary_proto::wire::DatasetInfo;
use granary_proto::{Cursor, DatasetVersion, GlobalPlan, RankPlan, RowRef, TensorLayout, Walk, plan_rank};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// A rank's data loader.
pub struct Loader {
    source: Arc<dyn ChunkSource>,
    info: Arc<DatasetInfo>,
    layouts: Arc<[TensorLayout]>,
    cfg: LoaderConfig,
    /// Assembled batches' buffers, kept across epochs: a batch buffer is
    /// large (megabytes), and one the allocator gives back to the kernel
    /// costs a page fault and a cleared page per 4 KiB when allocated again.
    pool: Arc<BufferPool>,
    /// Where this rank's time goes (`granary doctor`).
    clock: Arc<RankClock>,
}

/// How [`Loader::connect`] waits for a node that is not ready: pauses of
/// 50 ms doubling to 1 s, until `within` of the first try has passed.
#[derive(Debug)]
struct ConnectWait {
    until: std::time::Instant,
    pause: std::time::Duration,
    tries: u32,
}

impl ConnectWait {
    fn new(now: std::time::Instant, within: std::time::Duration) -> Self {
        Self { until: now + within, pause: std::time::Duration::from_millis(50), tries: 0 }
    }

    /// After a retryable failure at `now`: the pause before the next try,
    /// or None when the wait is spent.
    fn next(&mut self, now: std::time::Instant) -> Option<std::time::Duration> {
        let left = self.until.checked_duration_since(now).filter(|l| !l.is_zero())?;
        let pause = self.pause.min(left);
        self.pause = (self.pause * 2).min(std::time::Duration::from_secs(1));
        self.tries += 1;
        Some(pause)
    }
}

impl Loader {
    /// A loader reading from the node whose socket is at `socket`, keeping
    /// `cfg.mapping_cache_bytes` of chunk mappings.
    ///
    /// A node that is not there yet (its socket missing or refusing), or
    /// that answers it has not joined its cluster yet, is asked again for
    /// up to `cfg.reconnect` (issue 48): a trainer started before its node
    /// gets its batches once the node is up, and otherwise the last
    /// retryable error ([`ClientError::is_retryable`]). Other errors come
    /// at once.
    pub fn connect(socket: impl AsRef<Path>, cfg: LoaderConfig) -> Result<Self, ClientError> {
        let socket = socket.as_ref();
        let mut wait = ConnectWait::new(std::time::Instant::now(), cfg.reconnect);
        loop {
            let attempt = LocalSource::connect(socket).and_then(|s| {
                let source = s.mapping_cache(cfg.mapping_cache_bytes).reconnect_within(cfg.reconnect);
                Self::new(Arc::new(source), cfg.clone())
            });
            match attempt {
                Err(e) if e.is_retryable() => match wait.next(std::time::Instant::now()) {
                    Some(pause) => {
                        if wait.tries == 1 {
                            tracing::warn!(socket = %socket.display(), error = %e, "the node is not ready; asking again");
                        }
                        std::thread::sleep(pause);
                    }
                    None => return Err(e),
                },
                other => return other,
            }
        }
    }

    /// A loader reading from any source.
    pub fn new(source: Arc<dyn ChunkSource>, mut cfg: LoaderConfig) -> Result<Self, ClientError> {
        let info = source.describe(&cfg.dataset, cfg.version)?;
        // Validate the parameters once, up front (nothing is walked).
        let walk = cfg.walk(0, 0);
        walk.check()?;
        walk.num_batches(info.plan_key, &info.shards)?;
        cfg.batch_size = walk.batch_rows();
        let layouts: Arc<[TensorLayout]> = info.tensors.clone().into();
        // Buffers in use at once: the queue (finished or being assembled),
        // the batch the consumer waits on, the consumer's, and the walker's.
        let pool = Arc::new(BufferPool::new(cfg.prefetch_batches.max(1) + cfg.threads() + 2, cfg.host_memory.clone()));
        let clock = Arc::new(RankClock::new(cfg.threads()));
        Ok(Self { source, info: Arc::new(info), layouts, cfg, pool, clock })
    }

    /// Where this rank's time went since the loader was made: waiting in
    /// `next()`, the trainer's own steps between calls, waiting for chunks,
    /// assembling. The node gets them too, about twice a second, for
    /// `granary doctor` (`granary_proto::doctor::diagnose` reads them).
    pub fn times(&self) -> granary_proto::doctor::RankTimes {
        self.clock.times()
    }

    /// How often, and how long in all, this loader's source waited for its
    /// node to come back (a restart, a reconnect) since the loader was
    /// made (issue 48): stalls a trainer can log or alert on.
    pub fn stalls(&self) -> crate::Stalls {
        self.source.stalls()
    }

    /// The dataset as the source described it.
    pub fn info(&self) -> &DatasetInfo {
        &self.info
    }

    /// The configuration.
    pub fn config(&self) -> &LoaderConfig {
        &self.cfg
    }

    /// The dataset version this loader reads (pinned when it was made).
    pub fn version(&self) -> DatasetVersion {
        self.info.version
    }

    /// The resume state at `pos`: what a checkpoint taken there saves.
    pub fn state_at(&self, pos: Position) -> ResumeState {
        let c = &self.cfg;
        ResumeState {
            dataset: c.dataset.clone(),
            version: self.info.version,
            seed: c.seed,
            rank: c.rank,
            world_size: c.world_size,
            batch_size: c.batch_size,
            shuffle: c.shuffle,
            drop_last: c.drop_last,
            plan: c.plan,
            epoch: pos.epoch,
            batch: pos.batch,
        }
    }

    /// Continues where `state` was saved: an error naming the first field
    /// (version, seed, world size, rank, batch size, shuffle, drop_last)
    /// in which this loader differs, since it would read other batches.
    pub fn resume_from(&self, state: &ResumeState) -> Result<EpochStream, ClientError> {
        if let Some(m) = state.mismatch(&self.state_at(state.position())) {
            return Err(m.into());
        }
        self.resume(state.position())
    }

    /// This rank's plan for `epoch`, whole (every row of the epoch: for
    /// inspection and tests; the loader itself walks a cursor). With the
    /// global plan, [`PlanError::NotTheRankPlan`](granary_proto::PlanError):
    /// see [`Loader::global_plan`].
    pub fn plan(&self, epoch: u64) -> Result<RankPlan, ClientError> {
        if let PlanKind::Global { .. } = self.cfg.plan {
            return Err(granary_proto::PlanError::NotTheRankPlan.into());
        }
        Ok(plan_rank(self.info.plan_key, &self.info.shards, &self.cfg.params(epoch))?)
    }

    /// The global plan of `epoch` (for inspection and tests: every rank's
    /// batch of every step); None for a loader of the rank plan.
    pub fn global_plan(&self, epoch: u64) -> Result<Option<GlobalPlan>, ClientError> {
        match self.cfg.walk(epoch, 0) {
            Walk::Global { params, .. } => Ok(Some(GlobalPlan::new(self.info.plan_key, &self.info.shards, &params)?)),
            Walk::Rank { .. } => Ok(None),
        }
    }

    /// Batches in `epoch` (equal on every rank), without building the plan.
    pub fn num_batches(&self, epoch: u64) -> Result<usize, ClientError> {
        Ok(self.cfg.walk(epoch, 0).num_batches(self.info.plan_key, &self.info.shards)?)
    }

    /// All batches of `epoch`, from the first.
    pub fn epoch(&self, epoch: u64) -> Result<EpochStream, ClientError> {
        self.resume(Position { epoch, batch: 0 })
    }

    /// The batches of `pos.epoch` from batch `pos.batch` on (none when it
    /// is the epoch's batch count; past that, an error). The position
    /// alone: [`Loader::resume_from`] also checks that the saved state
    /// was this loader's.
    pub fn resume(&self, pos: Position) -> Result<EpochStream, ClientError> {
        let total = self.num_batches(pos.epoch)? as u64;
        if pos.batch > total {
            return Err(ClientError::PositionPastEnd { epoch: pos.epoch, batch: pos.batch, batches: total });
        }
        let start = pos.batch;
        let walk = self.cfg.walk(pos.epoch, start);
        let cursor = walk.cursor(self.info.plan_key, &self.info.shards)?;
        let ahead = self.cfg.prefetch_batches.max(1);
        let threads = self.cfg.threads();
        // Room for `ahead` finished batches while every thread works on one
        // more (the batch the consumer waits for is out of the queue).
        let (tx, rx) = sync_channel(ahead + threads.max(1) - 1);
        let stop = Arc::new(AtomicBool::new(false));
        let walker = Walker {
            source: self.source.clone(),
            info: self.info.clone(),
            layouts: self.layouts.clone(),
            cursor,
            walk,
            epoch: pos.epoch,
            stop: stop.clone(),
            pool: self.pool.clone(),
            clock: self.clock.clone(),
        };
        let handle = std::thread::Builder::new()
            .name(format!("granary-loader-r{}", self.cfg.rank))
            .spawn(move || walker.run(threads, tx))
            .map_err(ClientError::Io)?;
        Ok(EpochStream {
            rx: Some(rx),
            resume: self.state_at(pos),
            next: Position { epoch: pos.epoch, batch: start },
            total,
            stop,
            handle: Some(handle),
            clock: self.clock.clone(),
            source: self.source.clone(),
            dataset: self.info.name.clone(),
            world: self.cfg.world_size,
            reported_end: false,
        })
    }
}

/// The batches of one epoch, in plan order.
pub struct EpochStream {
    rx: Option<Receiver<Slot>>,
    /// The loader's resume state, at the position the stream began.
    resume: ResumeState,
    next: Position,
    total: u64,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    clock: Arc<RankClock>,
    /// Where the clocks are reported, and as which rank.
    source: Arc<dyn ChunkSource>,
    dataset: String,
    world: u32,
    /// The end of the epoch was reported.
    reported_end: bool,
}

impl EpochStream {
    /// Reports the clocks to the source (best effort: the next fetch
    /// surfaces a broken connection; a busy one is tried again at the next
    /// batch).
    fn report(&self) {
        let report = granary_proto::doctor::RankReport {
            dataset: self.dataset.clone(),
            rank: self.resume.rank,
            world: self.world,
            loader: self.clock.id(),
            times: self.clock.times(),
        };
        match self.source.report(&report) {
            Ok(true) => self.clock.reported(),
            Ok(false) => {}
            Err(e) => tracing::debug!(error = %e, "reporting the loader's clocks failed"),
        }
    }

    /// The position of the next batch this stream yields.
    pub fn position(&self) -> Position {
        self.next
    }

    /// The resume state at the next batch this stream yields: save it in a
    /// checkpoint, and resume with [`Loader::resume_from`].
    pub fn state(&self) -> ResumeState {
        ResumeState { epoch: self.next.epoch, batch: self.next.batch, ..self.resume.clone() }
    }

    /// Batches in the epoch.
    pub fn num_batches(&self) -> u64 {
        self.total
    }
}

impl Iterator for EpochStream {
    type Item = Result<Batch, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next.batch >= self.total {
            // An epoch's last clocks reach the node however short it was.
            if !std::mem::replace(&mut self.reported_end, true) {
                self.clock.epoch_ended();
                self.report();
            }
            return None;
        }
        let rx = self.rx.as_ref()?;
        let asked = Instant::now();
        self.clock.asked(asked);
        let next = match rx.recv() {
            Ok(Slot::Ready(result)) => Ok(result),
            Ok(Slot::Assembling(done)) => done.recv(),
            Err(e) => Err(e),
        };
        if self.clock.returned(asked, matches!(next, Ok(Ok(_)))) {
            self.report();
        }
        match next {
            Ok(Ok(batch)) => {
                self.next.batch += 1;
                Some(Ok(batch))
            }
            Ok(Err(e)) => {
                // The producer stops after an error; so does the stream.
                self.total = self.next.batch;
                Some(Err(e))
            }
            Err(_) => {
                self.total = self.next.batch;
                Some(Err(ProducerError::ThreadEnded.into()))
            }
        }
    }
}

impl Drop for EpochStream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Dropping the receiver makes a producer blocked on a full channel
        // fail its send and return; then it can be joined.
        self.rx = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// One batch's place in the ordered queue.
enum Slot {
    /// Produced (a view, a batch the walker assembled, or the error that
    /// ended the epoch).
    Ready(Result<Batch, ClientError>),
    /// Being assembled by the pool; it (or why not) arrives on this channel.
    Assembling(Receiver<Result<Batch, ClientError>>),
}

/// One batch for an assembler thread.
struct Job {
    position: Position,
    runs: Runs,
    chunks: Vec<Chunk>,
    buf: HostBuf,
    placements: Vec<Placement>,
    recycle: Arc<BufferPool>,
    done: SyncSender<Result<Batch, ClientError>>,
}

/// The background thread of one epoch: walks the plan, fetches chunks, and
/// hands out batches in plan order.
struct Walker {
    source: Arc<dyn ChunkSource>,
    info: Arc<DatasetInfo>,
    layouts: Arc<[TensorLayout]>,
    /// At the first batch to produce.
    cursor: Cursor,
    /// What the cursor walks, from where (announced to the source).
    walk: Walk,
    epoch: u64,
    stop: Arc<AtomicBool>,
    /// Assembled batches' buffers come back here when dropped.
    pool: Arc<BufferPool>,
    clock: Arc<RankClock>,
}

impl Walker {
    fn run(mut self, threads: usize, tx: SyncSender<Slot>) {
        let result = if threads <= 1 {
            self.walk(&tx, None)
        } else {
            // Assemblers live as long as the walk: dropping the job sender
            // at its end lets them take the jobs still queued and return,
            // and the scope joins them before this thread ends. Each owns a
            // handle on the job receiver, so should every assembler be gone,
            // the walker's next send fails instead of blocking forever.
            let (job_tx, job_rx) = sync_channel::<Job>(threads);
            let job_rx = Arc::new(Mutex::new(job_rx));
            let layouts = self.layouts.clone();
            let clock = self.clock.clone();
            let rank = self.walk.rank();
            std::thread::scope(|scope| {
                for k in 0..threads {
                    let (job_rx, layouts, clock) = (job_rx.clone(), &layouts, &clock);
                    let spawned = std::thread::Builder::new()
                        .name(format!("granary-asm-r{rank}-{k}"))
                        .spawn_scoped(scope, move || assembler(&job_rx, layouts, clock));
                    if let Err(e) = spawned {
                        return Err(ClientError::Io(e));
                    }
                }
                drop(job_rx);
                let result = self.walk(&tx, Some(&job_tx));
                drop(job_tx);
                result
            })
        };
        if let Err(e) = result {
            let _ = tx.send(Slot::Ready(Err(e)));
        }
    }

    fn walk(&mut self, tx: &SyncSender<Slot>, jobs: Option<&SyncSender<Job>>) -> Result<(), ClientError> {
        let version = self.info.version;
        self.source.follow(version, &self.walk)?;
        let mut held: Vec<(u32, Chunk)> = Vec::new();
        let mut rows: Vec<RowRef> = Vec::new();
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let Some(i) = self.cursor.next_batch(&mut rows) else { return Ok(()) };
            for r in &rows {
                if !held.iter().any(|(s, _)| *s == r.shard_index) {
                    let chunk = self.fetch(r.shard_index)?;
                    held.push((r.shard_index, chunk));
                }
            }
            let mut runs = Runs::default();
            runs.plan(&rows, |s| held.iter().position(|(h, _)| *h == s).unwrap_or(usize::MAX) as u32);
            let position = Position { epoch: self.epoch, batch: i as u64 };
            let slot = match (runs.runs(), jobs) {
                // One run of one chunk: the batch is that chunk's rows, in place.
                ([run], _) => {
                    let chunk = held[run.slot as usize].1.clone();
                    let offsets = rebased(&chunk, run.src as usize, rows.len());
                    let storage = Storage::View { chunk, first_row: run.src as usize, offsets };
                    Slot::Ready(Ok(Batch { position, rows: rows.len(), layouts: self.layouts.clone(), storage }))
                }
                (_, None) => {
                    let chunks: Vec<Chunk> = held.iter().map(|(_, c)| c.clone()).collect();
                    let (mut buf, placements) = self.buffer(&runs, &chunks)?;
                    let started = Instant::now();
                    assemble(&runs, &chunks, &self.layouts, &placements, buf.as_mut_slice());
                    self.clock.assembly(started.elapsed());
                    Slot::Ready(Ok(owned_batch(position, rows.len(), &self.layouts, buf, placements, &self.pool)))
                }
                (_, Some(jobs)) => {
                    let (done, arrives) = sync_channel(1);
                    let chunks: Vec<Chunk> = held.iter().map(|(_, c)| c.clone()).collect();
                    let (buf, placements) = self.buffer(&runs, &chunks)?;
                    let job = Job { position, runs, chunks, buf, placements, recycle: self.pool.clone(), done };
                    // Queue the slot first: order is the queue's order.
                    if tx.send(Slot::Assembling(arrives)).is_err() || jobs.send(job).is_err() {
                        return Ok(());
                    }
                    // A shard's rows all lie in one shuffle window: once none
                    // of them is left to hand out, its chunk is not needed
                    // again (the job holds its own references).
                    held.retain(|(s, _)| self.cursor.pending(*s));
                    continue;
                }
            };
            held.retain(|(s, _)| self.cursor.pending(*s));
            if tx.send(slot).is_err() {
                return Ok(());
            }
        }
    }

    /// A buffer for the batch of `runs` over `chunks` (a recycled one when
    /// the pool has one), and where each tensor goes in it.
    fn buffer(&self, runs: &Runs, chunks: &[Chunk]) -> Result<(HostBuf, Vec<Placement>), ClientError> {
        let rows = runs.rows();
        let values = runs.values(chunks, &self.layouts);
        let mut placements = Vec::with_capacity(self.layouts.len());
        let used =
            pack_values(&self.layouts, rows, &values, &mut placements).ok_or(ProtocolError::BatchTooLarge { rows })?;
        Ok((self.pool.take(used)?, placements))
    }

    /// Fetches a chunk and checks it matches the description the plan used.
    fn fetch(&self, shard_index: u32) -> Result<Chunk, ClientError> {
        let entry = self.info.shards[shard_index as usize];
        let started = Instant::now();
        let chunk = self.source.fetch(self.info.version, entry.shard);
        self.clock.chunk_wait(started.elapsed());
        let chunk = chunk?;
        let h = chunk.header();
        let layout_matches = h.tensors.len() == self.layouts.len()
            && h.tensors.iter().zip(self.layouts.iter()).all(|(m, l)| {
                m.name == l.name && m.dtype == l.dtype && m.shape == l.shape && m.is_jagged() == l.jagged
            });
        if h.rows != entry.rows || !layout_matches {
            return Err(ProtocolError::ChunkShape {
                shard: entry.shard,
                rows: h.rows,
                tensors: h.tensors.iter().map(|t| t.name.clone()).collect(),
                expected_rows: entry.rows,
                expected_tensors: self.layouts.iter().map(|t| t.name.clone()).collect(),
            }
            .into());
        }
        Ok(chunk)
    }
}

/// The row offsets of `chunk`'s jagged tensors for its rows `first..first +
/// rows`, rebased to the first row's first value (empty for dense tensors):
/// all a view into the chunk copies.
fn rebased(chunk: &Chunk, first: usize, rows: usize) -> Vec<Vec<u64>> {
    if !chunk.header().tensors.iter().any(|t| t.is_jagged()) {
        return Vec::new();
    }
    (0..chunk.header().tensors.len())
        .map(|i| match chunk.row_offsets(i).and_then(|o| o.get(first..=first + rows)) {
            Some(o) => o.iter().map(|&x| x - o[0]).collect(),
            None => Vec::new(),
        })
        .collect()
}

fn owned_batch(
    position: Position,
    rows: usize,
    layouts: &Arc<[TensorLayout]>,
    buf: HostBuf,
    placements: Vec<Placement>,
    recycle: &Arc<BufferPool>,
) -> Batch {
    let storage = Storage::Owned { buf, placements, recycle: Some(recycle.clone()) };
    Batch { position, rows, layouts: layouts.clone(), storage }
}

/// An assembler thread: takes jobs until the walker is done.
fn assembler(jobs: &Mutex<Receiver<Job>>, layouts: &Arc<[TensorLayout]>, clock: &RankClock) {
    loop {
        // The lock is held only while waiting for the next job (never while
        // assembling), so it cannot be poisoned; if it were, stop.
        let job = match jobs.lock() {
            Ok(rx) => match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            },
            Err(_) => return,
        };
        let Job { position, runs, chunks, mut buf, placements, recycle, done } = job;
        // A panic in the kernels (a chunk inconsistent with the plan that
        // validation missed) becomes this batch's error, not a dead thread.
        let started = Instant::now();
        let assembled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assemble(&runs, &chunks, layouts, &placements, buf.as_mut_slice())
        }));
        clock.assembly(started.elapsed());
        drop(chunks);
        let result = match assembled {
            Ok(()) => Ok(owned_batch(position, runs.rows(), layouts, buf, placements, &recycle)),
            Err(_) => Err(ProducerError::AssemblyPanicked { epoch: position.epoch, batch: position.batch }.into()),
        };
        // A consumer that went away drops the batch (and its buffer).
        let _ = done.send(result);
    }
}

#[cfg(test)]
mod tests {
    use super::ConnectWait;
    use std::time::{Duration, Instant};

    /// Pauses double from 50 ms to 1 s, the last is cut to what is left,
    /// and none comes once the wait is spent.
    #[test]
    fn a_loader_waits_for_its_node_with_doubling_pauses_until_its_reconnect_time() {
        let t0 = Instant::now();
        let mut w = ConnectWait::new(t0, Duration::from_secs(3));
        let ms = Duration::from_millis;
        let mut now = t0;
        let mut pauses = Vec::new();
        while let Some(p) = w.next(now) {
            pauses.push(p);
            now += p;
        }
        assert_eq!(pauses, [ms(50), ms(100), ms(200), ms(400), ms(800), ms(1_000), ms(450)]);
        assert_eq!(now, t0 + Duration::from_secs(3));
        assert_eq!(ConnectWait::new(t0, Duration::ZERO).next(t0), None, "zero: the error at once");
    }
}
