//! Host memory for assembled batches, and how a batch's tensors are packed
//! into it.
//!
//! An assembled batch is one allocation holding every tensor, each at a
//! 64-byte-aligned offset in view order ([`pack`]): the layout of a GPU
//! feed's slot, so a batch in page-locked memory ([`HostMemory::Pinned`],
//! feature `cuda`) goes to the device in one asynchronous copy, straight
//! from the bytes the loader assembled: chunk, pinned memory, device, with
//! one host copy on the way.
//!
//! Buffers come from, and go back to, the loader's [`BufferPool`], which
//! keeps a few across epochs: a batch buffer is megabytes, and one that the
//! allocator hands back to the kernel costs a page fault and a cleared page
//! per 4 KiB when allocated again (6.5% of a 4-rank run's samples before the
//! pool outlived the epoch); page-locking memory costs more still.

use crate::error::ClientError;
use granary_proto::{AlignedBuf, TensorLayout};
use std::sync::Mutex;

/// Alignment, in bytes, of every tensor inside an assembled batch.
pub const TENSOR_ALIGN: usize = 64;

/// Where one tensor of an assembled batch lies in its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Byte offset of the tensor's values, a multiple of [`TENSOR_ALIGN`].
    pub offset: usize,
    /// Bytes of values: rows x row bytes; of a jagged tensor, its values x
    /// value bytes.
    pub len: usize,
    /// Of a jagged tensor: the byte offset (a multiple of [`TENSOR_ALIGN`],
    /// before its values) of its row offsets, rows + 1 `u64`s rebased to
    /// the batch's first value. `None`: a dense tensor.
    pub row_offsets: Option<usize>,
}

/// Where tensors of `rows` rows go in one buffer: (offset, length) per
/// tensor in view order, each offset a multiple of [`TENSOR_ALIGN`], and the
/// bytes used (the end of the last tensor). `None` if a size overflows or a
/// tensor is jagged (its size depends on its rows: [`pack_values`]).
pub fn pack(layouts: &[TensorLayout], rows: usize, out: &mut Vec<(usize, usize)>) -> Option<usize> {
    out.clear();
    if layouts.iter().any(|l| l.jagged) {
        return None;
    }
    let mut placed = Vec::with_capacity(layouts.len());
    let end = pack_values(layouts, rows, &[], &mut placed)?;
    out.extend(placed.iter().map(|p| (p.offset, p.len)));
    Some(end)
}

/// Where tensors of `rows` rows go in one buffer, jagged tensor `i` holding
/// `values[i]` values in all (dense tensors' entries are not read): a
/// jagged tensor's row offsets, then its values, each at a multiple of
/// [`TENSOR_ALIGN`]. Returns the bytes used (the end of the last tensor),
/// `None` if a size overflows.
pub fn pack_values(layouts: &[TensorLayout], rows: usize, values: &[u64], out: &mut Vec<Placement>) -> Option<usize> {
    out.clear();
    let mut end = 0usize;
    let mut take = |len: usize| -> Option<usize> {
        let at = end.checked_next_multiple_of(TENSOR_ALIGN)?;
        end = at.checked_add(len)?;
        Some(at)
    };
    for (i, layout) in layouts.iter().enumerate() {
        let elems = layout.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))?;
        let width = elems.checked_mul(layout.dtype.size_bytes())?;
        let (count, row_offsets) = if layout.jagged {
            let count = usize::try_from(values.get(i).copied().unwrap_or(0)).ok()?;
            (count, Some(take(rows.checked_add(1)?.checked_mul(8)?)?))
        } else {
            (rows, None)
        };
        let len = width.checked_mul(count)?;
        out.push(Placement { offset: take(len)?, len, row_offsets });
    }
    Some(end)
}

/// Which memory a loader assembles batches into.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub enum HostMemory {
    /// Ordinary heap memory. Default.
    #[default]
    Heap,
    /// Page-locked memory of this CUDA context, from which a
    /// [`crate::cuda::GpuFeed`] copies to the device directly (feature
    /// `cuda`; take it from [`crate::cuda::GpuFeed::host_memory`]).
    #[cfg(feature = "cuda")]
    Pinned(std::sync::Arc<cudarc::driver::CudaContext>),
}

/// One batch's buffer.
pub(crate) struct HostBuf {
    mem: Mem,
    len: usize,
}

enum Mem {
    Heap(AlignedBuf),
    #[cfg(feature = "cuda")]
    Pinned {
        /// Owns the allocation (freed on drop, after its pending work).
        _slice: cudarc::driver::PinnedHostSlice<u8>,
        ptr: *mut u8,
        cap: usize,
    },
}

// SAFETY: `ptr` points into the allocation `_slice` owns (cudarc marks it
// Send and Sync); the buffer is only reached through `&self`/`&mut self`.
#[cfg(feature = "cuda")]
unsafe impl Send for Mem {}
// SAFETY: as above.
#[cfg(feature = "cuda")]
unsafe impl Sync for Mem {}

impl HostBuf {
    /// A buffer of at least `cap` bytes of `memory`, 64-byte aligned.
    fn alloc(memory: &HostMemory, cap: usize) -> Result<Self, ClientError> {
        let mem =
            match memory {
                HostMemory::Heap => Mem::Heap(AlignedBuf::zeroed(cap)),
                #[cfg(feature = "cuda")]
                HostMemory::Pinned(ctx) => crate::cuda::alloc_pinned(ctx, cap.max(1))
                    .map(|(slice, ptr)| Mem::Pinned { _slice: slice, ptr, cap: cap.max(1) })?,
            };
        Ok(Self { mem, len: 0 })
    }

