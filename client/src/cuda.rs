//! Copying batches to the GPU, double-buffered (feature `cuda`).
//!
//! A [`GpuFeed`] owns one CUDA stream and two *slots*. A slot is a pinned
//! (page-locked) host buffer, a device buffer of the same size, and two
//! events: `copied`, recorded on the feed's stream after the slot's
//! host-to-device copy, and `released`, which a consumer may record on its own
//! stream once its kernels have read the slot. [`GpuFeed::upload`] packs every
//! tensor of a [`Batch`] into the next slot's pinned buffer at 64-byte-aligned
//! offsets (see [`slot_bytes`]), enqueues one asynchronous copy of the used
//! bytes, and returns a [`GpuBatch`] describing the tensors on the device.
//! Slots alternate, so the copy of batch n+1 runs while the GPU still works on
//! batch n; [`GpuStream`] goes one step further and enqueues batch n+1 before
//! handing batch n to the caller, so the copy also overlaps host-side work.
//!
//! ## One host copy
//! [`GpuStream`] takes ownership of each batch. A batch the loader assembled
//! into page-locked memory (a [`LoaderConfig`](crate::LoaderConfig) whose
//! `host_memory` is [`GpuFeed::host_memory`]) is copied to the device
//! straight from that memory: the loader's gather is the only host copy, and
//! the slot's staging buffer is not used. The slot keeps the host batch, and
//! with it the buffer, until the slot's `copied` event has been waited on
//! (when the slot comes round again), so the loader cannot reuse the buffer
//! while the device still reads it. Every other batch (a view into chunk
//! memory, or one assembled on the heap) is packed into the slot's staging
//! buffer first, as [`GpuFeed::upload`] always does, except a view into a
//! chunk whose mapping is registered with the driver
//! ([`LocalSource::page_lock_for`](crate::LocalSource::page_lock_for)):
//! that is copied tensor by tensor straight from chunk memory, and held in
//! the slot like a pinned batch, so with a block shuffle most batches cross
//! to the device with no host copy at all.
//!
//! ## Design choices
//! - **Bounded memory.** Everything is allocated once, in [`GpuFeed::new`]:
//!   2 x `max_batch_bytes` pinned host memory and 2 x `max_batch_bytes` of
//!   device memory. A batch that does not fit is an error, never a
//!   reallocation.
//! - **Pinned staging, one host copy.** An asynchronous copy needs a
//!   page-locked source; the loader's pooled buffers are ordinary heap memory
//!   and registering them with the driver on every batch costs more than one
//!   `memcpy`. The staging buffers are allocated without
//!   `CU_MEMHOSTALLOC_WRITECOMBINED` (flags 0): the CPU writes them and
//!   write-combined memory is only fast for strictly streaming writes.
//! - **Reuse is enforced, not hoped for.** A [`GpuBatch`] borrows its feed,
//!   so the host cannot start another upload while it still holds views of
//!   the previous one. Before the CPU overwrites a slot's pinned buffer it
//!   waits on the slot's `copied` event; before the device buffer is
//!   overwritten the copy stream waits (on the GPU, without blocking the host)
//!   on the slot's `released` event and on cudarc's per-buffer read events.
//!   Work that reads a batch through [`GpuBatch::view`] with cudarc, or that
//!   runs on [`GpuFeed::stream`], is therefore ordered automatically; work
//!   launched on another stream through a raw [`GpuBatch::device_ptr`] must
//!   be followed by [`GpuBatch::release_after`].
//! - **No driver is an error, not a panic.** cudarc loads `libcuda` at run
//!   time (so this builds without a CUDA toolkit), but its first driver call
//!   panics when the library is missing. Every entry point first probes for
//!   the library and returns [`ClientError::Gpu`] when it is absent; as a
//!   second line of defence the driver calls made while probing and creating
//!   a feed run under [`std::panic::catch_unwind`]. Creation also performs
//!   one small copy per slot, which resolves every driver symbol the upload
//!   path uses, so a driver too old for them fails in [`GpuFeed::new`].

use crate::batch::{Batch, Element};
use crate::error::{ClientError, TensorError};
use crate::hostbuf::HostMemory;
use crate::position::Position;
use cudarc::driver::sys::{CUdeviceptr, CUevent_flags};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, CudaView, DevicePtr, DeviceRepr, DriverError, PinnedHostSlice,
};
use granary_proto::{DType, TensorLayout};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock};

/// Alignment, in bytes, of every tensor's offset inside a slot.
pub const SLOT_ALIGN: usize = 64;

/// Number of slots a feed rotates through: double buffering.
const SLOTS: usize = 2;

/// Bytes copied per slot by the warm-up in [`GpuFeed::new`].
const WARMUP_BYTES: usize = 64;

/// The error returned when `libcuda` cannot be loaded.
fn no_driver() -> ClientError {
    ClientError::Gpu(
        "no CUDA driver (libcuda) found: install the NVIDIA driver or add the directory holding \
         libcuda.so to LD_LIBRARY_PATH (the `cuda` feature loads it at run time)"
            .to_string(),
    )
}

/// Maps a driver error to [`ClientError::Gpu`], naming what failed.
///
/// The error code is formatted with `Debug` (for example
/// `CUDA_ERROR_OUT_OF_MEMORY`) rather than `Display`, which would call back
/// into the driver.
fn driver(what: impl std::fmt::Display) -> impl FnOnce(DriverError) -> ClientError {
    move |e| ClientError::Gpu(format!("{what}: {:?}", e.0))
}

/// True when `libcuda` can be loaded. Never calls into the driver.
fn driver_library_present() -> bool {
    // SAFETY: `is_culib_present` dlopens (and immediately closes) the
    // NVIDIA driver library under its usual names; loading it runs the
    // library's initialisers, which is exactly what cudarc does on the first
    // driver call anyway. It has no other preconditions and does not panic.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Runs driver calls, turning a panic inside cudarc into [`ClientError::Gpu`].
///
/// Second line of defence: callers check [`driver_library_present`] first,
/// but cudarc also panics when a driver symbol is missing (an old driver),
/// and a data loader must not take the trainer down over that.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, ClientError>) -> Result<T, ClientError> {
    // AssertUnwindSafe: `f` only builds owned values; if it unwinds they are
    // dropped during unwinding and no partially updated state is observed
    // afterwards.
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic payload".to_string());
        tracing::error!(what, %msg, "the CUDA driver wrapper panicked");
        Err(ClientError::Gpu(format!("the CUDA driver wrapper panicked while {what}: {msg}")))
    })
}

