//! Arrow to chunk: the conversion whose result is cached.
//!
//! [`resolve_view`] checks a view against a file's Arrow schema once, when the
//! dataset is opened. [`convert_into`] then writes one decoded row group
//! straight into the chunk's final bytes, tensor by tensor:
//! - a single column whose type matches is one bulk copy of its value buffer;
//! - a `FixedSizeList<T, k>` is already row-major: one bulk copy of its child;
//! - `k` stacked columns are transposed in blocks of [`BLOCK_ROWS`] rows, so
//!   the destination block stays in cache while every column is written into
//!   it;
//! - casts go through Arrow's cast kernel with overflow checking, booleans
//!   become one byte each, bf16 is rounded from f32.
//!
//! Nulls are an error naming the file, row group, column and first null row,
//! unless the view declares a fill value. Inner loops do not branch per
//! value: nulls are patched after the bulk copy, only when there are any.

use crate::error::{ConvertError, SchemaError};
use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    SchemaRef, UInt8Type,
};
use granary_proto::{ChunkLayout, DType, TensorLayout, View};
use std::borrow::Cow;

#[cfg(target_endian = "big")]
compile_error!("chunks are little-endian and the converter copies native buffers: big-endian hosts are not supported");

/// Rows per transposition block when stacking columns.
pub const BLOCK_ROWS: usize = 64;

/// How a tensor is built.
#[derive(Clone, Debug, PartialEq)]
enum Kind {
    /// One scalar column.
    Scalar,
    /// Several scalar columns of one type.
    Stacked,
    /// One `FixedSizeList<T, k>` column.
    List(usize),
}

/// One tensor of a view, resolved against a schema.
#[derive(Clone, Debug, PartialEq)]
struct ResolvedTensor {
    name: String,
    dtype: DType,
    kind: Kind,
    columns: Vec<String>,
    fill: Option<f64>,
}

/// A view resolved against one file's schema.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    /// Tensor layouts, in view order.
    pub layouts: Vec<TensorLayout>,
    /// Root column indices to read (the projection).
    pub projection: Vec<usize>,
    tensors: Vec<ResolvedTensor>,
}

/// The Arrow type a dtype is stored as without a cast (`None` for bf16,
/// which Arrow has no type for).
pub fn arrow_type(dtype: DType) -> Option<DataType> {
    Some(match dtype {
        DType::F32 => DataType::Float32,
        DType::F64 => DataType::Float64,
        DType::F16 => DataType::Float16,
        DType::BF16 => return None,
        DType::I64 => DataType::Int64,
        DType::I32 => DataType::Int32,
        DType::I16 => DataType::Int16,
        DType::I8 => DataType::Int8,
        DType::U8 => DataType::UInt8,
        DType::Bool => DataType::Boolean,
    })
}

fn castable(dt: &DataType) -> bool {
    dt.is_numeric() || *dt == DataType::Boolean
}

/// Checks `view` against `schema` and works out every tensor's shape.
pub fn resolve_view(view: &View, schema: &SchemaRef, file: &str) -> Result<Resolved, SchemaError> {
    let mut layouts = Vec::new();
    let mut tensors = Vec::new();
    let mut projection = Vec::new();
    for spec in &view.tensors {
        let err = |column: &str, problem: String| SchemaError {
            file: file.to_string(),
            tensor: spec.name.clone(),
            column: column.to_string(),
            problem,
        };
        let mut elem: Option<DataType> = None;
        let mut kind = Kind::Scalar;
        for col in &spec.columns {
            let (idx, field) =
                schema.column_with_name(col).ok_or_else(|| err(col, "no such column in the file".into()))?;
            if !projection.contains(&idx) {
                projection.push(idx);
            }
            let (this_elem, this_kind) = match field.data_type() {
                DataType::FixedSizeList(child, k) => {
                    if spec.columns.len() > 1 {
                        return Err(err(col, "a FixedSizeList column cannot be stacked with other columns".into()));
                    }
                    (child.data_type().clone(), Kind::List(*k as usize))
                }
                dt if castable(dt) => (dt.clone(), if spec.columns.len() > 1 { Kind::Stacked } else { Kind::Scalar }),
                dt => return Err(err(col, format!("has Arrow type {dt}, which no tensor can be built from"))),
            };
            if let Some(prev) = &elem
                && *prev != this_elem
            {
                return Err(err(col, format!("has Arrow type {this_elem}, but the tensor's other columns are {prev}")));
            }
            elem = Some(this_elem);
            kind = this_kind;
        }
        let Some(elem) = elem else {
            return Err(err("", "the tensor names no column".into()));
        };
        if !castable(&elem) {
            return Err(err(&spec.columns[0], format!("has element type {elem}, which no tensor can be built from")));
        }
        let exact = arrow_type(spec.dtype).as_ref() == Some(&elem);
        if !exact && !spec.cast {
            return Err(err(
                &spec.columns[0],
                format!("has Arrow type {elem}; the view asks for {} (declare cast = true to convert)", spec.dtype),
            ));
        }
        let shape = match kind {
            Kind::Scalar => vec![],
            Kind::Stacked => vec![spec.columns.len() as u32],
            Kind::List(k) => vec![k as u32],
        };
        layouts.push(TensorLayout { name: spec.name.clone(), dtype: spec.dtype, shape });
        tensors.push(ResolvedTensor {
            name: spec.name.clone(),
            dtype: spec.dtype,
            kind,
            columns: spec.columns.clone(),
            fill: spec.fill,
        });
    }
    projection.sort_unstable();
    Ok(Resolved { layouts, projection, tensors })
}

