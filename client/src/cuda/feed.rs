//! [`GpuFeed`]: one context, one copy stream and two [`Slot`]s used in
//! turn; stages a batch (or takes it from page-locked memory) and enqueues
//! its copy, blocking only on the slot's previous copy.

use super::driver::{driver, guarded, probe};
use super::layout::{GpuTensor, slot_bytes};
use super::slot::Slot;
use super::view::GpuBatch;
use crate::batch::Batch;
use crate::error::{ClientError, GpuError};
use crate::hostbuf::HostMemory;
use cudarc::driver::{CudaContext, CudaStream};
use std::sync::Arc;

/// Number of slots a feed rotates through: double buffering.
const SLOTS: usize = 2;

/// Bytes copied per slot by the warm-up in [`GpuFeed::new`].
const WARMUP_BYTES: usize = 64;

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
            return Err(ClientError::Gpu(GpuError::Buffers(format!(
                "max_batch_bytes must be between 1 and {}, not {max_batch_bytes}",
                isize::MAX
            ))));
        }
        let devices = probe()?;
        if device_ordinal >= devices {
            return Err(ClientError::Gpu(GpuError::NoDevice { ordinal: device_ordinal, devices }));
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
    /// [`GpuStream`](super::GpuStream) copies each straight from there (one host copy). Use
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
    pub(super) fn stage_owned(&mut self, batch: Batch) -> Result<usize, ClientError> {
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
                ClientError::Gpu(GpuError::Buffers(format!(
                    "tensor {i} at {}+{} overruns the staging buffer",
                    p.offset, p.len
                )))
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
    pub(super) fn batch_in(&self, index: usize) -> Result<GpuBatch<'_>, ClientError> {
        let slot = self
            .slots
            .get(index)
            .filter(|s| s.filled)
            .ok_or_else(|| ClientError::Gpu(GpuError::Buffers(format!("slot {index} holds no uploaded batch"))))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::driver::{cuda_available, register_host_read_only, unregister_host};
    use crate::cuda::fixtures::{batch, layouts};
    use crate::cuda::view::tests::check_on_device;
    use crate::error::TensorError;
    use crate::position::Position;
    use granary_proto::TensorLayout;

    #[test]
    fn cuda_feed_without_driver_is_a_clear_error() {
        if cuda_available() {
            crate::cuda::fixtures::skipped("a CUDA driver and device are present");
            return;
        }
        match GpuFeed::new(0, 1 << 20) {
            Err(ClientError::Gpu(e)) => assert!(e.to_string().contains("driver"), "unclear message: {e}"),
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

    /// Runs only where a CUDA device is present.
    #[test]
    fn cuda_upload_round_trip_on_gpu() {
        if !cuda_available() {
            crate::cuda::fixtures::skipped("no CUDA device");
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

    /// Chunk memory registered with the driver: a view into it is copied to
    /// the device tensor by tensor from the chunk itself, and equals the
    /// same rows staged. Runs only where a CUDA device is present.
    #[test]
    fn cuda_views_of_registered_chunks_copy_from_chunk_memory_on_gpu() {
        if !cuda_available() {
            crate::cuda::fixtures::skipped("no CUDA device");
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
            crate::cuda::fixtures::skipped(format!("this device or driver refuses read-only host registration ({e})"));
            return;
        }
        let chunk = Chunk::new(Arc::new(Registered { buf, ctx }), v, shard, Verify::Full).expect("chunk");
        let view = |first_row: usize, index: u64| Batch {
            position: Position { epoch: 0, batch: index },
            rows: 64,
            layouts: ls.clone(),
            storage: crate::batch::Storage::View { chunk: chunk.clone(), first_row, offsets: vec![Vec::new(); 4] },
        };
        for (i, first) in [0usize, 64, 100, 236].into_iter().enumerate() {
            let expected = view(first, i as u64);
            assert!(expected.is_page_locked_view());
            let g = feed.upload_owned(view(first, i as u64)).expect("upload");
            check_on_device(&g, &expected);
        }
    }
}