/// Loads the driver, initialises it and counts devices.
fn probe() -> Result<usize, ClientError> {
    if !driver_library_present() {
        return Err(no_driver());
    }
    guarded("initialising the CUDA driver", || {
        let n = CudaContext::device_count().map_err(driver("initialising the CUDA driver (cuInit / device count)"))?;
        Ok(usize::try_from(n).unwrap_or(0))
    })
}

/// True when a CUDA driver can be loaded and reports at least one device.
///
/// Never panics. The answer is computed once per process and cached.
pub fn cuda_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| matches!(probe(), Ok(n) if n > 0))
}

/// Where one tensor lies inside a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Placement {
    /// Byte offset from the start of the slot; a multiple of [`SLOT_ALIGN`].
    offset: usize,
    /// Bytes: rows x row bytes.
    len: usize,
}

/// Packs tensors in view order at [`SLOT_ALIGN`]-aligned offsets: the
/// packing of an assembled batch ([`crate::hostbuf::pack`]), so such a batch
/// is copied as one block.
///
/// Returns the placements and the bytes used (the end of the last tensor),
/// or `None` if a size overflows `usize`.
fn place(layouts: &[TensorLayout], rows: usize, out: &mut Vec<Placement>) -> Option<usize> {
    let mut packed = Vec::with_capacity(layouts.len());
    let used = crate::hostbuf::pack(layouts, rows, &mut packed)?;
    out.clear();
    out.extend(packed.into_iter().map(|(offset, len)| Placement { offset, len }));
    Some(used)
}

/// Makes `ctx` current on this thread without losing an error cudarc
/// recorded on it earlier (binding reports and clears such an error; it is
/// recorded again for the feed to find), then runs `f`.
fn with_context<T>(ctx: &Arc<CudaContext>, f: impl FnOnce() -> Result<T, ClientError>) -> Result<T, ClientError> {
    let earlier = ctx.bind_to_thread().err();
    if earlier.is_some() {
        ctx.bind_to_thread().map_err(driver("binding the CUDA context"))?;
    }
    let result = f();
    if let Some(e) = earlier {
        ctx.record_err::<()>(Err(e));
    }
    result
}

/// Registers `len` bytes at `ptr` (a read-only mapping) with `ctx` as
/// page-locked memory, usable from any context (`PORTABLE`); the error where
/// the driver refuses.
pub(crate) fn register_host_read_only(
    ctx: &Arc<CudaContext>,
    ptr: *mut std::ffi::c_void,
    len: usize,
) -> Result<(), ClientError> {
    guarded("registering chunk memory with the CUDA driver", || {
        with_context(ctx, || {
            use cudarc::driver::sys::{
                CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_READ_ONLY, cuMemHostRegister_v2,
            };
            // SAFETY: `ptr..ptr+len` is a live mapping owned by the caller,
            // which unregisters it (`unregister_host`) before unmapping it;
            // the driver only pins its pages and never writes them.
            let r =
                unsafe { cuMemHostRegister_v2(ptr, len, CU_MEMHOSTREGISTER_READ_ONLY | CU_MEMHOSTREGISTER_PORTABLE) };
            r.result().map_err(driver(format_args!("registering {len} bytes of chunk memory")))
        })
    })
}

/// Undoes [`register_host_read_only`] for `ptr`; false (logged) when the
/// driver did not, in which case the caller must not unmap the range.
pub(crate) fn unregister_host(ctx: &Arc<CudaContext>, ptr: *mut std::ffi::c_void) -> bool {
    let result = guarded("unregistering chunk memory", || {
        with_context(ctx, || {
            // SAFETY: `ptr` was registered with this context and is still
            // mapped.
            let r = unsafe { cudarc::driver::sys::cuMemHostUnregister(ptr) };
            r.result().map_err(driver("unregistering chunk memory"))
        })
    });
    match result {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "unregistering chunk memory failed: the mapping is kept");
            false
        }
    }
}

/// `bytes` of page-locked host memory of `ctx`, zeroed, and its address.
pub(crate) fn alloc_pinned(
    ctx: &Arc<CudaContext>,
    bytes: usize,
) -> Result<(PinnedHostSlice<u8>, *mut u8), ClientError> {
    guarded("allocating page-locked memory for a batch", || {
        // SAFETY: the memory is uninitialised after this call; it is zeroed
        // below before any slice of it is formed. Flags 0: plain page-locked
        // memory, not write-combined, since the CPU writes it.
        let mut host = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }
            .map_err(driver(format_args!("allocating {bytes} bytes of page-locked memory for a batch")))?;
        let ptr = host.as_mut_ptr().map_err(driver("waiting on a new page-locked buffer"))?;
        // SAFETY: `ptr` is the start of a live allocation of `bytes` bytes
        // owned by `host`, which no other code has seen yet.
        unsafe { ptr.write_bytes(0, bytes) };
        Ok((host, ptr))
    })
}

/// Places a batch of `rows` rows in a slot of `capacity` bytes, or explains
/// why it does not fit.
fn plan_slot(
    layouts: &[TensorLayout],
    rows: usize,
    capacity: usize,
    out: &mut Vec<Placement>,
) -> Result<usize, ClientError> {
    let used = place(layouts, rows, out)
        .ok_or_else(|| ClientError::Gpu(format!("a batch of {rows} rows overflows the address space")))?;
    if used > capacity {
        return Err(ClientError::Gpu(format!(
            "a batch of {rows} rows needs {used} bytes on the GPU (tensors at {SLOT_ALIGN}-byte-aligned offsets) but \
             the feed's slots hold {capacity} bytes; create the GpuFeed with max_batch_bytes >= {used}"
        )));
    }
    Ok(used)
}

/// The `max_batch_bytes` a [`GpuFeed`] needs for batches of up to `rows` rows
/// of these tensors: each tensor packed in view order at a
/// [`SLOT_ALIGN`]-aligned offset. `None` if the size overflows `usize`.
pub fn slot_bytes(layouts: &[TensorLayout], rows: usize) -> Option<usize> {
    place(layouts, rows, &mut Vec::with_capacity(layouts.len()))
}

