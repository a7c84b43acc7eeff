//! Batches and typed tensor views.
//!
//! A [`Batch`] owns one 64-byte-aligned buffer per tensor, row-major, rows in
//! plan order. Buffers go back to the loader's pool when the batch is
//! dropped, so steady state allocates nothing.

use crate::error::ClientError;
use crate::loader::Position;
use granary_proto::{AlignedBuf, DType, TensorLayout};
use std::sync::Arc;
use std::sync::mpsc::SyncSender;

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

/// One batch of rows, assembled.
pub struct Batch {
    pub(crate) position: Position,
    pub(crate) rows: usize,
    pub(crate) layouts: Arc<[TensorLayout]>,
    pub(crate) bufs: Vec<AlignedBuf>,
    pub(crate) recycle: Option<SyncSender<Vec<AlignedBuf>>>,
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

    /// Raw bytes of tensor `i` (view order), row-major, 64-byte aligned.
    pub fn tensor_bytes(&self, i: usize) -> &[u8] {
        self.bufs[i].as_slice()
    }

    /// A typed view of tensor `name`, for example `tensor::<f32>("dense")`
    /// with shape `[rows, 150]`.
    pub fn tensor<T: Element>(&self, name: &str) -> Result<TensorView<'_, T>, ClientError> {
        let i = self
            .layouts
            .iter()
            .position(|l| l.name == name)
            .ok_or_else(|| ClientError::UnknownTensor(name.to_string()))?;
        let layout = &self.layouts[i];
        if !T::accepts(layout.dtype) {
            return Err(ClientError::DType { tensor: name.to_string(), want: T::NAME, have: layout.dtype.name() });
        }
        // Buffers start 64-byte aligned and hold rows x row_bytes bytes, a
        // multiple of the element size, so the cast cannot fail.
        let data: &[T] = bytemuck::try_cast_slice(self.bufs[i].as_slice())
            .map_err(|e| ClientError::Protocol(format!("tensor {name:?} cannot be viewed as {}: {e}", T::NAME)))?;
        let mut shape = Vec::with_capacity(1 + layout.shape.len());
        shape.push(self.rows);
        shape.extend(layout.shape.iter().map(|&d| d as usize));
        Ok(TensorView { data, shape })
    }

    /// xxh3-64 over every tensor's bytes in view order: two batches with
    /// equal checksums hold (with overwhelming probability) equal bytes.
    pub fn checksum(&self) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for b in &self.bufs {
            h.update(&(b.len() as u64).to_le_bytes());
            h.update(b.as_slice());
        }
        h.digest()
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if let Some(tx) = self.recycle.take() {
            // A full pool or a finished loader just frees the buffers.
            let _ = tx.try_send(std::mem::take(&mut self.bufs));
        }
    }
}
