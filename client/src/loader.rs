//! The loader: plan, fetch, assemble, in that order, one epoch at a time.
//!
//! [`Loader::epoch`] walks the rank's plan locally ([`PlanCursor`]: a shuffle
//! window of rows at a time, never the whole epoch's) and starts one
//! background thread that walks it: it fetches each chunk when a batch first
//! needs it, copies the batch's rows out of the chunks into pooled buffers,
//! and drops each chunk after the last batch that reads it, so at most a
//! shuffle window of chunks is held. Finished batches wait in a bounded
//! channel of `prefetch_batches`. Order comes from the plan alone; the
//! thread only decides *when* work happens, never *what* is produced.
//!
//! Resume state is a [`Position`]: [`Loader::resume`] continues at exactly
//! that batch.

use crate::batch::Batch;
use crate::error::ClientError;
use crate::local::LocalSource;
use crate::source::{Chunk, ChunkSource};
use granary_proto::wire::DatasetInfo;
use granary_proto::{AlignedBuf, PlanCursor, PlanParams, RankPlan, RowRef, Shuffle, TensorLayout, plan_rank};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, sync_channel};
use std::thread::JoinHandle;

/// A place in the plan: the whole resume state of a rank.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Default)]
pub struct Position {
    /// Epoch, from 0.
    pub epoch: u64,
    /// Batch index within the epoch.
    pub batch: u64,
}

/// What a rank asks for.
#[derive(Clone, Debug)]
pub struct LoaderConfig {
    /// Dataset name.
    pub dataset: String,
    /// The job's seed.
    pub seed: u64,
    /// This rank.
    pub rank: u32,
    /// Number of data-parallel ranks.
    pub world_size: u32,
    /// Rows per batch.
    pub batch_size: u32,
    /// Shuffle settings. Default: windows of 4 shards.
    pub shuffle: Shuffle,
    /// Drop rows that do not fill a batch on every rank. Default: false.
    pub drop_last: bool,
    /// Batches assembled ahead of the consumer. Default: 2.
    pub prefetch_batches: usize,
}

impl LoaderConfig {
    /// Defaults for a single rank: seed 0, shuffle windows of 4 shards, keep
    /// the last partial batch, 2 batches ahead.
    pub fn new(dataset: impl Into<String>, batch_size: u32) -> Self {
        Self {
            dataset: dataset.into(),
            seed: 0,
            rank: 0,
            world_size: 1,
            batch_size,
            shuffle: Shuffle::Windowed { window_shards: 4 },
            drop_last: false,
            prefetch_batches: 2,
        }
    }

    /// The plan parameters for `epoch`.
    pub fn params(&self, epoch: u64) -> PlanParams {
        PlanParams {
            seed: self.seed,
            epoch,
            world_size: self.world_size,
            rank: self.rank,
            batch_size: self.batch_size,
            shuffle: self.shuffle,
            drop_last: self.drop_last,
        }
    }
}

/// A rank's data loader.
pub struct Loader {
    source: Arc<dyn ChunkSource>,
    info: Arc<DatasetInfo>,
    layouts: Arc<[TensorLayout]>,
    cfg: LoaderConfig,
}

impl Loader {
    /// A loader reading from the node whose socket is at `socket`.
    pub fn connect(socket: impl AsRef<Path>, cfg: LoaderConfig) -> Result<Self, ClientError> {
        Self::new(Arc::new(LocalSource::connect(socket)?), cfg)
    }

    /// A loader reading from any source.
    pub fn new(source: Arc<dyn ChunkSource>, cfg: LoaderConfig) -> Result<Self, ClientError> {
        let info = source.describe(&cfg.dataset)?;
        // Validate the parameters once, up front (a cursor holds no rows).
        PlanCursor::new(info.version, &info.shards, &cfg.params(0), 0)?;
        let layouts: Arc<[TensorLayout]> = info.tensors.clone().into();
        Ok(Self { source, info: Arc::new(info), layouts, cfg })
    }

    /// The dataset as the source described it.
    pub fn info(&self) -> &DatasetInfo {
        &self.info
    }

    /// The configuration.
    pub fn config(&self) -> &LoaderConfig {
        &self.cfg
    }

    /// This rank's plan for `epoch`, whole (every row of the epoch: for
    /// inspection and tests; the loader itself walks a [`PlanCursor`]).
    pub fn plan(&self, epoch: u64) -> Result<RankPlan, ClientError> {
        Ok(plan_rank(self.info.version, &self.info.shards, &self.cfg.params(epoch))?)
    }

    /// Batches in `epoch` (equal on every rank), without building the plan.
    pub fn num_batches(&self, epoch: u64) -> Result<usize, ClientError> {
        Ok(PlanCursor::new(self.info.version, &self.info.shards, &self.cfg.params(epoch), 0)?.num_batches())
    }

    /// All batches of `epoch`, from the first.
    pub fn epoch(&self, epoch: u64) -> Result<EpochStream, ClientError> {
        self.resume(Position { epoch, batch: 0 })
    }

