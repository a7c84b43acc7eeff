//! A view checked against a source before anything is deployed: the files
//! listed, the view resolved against the first file's footer. No
//! coordinator, no node, no certificates: `granary view check`.

use crate::dataset::OpenError;
use crate::remote::Remote;
use crate::schema::resolve_view;
use granary_proto::View;
use serde::Serialize;

/// One tensor as the view builds it from the first file.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CheckedTensor {
    /// Name.
    pub name: String,
    /// Granary dtype name (f32 ... bool).
    pub dtype: String,
    /// Per-row shape; of a jagged tensor, each value's.
    pub shape: Vec<u32>,
    /// Whether each row holds a variable number of values (a list or byte
    /// column).
    pub jagged: bool,
    /// The columns it is built from, in order.
    pub columns: Vec<String>,
    /// Whether the view declares a cast (the file's type differs).
    pub cast: bool,
    /// What the converter computes instead of copying, if anything:
    /// `hash into N`, `cross into N`, or the transform's steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub computed: Option<String>,
    /// Of a jagged (or padded) tensor: its rows' lengths in the first
    /// file's first row group (values per row; bytes of a byte column),
    /// before any truncation.
    pub lengths: Option<LengthStats>,
}

/// A jagged tensor's row lengths in a sample of rows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LengthStats {
    /// Rows sampled.
    pub rows: u64,
    /// Mean length.
    pub mean: f64,
    /// 99th percentile (nearest rank).
    pub p99: u64,
    /// Longest.
    pub max: u64,
}

impl LengthStats {
    /// The statistics of `lengths` (a null row counts as 0).
    pub fn of(mut lengths: Vec<u64>) -> Self {
        lengths.sort_unstable();
        let rows = lengths.len() as u64;
        let mean = if rows == 0 { 0.0 } else { lengths.iter().sum::<u64>() as f64 / rows as f64 };
        let rank = ((rows as f64 * 0.99).ceil() as usize).clamp(1, lengths.len().max(1)) - 1;
        Self { rows, mean, p99: lengths.get(rank).copied().unwrap_or(0), max: lengths.last().copied().unwrap_or(0) }
    }
}

/// The row lengths of a list or byte column (`None` for another type).
fn row_lengths(col: &arrow::array::ArrayRef) -> Option<Vec<u64>> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::DataType;
    let len = |o: &[i64]| o.windows(2).map(|w| (w[1] - w[0]).max(0) as u64).collect::<Vec<u64>>();
    let len32 = |o: &[i32]| o.windows(2).map(|w| (w[1] - w[0]).max(0) as u64).collect::<Vec<u64>>();
    let mut lengths = match col.data_type() {
        DataType::List(_) => len32(col.as_list::<i32>().offsets()),
        DataType::LargeList(_) => len(col.as_list::<i64>().offsets()),
        DataType::Binary => len32(col.as_binary::<i32>().offsets()),
        DataType::LargeBinary => len(col.as_binary::<i64>().offsets()),
        DataType::Utf8 => len32(col.as_string::<i32>().offsets()),
        DataType::LargeUtf8 => len(col.as_string::<i64>().offsets()),
        _ => return None,
    };
    for (r, l) in lengths.iter_mut().enumerate() {
        if col.is_null(r) {
            *l = 0;
        }
    }
    Some(lengths)
}

/// What `check_view` found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ViewCheck {
    /// The source, as given.
    pub source: String,
    /// Parquet files under it.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The file the view was resolved against, as a person finds it.
    pub first_file: String,
    /// Its rows and row groups.
    pub first_rows: u64,
    /// Row groups of the first file (each is a shard).
    pub first_row_groups: usize,
    /// The tensors.
    pub tensors: Vec<CheckedTensor>,
    /// Bytes one converted row takes: its dense tensors', and 8 bytes of
    /// row offset for each jagged tensor, whose values come on top.
    pub row_bytes: usize,
}