    fn capacity(&self) -> usize {
        match &self.mem {
            Mem::Heap(b) => b.len(),
            #[cfg(feature = "cuda")]
            Mem::Pinned { cap, .. } => *cap,
        }
    }

    /// Sets the length (at most the capacity).
    fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity());
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        match &self.mem {
            Mem::Heap(b) => &b.as_slice()[..self.len],
            // SAFETY: `ptr` maps `cap` >= `len` bytes, zeroed at allocation,
            // owned by this buffer; no device copy writes host memory.
            #[cfg(feature = "cuda")]
            Mem::Pinned { ptr, .. } => unsafe { std::slice::from_raw_parts(*ptr, self.len) },
        }
    }

    /// The bytes, mutably.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.mem {
            Mem::Heap(b) => &mut b.as_mut_slice()[..self.len],
            // SAFETY: as in `as_slice`; the borrow is unique through `&mut
            // self`, and a device copy out of this buffer is finished before
            // the buffer can be reused (the feed holds the batch until then).
            #[cfg(feature = "cuda")]
            Mem::Pinned { ptr, .. } => unsafe { std::slice::from_raw_parts_mut(*ptr, self.len) },
        }
    }

    /// True when the buffer is page-locked memory of a CUDA context.
    #[cfg(feature = "cuda")]
    pub(crate) fn is_pinned(&self) -> bool {
        matches!(self.mem, Mem::Pinned { .. })
    }
}

/// Batch buffers waiting for reuse, at most `cap` of them (more are freed).
pub(crate) struct BufferPool {
    cap: usize,
    memory: HostMemory,
    free: Mutex<Vec<HostBuf>>,
}

impl BufferPool {
    pub(crate) fn new(cap: usize, memory: HostMemory) -> Self {
        Self { cap, memory, free: Mutex::new(Vec::with_capacity(cap)) }
    }

    /// A buffer of `len` bytes: a waiting one that is large enough, or a new
    /// one. Its bytes are whatever the last batch left there.
    pub(crate) fn take(&self, len: usize) -> Result<HostBuf, ClientError> {
        // A poisoned lock only loses the pool: allocate instead.
        let reused = self.free.lock().ok().and_then(|mut free| {
            let i = free.iter().position(|b| b.capacity() >= len)?;
            Some(free.swap_remove(i))
        });
        let mut buf = match reused {
            Some(b) => b,
            None => HostBuf::alloc(&self.memory, len)?,
        };
        buf.set_len(len);
        Ok(buf)
    }

    /// Keeps `buf` for reuse, or frees it when the pool is full.
    pub(crate) fn give(&self, buf: HostBuf) {
        if let Ok(mut free) = self.free.lock()
            && free.len() < self.cap
        {
            free.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_proto::DType;

    #[test]
    fn tensors_are_packed_in_view_order_at_aligned_offsets() {
        let layouts = [
            TensorLayout { name: "a".into(), dtype: DType::F32, shape: vec![3], jagged: false },
            TensorLayout { name: "b".into(), dtype: DType::I64, shape: vec![], jagged: false },
            TensorLayout { name: "c".into(), dtype: DType::U8, shape: vec![2, 5], jagged: false },
        ];
        let mut out = Vec::new();
        assert_eq!(pack(&layouts, 5, &mut out), Some(128 + 50));
        assert_eq!(out, [(0, 60), (64, 40), (128, 50)]);
        assert_eq!(pack(&layouts, usize::MAX / 2, &mut out), None);
    }

    #[test]
    fn a_jagged_tensor_takes_its_row_offsets_then_its_values() {
        let layouts = [
            TensorLayout::dense("a", DType::F32, vec![3]),
            TensorLayout::jagged("h", DType::I64, vec![]),
            TensorLayout::dense("c", DType::U8, vec![]),
        ];
        let mut out = Vec::new();
        // 5 rows, 7 values of h: offsets 6 x 8 = 48 bytes, values 56.
        assert_eq!(pack_values(&layouts, 5, &[0, 7, 0], &mut out), Some(192 + 5));
        assert_eq!(
            out,
            [
                Placement { offset: 0, len: 60, row_offsets: None },
                Placement { offset: 128, len: 56, row_offsets: Some(64) },
                Placement { offset: 192, len: 5, row_offsets: None },
            ]
        );
        // Its size depends on its rows: the dense packing has none.
        assert_eq!(pack(&layouts, 5, &mut Vec::new()), None);
    }

    #[test]
    fn a_pool_hands_back_a_large_enough_buffer_and_keeps_at_most_its_cap() {
        let pool = BufferPool::new(1, HostMemory::Heap);
        let a = pool.take(1000).unwrap();
        let b = pool.take(10).unwrap();
        let a_ptr = a.as_slice().as_ptr();
        pool.give(a);
        pool.give(b); // over the cap: freed
        let again = pool.take(900).unwrap();
        assert_eq!(again.as_slice().as_ptr(), a_ptr);
        assert_eq!(again.as_slice().len(), 900);
        assert_eq!(again.as_slice().as_ptr() as usize % TENSOR_ALIGN, 0);
        // Nothing large enough waits: a new buffer.
        assert_eq!(pool.take(5000).unwrap().as_slice().len(), 5000);
    }
}