/// Where a conversion happens, for error messages.
#[derive(Clone, Copy, Debug)]
pub struct Site<'a> {
    /// Object path of the file.
    pub file: &'a str,
    /// Row group index.
    pub row_group: usize,
}

impl Site<'_> {
    fn err(&self, column: &str, problem: String) -> ConvertError {
        ConvertError { file: self.file.to_string(), row_group: self.row_group, column: column.to_string(), problem }
    }
}

/// Writes every tensor of `batch` (one whole row group) into its range of
/// `out`, a buffer laid out by `layout`. Does not seal the chunk.
pub fn convert_into(
    batch: &RecordBatch,
    resolved: &Resolved,
    layout: &ChunkLayout,
    out: &mut [u8],
    site: Site<'_>,
) -> Result<(), ConvertError> {
    let rows = batch.num_rows();
    for (i, t) in resolved.tensors.iter().enumerate() {
        let dst = &mut out[layout.tensor_range(i)];
        let column = |name: &str| {
            batch.column_by_name(name).ok_or_else(|| site.err(name, "column missing from the decoded row group".into()))
        };
        let elem = t.dtype.size_bytes();
        match t.kind {
            Kind::Scalar => {
                let bytes = column_bytes(column(&t.columns[0])?, t, &t.columns[0], site)?;
                copy_exact(dst, &bytes, &t.columns[0], site)?;
            }
            Kind::List(k) => {
                let name = &t.columns[0];
                let list = column(name)?
                    .as_fixed_size_list_opt()
                    .ok_or_else(|| site.err(name, "is not a FixedSizeList".into()))?;
                let child = list.values();
                if child.len() != rows * k {
                    return Err(site.err(name, format!("list child has {} values, expected {rows} x {k}", child.len())));
                }
                let bytes = column_bytes(child, t, name, site)?;
                copy_exact(dst, &bytes, name, site)?;
                if list.null_count() > 0 {
                    let Some(fill) = t.fill else {
                        return Err(null_error(list, name, site));
                    };
                    let one = fill_bytes(t.dtype, fill);
                    for r in (0..rows).filter(|&r| list.is_null(r)) {
                        for v in dst[r * k * elem..(r + 1) * k * elem].chunks_exact_mut(elem) {
                            v.copy_from_slice(&one);
                        }
                    }
                }
            }
            Kind::Stacked => {
                let cols: Vec<Cow<'_, [u8]>> = t
                    .columns
                    .iter()
                    .map(|c| column(c).and_then(|a| column_bytes(a, t, c, site)))
                    .collect::<Result<_, _>>()?;
                let srcs: Vec<&[u8]> = cols.iter().map(|c| c.as_ref()).collect();
                if srcs.iter().any(|s| s.len() != rows * elem) || dst.len() != rows * elem * srcs.len() {
                    return Err(site.err(&t.name, "column lengths disagree with the row count".into()));
                }
                match elem {
                    1 => transpose::<1>(&srcs, rows, dst),
                    2 => transpose::<2>(&srcs, rows, dst),
                    4 => transpose::<4>(&srcs, rows, dst),
                    _ => transpose::<8>(&srcs, rows, dst),
                }
            }
        }
    }
    Ok(())
}

fn copy_exact(dst: &mut [u8], src: &[u8], column: &str, site: Site<'_>) -> Result<(), ConvertError> {
    if dst.len() != src.len() {
        return Err(site.err(column, format!("produced {} bytes, the chunk expects {}", src.len(), dst.len())));
    }
    dst.copy_from_slice(src);
    Ok(())
}

fn null_error(arr: &dyn Array, column: &str, site: Site<'_>) -> ConvertError {
    let first = (0..arr.len()).find(|&r| arr.is_null(r)).unwrap_or(0);
    site.err(
        column,
        format!("{} null values (first at row {first}) and the view declares no fill value", arr.null_count()),
    )
}

