//! `granary.Loader` and its epoch iterator.
//!
//! The loader pins one dataset version and plans each epoch as the Rust
//! client does (the order is a pure function of the job: seed, rank, world
//! size, batch size, shuffle; with `global_batch`, the global plan, whose
//! global steps are the same on every world size dividing it). Iterating waits for batches with the GIL
//! released, so other Python threads run meanwhile. The resume state is the
//! Rust client's [`ResumeState`] as a plain dict (its JSON form), so a
//! checkpoint written from Python resumes a Rust rank and back.
//!
//! A loader holds a connection to the node and threads that assemble
//! batches; neither survives `fork`, so a loader (or an epoch) used in a
//! process other than the one that made it refuses with
//! `ForkedProcessError` instead of hanging.

use crate::batch::Batch;
use crate::errors::{raise, to_py, value_error};
use granary_client::Position;
use granary_client::{EpochStream, LoaderConfig, PlanKind, ResumeState};
use granary_proto::{DatasetVersion, Shuffle};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

// The signatures' literal default (a literal, so `help()` shows it).
const _: () = assert!(granary_client::local::DEFAULT_MAPPING_CACHE_BYTES == 1073741824);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Refuses use from a process other than `made_in` (a fork).
fn check_pid(py: Python<'_>, what: &str, made_in: u32) -> PyResult<()> {
    let now = std::process::id();
    if now == made_in {
        return Ok(());
    }
    Err(raise(
        py,
        "ForkedProcessError",
        format!(
            "this {what} was made in process {made_in} and cannot be used in process {now} (a fork, such as a \
             DataLoader worker): its node connection and threads stay in the parent. Make the Loader in the \
             process that iterates it, or use DataLoader(num_workers=0)"
        ),
        &[],
    ))
}

/// A resume state as its JSON dict.
fn state_to_dict<'py>(py: Python<'py>, s: &ResumeState) -> PyResult<Bound<'py, PyAny>> {
    let json = serde_json::to_string(s).map_err(|e| value_error(py, format!("resume state: {e}")))?;
    py.import("json")?.call_method1("loads", (json,))
}

/// A dict (as `state_dict` gave it) as a resume state.
fn state_from_dict(py: Python<'_>, d: &Bound<'_, PyAny>) -> PyResult<ResumeState> {
    let json: String = py
        .import("json")?
        .call_method1("dumps", (d,))
        .map_err(|e| value_error(py, format!("not a granary resume state (not plain JSON data: {e})")))?
        .extract()?;
    serde_json::from_str(&json).map_err(|e| value_error(py, format!("not a granary resume state ({e}): {json}")))
}

/// Batches of one epoch, in plan order. Made by `Loader.epoch` or
/// `Loader.resume`.
#[pyclass(frozen, module = "granary._granary")]
pub struct Epoch {
    /// None once dropped.
    stream: Mutex<Option<EpochStream>>,
    /// The resume state where the iterator began; `next` says where it is.
    base: ResumeState,
    /// The position of the next batch (readable while `stream` is locked
    /// by a thread waiting for a batch).
    next: Mutex<Position>,
    /// The loader's record of where its rank is (updated per batch).
    progress: Arc<Mutex<ResumeState>>,
    /// The first error, raised again by every later `next()`: an epoch
    /// that failed never looks like one that ended.
    failed: Mutex<Option<String>>,
    made_in: u32,
    /// Batches this iterator yields in all.
    len: u64,
}

impl Epoch {
    fn new(stream: EpochStream, progress: Arc<Mutex<ResumeState>>) -> Self {
        let len = stream.num_batches() - stream.position().batch;
        Self {
            base: stream.state(),
            next: Mutex::new(stream.position()),
            stream: Mutex::new(Some(stream)),
            progress,
            failed: Mutex::new(None),
            made_in: std::process::id(),
            len,
        }
    }
}

impl Drop for Epoch {
    /// Stopping the stream joins its assembly threads, which may wait on
    /// the node: that happens on a thread of its own, never while holding
    /// the GIL. In a forked child the threads do not exist: nothing to
    /// join, so the stream is forgotten.
    fn drop(&mut self) {
        let Some(stream) = self.stream.get_mut().unwrap_or_else(PoisonError::into_inner).take() else { return };
        if std::process::id() != self.made_in {
            std::mem::forget(stream);
        } else if std::thread::Builder::new().name("granary-epoch-drop".into()).spawn(move || drop(stream)).is_err() {
            // No thread to be had: the stream was dropped with the closure.
        }
    }
}