/// One tensor of a [`GpuBatch`], as it lies in device memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTensor {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    offset: usize,
    len: usize,
}

impl GpuTensor {
    /// Tensor name, as declared by the view.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape: `[rows]` followed by the per-row shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Byte offset of the tensor inside its slot's device buffer; a multiple
    /// of [`SLOT_ALIGN`].
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Size in bytes, row-major and densely packed.
    pub fn len_bytes(&self) -> usize {
        self.len
    }
}

/// One staging slot: pinned host buffer, device buffer, events, and the
/// description of the batch it currently holds.
struct Slot {
    host: PinnedHostSlice<u8>,
    dev: CudaSlice<u8>,
    /// Device address of `dev`, taken once at creation.
    dev_base: CUdeviceptr,
    /// Recorded on the feed's stream after each copy into `dev`.
    copied: CudaEvent,
    /// Recorded by consumers ([`GpuBatch::release_after`]); the copy stream
    /// waits on it before overwriting `dev`.
    released: CudaEvent,
    /// Whether `position`, `rows`, `used` and `tensors` describe the device
    /// buffer's contents.
    filled: bool,
    position: Position,
    rows: usize,
    used: usize,
    tensors: Vec<GpuTensor>,
    /// Scratch for placements, reused across uploads.
    placements: Vec<Placement>,
    /// The page-locked batch the last copy read from, kept until that copy
    /// is known to be done (its buffer then goes back to the loader).
    host_batch: Option<Batch>,
}

impl Slot {
    fn new(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        index: usize,
        capacity: usize,
    ) -> Result<Self, ClientError> {
        // SAFETY: the memory is uninitialised after this call; it is zeroed
        // below before any slice of it is formed. Flags 0: plain page-locked
        // memory, not write-combined, since the CPU writes it.
        let mut host = unsafe { ctx.alloc_pinned_with_flags::<u8>(capacity, 0) }
            .map_err(driver(format_args!("allocating {capacity} bytes of pinned host memory for slot {index}")))?;
        let ptr = host.as_mut_ptr().map_err(driver(format_args!("waiting on pinned slot {index}")))?;
        // SAFETY: `ptr` points to the start of a live allocation of
        // `capacity` bytes owned by `host`, which no other code has seen yet.
        unsafe { ptr.write_bytes(0, capacity) };
        let dev = stream
            .alloc_zeros::<u8>(capacity)
            .map_err(driver(format_args!("allocating {capacity} bytes of device memory for slot {index}")))?;
        // Taking the address on the feed's own stream records a read there,
        // which orders nothing that stream order does not already order.
        let dev_base = dev.device_ptr(stream).0;
        let copied = ctx
            .new_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(driver(format_args!("creating the copy event of slot {index}")))?;
        let released =
            ctx.new_event(None).map_err(driver(format_args!("creating the release event of slot {index}")))?;
        Ok(Slot {
            host,
            dev,
            dev_base,
            copied,
            released,
            filled: false,
            position: Position::default(),
            rows: 0,
            used: 0,
            tensors: Vec::new(),
            placements: Vec::new(),
            host_batch: None,
        })
    }

    /// Places `batch`'s tensors in this slot (into `placements`) and checks
    /// that each holds the bytes its layout implies; returns the bytes used.
    fn place(&mut self, batch: &Batch, capacity: usize) -> Result<usize, ClientError> {
        let layouts = batch.layouts();
        let used = plan_slot(layouts, batch.rows(), capacity, &mut self.placements)?;
        for (i, (layout, p)) in layouts.iter().zip(&self.placements).enumerate() {
            // A Batch holds one byte range per layout, in view order.
            let have = batch.tensor_bytes(i).len();
            if have != p.len {
                return Err(ClientError::Gpu(format!(
                    "tensor {:?} holds {have} bytes, not the {} its layout implies for {} rows",
                    layout.name,
                    p.len,
                    batch.rows()
                )));
            }
        }
        Ok(used)
    }

    /// Enqueues the copy of the first `used` staged bytes to the device, after
    /// every earlier consumer of the device buffer, and records `copied`.
    fn enqueue_copy(&mut self, stream: &Arc<CudaStream>, used: usize) -> Result<(), ClientError> {
        let host = self.host.as_slice().map_err(driver("waiting on the pinned staging buffer"))?;
        let src = host
            .get(..used)
            .ok_or_else(|| ClientError::Gpu(format!("{used} bytes exceed the {}-byte staging buffer", host.len())))?;
        Self::enqueue_copy_from(&mut self.dev, &self.released, &self.copied, stream, src)
    }

    /// Enqueues the copy of `src` (page-locked memory) into `dev`, after
    /// every earlier consumer of `dev` (`released`), and records `copied`.
    fn enqueue_copy_from(
        dev: &mut CudaSlice<u8>,
        released: &CudaEvent,
        copied: &CudaEvent,
        stream: &Arc<CudaStream>,
        src: &[u8],
    ) -> Result<(), ClientError> {
        Self::enqueue_copies(dev, released, copied, stream, &[(src, 0)])
    }

    /// Enqueues the copies of `pieces` (page-locked host bytes, each with its
    /// offset in `dev`), after every earlier consumer of `dev`
    /// (`released`), and records `copied` after the last.
    fn enqueue_copies(
        dev: &mut CudaSlice<u8>,
        released: &CudaEvent,
        copied: &CudaEvent,
        stream: &Arc<CudaStream>,
        pieces: &[(&[u8], usize)],
    ) -> Result<(), ClientError> {
        stream.wait(released).map_err(driver("making the copy stream wait for the slot's release"))?;
        for &(src, offset) in pieces {
            let len = src.len();
            if len == 0 {
                continue;
            }
            let dev_len = dev.len();
            let mut dst = offset.checked_add(len).and_then(|end| dev.try_slice_mut(offset..end)).ok_or_else(|| {
                ClientError::Gpu(format!("{len} bytes at {offset} exceed the {dev_len}-byte device buffer"))
            })?;
            stream
                .memcpy_htod(src, &mut dst)
                .map_err(driver(format_args!("enqueueing a {len}-byte host-to-device copy")))?;
        }
        copied.record(stream).map_err(driver("recording the copy-done event"))?;
        // Errors cudarc could only record (in drops and implicit stream
        // waits) surface here rather than never.
        stream.context().check_err().map_err(driver("an earlier asynchronous CUDA operation"))
    }
}

