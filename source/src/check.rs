//! A view checked against a source before anything is deployed: the files
//! listed, the view resolved against the first file's footer. No
//! coordinator, no node, no certificates: `granary view check`.

use crate::dataset::OpenError;
use crate::remote::Remote;
use crate::schema::resolve_view;
use granary_proto::View;
use serde::Serialize;

/// One tensor as the view builds it from the first file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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
    let tensors = resolved
        .layouts
        .iter()
        .zip(&view.tensors)
        .map(|(l, spec)| CheckedTensor {
            name: l.name.clone(),
            dtype: l.dtype.name().to_string(),
            shape: l.shape.clone(),
            jagged: l.jagged,
            columns: spec.columns.clone(),
            cast: spec.cast,
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