#[pymethods]
impl Epoch {
    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__(slf: &Bound<'_, Self>) -> PyResult<Option<Batch>> {
        let py = slf.py();
        let this = slf.get();
        check_pid(py, "epoch iterator", this.made_in)?;
        if let Some(first) = lock(&this.failed).clone() {
            return Err(raise(
                py,
                "GranaryError",
                format!("this epoch stopped after an error ({first}); resume from the loader's state_dict()"),
                &[],
            ));
        }
        // The wait for the assembly threads, without the GIL. Positions are
        // updated under the stream's lock, so they only move forward.
        let item = py.detach(|| {
            let mut guard = lock(&this.stream);
            let s = guard.as_mut()?;
            let item = s.next();
            if let Some(Ok(_)) = &item {
                let next = EpochStream::position(s);
                *lock(&this.next) = next;
                let mut p = lock(&this.progress);
                // The rest of the state is the loader's own.
                (p.epoch, p.batch) = (next.epoch, next.batch);
            }
            item
        });
        match item {
            None => Ok(None),
            Some(Ok(b)) => Ok(Some(Batch::new(b))),
            Some(Err(e)) => {
                *lock(&this.failed) = Some(e.to_string());
                Err(to_py(py, e))
            }
        }
    }

    /// Batches this iterator yields in all (from where it began).
    fn __len__(&self) -> usize {
        self.len as usize
    }

    /// The resume state at the next batch this iterator yields.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let next = *lock(&self.next);
        let s = ResumeState { epoch: next.epoch, batch: next.batch, ..self.base.clone() };
        state_to_dict(py, &s)
    }

    /// (epoch, index) of the next batch.
    #[getter]
    fn position(&self) -> (u64, u64) {
        let p = *lock(&self.next);
        (p.epoch, p.batch)
    }
}

/// One data-parallel rank's loader, reading ``dataset`` from the Granary node whose socket is ``socket``.
///
/// The dataset version is pinned when the loader is made (``version``: 32 hex digits, or the node's
/// current version); registering a new version does not change what a running job reads.
///
/// Arguments:
///     seed, rank, world_size: the job's seed and this rank of ``world_size``; every rank of one job
///         gets disjoint rows, and together all of them (less what ``drop_last`` drops).
///     shuffle: False keeps manifest order; True mixes rows within windows of ``window_shards``
///         shards (default 4), or, with ``block_batches`` > 0, keeps rows in chunk order and
///         shuffles which contiguous run each batch is within groups of that many batches (such a
///         batch is a read-only view of the node's chunk memory: nothing is copied at all).
///     drop_last: drop rows that do not fill a batch on every rank.
///     prefetch_batches: batches assembled ahead of the consumer (one batch of memory each).
///     assembly_threads: threads that assemble batches (0: the cores / LOCAL_WORLD_SIZE, 1 to 8).
///     mapping_cache_bytes: chunk mappings kept for later epochs (default 1 GiB).
///     reconnect_seconds: how long to keep reconnecting to a node that
///         restarts before the epoch raises NodeUnavailableError (default 30;
///         0 raises at once).
///     global_batch, partitions: walk the global plan: every step is ``global_batch`` rows, the same
///         on every world size that divides it, drawn from ``partitions`` canonical partitions
///         (fixed for the job); ``batch_size`` must be ``global_batch // world_size``. A
///         ``state_dict()`` then resumes on any such world size (``Loader.resuming(socket, state,
///         rank=, world_size=)`` or ``load_state_dict``), at the same step.
///
/// ``loader.epoch(e)`` iterates epoch ``e``'s batches (with the GIL released while waiting);
/// ``len(loader)`` is batches per epoch; ``loader.state_dict()`` is the whole resume state as a
/// plain dict, and ``loader.load_state_dict(state)`` (or ``Loader.resuming(socket, state)``)
/// continues at exactly the next batch.
///
/// Errors are :class:`granary.GranaryError` subclasses (see :mod:`granary.errors`).
#[pyclass(frozen, module = "granary._granary")]
pub struct Loader {
    inner: granary_client::Loader,
    socket: PathBuf,
    made_in: u32,
    /// Where the rank is: the state after the last batch handed out, or a
    /// state loaded with `load_state_dict`.
    progress: Arc<Mutex<ResumeState>>,
    /// A loaded state not yet resumed: the next `epoch(state.epoch)` starts
    /// at its batch.
    pending: Mutex<Option<ResumeState>>,
}