/// Double-buffered batch upload to one GPU.
///
/// Owns a CUDA context, one non-blocking stream and two staging slots of
/// `max_batch_bytes` each, in pinned host memory and on the device. See the
/// module documentation for the synchronisation rules.
pub struct GpuFeed {
    // Field order is drop order: slots free their buffers before the stream
    // and context go away. `Drop` synchronises the stream first.
    slots: [Slot; SLOTS],
    next: usize,
    capacity: usize,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
}

impl std::fmt::Debug for GpuFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuFeed").field("ordinal", &self.ctx.ordinal()).field("capacity", &self.capacity).finish()
    }
}

impl GpuFeed {
    /// A feed on device `device_ordinal` whose batches may use up to
    /// `max_batch_bytes` bytes (see [`slot_bytes`]).
    ///
    /// Allocates 2 x `max_batch_bytes` of pinned host memory and as much
    /// device memory. Returns [`ClientError::Gpu`] when no CUDA driver can be
    /// loaded, the device does not exist, or an allocation fails; never
    /// panics.
    pub fn new(device_ordinal: usize, max_batch_bytes: usize) -> Result<GpuFeed, ClientError> {
        if max_batch_bytes == 0 || max_batch_bytes > isize::MAX as usize {
            return Err(ClientError::Gpu(format!(
                "max_batch_bytes must be between 1 and {}, not {max_batch_bytes}",
                isize::MAX
            )));
        }
        let devices = probe()?;
        if device_ordinal >= devices {
            return Err(ClientError::Gpu(format!(
                "CUDA device {device_ordinal} does not exist: the driver reports {devices} device(s)"
            )));
        }
        let feed = guarded("creating the GPU feed", || Self::create(device_ordinal, max_batch_bytes))?;
        tracing::debug!(device_ordinal, max_batch_bytes, "GPU feed ready");
        Ok(feed)
    }

    fn create(ordinal: usize, capacity: usize) -> Result<GpuFeed, ClientError> {
        let ctx =
            CudaContext::new(ordinal).map_err(driver(format_args!("creating a context on CUDA device {ordinal}")))?;
        let stream = ctx.new_stream().map_err(driver(format_args!("creating a stream on CUDA device {ordinal}")))?;
        let slots = [Slot::new(&ctx, &stream, 0, capacity)?, Slot::new(&ctx, &stream, 1, capacity)?];
        let mut feed = GpuFeed { slots, next: 0, capacity, stream, ctx };
        // Warm-up: exercise every driver call the upload path makes, so that
        // a missing symbol (cudarc panics on first use) is caught here, under
        // `guarded`, and not in `upload`.
        let warmup = WARMUP_BYTES.min(capacity);
        for slot in &mut feed.slots {
            slot.copied.synchronize().map_err(driver("waiting for a warm-up copy"))?;
            slot.enqueue_copy(&feed.stream, warmup)?;
        }
        for slot in &feed.slots {
            slot.copied.synchronize().map_err(driver("waiting for a warm-up copy"))?;
        }
        feed.stream.synchronize().map_err(driver("synchronising the copy stream after warm-up"))?;
        Ok(feed)
    }

    /// Bytes each slot holds: the `max_batch_bytes` the feed was created with.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The CUDA context (the device's primary context).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Page-locked memory of this feed's context, for
    /// [`LoaderConfig::host_memory`](crate::LoaderConfig::host_memory): the
    /// loader then assembles batches where the device copy reads them, and
    /// [`GpuStream`] copies each straight from there (one host copy). Use
    /// the memory of the feed that uploads the batches: memory pinned for
    /// another context is copied from directly too, but the driver may
    /// treat it as pageable.
    pub fn host_memory(&self) -> HostMemory {
        HostMemory::Pinned(self.ctx.clone())
    }

