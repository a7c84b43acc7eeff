//! [`GpuBatch`]: a batch on the device, borrowed from its feed's slot, with
//! typed and raw views of its tensors and the calls that order other streams
//! after its copy and the slot's next copy after their reads.

use super::driver::driver;
use super::layout::GpuTensor;
use super::slot::Slot;
use crate::batch::Element;
use crate::error::{ClientError, GpuError, TensorError};
use crate::position::Position;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaStream, CudaView, DeviceRepr};
use std::sync::Arc;

/// A batch on the GPU: the tensors of one [`Batch`](crate::Batch) in one slot's device
/// buffer.
///
/// The copy may still be in flight; order work after it with
/// [`synchronize`](Self::synchronize) (host),
/// [`stream_wait`](Self::stream_wait) (another stream), by reading through
/// [`view`](Self::view) with cudarc (tracked automatically), or by launching
/// on [`GpuFeed::stream`](super::GpuFeed::stream).
pub struct GpuBatch<'a> {
    pub(super) stream: &'a Arc<CudaStream>,
    pub(super) slot: &'a Slot,
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
            ClientError::Gpu(GpuError::Buffers(format!(
                "tensor {name:?} at {}+{} overruns the device buffer",
                t.offset, t.len
            )))
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
        unsafe { bytes.transmute::<T>(elems) }.ok_or_else(|| {
            ClientError::Gpu(GpuError::Buffers(format!("tensor {name:?} cannot be viewed as {}", T::NAME)))
        })
    }

    /// Raw device address of tensor `name`, for handing to other libraries.
    ///
    /// Not tracked: work that reads it on a stream other than
    /// [`GpuFeed::stream`](super::GpuFeed::stream) must first [`stream_wait`](Self::stream_wait) and
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
    /// stream other than [`GpuFeed::stream`](super::GpuFeed::stream) (or reads on several streams);
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::batch::Batch;

    pub(in crate::cuda) fn check_on_device(g: &GpuBatch<'_>, host: &Batch) {
        g.synchronize().expect("copy completes");
        for (i, t) in g.tensors().iter().enumerate() {
            let view = g.view(t.name()).expect("tensor exists");
            let back = g.copy_stream().clone_dtoh(&view).expect("copy back");
            assert_eq!(back, host.tensor_bytes(i), "tensor {}", t.name());
            assert_eq!(t.shape()[0], host.rows());
        }
    }
}