/// Stacks `k` columns of `E`-byte elements into row-major `[rows, k]`.
fn transpose<const E: usize>(cols: &[&[u8]], rows: usize, dst: &mut [u8]) {
    let k = cols.len();
    for r0 in (0..rows).step_by(BLOCK_ROWS) {
        let r1 = (r0 + BLOCK_ROWS).min(rows);
        for (j, col) in cols.iter().enumerate() {
            let src = &col[r0 * E..r1 * E];
            for (n, v) in src.chunks_exact(E).enumerate() {
                let at = ((r0 + n) * k + j) * E;
                dst[at..at + E].copy_from_slice(v);
            }
        }
    }
}

/// The little-endian bytes of `fill` as one element of `dtype`. The view
/// checked that the value fits.
fn fill_bytes(dtype: DType, fill: f64) -> Vec<u8> {
    match dtype {
        DType::F32 => (fill as f32).to_le_bytes().to_vec(),
        DType::F64 => fill.to_le_bytes().to_vec(),
        DType::F16 => half::f16::from_f64(fill).to_le_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f64(fill).to_le_bytes().to_vec(),
        DType::I64 => (fill as i64).to_le_bytes().to_vec(),
        DType::I32 => (fill as i32).to_le_bytes().to_vec(),
        DType::I16 => (fill as i16).to_le_bytes().to_vec(),
        DType::I8 => (fill as i8).to_le_bytes().to_vec(),
        DType::U8 => vec![fill as u8],
        DType::Bool => vec![u8::from(fill != 0.0)],
    }
}

/// One column's values as little-endian bytes of the tensor's dtype,
/// borrowed when no cast, fill or widening is needed.
fn column_bytes<'a>(
    arr: &'a ArrayRef,
    t: &ResolvedTensor,
    column: &str,
    site: Site<'_>,
) -> Result<Cow<'a, [u8]>, ConvertError> {
    if arr.null_count() > 0 && t.fill.is_none() {
        return Err(null_error(arr.as_ref(), column, site));
    }
    let target = arrow_type(t.dtype).unwrap_or(DataType::Float32);
    if *arr.data_type() != target {
        let opts = CastOptions { safe: false, ..Default::default() };
        let cast = cast_with_options(arr, &target, &opts)
            .map_err(|e| site.err(column, format!("cannot convert {} to {}: {e}", arr.data_type(), t.dtype)))?;
        // The cast array is a temporary: its bytes must be copied out.
        return Ok(Cow::Owned(typed_bytes(&cast, t).into_owned()));
    }
    Ok(typed_bytes(arr, t))
}

/// The values of `a` (already of the dtype's Arrow type) as bytes.
fn typed_bytes<'a>(a: &'a ArrayRef, t: &ResolvedTensor) -> Cow<'a, [u8]> {
    let fill = t.fill.map(|f| fill_bytes(t.dtype, f));
    match t.dtype {
        DType::F32 => prim::<Float32Type>(a, fill.as_deref()),
        DType::F64 => prim::<Float64Type>(a, fill.as_deref()),
        DType::F16 => prim::<Float16Type>(a, fill.as_deref()),
        DType::I64 => prim::<Int64Type>(a, fill.as_deref()),
        DType::I32 => prim::<Int32Type>(a, fill.as_deref()),
        DType::I16 => prim::<Int16Type>(a, fill.as_deref()),
        DType::I8 => prim::<Int8Type>(a, fill.as_deref()),
        DType::U8 => prim::<UInt8Type>(a, fill.as_deref()),
        DType::BF16 => {
            let f = a.as_primitive::<Float32Type>();
            let fill = t.fill.map(half::bf16::from_f64).unwrap_or(half::bf16::ZERO);
            let v: Vec<half::bf16> =
                (0..f.len()).map(|i| if f.is_null(i) { fill } else { half::bf16::from_f32(f.value(i)) }).collect();
            Cow::Owned(bytemuck::cast_slice(&v).to_vec())
        }
        DType::Bool => {
            let b = a.as_boolean();
            let fill = u8::from(t.fill.is_some_and(|f| f != 0.0));
            Cow::Owned((0..b.len()).map(|i| if b.is_null(i) { fill } else { u8::from(b.value(i)) }).collect())
        }
    }
}

/// Bytes of a primitive array; nulls (if any) overwritten with `fill`.
fn prim<'a, T>(a: &'a ArrayRef, fill: Option<&[u8]>) -> Cow<'a, [u8]>
where
    T: ArrowPrimitiveType,
    T::Native: bytemuck::Pod,
{
    let p = a.as_primitive::<T>();
    let bytes: &[u8] = bytemuck::cast_slice(p.values().as_ref());
    match (p.null_count(), fill) {
        (0, _) | (_, None) => Cow::Borrowed(bytes),
        (_, Some(fill)) => {
            let e = fill.len();
            let mut v = bytes.to_vec();
            for r in (0..p.len()).filter(|&r| p.is_null(r)) {
                v[r * e..(r + 1) * e].copy_from_slice(fill);
            }
            Cow::Owned(v)
        }
    }
}
