//! Where a batch's tensors lie in a slot: packed in view order at
//! [`SLOT_ALIGN`]-aligned offsets, the capacity check, and [`GpuTensor`], one
//! tensor as it then lies in device memory.
//!
//! Pure arithmetic, no driver calls, so it is tested without a GPU.

use crate::error::{ClientError, GpuError};
use granary_proto::{DType, TensorLayout};

/// Alignment, in bytes, of every tensor's offset inside a slot.
pub const SLOT_ALIGN: usize = 64;

/// Where one tensor lies inside a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Placement {
    /// Byte offset from the start of the slot; a multiple of [`SLOT_ALIGN`].
    pub(super) offset: usize,
    /// Bytes: rows x row bytes.
    pub(super) len: usize,
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

/// Places a batch of `rows` rows in a slot of `capacity` bytes, or explains
/// why it does not fit.
pub(super) fn plan_slot(
    layouts: &[TensorLayout],
    rows: usize,
    capacity: usize,
    out: &mut Vec<Placement>,
) -> Result<usize, ClientError> {
    if let Some(l) = layouts.iter().find(|l| l.jagged) {
        return Err(ClientError::Gpu(GpuError::Jagged { tensor: l.name.clone() }));
    }
    let used = place(layouts, rows, out).ok_or_else(|| {
        ClientError::Gpu(GpuError::Buffers(format!("a batch of {rows} rows overflows the address space")))
    })?;
    if used > capacity {
        return Err(ClientError::Gpu(GpuError::Buffers(format!(
            "a batch of {rows} rows needs {used} bytes on the GPU (tensors at {SLOT_ALIGN}-byte-aligned offsets) but \
             the feed's slots hold {capacity} bytes; create the GpuFeed with max_batch_bytes >= {used}"
        ))));
    }
    Ok(used)
}

/// The `max_batch_bytes` a [`GpuFeed`](super::GpuFeed) needs for batches of up to `rows` rows
/// of these tensors: each tensor packed in view order at a
/// [`SLOT_ALIGN`]-aligned offset. `None` if the size overflows `usize`.
pub fn slot_bytes(layouts: &[TensorLayout], rows: usize) -> Option<usize> {
    place(layouts, rows, &mut Vec::with_capacity(layouts.len()))
}

/// One tensor of a [`GpuBatch`](super::GpuBatch), as it lies in device memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTensor {
    pub(super) name: String,
    pub(super) dtype: DType,
    pub(super) shape: Vec<usize>,
    pub(super) offset: usize,
    pub(super) len: usize,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::fixtures::{layout, layouts};

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
                    Err(ClientError::Gpu(e)) => assert!(e.to_string().contains("max_batch_bytes"), "{e}"),
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
    fn cuda_slot_layout_refuses_a_jagged_tensor_by_name() {
        let layouts = [TensorLayout::dense("d", DType::F32, vec![4]), TensorLayout::jagged("hist", DType::I64, vec![])];
        match plan_slot(&layouts, 8, 1 << 20, &mut Vec::new()) {
            Err(ClientError::Gpu(GpuError::Jagged { tensor })) => assert_eq!(tensor, "hist"),
            other => panic!("expected GpuError::Jagged, got {other:?}"),
        }
    }

    #[test]
    fn cuda_slot_layout_overflow_is_an_error() {
        let ls = vec![layout("x", DType::F64, &[u32::MAX, u32::MAX])];
        assert_eq!(slot_bytes(&ls, usize::MAX), None);
        assert!(matches!(plan_slot(&ls, usize::MAX, usize::MAX, &mut Vec::new()), Err(ClientError::Gpu(_))));
    }
}
