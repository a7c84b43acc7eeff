//! Values the converter computes rather than copies (issue 44): ids
//! hashed from strings or bytes (`hash`), ids of crossed columns
//! (`cross`), values after transform steps (`transform`), and a fill as
//! one element. Errors are the problem in words; the converter names the
//! file, row group and column.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Float64Type};
use granary_proto::DType;
use granary_source::schema::ResolvedTensor;

/// The little-endian bytes of `fill` as one element of `dtype`. The view
/// checked that the value fits.
pub(crate) fn fill_bytes(dtype: DType, fill: f64) -> Vec<u8> {
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

/// Each value of string or byte column `arr` as its id
/// ([`granary_proto::view::hash_id`] into `buckets`), as little-endian
/// bytes of the tensor's dtype (i64 or i32); a null takes the fill (the
/// caller refused nulls without one). A dictionary is hashed by its
/// values; a column of nulls alone (one a file lacks) is all fill.
pub(crate) fn hashed(arr: &ArrayRef, t: &ResolvedTensor, buckets: u64) -> Result<Vec<u8>, String> {
    let fill = t.fill.unwrap_or(0.0) as i64;
    let ids: Vec<i64> = if arr.null_count() == arr.len() {
        vec![fill; arr.len()]
    } else {
        let plain;
        let values = match arr.data_type() {
            DataType::Dictionary(_, v) => {
                plain =
                    arrow::compute::cast(arr, v).map_err(|e| format!("cannot read its dictionary's values: {e}"))?;
                &plain
            }
            _ => arr,
        };
        // Downcast once, then walk the values.
        fn ids<'a>(
            n: usize,
            nulls: impl Fn(usize) -> bool,
            get: impl Fn(usize) -> &'a [u8],
            fill: i64,
            buckets: u64,
        ) -> Vec<i64> {
            (0..n).map(|i| if nulls(i) { fill } else { granary_proto::view::hash_id(get(i), buckets) as i64 }).collect()
        }
        let (n, null) = (values.len(), |i| values.is_null(i));
        match values.data_type() {
            DataType::Utf8 => {
                let a = values.as_string::<i32>();
                ids(n, null, |i| a.value(i).as_bytes(), fill, buckets)
            }
            DataType::LargeUtf8 => {
                let a = values.as_string::<i64>();
                ids(n, null, |i| a.value(i).as_bytes(), fill, buckets)
            }
            DataType::Binary => {
                let a = values.as_binary::<i32>();
                ids(n, null, |i| a.value(i), fill, buckets)
            }
            DataType::LargeBinary => {
                let a = values.as_binary::<i64>();
                ids(n, null, |i| a.value(i), fill, buckets)
            }
            other => return Err(format!("has Arrow type {other}: hash applies to string or byte values")),
        }
    };
    Ok(match t.dtype {
        // The view checked that every id fits i32 (buckets <= 2^31).
        DType::I32 => ids.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect(),
        _ => ids.iter().flat_map(|&v| v.to_le_bytes()).collect(),
    })
}

/// One id per row of the crossed columns `cols`
/// ([`granary_proto::view::cross_id`] of each value's text), written into
/// `dst` as the tensor's dtype; a row with a null takes the fill, or is an
/// error naming the column and row without one.
/// The error names the column (its index in `t.columns`).
pub(crate) fn crossed(cols: &[&ArrayRef], t: &ResolvedTensor, dst: &mut [u8]) -> Result<(), (usize, String)> {
    let texts: Vec<ArrayRef> = cols
        .iter()
        .enumerate()
        .map(|(c, a)| match a.data_type() {
            DataType::Binary | DataType::LargeBinary => Ok((*a).clone()),
            _ => cast_with_options(a, &DataType::LargeUtf8, &CastOptions { safe: false, ..Default::default() })
                .map_err(|e| (c, format!("cannot read {} as text to cross: {e}", a.data_type()))),
        })
        .collect::<Result<_, _>>()?;
    fn bytes_at(a: &ArrayRef, r: usize) -> &[u8] {
        match a.data_type() {
            DataType::Binary => a.as_binary::<i32>().value(r),
            DataType::LargeBinary => a.as_binary::<i64>().value(r),
            _ => a.as_string::<i64>().value(r).as_bytes(),
        }
    }
    let buckets = t.hash.unwrap_or(1);
    let elem = t.dtype.size_bytes();
    for (r, out) in dst.chunks_exact_mut(elem).enumerate() {
        let id = match texts.iter().position(|a| a.is_null(r)) {
            Some(c) => match t.fill {
                Some(f) => f as i64,
                None => {
                    return Err((
                        c,
                        format!("a null at row {r} of a crossed column, and the view declares no fill value"),
                    ));
                }
            },
            None => granary_proto::view::cross_id(texts.iter().map(|a| bytes_at(a, r)), buckets) as i64,
        };
        match t.dtype {
            // The view checked that every id fits i32 (buckets <= 2^31).
            DType::I32 => out.copy_from_slice(&(id as i32).to_le_bytes()),
            _ => out.copy_from_slice(&id.to_le_bytes()),
        }
    }
    Ok(())
}

/// Each value of numeric column `arr`, read as an f64, after the tensor's
/// transform steps ([`granary_proto::transform`]), as little-endian bytes
/// of its dtype; a null takes the fill as it is. A bucket index always
/// fits the integer dtype (the view checked it); a float step's result is
/// rounded to a narrower float dtype as a cast would.
pub(crate) fn transformed(arr: &ArrayRef, t: &ResolvedTensor) -> Result<Vec<u8>, String> {
    let x = cast_with_options(arr, &DataType::Float64, &CastOptions { safe: false, ..Default::default() })
        .map_err(|e| format!("cannot read {} as numbers to transform: {e}", arr.data_type()))?;
    let x = x.as_primitive::<Float64Type>();
    let fill = t.fill.unwrap_or(0.0);
    let values = (0..x.len())
        .map(|i| if x.is_null(i) { fill } else { granary_proto::transform::apply(&t.transform, x.value(i)) });
    let mut out = Vec::with_capacity(x.len() * t.dtype.size_bytes());
    match t.dtype {
        DType::F32 => values.for_each(|v| out.extend_from_slice(&(v as f32).to_le_bytes())),
        DType::F64 => values.for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DType::I64 => values.for_each(|v| out.extend_from_slice(&(v as i64).to_le_bytes())),
        DType::I32 => values.for_each(|v| out.extend_from_slice(&(v as i32).to_le_bytes())),
        dtype => values.for_each(|v| out.extend_from_slice(&fill_bytes(dtype, v))),
    }
    Ok(out)
}
