//! One staging slot of a [`GpuFeed`](super::GpuFeed): a pinned host buffer,
//! a device buffer of the same size, the `copied` and `released` events, and
//! the enqueueing of host-to-device copies into it.

use super::driver::driver;
use super::layout::{GpuTensor, Placement, plan_slot};
use crate::batch::Batch;
use crate::error::{ClientError, GpuError};
use crate::position::Position;
use cudarc::driver::sys::{CUdeviceptr, CUevent_flags};
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, PinnedHostSlice};
use std::sync::Arc;

/// One staging slot: pinned host buffer, device buffer, events, and the
/// description of the batch it currently holds.
pub(super) struct Slot {
    pub(super) host: PinnedHostSlice<u8>,
    pub(super) dev: CudaSlice<u8>,
    /// Device address of `dev`, taken once at creation.
    pub(super) dev_base: CUdeviceptr,
    /// Recorded on the feed's stream after each copy into `dev`.
    pub(super) copied: CudaEvent,
    /// Recorded by consumers ([`GpuBatch::release_after`](super::GpuBatch::release_after)); the copy stream
    /// waits on it before overwriting `dev`.
    pub(super) released: CudaEvent,
    /// Whether `position`, `rows`, `used` and `tensors` describe the device
    /// buffer's contents.
    pub(super) filled: bool,
    pub(super) position: Position,
    pub(super) rows: usize,
    pub(super) used: usize,
    pub(super) tensors: Vec<GpuTensor>,
    /// Scratch for placements, reused across uploads.
    pub(super) placements: Vec<Placement>,
    /// The page-locked batch the last copy read from, kept until that copy
    /// is known to be done (its buffer then goes back to the loader).
    pub(super) host_batch: Option<Batch>,
}

impl Slot {
    pub(super) fn new(
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
    pub(super) fn place(&mut self, batch: &Batch, capacity: usize) -> Result<usize, ClientError> {
        let layouts = batch.layouts();
        let used = plan_slot(layouts, batch.rows(), capacity, &mut self.placements)?;
        for (i, (layout, p)) in layouts.iter().zip(&self.placements).enumerate() {
            // A Batch holds one byte range per layout, in view order.
            let have = batch.tensor_bytes(i).len();
            if have != p.len {
                return Err(ClientError::Gpu(GpuError::Buffers(format!(
                    "tensor {:?} holds {have} bytes, not the {} its layout implies for {} rows",
                    layout.name,
                    p.len,
                    batch.rows()
                ))));
            }
        }
        Ok(used)
    }

    /// Enqueues the copy of the first `used` staged bytes to the device, after
    /// every earlier consumer of the device buffer, and records `copied`.
    pub(super) fn enqueue_copy(&mut self, stream: &Arc<CudaStream>, used: usize) -> Result<(), ClientError> {
        let host = self.host.as_slice().map_err(driver("waiting on the pinned staging buffer"))?;
        let src = host.get(..used).ok_or_else(|| {
            ClientError::Gpu(GpuError::Buffers(format!("{used} bytes exceed the {}-byte staging buffer", host.len())))
        })?;
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
    pub(super) fn enqueue_copies(
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
                ClientError::Gpu(GpuError::Buffers(format!(
                    "{len} bytes at {offset} exceed the {dev_len}-byte device buffer"
                )))
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