/// The shuffle the keyword arguments name.
fn shuffle_of(py: Python<'_>, shuffle: bool, window_shards: u32, block_batches: u32) -> PyResult<Shuffle> {
    if !shuffle {
        return Ok(Shuffle::Off);
    }
    if block_batches > 0 {
        return Ok(Shuffle::Blocks { window_batches: block_batches });
    }
    if window_shards == 0 {
        return Err(value_error(py, "window_shards must be at least 1 (or shuffle=False)".into()));
    }
    Ok(Shuffle::Windowed { window_shards })
}

/// Most batches a loader may assemble ahead, and assembly threads: each
/// costs a batch of memory (and a thread), and a number past these is a
/// mistake, not a setting.
const MAX_PREFETCH_BATCHES: usize = 1024;
const MAX_ASSEMBLY_THREADS: usize = 256;

impl Loader {
    fn connect(py: Python<'_>, socket: PathBuf, cfg: LoaderConfig) -> PyResult<Self> {
        if cfg.batch_size == 0 {
            return Err(value_error(py, "batch_size must be at least 1".into()));
        }
        if !(1..=MAX_PREFETCH_BATCHES).contains(&cfg.prefetch_batches) {
            return Err(value_error(
                py,
                format!("prefetch_batches must be 1 to {MAX_PREFETCH_BATCHES}, not {}", cfg.prefetch_batches),
            ));
        }
        if cfg.assembly_threads > MAX_ASSEMBLY_THREADS {
            return Err(value_error(
                py,
                format!(
                    "assembly_threads must be 0 (chosen from the machine) to {MAX_ASSEMBLY_THREADS}, not {}",
                    cfg.assembly_threads
                ),
            ));
        }
        let path = socket.clone();
        let inner = py.detach(move || granary_client::Loader::connect(&path, cfg)).map_err(|e| to_py(py, e))?;
        let start = inner.state_at(Position { epoch: 0, batch: 0 });
        Ok(Self {
            inner,
            socket,
            made_in: std::process::id(),
            progress: Arc::new(Mutex::new(start)),
            pending: Mutex::new(None),
        })
    }

    /// Checks `state` against this loader and its epoch's length.
    fn check_state(&self, py: Python<'_>, state: &ResumeState) -> PyResult<()> {
        if let Some(m) = state.mismatch(&self.inner.state_at(state.position())) {
            return Err(to_py(py, m.into()));
        }
        let batches = self.inner.num_batches(state.epoch).map_err(|e| to_py(py, e))? as u64;
        if state.batch > batches {
            return Err(to_py(
                py,
                granary_client::ClientError::PositionPastEnd { epoch: state.epoch, batch: state.batch, batches },
            ));
        }
        Ok(())
    }
}