    /// The stream copies are enqueued on. Kernels launched on it are ordered
    /// after the batch's copy and before the slot's next copy without further
    /// synchronisation.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Stages `batch` into the next slot and enqueues its copy to the device.
    ///
    /// Returns as soon as the copy is enqueued; the returned [`GpuBatch`]
    /// borrows the feed, so the next upload can only start once it is gone.
    /// Blocks only if the slot's previous copy (two uploads ago) has not
    /// finished reading the staging buffer. A batch larger than
    /// [`capacity`](Self::capacity) is an error.
    pub fn upload(&mut self, batch: &Batch) -> Result<GpuBatch<'_>, ClientError> {
        let index = self.stage(batch)?;
        self.batch_in(index)
    }

    /// Like [`upload`](Self::upload), taking the batch: one assembled in
    /// this feed's page-locked memory ([`host_memory`](Self::host_memory)),
    /// or a view into a chunk registered with the driver
    /// ([`LocalSource::page_lock_for`](crate::LocalSource::page_lock_for)),
    /// is copied to the device straight from that memory, and kept (with
    /// its buffer or mapping) until that copy is done.
    pub fn upload_owned(&mut self, batch: Batch) -> Result<GpuBatch<'_>, ClientError> {
        let index = self.stage_owned(batch)?;
        self.batch_in(index)
    }

    /// Enqueues `batch` from its own page-locked memory when it lives in
    /// some, otherwise stages it; returns the slot that holds it.
    fn stage_owned(&mut self, batch: Batch) -> Result<usize, ClientError> {
        let pinned = batch
            .pinned_bytes()
            .is_some_and(|b| slot_bytes(batch.layouts(), batch.rows()) == Some(b.len()) && b.len() <= self.capacity);
        // A view into chunk memory registered with the driver is copied
        // tensor by tensor from the chunk itself.
        let locked_view = batch.is_page_locked_view();
        if !pinned && !locked_view {
            return self.stage(&batch);
        }
        let index = self.next;
        let stream = &self.stream;
        let slot = &mut self.slots[index];
        slot.filled = false;
        let used = slot.place(&batch, self.capacity)?;
        // The slot's previous copy must be done before its device buffer is
        // written again (the stream orders that) and before the batch it
        // read from is let go (the host waits for that here).
        slot.copied.synchronize().map_err(driver(format_args!("waiting for the previous copy out of slot {index}")))?;
        // The slot holds the batch while copies read it.
        Self::describe(slot, &batch, used);
        slot.filled = false;
        let held = slot.host_batch.insert(batch);
        let pieces: Vec<(&[u8], usize)> = match held.pinned_bytes() {
            Some(all) if pinned => vec![(all, 0)],
            _ => slot.placements.iter().enumerate().map(|(i, p)| (held.tensor_bytes(i), p.offset)).collect(),
        };
        if let Err(e) = Slot::enqueue_copies(&mut slot.dev, &slot.released, &slot.copied, stream, &pieces) {
            // Some copies may be enqueued with no `copied` after them: wait
            // for the stream before the batch can be let go, and where even
            // that fails, never let it go (its memory may still be read).
            if stream.synchronize().is_err()
                && let Some(batch) = slot.host_batch.take()
            {
                std::mem::forget(batch);
            }
            return Err(e);
        }
        slot.filled = true;
        self.next = (index + 1) % SLOTS;
        Ok(index)
    }

    /// Stages and enqueues `batch`; returns the slot that holds it.
    fn stage(&mut self, batch: &Batch) -> Result<usize, ClientError> {
        let index = self.next;
        let stream = &self.stream;
        let slot = &mut self.slots[index];
        slot.filled = false;
        let used = slot.place(batch, self.capacity)?;
        // The CPU may only overwrite the staging buffer once the slot's last
        // copy has read it.
        slot.copied.synchronize().map_err(driver(format_args!("waiting for the previous copy out of slot {index}")))?;
        slot.host_batch = None;
        let host = slot.host.as_mut_slice().map_err(driver("waiting on the pinned staging buffer"))?;
        for (i, p) in slot.placements.iter().enumerate() {
            let dst = host.get_mut(p.offset..p.offset + p.len).ok_or_else(|| {
                ClientError::Gpu(format!("tensor {i} at {}+{} overruns the staging buffer", p.offset, p.len))
            })?;
            dst.copy_from_slice(batch.tensor_bytes(i));
        }
        slot.enqueue_copy(stream, used)?;
        Self::describe(slot, batch, used);
        self.next = (index + 1) % SLOTS;
        Ok(index)
    }

    /// Records what slot `slot` now holds: `batch`'s tensors at the slot's
    /// placements, `used` bytes.
    fn describe(slot: &mut Slot, batch: &Batch, used: usize) {
        slot.tensors.clear();
        slot.tensors.extend(batch.layouts().iter().zip(&slot.placements).map(|(l, p)| {
            let mut shape = Vec::with_capacity(1 + l.shape.len());
            shape.push(batch.rows());
            shape.extend(l.shape.iter().map(|&d| d as usize));
            GpuTensor { name: l.name.clone(), dtype: l.dtype, shape, offset: p.offset, len: p.len }
        }));
        slot.position = batch.position();
        slot.rows = batch.rows();
        slot.used = used;
        slot.filled = true;
        tracing::trace!(bytes = used, epoch = slot.position.epoch, batch = slot.position.batch, "batch copy enqueued");
    }

    /// The batch held by slot `index`.
    fn batch_in(&self, index: usize) -> Result<GpuBatch<'_>, ClientError> {
        let slot = self
            .slots
            .get(index)
            .filter(|s| s.filled)
            .ok_or_else(|| ClientError::Gpu(format!("slot {index} holds no uploaded batch")))?;
        Ok(GpuBatch { stream: &self.stream, slot })
    }
}

impl Drop for GpuFeed {
    fn drop(&mut self) {
        // Pinned buffers must not be freed while a copy still reads them.
        if let Err(e) = self.stream.synchronize() {
            tracing::warn!(error = ?e.0, "synchronising the GPU copy stream before freeing its buffers failed");
            // A copy may still read the loader's batches the slots hold:
            // leak them rather than hand their buffers back for reuse.
            for slot in &mut self.slots {
                if let Some(batch) = slot.host_batch.take() {
                    std::mem::forget(batch);
                }
            }
        }
    }
}

/// A batch on the GPU: the tensors of one [`Batch`] in one slot's device
/// buffer.
///
/// The copy may still be in flight; order work after it with
/// [`synchronize`](Self::synchronize) (host),
/// [`stream_wait`](Self::stream_wait) (another stream), by reading through
/// [`view`](Self::view) with cudarc (tracked automatically), or by launching
/// on [`GpuFeed::stream`].
pub struct GpuBatch<'a> {
    stream: &'a Arc<CudaStream>,
    slot: &'a Slot,
}

impl std::fmt::Debug for GpuBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBatch")
            .field("position", &self.slot.position)
            .field("rows", &self.slot.rows)
            .field("tensors", &self.slot.tensors)
            .finish()
    }
}

