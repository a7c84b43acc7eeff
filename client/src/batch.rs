//! Batches and typed tensor views.
//!
//! A [`Batch`] holds its tensors row-major, rows in plan order, in one of two
//! ways: assembled into one buffer, every tensor at a 64-byte-aligned offset
//! (the buffer goes back to the loader's pool when the batch is dropped, so
//! steady state allocates nothing), or, where the batch's rows are one
//! contiguous run of one chunk (most batches of
//! [`granary_proto::Shuffle::Blocks`] and of an unshuffled plan), as a view
//! into the sealed chunk memory itself: nothing is copied on the host.
//!
//! A jagged tensor (a list or byte column: a variable number of values per
//! row) is its values, rows in plan order, and rows + 1 row offsets rebased
//! to the batch's first value ([`Batch::jagged`], [`Batch::bytes`]). In a
//! view the values are the chunk's own; only the offsets are copied, to
//! rebase them.

use crate::error::TensorError;
use crate::hostbuf::{BufferPool, HostBuf, Placement};
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

/// A jagged tensor of a batch: row `r` holds values
/// `offsets[r]..offsets[r + 1]`, each value `value_shape` elements.
#[derive(Debug, Clone)]
pub struct JaggedView<'a, T> {
    values: &'a [T],
    offsets: &'a [u64],
    /// Elements per value (the product of the per-value shape).
    per_value: usize,
    value_shape: Vec<usize>,
}

impl<'a, T> JaggedView<'a, T> {
    /// Every row's values, rows in batch order, contiguous.
    pub fn values(&self) -> &'a [T] {
        self.values
    }

    /// Rows + 1 offsets into the values (in values, not elements, when a
    /// value has a shape): the first is 0, the last the value count.
    pub fn offsets(&self) -> &'a [u64] {
        self.offsets
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Each row's length in values.
    pub fn lengths(&self) -> impl ExactSizeIterator<Item = usize> + 'a {
        self.offsets.windows(2).map(|w| (w[1] - w[0]) as usize)
    }

    /// The shape of one value (`[]` for scalars).
    pub fn value_shape(&self) -> &[usize] {
        &self.value_shape
    }

    /// Row `r`'s values (`None` past the last row).
    pub fn row(&self, r: usize) -> Option<&'a [T]> {
        let (a, b) = (*self.offsets.get(r)? as usize, *self.offsets.get(r + 1)? as usize);
        self.values.get(a * self.per_value..b * self.per_value)
    }

    /// The rows, in batch order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &'a [T]> + '_ {
        (0..self.rows()).map(|r| self.row(r).unwrap_or(&[]))
    }
}

/// Where a batch's tensor bytes live.
pub(crate) enum Storage {
    /// Assembled into one buffer ([`crate::hostbuf::pack`]), returned to
    /// `recycle` on drop.
    Owned {
        /// Every tensor, packed.
        buf: HostBuf,
        /// Where each tensor lies in `buf`, view order.
        placements: Vec<Placement>,
        /// The loader's buffer pool.
        recycle: Option<Arc<BufferPool>>,
    },
    /// Rows `first_row..first_row + rows` of one chunk, in place.
    View {
        /// The chunk (keeps its memory mapped while the batch lives).
        chunk: Chunk,
        /// The batch's first row in the chunk.
        first_row: usize,
        /// Per tensor, view order: a jagged tensor's row offsets rebased to
        /// the batch's first value (rows + 1); empty for a dense tensor
        /// (and no entry at all when no tensor is jagged).
        offsets: Vec<Vec<u64>>,
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

    /// Raw bytes of tensor `i` (view order), row-major; of a jagged tensor,
    /// its values. Assembled batches start every tensor 64-byte aligned; a
    /// view into a chunk starts where its first row lies (aligned to the
    /// element size, which is all a typed view or a device copy needs).
    pub fn tensor_bytes(&self, i: usize) -> &[u8] {
        match &self.storage {
            Storage::Owned { buf, placements, .. } => {
                let p = placements[i];
                &buf.as_slice()[p.offset..p.offset + p.len]
            }
            Storage::View { chunk, first_row, .. } => {
                let rb = self.layouts[i].row_bytes();
                match chunk.row_offsets(i) {
                    None => &chunk.tensor_bytes(i)[first_row * rb..(first_row + self.rows) * rb],
                    Some(o) => {
                        let (a, b) = (o[*first_row] as usize, o[first_row + self.rows] as usize);
                        &chunk.tensor_bytes(i)[a * rb..b * rb]
                    }
                }
            }
            Storage::Released => &[],
        }
    }

    /// The row offsets of jagged tensor `i` (view order): rows + 1, rebased
    /// to the batch's first value. `None` for a dense tensor.
    pub fn row_offsets(&self, i: usize) -> Option<&[u64]> {
        if !self.layouts.get(i)?.jagged {
            return None;
        }
        match &self.storage {
            Storage::Owned { buf, placements, .. } => {
                let at = placements[i].row_offsets?;
                // The buffer and `at` are 64-byte aligned.
                bytemuck::try_cast_slice(&buf.as_slice()[at..at + (self.rows + 1) * 8]).ok()
            }
            Storage::View { offsets, .. } => offsets.get(i).map(Vec::as_slice),
            Storage::Released => None,
        }
    }

    /// Every byte of the batch, in view order: a jagged tensor's row
    /// offsets (as little-endian `u64`s), then its values; a dense tensor's
    /// bytes. What the checksum covers, and what a consumer copying the
    /// whole batch moves.
    pub fn parts(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.layouts.len()).flat_map(move |i| {
            let offsets = self.row_offsets(i).map(|o| -> &[u8] { bytemuck::cast_slice(o) });
            offsets.into_iter().chain(std::iter::once(self.tensor_bytes(i)))
        })
    }