/// `reconnect_seconds` as a duration: 0 to a day.
fn reconnect_of(py: Python<'_>, seconds: f64) -> PyResult<std::time::Duration> {
    if !(0.0..=86_400.0).contains(&seconds) {
        return Err(value_error(py, format!("reconnect_seconds must be from 0 to 86400, not {seconds}")));
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

#[pymethods]
impl Loader {
    #[new]
    #[pyo3(signature = (
        socket, dataset, batch_size, *, seed=0, rank=0, world_size=1, shuffle=true, window_shards=4,
        block_batches=0, drop_last=false, version=None, prefetch_batches=2, assembly_threads=0,
        mapping_cache_bytes=1073741824, reconnect_seconds=30.0, global_batch=None, partitions=1
    ))]
    #[allow(clippy::too_many_arguments)]
    fn py_new(
        py: Python<'_>,
        socket: PathBuf,
        dataset: String,
        batch_size: u32,
        seed: u64,
        rank: u32,
        world_size: u32,
        shuffle: bool,
        window_shards: u32,
        block_batches: u32,
        drop_last: bool,
        version: Option<&str>,
        prefetch_batches: usize,
        assembly_threads: usize,
        mapping_cache_bytes: u64,
        reconnect_seconds: f64,
        global_batch: Option<u32>,
        partitions: u32,
    ) -> PyResult<Self> {
        let reconnect = reconnect_of(py, reconnect_seconds)?;
        let plan = match global_batch {
            None => PlanKind::Rank,
            Some(g) if u64::from(batch_size) * u64::from(world_size) == u64::from(g) => {
                PlanKind::Global { global_batch: g, partitions }
            }
            Some(g) => {
                return Err(value_error(
                    py,
                    format!(
                        "with global_batch={g}, batch_size is this rank's share of it, global_batch / world_size: \
                         {g} / {world_size} is not {batch_size} (the world size must divide the global batch)"
                    ),
                ));
            }
        };
        let version =
            match version {
                None => None,
                Some(v) => Some(DatasetVersion::from_hex(v).ok_or_else(|| {
                    value_error(py, format!("version {v:?} is not a dataset version (32 hex digits)"))
                })?),
            };
        let cfg = LoaderConfig {
            version,
            seed,
            rank,
            world_size,
            shuffle: shuffle_of(py, shuffle, window_shards, block_batches)?,
            drop_last,
            plan,
            prefetch_batches,
            assembly_threads,
            mapping_cache_bytes,
            reconnect,
            ..LoaderConfig::new(dataset, batch_size)
        };
        Self::connect(py, socket, cfg)
    }

    /// A loader that reads what `state` was saved from (its dataset,
    /// version and plan parameters), positioned at it: the next
    /// `epoch(state["epoch"])` continues at exactly the next batch. A
    /// state of the global plan resumes as any `rank` of any `world_size`
    /// that divides its global batch (default: the state's own).
    #[staticmethod]
    #[pyo3(signature = (socket, state, *, rank=None, world_size=None, prefetch_batches=2, assembly_threads=0,
        mapping_cache_bytes=1073741824, reconnect_seconds=30.0))]
    #[allow(clippy::too_many_arguments)]
    fn resuming(
        py: Python<'_>,
        socket: PathBuf,
        state: &Bound<'_, PyAny>,
        rank: Option<u32>,
        world_size: Option<u32>,
        prefetch_batches: usize,
        assembly_threads: usize,
        mapping_cache_bytes: u64,
        reconnect_seconds: f64,
    ) -> PyResult<Self> {
        let mut s = state_from_dict(py, state)?;
        s.rank = rank.unwrap_or(s.rank);
        s.world_size = world_size.unwrap_or(s.world_size);
        let reconnect = reconnect_of(py, reconnect_seconds)?;
        let cfg = LoaderConfig {
            prefetch_batches,
            assembly_threads,
            mapping_cache_bytes,
            reconnect,
            ..LoaderConfig::resuming(&s)
        };
        let loader = Self::connect(py, socket, cfg)?;
        s.batch_size = loader.inner.config().batch_size;
        loader.check_state(py, &s)?;
        *lock(&loader.progress) = s.clone();
        *lock(&loader.pending) = Some(s);
        Ok(loader)
    }

    /// The batches of epoch `epoch`, from its first (or from the batch a
    /// loaded state names, for that state's epoch).
    fn epoch(&self, py: Python<'_>, epoch: u64) -> PyResult<Epoch> {
        check_pid(py, "Loader", self.made_in)?;
        let pending = lock(&self.pending).clone().filter(|s| s.epoch == epoch);
        let inner = &self.inner;
        let stream = py
            .detach(|| match &pending {
                Some(s) => inner.resume_from(s),
                None => inner.epoch(epoch),
            })
            .map_err(|e| to_py(py, e))?;
        // Used once it worked: a failed start keeps it for the next try.
        if pending.is_some() {
            *lock(&self.pending) = None;
        }
        Ok(Epoch::new(stream, self.progress.clone()))
    }

    /// The batches from where `state` (a `state_dict()`) was saved; refuses
    /// a state this loader would read differently.
    fn resume(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<Epoch> {
        check_pid(py, "Loader", self.made_in)?;
        let s = state_from_dict(py, state)?;
        let inner = &self.inner;
        let stream = py.detach(|| inner.resume_from(&s)).map_err(|e| to_py(py, e))?;
        *lock(&self.pending) = None;
        Ok(Epoch::new(stream, self.progress.clone()))
    }

    /// The whole resume state at the rank's next batch (after the last one
    /// handed out), as a plain dict a checkpoint can hold.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = lock(&self.progress).clone();
        state_to_dict(py, &s)
    }

    /// Continues from `state` (a `state_dict()`): the next
    /// `epoch(state["epoch"])` starts at `state["batch"]`. Refuses a state
    /// saved under another version, plan, seed, shuffle or drop_last, or
    /// (with the rank plan) another world size, rank or batch size. A state
    /// of the global plan loads into a loader of any world size dividing
    /// its global batch, and continues at the same global step.
    fn load_state_dict(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut s = state_from_dict(py, state)?;
        self.check_state(py, &s)?;
        // The state is now this rank's (with the global plan it may have
        // been another world's).
        let c = self.inner.config();
        (s.rank, s.world_size, s.batch_size) = (c.rank, c.world_size, c.batch_size);
        *lock(&self.progress) = s.clone();
        *lock(&self.pending) = Some(s);
        Ok(())
    }

    /// How often, and how long in all, this loader waited for its node to
    /// come back (a restart, a reconnect): `{"reconnects": n, "waited_s": s}`.
    fn stalls<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stalls();
        let d = PyDict::new(py);
        d.set_item("reconnects", s.reconnects)?;
        d.set_item("waited_s", s.waited.as_secs_f64())?;
        Ok(d)
    }

    /// Batches in an epoch (the same on every rank and in every epoch).
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.num_batches(0).map_err(|e| to_py(py, e))
    }

    /// Batches in epoch `epoch`.
    fn num_batches(&self, py: Python<'_>, epoch: u64) -> PyResult<usize> {
        self.inner.num_batches(epoch).map_err(|e| to_py(py, e))
    }

    /// The dataset version this loader reads (32 hex digits), pinned when
    /// it was made.
    #[getter]
    fn version(&self) -> String {
        self.inner.version().to_hex()
    }

    /// The dataset's name.
    #[getter]
    fn dataset(&self) -> String {
        self.inner.config().dataset.clone()
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> u32 {
        self.inner.config().rank
    }

    /// Number of ranks.
    #[getter]
    fn world_size(&self) -> u32 {
        self.inner.config().world_size
    }

    /// Rows per batch.
    #[getter]
    fn batch_size(&self) -> u32 {
        self.inner.config().batch_size
    }

    /// The job's seed.
    #[getter]
    fn seed(&self) -> u64 {
        self.inner.config().seed
    }

    /// Rows of a global step, all ranks together, with the global plan;
    /// None with the rank plan.
    #[getter]
    fn global_batch(&self) -> Option<u32> {
        match self.inner.config().plan {
            PlanKind::Global { global_batch, .. } => Some(global_batch),
            PlanKind::Rank => None,
        }
    }

    /// The node's socket.
    #[getter]
    fn socket(&self) -> PathBuf {
        self.socket.clone()
    }

    /// Rows in the dataset version.
    #[getter]
    fn total_rows(&self) -> u64 {
        self.inner.info().shards.iter().map(|s| s.rows).sum()
    }

    /// The tensors every batch holds: a list of dicts with `name`, `dtype`
    /// (Granary's name: f32 ... bool, bf16), `shape` (per row; of a jagged
    /// tensor, per value) and `jagged` (a list or byte column).
    #[getter]
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for l in &self.inner.info().tensors {
            let d = PyDict::new(py);
            d.set_item("name", &l.name)?;
            d.set_item("dtype", l.dtype.name())?;
            d.set_item("shape", l.shape.iter().map(|&x| x as usize).collect::<Vec<_>>())?;
            d.set_item("jagged", l.jagged)?;
            out.append(d)?;
        }
        Ok(out)
    }

    fn __repr__(&self) -> String {
        let c = self.inner.config();
        format!(
            "<granary.Loader {} version {} rank {}/{} batch_size {} seed {} via {}>",
            c.dataset,
            self.inner.version().to_hex(),
            c.rank,
            c.world_size,
            c.batch_size,
            c.seed,
            self.socket.display()
        )
    }
}