/// Lists `remote` and resolves `view` (validated: patterns expanded)
/// against its first file's footer. Only the first footer is read: a
/// registration checks every file.
pub async fn check_view(remote: &Remote, view: &View) -> Result<ViewCheck, OpenError> {
    let metas = remote.list_parquet().await?;
    let first = &metas[0];
    let mut f = remote.file(first.location.clone(), first.size);
    let shown = f.shown();
    let md = f.metadata().await?;
    let schema = parquet::arrow::arrow_reader::ArrowReaderMetadata::try_new(
        md.clone(),
        parquet::arrow::arrow_reader::ArrowReaderOptions::new(),
    )
    .map_err(|source| crate::error::RemoteError::Parquet { path: shown.clone(), source })?;
    let resolved = resolve_view(view, schema.schema(), &shown)?;
    let lengths = first_row_group_lengths(f, &schema, &resolved, &shown).await?;
    let tensors = resolved
        .layouts
        .iter()
        .zip(&resolved.tensors)
        .map(|(l, t)| CheckedTensor {
            name: l.name.clone(),
            dtype: l.dtype.name().to_string(),
            shape: l.shape.clone(),
            jagged: l.jagged,
            columns: t.columns.clone(),
            cast: t.kind != crate::schema::Kind::Lengths
                && view.tensors.iter().find(|s| s.name == t.name).is_some_and(|s| s.cast),
            lengths: lengths.get(&l.name).cloned(),
            computed: view
                .tensors
                .iter()
                .find(|s| s.name == t.name && t.kind != crate::schema::Kind::Lengths)
                .and_then(|s| match (s.hash, s.cross) {
                    (Some(h), _) => Some(format!("hash into {}", h.buckets)),
                    (_, Some(c)) => Some(format!("cross into {}", c.buckets)),
                    _ if !s.transform.is_empty() => Some(s.transform.join(", ")),
                    _ => None,
                }),
        })
        .collect();
    Ok(ViewCheck {
        source: remote.url().to_string(),
        files: metas.len(),
        bytes: metas.iter().map(|m| m.size).sum(),
        first_file: shown,
        first_rows: md.row_groups().iter().map(|g| g.num_rows().max(0) as u64).sum(),
        first_row_groups: md.num_row_groups(),
        row_bytes: resolved.layouts.iter().map(|l| if l.jagged { 8 } else { l.row_bytes() }).sum(),
        tensors,
    })
}

/// The row lengths of every jagged tensor of `resolved`, by tensor name, in
/// the first row group of `f` (only those columns are read).
async fn first_row_group_lengths(
    f: crate::remote::RemoteFile,
    meta: &parquet::arrow::arrow_reader::ArrowReaderMetadata,
    resolved: &crate::schema::Resolved,
    shown: &str,
) -> Result<std::collections::BTreeMap<String, LengthStats>, OpenError> {
    let jagged: Vec<(&str, &str, usize)> = resolved
        .tensors
        .iter()
        .filter(|t| matches!(t.kind, crate::schema::Kind::Jagged | crate::schema::Kind::Padded(_)))
        .filter_map(|t| {
            Some((t.name.as_str(), t.columns[0].as_str(), crate::path::find(meta.schema(), &t.columns[0])?.0))
        })
        .collect();
    let mut out = std::collections::BTreeMap::new();
    if jagged.is_empty() || meta.metadata().num_row_groups() == 0 {
        return Ok(out);
    }
    let err = |source| crate::error::RemoteError::Parquet { path: shown.to_string(), source };
    let builder = parquet::arrow::ParquetRecordBatchStreamBuilder::new_with_metadata(f, meta.clone());
    let mask = parquet::arrow::ProjectionMask::roots(builder.parquet_schema(), jagged.iter().map(|(_, _, i)| *i));
    let mut stream = builder.with_row_groups(vec![0]).with_projection(mask).build().map_err(err)?;
    let mut lengths: std::collections::BTreeMap<&str, Vec<u64>> = std::collections::BTreeMap::new();
    while let Some(batch) = futures::StreamExt::next(&mut stream).await {
        let batch = batch.map_err(err)?;
        for (name, column, _) in &jagged {
            if let Some(l) = crate::path::array(&batch, column).as_ref().and_then(row_lengths) {
                lengths.entry(name).or_default().extend(l);
            }
        }
    }
    for (name, l) in lengths {
        out.insert(name.to_string(), LengthStats::of(l));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_statistics_take_the_nearest_rank() {
        let s = LengthStats::of((1..=100).collect());
        assert_eq!((s.rows, s.p99, s.max), (100, 99, 100));
        assert!((s.mean - 50.5).abs() < 1e-9);
        let empty = LengthStats::of(vec![]);
        assert_eq!((empty.rows, empty.p99, empty.max), (0, 0, 0));
        assert_eq!(LengthStats::of(vec![7]).p99, 7);
    }
}