    /// The batches of `pos.epoch` from batch `pos.batch` on.
    pub fn resume(&self, pos: Position) -> Result<EpochStream, ClientError> {
        let params = self.cfg.params(pos.epoch);
        let start = usize::try_from(pos.batch).unwrap_or(usize::MAX);
        let cursor = PlanCursor::new(self.info.version, &self.info.shards, &params, start)?;
        let total = cursor.num_batches() as u64;
        let start = pos.batch.min(total);
        let (tx, rx) = sync_channel(self.cfg.prefetch_batches.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let producer = Producer {
            source: self.source.clone(),
            info: self.info.clone(),
            layouts: self.layouts.clone(),
            cursor,
            epoch: pos.epoch,
            stop: stop.clone(),
        };
        let handle = std::thread::Builder::new()
            .name(format!("granary-loader-r{}", self.cfg.rank))
            .spawn(move || producer.run(tx))
            .map_err(ClientError::Io)?;
        Ok(EpochStream {
            rx: Some(rx),
            next: Position { epoch: pos.epoch, batch: start },
            total,
            stop,
            handle: Some(handle),
        })
    }
}

/// The batches of one epoch, in plan order.
pub struct EpochStream {
    rx: Option<Receiver<Result<Batch, ClientError>>>,
    next: Position,
    total: u64,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl EpochStream {
    /// The position of the next batch this stream yields: save it to resume.
    pub fn state(&self) -> Position {
        self.next
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
            return None;
        }
        let rx = self.rx.as_ref()?;
        match rx.recv() {
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
                Some(Err(ClientError::Producer("loader thread ended early".into())))
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

struct Producer {
    source: Arc<dyn ChunkSource>,
    info: Arc<DatasetInfo>,
    layouts: Arc<[TensorLayout]>,
    /// At the first batch to produce.
    cursor: PlanCursor,
    epoch: u64,
    stop: Arc<AtomicBool>,
}

impl Producer {
    fn run(mut self, tx: SyncSender<Result<Batch, ClientError>>) {
        if let Err(e) = self.walk(&tx) {
            let _ = tx.send(Err(e));
        }
    }

    fn walk(&mut self, tx: &SyncSender<Result<Batch, ClientError>>) -> Result<(), ClientError> {
        let version = self.info.version;
        self.source.follow(version, self.cursor.params())?;
        let mut held: Vec<(u32, Chunk)> = Vec::new();
        let (pool_tx, pool_rx) = sync_channel::<Vec<AlignedBuf>>(4);
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
            let mut bufs = match pool_rx.try_recv() {
                Ok(b) => b,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => {
                    vec![AlignedBuf::zeroed(0); self.layouts.len()]
                }
            };
            assemble(&rows, &held, &self.layouts, &mut bufs);
            // A shard's rows all lie in one shuffle window: once none of
            // them is left to hand out, its chunk is not needed again.
            held.retain(|(s, _)| self.cursor.pending(*s));
            let batch = Batch {
                position: crate::Position { epoch: self.epoch, batch: i as u64 },
                rows: rows.len(),
                layouts: self.layouts.clone(),
                bufs,
                recycle: Some(pool_tx.clone()),
            };
            if tx.send(Ok(batch)).is_err() {
                return Ok(());
            }
        }
    }

    /// Fetches a chunk and checks it matches the description the plan used.
    fn fetch(&self, shard_index: u32) -> Result<Chunk, ClientError> {
        let entry = self.info.shards[shard_index as usize];
        let chunk = self.source.fetch(self.info.version, entry.shard)?;
        let h = chunk.header();
        let layout_matches = h.tensors.len() == self.layouts.len()
            && h.tensors
                .iter()
                .zip(self.layouts.iter())
                .all(|(m, l)| m.name == l.name && m.dtype == l.dtype && m.shape == l.shape);
        if h.rows != entry.rows || !layout_matches {
            return Err(ClientError::Protocol(format!(
                "chunk {} has {} rows and tensors {:?}; the dataset description says {} rows and {:?}",
                entry.shard,
                h.rows,
                h.tensors.iter().map(|t| &t.name).collect::<Vec<_>>(),
                entry.rows,
                self.layouts.iter().map(|t| &t.name).collect::<Vec<_>>()
            )));
        }
        Ok(chunk)
    }
}

/// Copies the rows of one batch out of their chunks into `bufs`, one
/// row-major buffer per tensor. Every row's chunk must be in `held`.
fn assemble(rows: &[RowRef], held: &[(u32, Chunk)], layouts: &[TensorLayout], bufs: &mut [AlignedBuf]) {
    // Resolve each row's chunk once, not once per tensor.
    let slot: Vec<usize> =
        rows.iter().map(|r| held.iter().position(|(s, _)| *s == r.shard_index).unwrap_or(usize::MAX)).collect();
    for (t, layout) in layouts.iter().enumerate() {
        let rb = layout.row_bytes();
        let sources: Vec<&[u8]> = held.iter().map(|(_, c)| c.tensor_bytes(t)).collect();
        let buf = &mut bufs[t];
        buf.resize(rows.len() * rb);
        let dst = buf.as_mut_slice();
        match rb {
            1 => gather::<1>(rows, &slot, &sources, dst),
            2 => gather::<2>(rows, &slot, &sources, dst),
            4 => gather::<4>(rows, &slot, &sources, dst),
            8 => gather::<8>(rows, &slot, &sources, dst),
            16 => gather::<16>(rows, &slot, &sources, dst),
            32 => gather::<32>(rows, &slot, &sources, dst),
            _ => {
                for (k, (r, &s)) in rows.iter().zip(&slot).enumerate() {
                    let off = r.row as usize * rb;
                    dst[k * rb..(k + 1) * rb].copy_from_slice(&sources[s][off..off + rb]);
                }
            }
        }
    }
}

/// Row gather with a compile-time row size, so small rows are single moves.
fn gather<const N: usize>(rows: &[RowRef], slot: &[usize], sources: &[&[u8]], dst: &mut [u8]) {
    for ((r, &s), out) in rows.iter().zip(slot).zip(dst.chunks_exact_mut(N)) {
        let off = r.row as usize * N;
        out.copy_from_slice(&sources[s][off..off + N]);
    }
}
