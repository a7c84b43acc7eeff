//! Arrow to chunk: the conversion whose result is cached.
//!
//! `granary_source::schema::resolve_view` checks a view against a file's Arrow
//! schema once, when the dataset is opened. [`convert_into`] then writes one decoded row group
//! straight into the chunk's final bytes, tensor by tensor:
//! - a single column whose type matches is one bulk copy of its value buffer;
//! - a `FixedSizeList<T, k>` is already row-major: one bulk copy of its child;
//! - `k` stacked columns are transposed in blocks of [`BLOCK_ROWS`] rows, so
//!   the destination block stays in cache while every column is written into
//!   it;
//! - a `List`/`LargeList` or byte column (a jagged tensor) becomes its row
//!   offsets, rebased to 0, and its values in one bulk copy; a row group
//!   with null rows (`null = "empty"`) or rows cut to `max_len`
//!   (`truncate`) copies row by row ([`KeptRows`]); with `pad_to` it
//!   becomes a dense `[N]` tensor padded with the fill, and a `<name>_len`
//!   tensor of each row's length;
//! - casts go through Arrow's cast kernel with overflow checking, booleans
//!   become one byte each, bf16 is rounded from f32.
//!
//! Nulls are an error naming the file, row group, column and first null row,
//! unless the view declares a fill value (a null row of a list or byte
//! column: unless it declares `null = "empty"`); so is a row longer than
//! `max_len` or `pad_to` without `truncate`. Inner loops do not branch per
//! value: nulls are patched after the bulk copy, only when there are any.

use crate::error::ConvertError;
use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, RecordBatch};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    UInt8Type,
};
use granary_proto::{ChunkLayout, DType};
use granary_source::schema::arrow_type;
use granary_source::schema::{Kind, Resolved, ResolvedTensor};
use std::borrow::Cow;

#[cfg(target_endian = "big")]
compile_error!("chunks are little-endian and the converter copies native buffers: big-endian hosts are not supported");

/// Rows per transposition block when stacking columns.
pub(crate) const BLOCK_ROWS: usize = 64;

