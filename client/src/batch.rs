//! Batches and typed tensor views.
//!
//! A [`Batch`] holds its tensors row-major, rows in plan order, in one of two
//! ways: assembled into one buffer, every tensor at a 64-byte-aligned offset
//! (the buffer goes back to the loader's pool when the batch is dropped, so
//! steady state allocates nothing), or, where the batch's rows are one
//! contiguous run of one chunk (most batches of
//! [`granary_proto::Shuffle::Blocks`] and of an unshuffled plan), as a view
//! into the sealed chunk memory itself: nothing is copied on the host.

use crate::error::TensorError;
use crate::hostbuf::{BufferPool, HostBuf};
use crate::position::Position;
use crate::source::Chunk;
use granary_proto::{DType, TensorLayout};
use std::sync::Arc;

/// An element type a tensor view can have.
pub trait Element: bytemuck::Pod {
    /// Rust type name, for errors.
    const NAME: &'static str;
    /// True when a tensor of `dtype` can be viewed as `Self`.
    fn accepts(dtype: DType) -> bool;
}

macro_rules! element {
    ($t:ty, $name:literal, $($d:ident)|+) => {
        impl Element for $t {
            const NAME: &'static str = $name;
            fn accepts(dtype: DType) -> bool {
                matches!(dtype, $(DType::$d)|+)
            }
        }
    };
}

element!(f32, "f32", F32);
element!(f64, "f64", F64);
element!(half::f16, "f16", F16);
element!(half::bf16, "bf16", BF16);
element!(i64, "i64", I64);
element!(i32, "i32", I32);
element!(i16, "i16", I16);
element!(i8, "i8", I8);
// Booleans are stored one byte per value, 0 or 1.
element!(u8, "u8", U8 | Bool);

/// A typed, shaped view of one tensor of a batch.
#[derive(Debug, Clone)]
pub struct TensorView<'a, T> {
    data: &'a [T],
    shape: Vec<usize>,
}

impl<'a, T> TensorView<'a, T> {
    /// The elements, row-major.
    pub fn data(&self) -> &'a [T] {
        self.data
    }

    /// The shape: `[rows]` followed by the per-row shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
}

/// Where a batch's tensor bytes live.
pub(crate) enum Storage {
    /// Assembled into one buffer ([`crate::hostbuf::pack`]), returned to
    /// `recycle` on drop.
    Owned {
        /// Every tensor, packed.
        buf: HostBuf,
        /// (offset, length) of each tensor in `buf`, view order.
        placements: Vec<(usize, usize)>,
        /// The loader's buffer pool.
        recycle: Option<Arc<BufferPool>>,
    },
    /// Rows `first_row..first_row + rows` of one chunk, in place.
    View {
        /// The chunk (keeps its memory mapped while the batch lives).
        chunk: Chunk,
        /// The batch's first row in the chunk.
        first_row: usize,
    },
    /// The buffer went back to the pool (only while dropping).
    Released,
}

/// One batch of rows.
pub struct Batch {
    pub(crate) position: Position,
    pub(crate) rows: usize,
    pub(crate) layouts: Arc<[TensorLayout]>,
    pub(crate) storage: Storage,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch").field("position", &self.position).field("rows", &self.rows).finish()
    }
}

impl Batch {
    /// Where this batch sits in the plan.
    pub fn position(&self) -> Position {
        self.position
    }

    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Tensor layouts, in view order.
    pub fn layouts(&self) -> &[TensorLayout] {
        &self.layouts
    }

    /// Raw bytes of tensor `i` (view order), row-major. Assembled batches
    /// start every tensor 64-byte aligned; a view into a chunk starts where
    /// its first row lies (aligned to the element size, which is all a typed
    /// view or a device copy needs).
    pub fn tensor_bytes(&self, i: usize) -> &[u8] {
        match &self.storage {
            Storage::Owned { buf, placements, .. } => {
                let (offset, len) = placements[i];
                &buf.as_slice()[offset..offset + len]
            }
            Storage::View { chunk, first_row } => {
                let rb = self.layouts[i].row_bytes();
                &chunk.tensor_bytes(i)[first_row * rb..(first_row + self.rows) * rb]
            }
            Storage::Released => &[],
        }
    }

    /// True when the batch is a view into a chunk whose memory is
    /// registered with a CUDA context.
    #[cfg(feature = "cuda")]
    pub(crate) fn is_page_locked_view(&self) -> bool {
        matches!(&self.storage, Storage::View { chunk, .. } if chunk.is_page_locked())
    }

    /// An assembled batch in page-locked memory: its whole packed buffer
    /// (tensors at [`crate::hostbuf::pack`]'s offsets).
    #[cfg(feature = "cuda")]
    pub(crate) fn pinned_bytes(&self) -> Option<&[u8]> {
        match &self.storage {
            Storage::Owned { buf, .. } if buf.is_pinned() => Some(buf.as_slice()),
            _ => None,
        }
    }

    /// True when the batch is a view into chunk memory (nothing was copied
    /// to make it), false when it was assembled into buffers of its own.
    pub fn is_view(&self) -> bool {
        matches!(self.storage, Storage::View { .. })
    }

    /// A typed view of tensor `name`, for example `tensor::<f32>("dense")`
    /// with shape `[rows, 150]`.
    pub fn tensor<T: Element>(&self, name: &str) -> Result<TensorView<'_, T>, TensorError> {
        let i =
            self.layouts.iter().position(|l| l.name == name).ok_or_else(|| TensorError::Unknown(name.to_string()))?;
        let layout = &self.layouts[i];
        if !T::accepts(layout.dtype) {
            return Err(TensorError::DType { tensor: name.to_string(), want: T::NAME, have: layout.dtype.name() });
        }
        // Tensor bytes start aligned to at least the element size (buffers
        // and chunk tensors are 64-byte aligned, rows a multiple of the
        // element size) and hold rows x row_bytes bytes, so the cast cannot
        // fail; were it to, an empty view is not a wrong tensor.
        let data: &[T] = bytemuck::try_cast_slice(self.tensor_bytes(i)).map_err(|_| TensorError::DType {
            tensor: name.to_string(),
            want: T::NAME,
            have: "bytes that are not aligned or sized for it",
        })?;
        let mut shape = Vec::with_capacity(1 + layout.shape.len());
        shape.push(self.rows);
        shape.extend(layout.shape.iter().map(|&d| d as usize));
        Ok(TensorView { data, shape })
    }

    /// xxh3-64 over every tensor's bytes in view order: two batches with
    /// equal checksums hold (with overwhelming probability) equal bytes.
    pub fn checksum(&self) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for i in 0..self.layouts.len() {
            let b = self.tensor_bytes(i);
            h.update(&(b.len() as u64).to_le_bytes());
            h.update(b);
        }
        h.digest()
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if let Storage::Owned { buf, recycle: Some(pool), .. } = std::mem::replace(&mut self.storage, Storage::Released)
        {
            // A full pool just frees the buffer.
            pool.give(buf);
        }
    }
}
