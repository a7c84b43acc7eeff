//! A served dataset: its manifest, its resolved view, and the decoded
//! footers kept so that reading a shard never re-reads a footer.
//!
//! [`Dataset::open`] lists the source, reads every footer once, checks every
//! file's schema against the view (naming the file, tensor and column that do
//! not fit) and computes the [`DatasetVersion`].

use crate::convert::{Resolved, resolve_view};
use crate::error::{FetchError, RemoteError};
use crate::remote::Remote;
use granary_proto::wire::DatasetInfo;
use granary_proto::{DatasetVersion, FileEntry, Manifest, RowGroupEntry, ShardId, View};
use object_store::path::Path as StorePath;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use std::sync::Arc;

/// One file of the dataset, with its decoded footer.
pub struct DatasetFile {
    /// Object path.
    pub path: StorePath,
    /// Object size.
    pub size: u64,
    /// Decoded footer and Arrow schema.
    pub metadata: ArrowReaderMetadata,
    /// The view resolved against this file's schema.
    pub resolved: Arc<Resolved>,
}

/// A dataset version this node serves.
pub struct Dataset {
    /// Name.
    pub name: String,
    /// The view.
    pub view: View,
    /// The manifest.
    pub manifest: Manifest,
    /// Version hash of manifest and view.
    pub version: DatasetVersion,
    /// Files in manifest order.
    pub files: Vec<DatasetFile>,
    /// The source.
    pub remote: Remote,
}

/// Opening a dataset failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The source could not be read.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// A file's schema does not fit the view.
    #[error(transparent)]
    Schema(#[from] crate::error::SchemaError),
    /// Two files resolve the view to different tensor layouts.
    #[error("{file}: tensor layouts {got:?} differ from the first file's {want:?}")]
    Inconsistent {
        /// The file that differs.
        file: String,
        /// Its layouts.
        got: Vec<granary_proto::TensorLayout>,
        /// The first file's layouts.
        want: Vec<granary_proto::TensorLayout>,
    },
}

impl Dataset {
    /// Lists `remote`, reads every footer and resolves `view`.
    pub async fn open(name: &str, remote: Remote, view: View) -> Result<Self, OpenError> {
        let metas = remote.list_parquet().await?;
        let mut files = Vec::with_capacity(metas.len());
        let mut entries = Vec::with_capacity(metas.len());
        let mut layouts = None;
        for m in metas {
            let mut f = remote.file(m.location.clone(), m.size);
            let md = f.metadata().await?;
            let path = m.location.to_string();
            let metadata = ArrowReaderMetadata::try_new(md, ArrowReaderOptions::new())
                .map_err(|source| RemoteError::Parquet { path: path.clone(), source })?;
            let resolved = resolve_view(&view, metadata.schema(), &path)?;
            match &layouts {
                None => layouts = Some(resolved.layouts.clone()),
                Some(first) if *first != resolved.layouts => {
                    return Err(OpenError::Inconsistent { file: path, got: resolved.layouts, want: first.clone() });
                }
                Some(_) => {}
            }
            let pmd = metadata.metadata();
            let row_groups = pmd
                .row_groups()
                .iter()
                .map(|rg| RowGroupEntry {
                    rows: rg.num_rows().max(0) as u64,
                    compressed_bytes: rg.compressed_size().max(0) as u64,
                })
                .collect();
            let version_tag =
                m.e_tag.clone().unwrap_or_else(|| format!("mtime:{}", m.last_modified.timestamp_micros()));
            entries.push(FileEntry { path: path.clone(), size_bytes: m.size, version_tag, row_groups });
            files.push(DatasetFile { path: m.location, size: m.size, metadata, resolved: Arc::new(resolved) });
        }
        let manifest = Manifest {
            source: granary_proto::manifest::canonical_source(remote.url()).to_string(),
            files: entries,
            tensors: layouts.unwrap_or_default(),
        };
        let version = manifest.version(&view);
        Ok(Self { name: name.to_string(), view, manifest, version, files, remote })
    }

    /// What a trainer needs to plan.
    pub fn info(&self) -> DatasetInfo {
        DatasetInfo {
            name: self.name.clone(),
            version: self.version,
            tensors: self.manifest.tensors.clone(),
            shards: self.manifest.shards(),
            files: self.manifest.files.iter().map(|f| f.path.clone()).collect(),
            source_bytes: self.manifest.total_file_bytes(),
        }
    }

    /// The file and row group of `shard`, if it exists.
    pub fn locate(&self, shard: ShardId) -> Result<(&DatasetFile, usize), FetchError> {
        let file = self.files.get(shard.file as usize).ok_or(FetchError::UnknownShard(shard))?;
        let rg = shard.row_group as usize;
        if rg >= file.metadata.metadata().num_row_groups() {
            return Err(FetchError::UnknownShard(shard));
        }
        Ok((file, rg))
    }

    /// Converted size of `shard` in bytes (exact: the chunk layout's length).
    pub fn chunk_len(&self, shard: ShardId) -> Option<usize> {
        let rows = self.manifest.files.get(shard.file as usize)?.row_groups.get(shard.row_group as usize)?.rows;
        granary_proto::ChunkLayout::new(self.version, shard, rows, &self.manifest.tensors).ok().map(|l| l.total_len())
    }
}