/// Where a conversion happens, for error messages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Site<'a> {
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
pub(crate) fn convert_into(
    batch: &RecordBatch,
    resolved: &Resolved,
    layout: &ChunkLayout,
    out: &mut [u8],
    site: Site<'_>,
) -> Result<(), ConvertError> {
    let rows = batch.num_rows();
    let standins = stand_ins(batch, resolved);
    for (i, t) in resolved.tensors.iter().enumerate() {
        let column = |name: &str| column_of(batch, &standins, name, site);
        let elem = t.dtype.size_bytes();
        match t.kind {
            Kind::Scalar => {
                let bytes = column_bytes(column(&t.columns[0])?, t, &t.columns[0], site)?;
                copy_exact(&mut out[layout.tensor_range(i)], &bytes, &t.columns[0], site)?;
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
                // Checked here, not by `column_bytes` on the child, so that the
                // error counts and names rows, not child values.
                if t.fill.is_none() && (list.null_count() > 0 || child.null_count() > 0) {
                    return Err(list_null_error(list, k, name, site));
                }
                let bytes = column_bytes(child, t, name, site)?;
                let dst = &mut out[layout.tensor_range(i)];
                copy_exact(dst, &bytes, name, site)?;
                if list.null_count() > 0 {
                    let Some(fill) = t.fill else {
                        return Err(null_error(list, name, site));
                    };
                    let one = crate::computed::fill_bytes(t.dtype, fill);
                    for r in (0..rows).filter(|&r| list.is_null(r)) {
                        for v in dst[r * k * elem..(r + 1) * k * elem].chunks_exact_mut(elem) {
                            v.copy_from_slice(&one);
                        }
                    }
                }
            }
            Kind::Jagged | Kind::Padded(_) | Kind::Lengths => {
                let name = &t.columns[0];
                let col = column(name)?;
                let rows_kept = kept_rows(col, t, name, site)?;
                if rows_kept.rows() != rows {
                    return Err(site.err(name, "row offsets disagree with the row count".into()));
                }
                let dst = &mut out[layout.tensor_range(i)];
                match t.kind {
                    Kind::Lengths => {
                        if dst.len() != rows * 4 {
                            return Err(site.err(name, "lengths disagree with the row count".into()));
                        }
                        for (d, r) in dst.chunks_exact_mut(4).zip(0..rows) {
                            let (a, b) = rows_kept.range(r);
                            // At most pad_to (<= MAX_PAD_TO) values.
                            d.copy_from_slice(&((b - a) as i32).to_le_bytes());
                        }
                    }
                    Kind::Padded(n) => {
                        let bytes = list_bytes(col, t, name, site, &rows_kept)?;
                        if dst.len() != rows * n * elem {
                            return Err(site.err(name, "padded rows disagree with the row count".into()));
                        }
                        let one = crate::computed::fill_bytes(t.dtype, t.fill.unwrap_or(0.0));
                        for v in dst.chunks_exact_mut(elem) {
                            v.copy_from_slice(&one);
                        }
                        for r in 0..rows {
                            let (a, b) = rows_kept.range(r);
                            let (a, b) = (a as usize * elem, b as usize * elem);
                            dst[r * n * elem..][..b - a].copy_from_slice(&bytes[a..b]);
                        }
                    }
                    _ => {
                        let bytes = list_bytes(col, t, name, site, &rows_kept)?;
                        let Some(offsets_at) = layout.offsets_range(i) else {
                            return Err(
                                site.err(name, "the chunk's layout has no row offsets for a jagged tensor".into())
                            );
                        };
                        if offsets_at.len() != (rows + 1) * 8 {
                            return Err(site.err(name, "row offsets disagree with the row count".into()));
                        }
                        let dst = &mut out[layout.tensor_range(i)];
                        match &rows_kept.kept {
                            // Every row whole: one bulk copy.
                            None => copy_exact(dst, &bytes, name, site)?,
                            // Null rows dropped or long rows cut: row by row.
                            Some(kept) => {
                                if dst.len() != rows_kept.values() as usize * elem {
                                    return Err(site.err(name, "kept values disagree with the layout".into()));
                                }
                                let mut at = 0;
                                for &(a, b) in kept {
                                    let (sa, sb) = (a as usize * elem, b as usize * elem);
                                    dst[at..at + sb - sa].copy_from_slice(&bytes[sa..sb]);
                                    at += sb - sa;
                                }
                            }
                        }
                        // Row offsets, rebased to 0.
                        let mut at = 0u64;
                        for (r, d) in out[offsets_at].chunks_exact_mut(8).enumerate() {
                            d.copy_from_slice(&at.to_le_bytes());
                            if r < rows {
                                let (a, b) = rows_kept.range(r);
                                at += b - a;
                            }
                        }
                    }
                }
            }
            Kind::Crossed => {
                let cols: Vec<&ArrayRef> = t.columns.iter().map(|c| column(c)).collect::<Result<_, _>>()?;
                let dst = &mut out[layout.tensor_range(i)];
                if dst.len() != rows * elem {
                    return Err(site.err(&t.name, "crossed ids disagree with the row count".into()));
                }
                crate::computed::crossed(&cols, t, dst).map_err(|(c, p)| site.err(&t.columns[c], p))?;
            }
            Kind::Stacked => {
                let cols: Vec<Cow<'_, [u8]>> = t
                    .columns
                    .iter()
                    .map(|c| column(c).and_then(|a| column_bytes(a, t, c, site)))
                    .collect::<Result<_, _>>()?;
                let srcs: Vec<&[u8]> = cols.iter().map(|c| c.as_ref()).collect();
                let dst = &mut out[layout.tensor_range(i)];
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

/// The columns the view names that are not columns of `batch`: a field
/// inside one (a struct's, a list of structs', a map's keys or values:
/// [`granary_source::path`]), a Hive partition of the file's folders
/// ([`Resolved::partitions`]), or, for each column the file lacks
/// ([`Resolved::absent`]), a null column of the batch's rows, for which
/// the tensor's fill, or of a list its empty rows, stand in.
fn stand_ins<'a>(batch: &RecordBatch, resolved: &'a Resolved) -> Vec<(&'a str, ArrayRef)> {
    let rows = batch.num_rows();
    let mut out: Vec<(&str, ArrayRef)> =
        resolved.absent.iter().map(|(name, dt)| (name.as_str(), arrow::array::new_null_array(dt, rows))).collect();
    // A Hive partition's value, in every row of the file.
    for (name, value) in &resolved.partitions {
        let column: ArrayRef = match value.parse::<i64>() {
            Ok(v) => std::sync::Arc::new(arrow::array::Int64Array::from(vec![v; rows])),
            Err(_) => std::sync::Arc::new(arrow::array::StringArray::from(vec![value.as_str(); rows])),
        };
        out.push((name.as_str(), column));
    }
    for c in resolved.tensors.iter().flat_map(|t| &t.columns) {
        if batch.column_by_name(c).is_none()
            && !out.iter().any(|(n, _)| n == c)
            && let Some(a) = granary_source::path::array(batch, c)
        {
            out.push((c.as_str(), a));
        }
    }
    out
}

/// The column `name` of `batch`, or its stand-in.
fn column_of<'a>(
    batch: &'a RecordBatch,
    standins: &'a [(&str, ArrayRef)],
    name: &str,
    site: Site<'_>,
) -> Result<&'a ArrayRef, ConvertError> {
    batch
        .column_by_name(name)
        .or_else(|| standins.iter().find(|(n, _)| *n == name).map(|(_, a)| a))
        .ok_or_else(|| site.err(name, "column missing from the decoded row group".into()))
}

/// Bytes a jagged tensor's values may take in one chunk: a chunk over it
/// is not kept (the tiers' limit).
pub(crate) const MAX_JAGGED_BYTES: u64 = 4 << 30;

/// The value count of each jagged tensor of `batch` (0 for a dense one),
/// which its chunk's layout needs before [`convert_into`] fills it: what
/// the view keeps of each row (null rows empty, long rows truncated).
pub(crate) fn jagged_values(
    batch: &RecordBatch,
    resolved: &Resolved,
    site: Site<'_>,
) -> Result<Vec<u64>, ConvertError> {
    let standins = stand_ins(batch, resolved);
    resolved
        .tensors
        .iter()
        .map(|t| {
            if t.kind != Kind::Jagged {
                return Ok(0);
            }
            let name = &t.columns[0];
            let col = column_of(batch, &standins, name, site)?;
            let kept = kept_rows(col, t, name, site)?;
            if let Some((bytes, row, len)) = over_limit(&kept, t.dtype.size_bytes() as u64, MAX_JAGGED_BYTES) {
                return Err(site.err(
                    name,
                    format!(
                        "the row group's values take {bytes} bytes, over the {MAX_JAGGED_BYTES} a chunk may hold \
                         (its longest row, row {row}, holds {len} values): write smaller row groups"
                    ),
                ));
            }
            Ok(kept.values())
        })
        .collect()
}

/// When `kept`'s values (`vb` bytes each) take more than `limit` bytes:
/// their bytes, and the longest row and its length.
fn over_limit(kept: &KeptRows, vb: u64, limit: u64) -> Option<(u64, usize, u64)> {
    let bytes = kept.values().saturating_mul(vb);
    if bytes <= limit {
        return None;
    }
    let (row, len) = (0..kept.rows()).map(|r| (r, kept.range(r).1 - kept.range(r).0)).max_by_key(|&(_, l)| l)?;
    Some((bytes, row, len))
}

/// A list or byte column's row offsets as `u64`s (not rebased) and its
/// null rows; `None` for another type.
fn raw_offsets(col: &ArrayRef) -> Option<(Vec<u64>, Option<&arrow::buffer::NullBuffer>)> {
    let widen = |o: &[i64]| o.iter().map(|&x| x.max(0) as u64).collect::<Vec<u64>>();
    let widen32 = |o: &[i32]| o.iter().map(|&x| x.max(0) as u64).collect::<Vec<u64>>();
    Some(match col.data_type() {
        DataType::List(_) => (widen32(col.as_list::<i32>().offsets()), col.nulls()),
        DataType::LargeList(_) => (widen(col.as_list::<i64>().offsets()), col.nulls()),
        DataType::Binary => (widen32(col.as_binary::<i32>().offsets()), col.nulls()),
        DataType::LargeBinary => (widen(col.as_binary::<i64>().offsets()), col.nulls()),
        DataType::Utf8 => (widen32(col.as_string::<i32>().offsets()), col.nulls()),
        DataType::LargeUtf8 => (widen(col.as_string::<i64>().offsets()), col.nulls()),
        _ => return None,
    })
}

/// What a view keeps of each row of a list or byte column.
struct KeptRows {
    /// The column's row offsets (rows + 1, not rebased, never decreasing).
    raw: Vec<u64>,
    /// Each row's kept values, relative to the first row's first value;
    /// `None` when every row is kept whole (its raw range).
    kept: Option<Vec<(u64, u64)>>,
}

impl KeptRows {
    fn rows(&self) -> usize {
        self.raw.len().saturating_sub(1)
    }

    /// Row `r`'s kept values, relative to the first row's first value.
    fn range(&self, r: usize) -> (u64, u64) {
        match &self.kept {
            Some(k) => k[r],
            None => (self.raw[r] - self.raw[0], self.raw[r + 1] - self.raw[0]),
        }
    }

    /// The values of the first row's first to the last row's end (the
    /// span the values' bytes cover).
    fn span(&self) -> (u64, u64) {
        (self.raw.first().copied().unwrap_or(0), self.raw.last().copied().unwrap_or(0))
    }

    /// Values kept in all.
    fn values(&self) -> u64 {
        match &self.kept {
            Some(k) => k.iter().map(|&(a, b)| b - a).sum(),
            None => self.span().1 - self.span().0,
        }
    }
}

/// Which values of each row of list or byte column `col` tensor `t`
/// keeps: a null row is an error naming it unless the view declares
/// `null = "empty"`; a row longer than `max_len` (or `pad_to`) is an
/// error naming it unless the view declares `truncate`.
fn kept_rows(col: &ArrayRef, t: &ResolvedTensor, name: &str, site: Site<'_>) -> Result<KeptRows, ConvertError> {
    let (raw, nulls) = raw_offsets(col).ok_or_else(|| site.err(name, "is not a list or byte column".into()))?;
    if raw.windows(2).any(|w| w[1] < w[0]) {
        return Err(site.err(name, "its row offsets decrease".into()));
    }
    let rows = raw.len().saturating_sub(1);
    let is_null = |r: usize| nulls.is_some_and(|n| n.is_null(r));
    let len = |r: usize| raw[r + 1] - raw[r];
    if !t.null_empty
        && let Some(r) = (0..rows).find(|&r| is_null(r))
    {
        let count = (0..rows).filter(|&r| is_null(r)).count();
        return Err(site.err(
            name,
            format!("{count} null rows (first at row {r}); declare null = \"empty\" to read a null row as empty"),
        ));
    }
    let limit_name = if matches!(t.kind, Kind::Jagged) { "max_len" } else { "pad_to" };
    if let (Some(max), None) = (t.max_len, t.truncate)
        && let Some(r) = (0..rows).find(|&r| !is_null(r) && len(r) > u64::from(max))
    {
        return Err(site.err(
            name,
            format!(
                "row {r} holds {} values, over {limit_name} = {max}; declare truncate = \"keep_first\" or \
                 \"keep_last\" to keep part of it",
                len(r)
            ),
        ));
    }
    let long = |r: usize| t.max_len.is_some_and(|m| len(r) > u64::from(m));
    if !(0..rows).any(|r| (is_null(r) && len(r) > 0) || long(r)) {
        return Ok(KeptRows { raw, kept: None });
    }
    let first = raw.first().copied().unwrap_or(0);
    let kept = (0..rows)
        .map(|r| {
            let (a, b) = (raw[r] - first, raw[r + 1] - first);
            match (is_null(r), t.max_len) {
                (true, _) => (a, a),
                (false, Some(m)) if b - a > u64::from(m) => match t.truncate {
                    Some(granary_proto::Truncate::KeepLast) => (b - u64::from(m), b),
                    _ => (a, a + u64::from(m)),
                },
                _ => (a, b),
            }
        })
        .collect();
    Ok(KeptRows { raw, kept: Some(kept) })
}

/// The values of list or byte column `col` over `kept`'s span, as bytes
/// of the tensor's dtype (cast, and null values inside a list filled, as
/// any column; a null value without a fill is an error naming its row).
fn list_bytes<'a>(
    col: &'a ArrayRef,
    t: &ResolvedTensor,
    name: &str,
    site: Site<'_>,
    kept: &KeptRows,
) -> Result<Cow<'a, [u8]>, ConvertError> {
    let (first, last) = kept.span();
    let (start, len) = (first as usize, (last - first) as usize);
    Ok(match col.data_type() {
        DataType::List(_) | DataType::LargeList(_) => {
            let child = match col.data_type() {
                DataType::List(_) => col.as_list::<i32>().values(),
                _ => col.as_list::<i64>().values(),
            };
            if start + len > child.len() {
                return Err(site.err(name, format!("list offsets run past its {} values", child.len())));
            }
            if child.null_count() > 0 && t.fill.is_none() {
                let v = (start..start + len).find(|&v| child.is_null(v)).unwrap_or(start) as u64;
                let row = kept.raw.partition_point(|&o| o <= v).saturating_sub(1);
                return Err(site.err(
                    name,
                    format!("a null value inside its list at row {row}, and the view declares no fill value"),
                ));
            }
            if start == 0 && len == child.len() {
                // As the Parquet reader decodes: the rows span the whole
                // child, whose bytes are borrowed when no cast is needed.
                column_bytes(child, t, name, site)?
            } else {
                let sliced = child.slice(start, len);
                Cow::Owned(column_bytes(&sliced, t, name, site)?.into_owned())
            }
        }
        _ => {
            let buf: &'a [u8] = match col.data_type() {
                DataType::Binary => col.as_binary::<i32>().values(),
                DataType::LargeBinary => col.as_binary::<i64>().values(),
                DataType::Utf8 => col.as_string::<i32>().values(),
                _ => col.as_string::<i64>().values(),
            };
            let Some(b) = buf.get(start..start + len) else {
                return Err(site.err(name, format!("byte offsets run past its {} bytes", buf.len())));
            };
            Cow::Borrowed(b)
        }
    })
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