impl<'a> GpuBatch<'a> {
    /// Where this batch sits in the plan.
    pub fn position(&self) -> Position {
        self.slot.position
    }

    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.slot.rows
    }

    /// Bytes of the slot this batch uses, padding included.
    pub fn bytes_used(&self) -> usize {
        self.slot.used
    }

    /// The tensors, in view order.
    pub fn tensors(&self) -> &'a [GpuTensor] {
        &self.slot.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Result<&'a GpuTensor, ClientError> {
        self.slot
            .tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| ClientError::Tensor(TensorError::Unknown(name.to_string())))
    }

    /// The bytes of tensor `name` on the device. Reads through this view with
    /// cudarc are ordered after the copy, and before the slot's next copy, by
    /// cudarc's event tracking. cudarc keeps one read event per buffer: when
    /// several streams read a batch, make one of them wait for the others and
    /// call [`release_after`](Self::release_after) on it.
    pub fn view(&self, name: &str) -> Result<CudaView<'a, u8>, ClientError> {
        let t = self.tensor(name)?;
        self.slot.dev.try_slice(t.offset..t.offset + t.len).ok_or_else(|| {
            ClientError::Gpu(format!("tensor {name:?} at {}+{} overruns the device buffer", t.offset, t.len))
        })
    }

    /// Tensor `name` viewed as elements of `T`, for example
    /// `typed_view::<f32>("dense")`; `T` must match the tensor's dtype.
    pub fn typed_view<T: Element + DeviceRepr>(&self, name: &str) -> Result<CudaView<'a, T>, ClientError> {
        let t = self.tensor(name)?;
        if !T::accepts(t.dtype) {
            return Err(TensorError::DType { tensor: name.to_string(), want: T::NAME, have: t.dtype.name() }.into());
        }
        let bytes = self.view(name)?;
        let elems = t.len / std::mem::size_of::<T>();
        // SAFETY: `T: Element` is `Pod`, so every bit pattern is a valid `T`;
        // the tensor starts at a 64-byte-aligned offset of a device
        // allocation (itself at least 256-byte aligned), so it is aligned for
        // `T`; and `t.len` is rows x row elements x the dtype's size, which
        // equals `size_of::<T>()` because `T` accepts the dtype, so `elems`
        // elements cover exactly the tensor's bytes.
        unsafe { bytes.transmute::<T>(elems) }
            .ok_or_else(|| ClientError::Gpu(format!("tensor {name:?} cannot be viewed as {}", T::NAME)))
    }

    /// Raw device address of tensor `name`, for handing to other libraries.
    ///
    /// Not tracked: work that reads it on a stream other than
    /// [`GpuFeed::stream`] must first [`stream_wait`](Self::stream_wait) and
    /// afterwards [`release_after`](Self::release_after), and the address is
    /// only valid for this batch, until the upload after next.
    pub fn device_ptr(&self, name: &str) -> Result<CUdeviceptr, ClientError> {
        let t = self.tensor(name)?;
        // Offsets are below the slot capacity, itself below isize::MAX.
        Ok(self.slot.dev_base + t.offset as CUdeviceptr)
    }

    /// Blocks the host until this batch's copy has landed on the device.
    pub fn synchronize(&self) -> Result<(), ClientError> {
        self.slot.copied.synchronize().map_err(driver("waiting for a batch's host-to-device copy"))
    }

    /// Makes `consumer` wait, on the GPU and without blocking the host, until
    /// this batch's copy has landed.
    pub fn stream_wait(&self, consumer: &CudaStream) -> Result<(), ClientError> {
        consumer.wait(&self.slot.copied).map_err(driver("making a consumer stream wait for a batch's copy"))
    }

    /// Declares that all reads of this batch are enqueued on `consumer`: the
    /// slot's next copy waits (on the GPU) until `consumer` reaches this
    /// point. Needed only for raw [`device_ptr`](Self::device_ptr) reads on a
    /// stream other than [`GpuFeed::stream`] (or reads on several streams);
    /// `consumer` must belong to the feed's device. The slot has one release
    /// event, so a later call replaces an earlier one.
    pub fn release_after(&self, consumer: &CudaStream) -> Result<(), ClientError> {
        self.slot.released.record(consumer).map_err(driver("recording a batch's release on a consumer stream"))
    }

    /// The stream the copy was enqueued on.
    pub fn copy_stream(&self) -> &'a Arc<CudaStream> {
        self.stream
    }
}

/// Batches from an iterator, uploaded one ahead: when the caller gets batch
/// n, the copy of batch n+1 is already enqueued.
///
/// Returning a borrowed [`GpuBatch`] makes this a lending iterator, so it
/// offers [`next_gpu`](Self::next_gpu) instead of implementing [`Iterator`].
/// Errors from the source are passed through in order, after the batches
/// before them.
pub struct GpuStream<I> {
    feed: GpuFeed,
    batches: I,
    /// Slot holding the next batch to hand out, already enqueued.
    queued: Option<usize>,
    /// An error met while prefetching, to hand out after the current batch.
    pending: Option<ClientError>,
    /// The source returned `None`.
    exhausted: bool,
}

impl<I> std::fmt::Debug for GpuStream<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuStream")
            .field("feed", &self.feed)
            .field("queued", &self.queued)
            .field("exhausted", &self.exhausted)
            .finish()
    }
}

impl<I: Iterator<Item = Result<Batch, ClientError>>> GpuStream<I> {
    /// Uploads the batches of `batches` through `feed`.
    pub fn new(feed: GpuFeed, batches: I) -> Self {
        GpuStream { feed, batches, queued: None, pending: None, exhausted: false }
    }