    /// Bytes in [`Batch::parts`].
    pub fn byte_len(&self) -> usize {
        self.parts().map(<[u8]>::len).sum()
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

    /// The index of tensor `name` and its layout, checked against `T`.
    fn find<T: Element>(&self, name: &str) -> Result<(usize, &TensorLayout), TensorError> {
        let i =
            self.layouts.iter().position(|l| l.name == name).ok_or_else(|| TensorError::Unknown(name.to_string()))?;
        let layout = &self.layouts[i];
        if !T::accepts(layout.dtype) {
            return Err(TensorError::DType { tensor: name.to_string(), want: T::NAME, have: layout.dtype.name() });
        }
        Ok((i, layout))
    }

    /// Tensor `i`'s bytes as `T`s.
    fn typed<T: Element>(&self, i: usize, name: &str) -> Result<&[T], TensorError> {
        // Tensor bytes start aligned to at least the element size (buffers
        // and chunk tensors are 64-byte aligned, rows a multiple of the
        // element size) and hold a whole number of elements, so the cast
        // cannot fail; were it to, an error is not a wrong tensor.
        bytemuck::try_cast_slice(self.tensor_bytes(i)).map_err(|_| TensorError::DType {
            tensor: name.to_string(),
            want: T::NAME,
            have: "bytes that are not aligned or sized for it",
        })
    }

    /// A typed view of dense tensor `name`, for example
    /// `tensor::<f32>("dense")` with shape `[rows, 150]`.
    pub fn tensor<T: Element>(&self, name: &str) -> Result<TensorView<'_, T>, TensorError> {
        let (i, layout) = self.find::<T>(name)?;
        if layout.jagged {
            return Err(TensorError::Jagged { tensor: name.to_string(), jagged: true });
        }
        let data = self.typed::<T>(i, name)?;
        let mut shape = Vec::with_capacity(1 + layout.shape.len());
        shape.push(self.rows);
        shape.extend(layout.shape.iter().map(|&d| d as usize));
        Ok(TensorView { data, shape })
    }

    /// A typed view of jagged tensor `name` (a list column), for example
    /// `jagged::<i64>("hist")`: its values and row offsets, without a copy.
    pub fn jagged<T: Element>(&self, name: &str) -> Result<JaggedView<'_, T>, TensorError> {
        let (i, layout) = self.find::<T>(name)?;
        let offsets =
            self.row_offsets(i).ok_or_else(|| TensorError::Jagged { tensor: name.to_string(), jagged: false })?;
        let values = self.typed::<T>(i, name)?;
        let value_shape: Vec<usize> = layout.shape.iter().map(|&d| d as usize).collect();
        Ok(JaggedView { values, offsets, per_value: value_shape.iter().product(), value_shape })
    }

    /// Byte tensor `name` (a binary or string column): each row's bytes,
    /// `for img in batch.bytes("img")?.iter()`.
    pub fn bytes(&self, name: &str) -> Result<JaggedView<'_, u8>, TensorError> {
        self.jagged::<u8>(name)
    }

    /// One xxh3-64 per row over that row's bytes of every tensor, in view
    /// order (a jagged tensor's row: its values, after their count): which
    /// rows a batch holds and in what order, independent of how the batch
    /// was cut (the same row has the same digest in a batch of 1,024 rows
    /// as in a batch of 256). What `granary demo --elastic` compares across
    /// world sizes.
    pub fn row_digests(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.rows);
        /// A tensor's bytes, row offsets (jagged) and bytes per row (value).
        type Rows<'a> = (&'a [u8], Option<&'a [u64]>, usize);
        let tensors: Vec<Rows<'_>> = (0..self.layouts.len())
            .map(|i| (self.tensor_bytes(i), self.row_offsets(i), self.layouts[i].row_bytes()))
            .collect();
        for r in 0..self.rows {
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            for &(bytes, offsets, rb) in &tensors {
                let (a, b) = match offsets {
                    None => (r * rb, (r + 1) * rb),
                    Some(o) => (o[r] as usize * rb, o[r + 1] as usize * rb),
                };
                h.update(&((b - a) as u64).to_le_bytes());
                h.update(bytes.get(a..b).unwrap_or(&[]));
            }
            out.push(h.digest());
        }
        out
    }

    /// xxh3-64 over every tensor's bytes in view order (a jagged tensor's
    /// row offsets, then its values): two batches with equal checksums hold
    /// (with overwhelming probability) equal bytes.
    pub fn checksum(&self) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for b in self.parts() {
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