/// [`null_error`] for a `FixedSizeList` of `k` values per row: a row is null
/// when the list or any of its values is.
fn list_null_error(list: &FixedSizeListArray, k: usize, column: &str, site: Site<'_>) -> ConvertError {
    let child = list.values();
    let null_row = |&r: &usize| list.is_null(r) || (r * k..(r + 1) * k).any(|i| child.is_null(i));
    let count = (0..list.len()).filter(null_row).count();
    let first = (0..list.len()).find(null_row).unwrap_or(0);
    site.err(
        column,
        format!("{count} rows with null values (first at row {first}) and the view declares no fill value"),
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
    if let Some(buckets) = t.hash {
        return crate::computed::hashed(arr, t, buckets).map(Cow::Owned).map_err(|p| site.err(column, p));
    }
    if !t.transform.is_empty() {
        return crate::computed::transformed(arr, t).map(Cow::Owned).map_err(|p| site.err(column, p));
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
    let fill = t.fill.map(|f| crate::computed::fill_bytes(t.dtype, f));
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

#[cfg(test)]
mod tests {
    //! The oracle is Arrow itself: every tensor element is compared, bit for
    //! bit, with the value Arrow's typed accessors return for that row, after
    //! the chunk has been sealed and parsed back with full verification.

    use super::*;
    use crate::error::SchemaError;
    use arrow::array::{
        BooleanArray, Float16Array, Float32Array, Float64Array, Int8Array, Int16Array, Int32Array, Int64Array,
        ListArray, StringArray, UInt8Array,
    };
    use arrow::buffer::{NullBuffer, OffsetBuffer};
    use arrow::compute::cast;
    use arrow::datatypes::{Field, Schema};
    use granary_proto::chunk::Verify;
    use granary_proto::view::fill_fits;
    use granary_proto::{ChunkView, DatasetVersion, ShardId, TensorSpec, View};
    use granary_source::schema::resolve_view;
    use proptest::prelude::*;
    use std::sync::Arc;

    const FILE: &str = "s3://bucket/data/part-0.parquet";
    const ROW_GROUP: usize = 3;
    const SITE: Site<'static> = Site { file: FILE, row_group: ROW_GROUP };
    /// Fill candidates, each exactly representable in f32 so that every
    /// rounding path (f64 -> f16/bf16 directly or via f32) agrees.
    const FILLS: [f64; 13] =
        [0.0, -0.0, 1.0, -1.0, 7.0, -1.5, 127.0, -128.0, 255.0, 65504.0, 1e6, f64::INFINITY, f64::NEG_INFINITY];

    /// One element per row as little-endian bytes, `None` for a null.
    type Elems = Vec<Option<Vec<u8>>>;

    /// The Arrow type a column of `dtype` is written in (bf16 has none: f32).
    fn source_type(dtype: DType) -> DataType {
        arrow_type(dtype).unwrap_or(DataType::Float32)
    }

    /// Raw bits for one value: uniform, plus zeros, all-ones (NaN / -1) and
    /// the infinities, NaNs and negative zeros of every float width.
    fn bits() -> impl Strategy<Value = u64> {
        prop_oneof![
            6 => any::<u64>(),
            1 => 0u64..4,
            1 => prop::sample::select(vec![
                u64::MAX,
                0x8000,
                0x7c00,
                0xfc00,
                0x7e01,
                0x7f80_0000,
                0xff80_0000,
                0x7fc0_0001,
                0x8000_0000,
                0x7ff0_0000_0000_0000,
                0x7ff8_0000_0000_0001,
                0x8000_0000_0000_0000,
            ]),
        ]
    }

    fn cells(rows: impl Into<prop::collection::SizeRange>) -> impl Strategy<Value = Vec<Option<u64>>> {
        prop::collection::vec(bits().prop_map(Some), rows)
    }

    fn nullable_cells(rows: impl Into<prop::collection::SizeRange>) -> impl Strategy<Value = Vec<Option<u64>>> {
        prop::collection::vec(prop::option::weighted(0.85, bits()), rows)
    }

    fn dtypes() -> impl Strategy<Value = DType> {
        prop::sample::select(DType::ALL.to_vec())
    }

    /// Row counts: anything below 300, and exact multiples of [`BLOCK_ROWS`].
    fn row_counts() -> impl Strategy<Value = usize> {
        prop_oneof![3 => 0usize..300, 1 => (0usize..5).prop_map(|b| b * BLOCK_ROWS)]
    }

    /// An Arrow array of `dtype`'s source type holding `raw`'s bits.
    fn array(dtype: DType, raw: &[Option<u64>]) -> ArrayRef {
        let it = raw.iter();
        match dtype {
            DType::F32 | DType::BF16 => {
                Arc::new(it.map(|r| r.map(|b| f32::from_bits(b as u32))).collect::<Float32Array>())
            }
            DType::F64 => Arc::new(it.map(|r| r.map(f64::from_bits)).collect::<Float64Array>()),
            DType::F16 => Arc::new(it.map(|r| r.map(|b| half::f16::from_bits(b as u16))).collect::<Float16Array>()),
            DType::I64 => Arc::new(it.map(|r| r.map(|b| b as i64)).collect::<Int64Array>()),
            DType::I32 => Arc::new(it.map(|r| r.map(|b| b as i32)).collect::<Int32Array>()),
            DType::I16 => Arc::new(it.map(|r| r.map(|b| b as i16)).collect::<Int16Array>()),
            DType::I8 => Arc::new(it.map(|r| r.map(|b| b as i8)).collect::<Int8Array>()),
            DType::U8 => Arc::new(it.map(|r| r.map(|b| b as u8)).collect::<UInt8Array>()),
            DType::Bool => Arc::new(it.map(|r| r.map(|b| b & 1 == 1)).collect::<BooleanArray>()),
        }
    }

    /// Arrow's value of every element of `arr` as the tensor should hold it.
    fn arrow_elems(arr: &dyn Array, dtype: DType) -> Elems {
        fn each<T: ArrowPrimitiveType>(arr: &dyn Array, le: impl Fn(T::Native) -> Vec<u8>) -> Elems {
            let p = arr.as_primitive::<T>();
            (0..p.len()).map(|i| p.is_valid(i).then(|| le(p.value(i)))).collect()
        }
        match dtype {
            DType::F32 => each::<Float32Type>(arr, |v| v.to_le_bytes().to_vec()),
            DType::F64 => each::<Float64Type>(arr, |v| v.to_le_bytes().to_vec()),
            DType::F16 => each::<Float16Type>(arr, |v| v.to_le_bytes().to_vec()),
            DType::BF16 => each::<Float32Type>(arr, |v| half::bf16::from_f32(v).to_le_bytes().to_vec()),
            DType::I64 => each::<Int64Type>(arr, |v| v.to_le_bytes().to_vec()),
            DType::I32 => each::<Int32Type>(arr, |v| v.to_le_bytes().to_vec()),
            DType::I16 => each::<Int16Type>(arr, |v| v.to_le_bytes().to_vec()),
            DType::I8 => each::<Int8Type>(arr, |v| v.to_le_bytes().to_vec()),
            DType::U8 => each::<UInt8Type>(arr, |v| v.to_le_bytes().to_vec()),
            DType::Bool => {
                let b = arr.as_boolean();
                (0..b.len()).map(|i| b.is_valid(i).then(|| vec![u8::from(b.value(i))])).collect()
            }
        }
    }

    /// `fill` as one element of `dtype`, by way of Arrow's own cast.
    fn fill_elem(dtype: DType, fill: f64) -> Vec<u8> {
        let f: ArrayRef = Arc::new(Float64Array::from(vec![fill]));
        let c = cast(&f, &source_type(dtype)).expect("fill casts");
        arrow_elems(c.as_ref(), dtype).remove(0).expect("fill fits the dtype")
    }

    fn pick_fill(dtype: DType, pick: prop::sample::Index) -> f64 {
        let fits: Vec<f64> = FILLS.into_iter().filter(|&f| fill_fits(f, dtype)).collect();
        fits[pick.index(fits.len())]
    }

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        let fields: Vec<Field> = columns.iter().map(|(n, a)| Field::new(*n, a.data_type().clone(), true)).collect();
        let arrays = columns.into_iter().map(|(_, a)| a).collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).expect("valid batch")
    }

    fn spec(name: &str, dtype: DType, columns: &[&str]) -> TensorSpec {
        TensorSpec { cast: dtype == DType::BF16, ..TensorSpec::new(name, dtype, columns) }
    }

    fn view(tensors: Vec<TensorSpec>) -> View {
        View { tensors }.validated().expect("valid view")
    }

    fn resolve(view: &View, batch: &RecordBatch) -> Result<Resolved, SchemaError> {
        resolve_view(view, &batch.schema(), FILE)
    }

    /// Converts `batch` into a sealed chunk. The buffer starts poisoned, not
    /// zeroed, so a byte the converter forgets to write shows up.
    fn chunk(batch: &RecordBatch, view: &View) -> Result<Vec<u8>, ConvertError> {
        let resolved = resolve(view, batch).expect("view resolves");
        let shard = ShardId { file: 1, row_group: ROW_GROUP as u32 };
        let values = jagged_values(batch, &resolved, SITE)?;
        let layout = ChunkLayout::with_values(
            DatasetVersion([7; 16]),
            shard,
            batch.num_rows() as u64,
            &resolved.layouts,
            &values,
        )
        .expect("layout");
        let mut buf = vec![0xA5u8; layout.total_len()];
        convert_into(batch, &resolved, &layout, &mut buf, SITE)?;
        layout.seal(&mut buf).expect("seal");
        Ok(buf)
    }

    /// Checks tensor `name` of the chunk: its header, then element `i`
    /// against `want[i]` (`None`: the fill).
    fn check(
        buf: &[u8],
        name: &str,
        dtype: DType,
        shape: &[u32],
        want: &[Option<Vec<u8>>],
        fill: Option<&[u8]>,
    ) -> Result<(), TestCaseError> {
        let parsed = ChunkView::parse(buf, Verify::Full).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let (meta, bytes) = parsed.tensor(name).ok_or_else(|| TestCaseError::fail(format!("no tensor {name}")))?;
        prop_assert_eq!(meta.dtype, dtype);
        prop_assert_eq!(&meta.shape[..], shape);
        let e = dtype.size_bytes();
        prop_assert_eq!(bytes.len(), want.len() * e);
        for (i, (got, w)) in bytes.chunks_exact(e).zip(want).enumerate() {
            let w = match w {
                Some(w) => &w[..],
                None => fill.ok_or_else(|| TestCaseError::fail(format!("element {i} is null with no fill")))?,
            };
            prop_assert_eq!(got, w, "{} element {} of {}", name, i, want.len());
        }
        Ok(())
    }

    /// Element `r * k + j` of a row-major `[rows, k]` from `k` columns.
    fn row_major(cols: &[Elems]) -> Elems {
        let rows = cols.first().map_or(0, Vec::len);
        (0..rows).flat_map(|r| cols.iter().map(move |c| c[r].clone())).collect()
    }

    fn stacked_input() -> impl Strategy<Value = (DType, Vec<Vec<Option<u64>>>)> {
        (dtypes(), 1usize..8, row_counts())
            .prop_flat_map(|(d, k, rows)| (Just(d), prop::collection::vec(cells(rows), k)))
    }

    fn list_array(dtype: DType, k: usize, child: &[Option<u64>], valid: Option<Vec<bool>>) -> ArrayRef {
        let field = Arc::new(Field::new_list_field(source_type(dtype), true));
        let list = FixedSizeListArray::try_new(field, k as i32, array(dtype, child), valid.map(NullBuffer::from))
            .expect("valid list");
        Arc::new(list)
    }

    fn first_null_row(valid: impl Fn(usize) -> bool, rows: usize) -> Option<usize> {
        (0..rows).find(|&r| !valid(r))
    }

    proptest! {
        // A case converts up to a few thousand values; 128 cases a property
        // keep this block to seconds in a debug build on two cores.
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn scalar_column_equals_arrow(dtype in dtypes(), raw in cells(0..300), skip in 0usize..3) {
            // A sliced array checks that buffer offsets (and bit offsets of
            // booleans) are honoured.
            let full = array(dtype, &raw);
            let skip = skip.min(full.len());
            let col = full.slice(skip, full.len() - skip);
            let b = batch(vec![("c", col.clone())]);
            let buf = chunk(&b, &view(vec![spec("t", dtype, &["c"])])).map_err(|e| TestCaseError::fail(e.to_string()))?;
            check(&buf, "t", dtype, &[], &arrow_elems(col.as_ref(), dtype), None)?;
        }

        #[test]
        fn every_dtype_in_one_chunk(raw in prop::collection::vec(cells(37), DType::ALL.len())) {
            let names: Vec<String> = (0..DType::ALL.len()).map(|i| format!("c{i}")).collect();
            let cols: Vec<ArrayRef> = DType::ALL.iter().zip(&raw).map(|(&d, r)| array(d, r)).collect();
            let b = batch(names.iter().map(String::as_str).zip(cols.iter().cloned()).collect());
            let specs = DType::ALL.iter().zip(&names).map(|(&d, n)| spec(&format!("t{n}"), d, &[n])).collect();
            let buf = chunk(&b, &view(specs)).map_err(|e| TestCaseError::fail(e.to_string()))?;
            for ((&d, n), c) in DType::ALL.iter().zip(&names).zip(&cols) {
                check(&buf, &format!("t{n}"), d, &[], &arrow_elems(c.as_ref(), d), None)?;
            }
        }

        #[test]
        fn stacked_columns_are_row_major((dtype, raw) in stacked_input()) {
            let k = raw.len();
            let names: Vec<String> = (0..k).map(|j| format!("f{j}")).collect();
            let cols: Vec<ArrayRef> = raw.iter().map(|r| array(dtype, r)).collect();
            let b = batch(names.iter().map(String::as_str).zip(cols.iter().cloned()).collect());
            let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let buf = chunk(&b, &view(vec![spec("t", dtype, &name_refs)]))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let want = row_major(&cols.iter().map(|c| arrow_elems(c.as_ref(), dtype)).collect::<Vec<_>>());
            // One column is a scalar tensor; its bytes are the same.
            let shape: &[u32] = if k == 1 { &[] } else { &[k as u32] };
            check(&buf, "t", dtype, shape, &want, None)?;
        }

        #[test]
        fn fixed_size_list_is_its_child_row_major(
            (dtype, k, raw) in (dtypes(), 1usize..8, row_counts())
                .prop_flat_map(|(d, k, rows)| (Just(d), Just(k), cells(rows * k)))
        ) {
            let col = list_array(dtype, k, &raw, None);
            let b = batch(vec![("v", col.clone())]);
            let buf = chunk(&b, &view(vec![spec("t", dtype, &["v"])])).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let child = col.as_fixed_size_list().values().clone();
            check(&buf, "t", dtype, &[k as u32], &arrow_elems(child.as_ref(), dtype), None)?;
        }

        #[test]
        fn int32_cast_to_f64_is_exact(
            values in prop::collection::vec(prop::option::weighted(0.9, any::<i32>()), 0..300),
        ) {
            let b = batch(vec![("c", Arc::new(values.iter().copied().collect::<Int32Array>()) as ArrayRef)]);
            let mut s = spec("t", DType::F64, &["c"]);
            s.cast = true;
            s.fill = Some(-1.5);
            let buf = chunk(&b, &view(vec![s])).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let want: Elems = values.iter().map(|v| v.map(|v| (v as f64).to_le_bytes().to_vec())).collect();
            check(&buf, "t", DType::F64, &[], &want, Some(&(-1.5f64).to_le_bytes()))?;
        }

        #[test]
        fn overflowing_cast_is_an_error_never_a_wrapped_value(
            values in prop::collection::vec(-128i64..=127, 1..300),
            at in any::<prop::sample::Index>(),
            bad in prop_oneof![128i64..=i64::MAX, i64::MIN..=-129, Just(1000i64)],
        ) {
            let mut s = spec("t", DType::I8, &["c"]);
            s.cast = true;
            let v = view(vec![s]);
            // In range, every value survives the cast exactly.
            let b = batch(vec![("c", Arc::new(Int64Array::from(values.clone())) as ArrayRef)]);
            let buf = chunk(&b, &v).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let want: Elems = values.iter().map(|&x| Some(vec![x as i8 as u8])).collect();
            check(&buf, "t", DType::I8, &[], &want, None)?;
            // One value out of range fails the whole row group.
            let mut values = values;
            let i = at.index(values.len());
            values[i] = bad;
            let b = batch(vec![("c", Arc::new(Int64Array::from(values)) as ArrayRef)]);
            let err = chunk(&b, &v).expect_err("an overflowing cast must fail");
            prop_assert_eq!(&err.file, FILE);
            prop_assert_eq!(err.row_group, ROW_GROUP);
            prop_assert_eq!(&err.column, "c");
            let msg = err.to_string();
            prop_assert!(msg.contains(FILE) && msg.contains("row group 3") && msg.contains("\"c\""), "{}", msg);
        }

        #[test]
        fn scalar_nulls_need_a_fill(
            dtype in dtypes(),
            raw in nullable_cells(0..300),
            pick in any::<prop::sample::Index>(),
        ) {
            let col = array(dtype, &raw);
            let b = batch(vec![("c", col.clone())]);
            let want = arrow_elems(col.as_ref(), dtype);
            let s = spec("t", dtype, &["c"]);
            match (chunk(&b, &view(vec![s.clone()])), first_null_row(|r| raw[r].is_some(), raw.len())) {
                (Ok(buf), None) => check(&buf, "t", dtype, &[], &want, None)?,
                (Err(e), Some(first)) => {
                    prop_assert_eq!(&e.column, "c");
                    prop_assert!(e.problem.contains("null"), "{}", e);
                    prop_assert!(e.problem.contains(&format!("first at row {first}")), "{}", e);
                }
                (got, first) => prop_assert!(false, "first null {:?}, conversion {:?}", first, got.map(|_| ())),
            }
            let fill = pick_fill(dtype, pick);
            let buf = chunk(&b, &view(vec![TensorSpec { fill: Some(fill), ..s }]))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            check(&buf, "t", dtype, &[], &want, Some(&fill_elem(dtype, fill)))?;
        }

        #[test]
        fn stacked_nulls_need_a_fill(
            (dtype, raw) in (dtypes(), 2usize..6, row_counts())
                .prop_flat_map(|(d, k, rows)| (Just(d), prop::collection::vec(nullable_cells(rows), k))),
            pick in any::<prop::sample::Index>(),
        ) {
            let k = raw.len();
            let names: Vec<String> = (0..k).map(|j| format!("f{j}")).collect();
            let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let cols: Vec<ArrayRef> = raw.iter().map(|r| array(dtype, r)).collect();
            let b = batch(name_refs.iter().copied().zip(cols.iter().cloned()).collect());
            let s = spec("t", dtype, &name_refs);
            // Columns are converted in view order: the first with a null is named.
            let first_bad = raw.iter().position(|r| r.iter().any(Option::is_none));
            match (chunk(&b, &view(vec![s.clone()])), first_bad) {
                (Ok(_), None) => {}
                (Err(e), Some(j)) => {
                    prop_assert_eq!(&e.column, &names[j]);
                    prop_assert!(e.problem.contains("null"), "{}", e);
                }
                (got, bad) => prop_assert!(false, "first null column {:?}, conversion {:?}", bad, got.map(|_| ())),
            }
            let fill = pick_fill(dtype, pick);
            let buf = chunk(&b, &view(vec![TensorSpec { fill: Some(fill), ..s }]))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let want = row_major(&cols.iter().map(|c| arrow_elems(c.as_ref(), dtype)).collect::<Vec<_>>());
            check(&buf, "t", dtype, &[k as u32], &want, Some(&fill_elem(dtype, fill)))?;
        }

        #[test]
        fn list_nulls_need_a_fill(
            (dtype, k, valid, raw) in (dtypes(), 1usize..6, row_counts()).prop_flat_map(|(d, k, rows)| {
                (Just(d), Just(k), prop::collection::vec(prop::bool::weighted(0.9), rows), nullable_cells(rows * k))
            }),
            null_children_under_null_rows in any::<bool>(),
            pick in any::<prop::sample::Index>(),
        ) {
            // Parquet's reader puts null children under a null list; other
            // writers leave arbitrary values there. Both must work.
            let mut raw = raw;
            if null_children_under_null_rows {
                for (r, _) in valid.iter().enumerate().filter(|(_, v)| !**v) {
                    raw[r * k..(r + 1) * k].fill(None);
                }
            }
            let col = list_array(dtype, k, &raw, Some(valid.clone()));
            let b = batch(vec![("v", col)]);
            let row_ok = |r: usize| valid[r] && raw[r * k..(r + 1) * k].iter().all(Option::is_some);
            let want: Elems = raw
                .chunks_exact(k)
                .zip(&valid)
                .flat_map(|(row, &ok)| {
                    let child: ArrayRef = array(dtype, row);
                    arrow_elems(child.as_ref(), dtype).into_iter().map(move |e| e.filter(|_| ok))
                })
                .collect();
            let s = spec("t", dtype, &["v"]);
            match (chunk(&b, &view(vec![s.clone()])), first_null_row(row_ok, valid.len())) {
                (Ok(buf), None) => check(&buf, "t", dtype, &[k as u32], &want, None)?,
                (Err(e), Some(first)) => {
                    prop_assert_eq!(&e.column, "v");
                    prop_assert!(e.problem.contains("null"), "{}", e);
                    prop_assert!(e.problem.contains(&format!("first at row {first}")), "{}", e);
                }
                (got, first) => prop_assert!(false, "first null row {:?}, conversion {:?}", first, got.map(|_| ())),
            }
            let fill = pick_fill(dtype, pick);
            let buf = chunk(&b, &view(vec![TensorSpec { fill: Some(fill), ..s }]))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            check(&buf, "t", dtype, &[k as u32], &want, Some(&fill_elem(dtype, fill)))?;
        }
    }

    /// Regression: a null inside a list used to be reported by child index
    /// ("2 null values (first at row 4)" for row 1 of a 3-wide list).
    #[test]
    fn list_nulls_are_reported_in_rows() {
        let cases = [
            // Row 1 holds a null value; no list is null.
            (vec![Some(1), Some(2), Some(3), Some(4), None, Some(6)], None, "1 rows with null values (first at row 1)"),
            // Row 1 is a null list over null values, as Parquet's reader makes it.
            (
                vec![Some(1), Some(2), Some(3), None, None, None],
                Some(vec![true, false]),
                "1 rows with null values (first at row 1)",
            ),
            // Row 0 is a null list over values; row 1 holds a null value.
            (
                vec![Some(1), Some(2), Some(3), Some(4), None, Some(6)],
                Some(vec![false, true]),
                "2 rows with null values (first at row 0)",
            ),
        ];
        for (child, valid, want) in cases {
            let b = batch(vec![("v", list_array(DType::I64, 3, &child, valid))]);
            let err = chunk(&b, &view(vec![spec("t", DType::I64, &["v"])])).expect_err("nulls without a fill");
            assert_eq!(err.column, "v");
            assert!(err.problem.starts_with(want), "{err}");
        }
    }

    fn schema_error(b: &RecordBatch, s: TensorSpec) -> SchemaError {
        resolve(&view(vec![s]), b).expect_err("the view must not resolve")
    }

    fn assert_names(e: &SchemaError, column: &str, words: &str) {
        assert_eq!((e.file.as_str(), e.tensor.as_str(), e.column.as_str()), (FILE, "t", column), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(&format!("{column:?}")) && msg.contains(words), "{msg}");
    }

    fn ints(n: usize) -> ArrayRef {
        Arc::new(Int32Array::from_iter_values(0..n as i32))
    }

    #[test]
    fn a_type_mismatch_needs_cast() {
        let b = batch(vec![("c", ints(3))]);
        assert_names(&schema_error(&b, spec("t", DType::F64, &["c"])), "c", "cast = true");
        // bf16 has no Arrow type: even f32 is a cast.
        let f: ArrayRef = Arc::new(Float32Array::from(vec![1.0]));
        let mut s = spec("t", DType::BF16, &["c"]);
        s.cast = false;
        assert_names(&schema_error(&batch(vec![("c", f)]), s), "c", "cast = true");
    }

    #[test]
    fn a_missing_column_is_named() {
        let b = batch(vec![("c", ints(3))]);
        assert_names(&schema_error(&b, spec("t", DType::I32, &["c", "nope"])), "nope", "no such column");
    }

    #[test]
    fn a_fixed_size_list_cannot_be_stacked() {
        let b = batch(vec![("c", ints(2)), ("v", list_array(DType::I32, 2, &[Some(1); 4], None))]);
        for cols in [["v", "c"], ["c", "v"]] {
            assert_names(&schema_error(&b, spec("t", DType::I32, &cols)), "v", "cannot be stacked");
        }
    }

    #[test]
    fn stacked_columns_must_share_a_type() {
        let wide: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]));
        let b = batch(vec![("a", ints(3)), ("b", wide)]);
        let mut s = spec("t", DType::I64, &["a", "b"]);
        // Not even a cast mixes types within one tensor.
        s.cast = true;
        assert_names(&schema_error(&b, s), "b", "other columns are Int32");
    }

    #[test]
    fn strings_make_only_byte_tensors() {
        let s: ArrayRef = Arc::new(StringArray::from(vec!["a", "b"]));
        let field = Arc::new(Field::new_list_field(DataType::Utf8, true));
        let l: ArrayRef =
            Arc::new(FixedSizeListArray::try_new(field, 1, Arc::new(StringArray::from(vec!["x", "y"])), None).unwrap());
        let strings = Arc::new(Field::new_list_field(DataType::Utf8, true));
        let ls: ArrayRef = Arc::new(ListArray::new(
            strings,
            OffsetBuffer::from_lengths([1, 1]),
            Arc::new(StringArray::from(vec!["x", "y"])),
            None,
        ));
        let b = batch(vec![("s", s), ("l", l), ("ls", ls)]);
        for col in ["l", "ls"] {
            let mut t = spec("t", DType::U8, &[col]);
            t.cast = true;
            assert_names(&schema_error(&b, t), col, "Utf8");
        }
        // A string column is a byte tensor, of u8 only.
        assert_names(&schema_error(&b, spec("t", DType::F32, &["s"])), "s", "its tensor's dtype must be u8, not f32");
        let buf = chunk(&b, &view(vec![spec("t", DType::U8, &["s"])])).expect("bytes");
        let v = ChunkView::parse(&buf, Verify::Full).unwrap();
        let j = v.jagged_at(0).expect("jagged");
        assert_eq!((j.row(0), j.row(1)), (&b"a"[..], &b"b"[..]));
    }

    /// The rows of jagged tensor `i` of chunk `buf`, as little-endian
    /// `E`-byte values.
    fn jagged_rows<const E: usize>(buf: &[u8], i: usize) -> Vec<Vec<[u8; E]>> {
        let v = ChunkView::parse(buf, Verify::Full).expect("chunk");
        let j = v.jagged_at(i).expect("jagged");
        (0..j.rows()).map(|r| j.row(r).chunks_exact(E).map(|c| c.try_into().unwrap()).collect()).collect()
    }

    #[test]
    fn list_columns_become_row_offsets_and_values_sliced_cast_and_nulls_as_declared() {
        let lens = [3usize, 0, 2, 1, 4];
        let values = Int32Array::from_iter_values(0..10);
        let item = Arc::new(Field::new_list_field(DataType::Int32, false));
        let list = ListArray::new(item.clone(), OffsetBuffer::from_lengths(lens), Arc::new(values), None);
        // A slice: its offsets start at 3, not 0.
        let sliced: ArrayRef = Arc::new(list.slice(1, 4));
        let large = cast(&(Arc::new(list.slice(1, 4)) as ArrayRef), &DataType::LargeList(item.clone())).expect("large");
        let b = batch(vec![("l", sliced), ("big", large)]);
        let mut wide = spec("wide", DType::I64, &["big"]);
        wide.cast = true;
        let buf = chunk(&b, &view(vec![spec("t", DType::I32, &["l"]), wide])).expect("converts");
        let want: Vec<Vec<i64>> = vec![vec![], vec![3, 4], vec![5], vec![6, 7, 8, 9]];
        let as_i32: Vec<Vec<[u8; 4]>> =
            want.iter().map(|r| r.iter().map(|&v| (v as i32).to_le_bytes()).collect()).collect();
        let as_i64: Vec<Vec<[u8; 8]>> = want.iter().map(|r| r.iter().map(|&v| v.to_le_bytes()).collect()).collect();
        assert_eq!(jagged_rows::<4>(&buf, 0), as_i32);
        assert_eq!(jagged_rows::<8>(&buf, 1), as_i64);

        // A null row: an error naming it, or empty with null = "empty"
        // declared (even when its offsets span values).
        let nulls = NullBuffer::from(vec![true, false, true]);
        let spans = ListArray::new(
            item,
            OffsetBuffer::from_lengths([1, 2, 1]),
            Arc::new(Int32Array::from(vec![1, 2, 3, 4])),
            Some(nulls),
        );
        let b = batch(vec![("l", Arc::new(spans) as ArrayRef)]);
        let e = chunk(&b, &view(vec![spec("t", DType::I32, &["l"])])).expect_err("a null row");
        assert!(e.to_string().contains("1 null rows (first at row 1); declare null = \"empty\""), "{e}");
        let empty = TensorSpec { null_rows: granary_proto::NullRows::Empty, ..spec("t", DType::I32, &["l"]) };
        let buf = chunk(&b, &view(vec![empty])).expect("null = empty declared");
        let want: Vec<Vec<[u8; 4]>> = vec![vec![1i32.to_le_bytes()], vec![], vec![4i32.to_le_bytes()]];
        assert_eq!(jagged_rows::<4>(&buf, 0), want);
    }

    #[test]
    fn a_null_value_inside_a_list_is_an_error_naming_its_row() {
        let item = Arc::new(Field::new_list_field(DataType::Int64, true));
        let values = Int64Array::from(vec![Some(1), Some(2), None, Some(4)]);
        let list = ListArray::new(item, OffsetBuffer::from_lengths([2, 2]), Arc::new(values), None);
        let b = batch(vec![("l", Arc::new(list) as ArrayRef)]);
        let e = chunk(&b, &view(vec![spec("t", DType::I64, &["l"])])).expect_err("a null value");
        assert!(e.to_string().contains("a null value inside its list at row 1"), "{e}");
    }

    /// Rows of lengths `lens` (values 0, 1, 2, ... in order) as a list
    /// column of i64, rows `nulls` null.
    fn counted_list(lens: &[usize], nulls: Option<Vec<bool>>) -> ArrayRef {
        let total: usize = lens.iter().sum();
        let item = Arc::new(Field::new_list_field(DataType::Int64, false));
        let values = Int64Array::from_iter_values(0..total as i64);
        Arc::new(ListArray::new(
            item,
            OffsetBuffer::from_lengths(lens.iter().copied()),
            Arc::new(values),
            nulls.map(NullBuffer::from),
        ))
    }

    fn i64_rows(buf: &[u8], i: usize) -> Vec<Vec<i64>> {
        jagged_rows::<8>(buf, i).into_iter().map(|r| r.into_iter().map(i64::from_le_bytes).collect()).collect()
    }

    #[test]
    fn max_len_keeps_the_first_or_last_values_or_names_the_long_row() {
        let b = batch(vec![("h", counted_list(&[2, 5, 0, 3], None))]);
        let base = TensorSpec { max_len: Some(3), ..spec("h", DType::I64, &["h"]) };
        let e = chunk(&b, &view(vec![base.clone()])).expect_err("a long row");
        let msg = e.to_string();
        assert!(msg.contains("row 1 holds 5 values, over max_len = 3") && msg.contains("truncate"), "{msg}");
        assert!(msg.contains(FILE) && msg.contains("column \"h\""), "names file and column: {msg}");
        let first = TensorSpec { truncate: Some(granary_proto::Truncate::KeepFirst), ..base.clone() };
        let buf = chunk(&b, &view(vec![first])).expect("keep_first");
        assert_eq!(i64_rows(&buf, 0), vec![vec![0, 1], vec![2, 3, 4], vec![], vec![7, 8, 9]]);
        let last = TensorSpec { truncate: Some(granary_proto::Truncate::KeepLast), ..base };
        let buf = chunk(&b, &view(vec![last])).expect("keep_last");
        assert_eq!(i64_rows(&buf, 0), vec![vec![0, 1], vec![4, 5, 6], vec![], vec![7, 8, 9]]);
    }

    #[test]
    fn pad_to_makes_a_dense_tensor_and_its_lengths() {
        let b = batch(vec![("h", counted_list(&[2, 5, 0, 3], Some(vec![true, true, false, true])))]);
        let padded = TensorSpec {
            pad_to: Some(4),
            fill: Some(-1.0),
            truncate: Some(granary_proto::Truncate::KeepFirst),
            null_rows: granary_proto::NullRows::Empty,
            ..spec("h", DType::I64, &["h"])
        };
        let resolved = resolve(&view(vec![padded.clone()]), &b).expect("resolves");
        let names: Vec<(&str, &[u32], bool)> =
            resolved.layouts.iter().map(|l| (l.name.as_str(), &l.shape[..], l.jagged)).collect();
        assert_eq!(names, [("h", &[4u32][..], false), ("h_len", &[][..], false)]);
        assert_eq!(resolved.layouts[1].dtype, DType::I32);
        let buf = chunk(&b, &view(vec![padded.clone()])).expect("pads");
        let v = ChunkView::parse(&buf, Verify::Full).expect("chunk");
        let (_, h) = v.tensor("h").expect("h");
        let h: Vec<i64> = h.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(h, [0, 1, -1, -1, 2, 3, 4, 5, -1, -1, -1, -1, 7, 8, 9, -1]);
        let (_, lens) = v.tensor("h_len").expect("h_len");
        let lens: Vec<i32> = lens.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(lens, [2, 4, 0, 3]);
        // Without truncate a row longer than pad_to is an error naming it.
        let strict = TensorSpec { truncate: None, ..padded };
        let e = chunk(&b, &view(vec![strict])).expect_err("a long row");
        assert!(e.to_string().contains("row 1 holds 5 values, over pad_to = 4"), "{e}");
    }

    #[test]
    fn list_options_on_a_scalar_column_or_a_list_of_strings_are_refused_by_name() {
        let b = batch(vec![("x", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef)]);
        let e = resolve(&view(vec![TensorSpec { max_len: Some(3), ..spec("x", DType::I64, &["x"]) }]), &b)
            .expect_err("a scalar column");
        assert!(e.to_string().contains("apply to a list or byte column") && e.to_string().contains("Int64"), "{e}");
        let strings = Arc::new(ListArray::new(
            Arc::new(Field::new_list_field(DataType::Utf8, false)),
            OffsetBuffer::from_lengths([1, 1]),
            Arc::new(arrow::array::StringArray::from(vec!["a", "b"])),
            None,
        )) as ArrayRef;
        let b = batch(vec![("s", strings)]);
        let e = resolve(&view(vec![spec("s", DType::U8, &["s"])]), &b).expect_err("a list of strings");
        assert!(e.to_string().contains("which no tensor can be built from"), "{e}");
        let text = Arc::new(arrow::array::StringArray::from(vec!["a", "b"])) as ArrayRef;
        let b = batch(vec![("t", text)]);
        let e = resolve(&view(vec![spec("t", DType::I64, &["t"])]), &b).expect_err("a Utf8 column as i64");
        assert!(e.to_string().contains("its tensor's dtype must be u8"), "{e}");
    }

    #[test]
    fn values_over_a_chunks_limit_name_the_longest_row() {
        let kept = KeptRows { raw: vec![10, 12, 20, 21], kept: None };
        assert_eq!(over_limit(&kept, 8, 11 * 8), None);
        assert_eq!(over_limit(&kept, 8, 10 * 8), Some((88, 1, 8)));
        // Offsets are u64: a chunk's values past u32 do not wrap.
        let big = KeptRows { raw: vec![0, 3 << 30, 5 << 30], kept: None };
        assert_eq!(big.values(), 5 << 30);
        assert_eq!(over_limit(&big, 1, MAX_JAGGED_BYTES), Some((5 << 30, 0, 3 << 30)));
    }
}