    /// The next batch on the GPU, with the following batch's copy already
    /// enqueued; `None` when the source is exhausted.
    pub fn next_gpu(&mut self) -> Option<Result<GpuBatch<'_>, ClientError>> {
        let current = match self.queued.take() {
            Some(index) => index,
            None => {
                if let Some(e) = self.pending.take() {
                    return Some(Err(e));
                }
                match self.pull() {
                    Ok(Some(index)) => index,
                    Ok(None) => return None,
                    Err(e) => return Some(Err(e)),
                }
            }
        };
        // Prefetch into the other slot. The caller's previous GpuBatch lived
        // there and its borrow has ended, since this call takes `&mut self`.
        if self.pending.is_none() {
            match self.pull() {
                Ok(next) => self.queued = next,
                Err(e) => self.pending = Some(e),
            }
        }
        Some(self.feed.batch_in(current))
    }

    /// Takes the next batch from the source and stages it.
    fn pull(&mut self) -> Result<Option<usize>, ClientError> {
        if self.exhausted {
            return Ok(None);
        }
        match self.batches.next() {
            None => {
                self.exhausted = true;
                Ok(None)
            }
            // A batch in page-locked memory is copied from there and kept
            // until the copy is done; any other is staged and dropped,
            // returning its buffer to the loader's pool.
            Some(batch) => self.feed.stage_owned(batch?).map(Some),
        }
    }

    /// The feed.
    pub fn feed(&self) -> &GpuFeed {
        &self.feed
    }

    /// The feed and the source. A batch already prefetched onto the GPU but
    /// not yet handed out is discarded: resume the source from the position
    /// after the last batch consumed.
    pub fn into_parts(self) -> (GpuFeed, I) {
        (self.feed, self.batches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostbuf::BufferPool;

    fn layout(name: &str, dtype: DType, shape: &[u32]) -> TensorLayout {
        TensorLayout { name: name.to_string(), dtype, shape: shape.to_vec() }
    }

    fn layouts() -> Vec<TensorLayout> {
        vec![
            layout("label", DType::Bool, &[]),
            layout("dense", DType::F32, &[13]),
            layout("ids", DType::I64, &[3]),
            layout("f16", DType::F16, &[5]),
        ]
    }

    #[test]
    fn cuda_feed_without_driver_is_a_clear_error() {
        if cuda_available() {
            eprintln!("skipped: a CUDA driver and device are present");
            return;
        }
        match GpuFeed::new(0, 1 << 20) {
            Err(ClientError::Gpu(msg)) => assert!(msg.contains("driver"), "unclear message: {msg}"),
            other => panic!("expected a GPU error, got {other:?}"),
        }
        // Repeated probes stay errors, never panics.
        assert!(!cuda_available());
        assert!(GpuFeed::new(3, 64).is_err());
    }

    #[test]
    fn cuda_feed_rejects_zero_capacity() {
        assert!(matches!(GpuFeed::new(0, 0), Err(ClientError::Gpu(_))));
    }

    #[test]
    fn cuda_slot_layout_is_aligned_packed_and_bounded() {
        let ls = layouts();
        for rows in [0usize, 1, 7, 64, 1000] {
            let mut p = Vec::new();
            let used = place(&ls, rows, &mut p).expect("small sizes do not overflow");
            assert_eq!(p.len(), ls.len());
            let mut end = 0;
            for (l, pl) in ls.iter().zip(&p) {
                assert_eq!(pl.offset % SLOT_ALIGN, 0);
                assert!(pl.offset >= end, "tensors overlap");
                assert!(pl.offset - end < SLOT_ALIGN, "more padding than alignment needs");
                assert_eq!(pl.len, rows * l.row_bytes());
                end = pl.offset + pl.len;
            }
            assert_eq!(used, end);
            assert_eq!(slot_bytes(&ls, rows), Some(used));
            // Exactly enough fits; one byte less does not.
            assert_eq!(plan_slot(&ls, rows, used, &mut p).ok(), Some(used));
            if used > 0 {
                match plan_slot(&ls, rows, used - 1, &mut p) {
                    Err(ClientError::Gpu(msg)) => assert!(msg.contains("max_batch_bytes"), "{msg}"),
                    other => panic!("expected a capacity error, got {other:?}"),
                }
            }
        }
    }

    #[test]
    fn cuda_slot_layout_known_offsets() {
        // 7 rows: label 7 B @0, dense 364 B @64, ids 168 B @448, f16 70 B @640.
        let mut p = Vec::new();
        let used = place(&layouts(), 7, &mut p).expect("no overflow");
        let got: Vec<(usize, usize)> = p.iter().map(|p| (p.offset, p.len)).collect();
        assert_eq!(got, vec![(0, 7), (64, 364), (448, 168), (640, 70)]);
        assert_eq!(used, 710);
    }

    #[test]
    fn cuda_slot_layout_overflow_is_an_error() {
        let ls = vec![layout("x", DType::F64, &[u32::MAX, u32::MAX])];
        assert_eq!(slot_bytes(&ls, usize::MAX), None);
        assert!(matches!(plan_slot(&ls, usize::MAX, usize::MAX, &mut Vec::new()), Err(ClientError::Gpu(_))));
    }

    /// A batch of `rows` rows in `memory`, every byte a function of its
    /// place.
    fn batch_in(ls: &Arc<[TensorLayout]>, rows: usize, index: u64, memory: HostMemory) -> Batch {
        let mut placements = Vec::new();
        let used = crate::hostbuf::pack(ls, rows, &mut placements).expect("no overflow");
        let mut buf = BufferPool::new(1, memory).take(used).expect("buffer");
        for (t, &(offset, len)) in placements.iter().enumerate() {
            for (b, byte) in buf.as_mut_slice()[offset..offset + len].iter_mut().enumerate() {
                *byte = (b as u64 * 31 + index * 7 + t as u64) as u8;
            }
        }
        Batch {
            position: Position { epoch: 0, batch: index },
            rows,
            layouts: ls.clone(),
            storage: crate::batch::Storage::Owned { buf, placements, recycle: None },
        }
    }

    fn batch(ls: &Arc<[TensorLayout]>, rows: usize, index: u64) -> Batch {
        batch_in(ls, rows, index, HostMemory::Heap)
    }

    fn check_on_device(g: &GpuBatch<'_>, host: &Batch) {
        g.synchronize().expect("copy completes");
        for (i, t) in g.tensors().iter().enumerate() {
            let view = g.view(t.name()).expect("tensor exists");
            let back = g.copy_stream().clone_dtoh(&view).expect("copy back");
            assert_eq!(back, host.tensor_bytes(i), "tensor {}", t.name());
            assert_eq!(t.shape()[0], host.rows());
        }
    }

    /// Runs only where a CUDA device is present.
    #[test]
    fn cuda_upload_round_trip_on_gpu() {
        if !cuda_available() {
            eprintln!("skipped: no CUDA device");
            return;
        }
        let ls: Arc<[TensorLayout]> = layouts().into();
        let rows = 100;
        let cap = slot_bytes(&ls, rows).expect("no overflow");
        let mut feed = GpuFeed::new(0, cap).expect("feed on device 0");
        for i in 0..5 {
            let b = batch(&ls, rows - i as usize, i);
            let g = feed.upload(&b).expect("upload");
            assert_eq!(g.position().batch, i);
            check_on_device(&g, &b);
            let dense = g.typed_view::<f32>("dense").expect("f32 view");
            assert_eq!(dense.len(), b.rows() * 13);
            assert!(matches!(g.typed_view::<i64>("dense"), Err(ClientError::Tensor(TensorError::DType { .. }))));
        }
        let too_big = batch(&ls, rows + 1, 9);
        assert!(matches!(feed.upload(&too_big), Err(ClientError::Gpu(_))));
    }

    /// Runs only where a CUDA device is present.
    #[test]
    fn cuda_stream_prefetches_in_order_on_gpu() {
        if !cuda_available() {
            eprintln!("skipped: no CUDA device");
            return;
        }
        let ls: Arc<[TensorLayout]> = layouts().into();
        let cap = slot_bytes(&ls, 32).expect("no overflow");
        let feed = GpuFeed::new(0, cap).expect("feed on device 0");
        let expected: Vec<Batch> = (0..5).map(|i| batch(&ls, 32, i)).collect();
        let mut source: Vec<Result<Batch, ClientError>> = (0..5).map(|i| Ok(batch(&ls, 32, i))).collect();
        source.insert(3, Err(ClientError::Producer("injected".into())));
        let mut stream = GpuStream::new(feed, source.into_iter());
        let mut seen = Vec::new();
        let mut errors = 0;
        while let Some(next) = stream.next_gpu() {
            match next {
                Ok(g) => {
                    check_on_device(&g, &expected[g.position().batch as usize]);
                    seen.push(g.position().batch);
                }
                Err(_) => {
                    errors += 1;
                    assert_eq!(seen, vec![0, 1, 2], "error delivered in order");
                }
            }
        }
        assert_eq!(seen, vec![0, 1, 2, 3, 4]);
        assert_eq!(errors, 1);
    }

    /// A loader assembling into the feed's page-locked memory, through a
    /// GpuStream: every batch on the device equals the same loader's batch
    /// assembled on the heap, and the pinned buffers (reused by the loader
    /// while copies are in flight) never hand the device a later batch's
    /// bytes. Runs only where a CUDA device is present.
    #[test]
    fn cuda_stream_copies_loader_batches_from_pinned_memory_on_gpu() {
        if !cuda_available() {
            eprintln!("skipped: no CUDA device");
            return;
        }
        use crate::{Loader, LoaderConfig, MemorySource};
        use granary_proto::wire::DatasetInfo;
        use granary_proto::{AlignedBuf, ChunkLayout, DatasetVersion, ShardId, ShardRows, Shuffle};
        let v = DatasetVersion([5; 16]);
        let ls = layouts();
        let (mut shards, mut chunks) = (Vec::new(), Vec::new());
        for i in 0..6u32 {
            let shard = ShardId { file: 0, row_group: i };
            let rows = 50 + u64::from(i) * 7;
            shards.push(ShardRows { shard, rows });
            let layout = ChunkLayout::new(v, shard, rows, &ls).expect("layout");
            let mut buf = AlignedBuf::zeroed(layout.total_len());
            for t in 0..ls.len() {
                for (b, byte) in buf.as_mut_slice()[layout.tensor_range(t)].iter_mut().enumerate() {
                    *byte = (b as u32 * 13 + i * 101 + t as u32) as u8;
                }
            }
            layout.seal(buf.as_mut_slice()).expect("seal");
            chunks.push((shard, buf));
        }
        let info = DatasetInfo {
            name: "t".into(),
            version: v,
            tensors: ls.clone(),
            shards,
            files: vec!["f".into()],
            source_bytes: 0,
        };
        let src = Arc::new(MemorySource::new(info, chunks).expect("source"));
        let cfg = LoaderConfig {
            shuffle: Shuffle::Windowed { window_shards: 2 },
            assembly_threads: 3,
            ..LoaderConfig::new("t", 16)
        };
        let heap = Loader::new(src.clone(), cfg.clone()).expect("heap loader");
        let expected: Vec<Batch> = heap.epoch(0).expect("epoch").collect::<Result<_, _>>().expect("batches");
        let ls: Arc<[TensorLayout]> = ls.into();
        let feed = GpuFeed::new(0, slot_bytes(&ls, 16).expect("no overflow")).expect("feed on device 0");
        let pinned = Loader::new(src, LoaderConfig { host_memory: feed.host_memory(), ..cfg }).expect("pinned loader");
        let mut stream = GpuStream::new(feed, pinned.epoch(0).expect("epoch"));
        let mut n = 0;
        while let Some(next) = stream.next_gpu() {
            let g = next.expect("batch on the device");
            check_on_device(&g, &expected[g.position().batch as usize]);
            n += 1;
        }
        assert_eq!(n, expected.len());
    }

    /// Chunk memory registered with the driver: a view into it is copied to
    /// the device tensor by tensor from the chunk itself, and equals the
    /// same rows staged. Runs only where a CUDA device is present.
    #[test]
    fn cuda_views_of_registered_chunks_copy_from_chunk_memory_on_gpu() {
        if !cuda_available() {
            eprintln!("skipped: no CUDA device");
            return;
        }
        use crate::source::{Chunk, ChunkBytes};
        use granary_proto::chunk::Verify;
        use granary_proto::{AlignedBuf, ChunkLayout, DatasetVersion, ShardId};

        /// Chunk bytes registered with a context for the test's lifetime.
        struct Registered {
            buf: AlignedBuf,
            ctx: Arc<CudaContext>,
        }
        impl ChunkBytes for Registered {
            fn bytes(&self) -> &[u8] {
                self.buf.as_slice()
            }
            fn page_locked(&self) -> bool {
                true
            }
        }
        impl Drop for Registered {
            fn drop(&mut self) {
                assert!(unregister_host(&self.ctx, self.buf.as_slice().as_ptr() as *mut std::ffi::c_void));
            }
        }

        let ls: Arc<[TensorLayout]> = layouts().into();
        let (v, shard, rows) = (DatasetVersion([4; 16]), ShardId { file: 0, row_group: 0 }, 300u64);
        let layout = ChunkLayout::new(v, shard, rows, &ls).expect("layout");
        let mut buf = AlignedBuf::zeroed(layout.total_len());
        for t in 0..ls.len() {
            for (b, byte) in buf.as_mut_slice()[layout.tensor_range(t)].iter_mut().enumerate() {
                *byte = (b * 7 + t) as u8;
            }
        }
        layout.seal(buf.as_mut_slice()).expect("seal");
        let mut feed = GpuFeed::new(0, slot_bytes(&ls, 64).expect("no overflow")).expect("feed on device 0");
        let ctx = feed.context().clone();
        let (ptr, len) = (buf.as_slice().as_ptr() as *mut std::ffi::c_void, buf.len());
        if let Err(e) = register_host_read_only(&ctx, ptr, len) {
            eprintln!("skipped: this device or driver refuses read-only host registration ({e})");
            return;
        }
        let chunk = Chunk::new(Arc::new(Registered { buf, ctx }), v, shard, Verify::Full).expect("chunk");
        let view = |first_row: usize, index: u64| Batch {
            position: Position { epoch: 0, batch: index },
            rows: 64,
            layouts: ls.clone(),
            storage: crate::batch::Storage::View { chunk: chunk.clone(), first_row },
        };
        for (i, first) in [0usize, 64, 100, 236].into_iter().enumerate() {
            let expected = view(first, i as u64);
            assert!(expected.is_page_locked_view());
            let g = feed.upload_owned(view(first, i as u64)).expect("upload");
            check_on_device(&g, &expected);
        }
    }
}
