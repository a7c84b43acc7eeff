//! A served dataset: its manifest, its resolved view, and the decoded
//! footers kept so that reading a shard never re-reads a footer.
//!
//! [`Dataset::open`] lists the source, reads every footer once, checks every
//! file's schema against the view (naming the file, tensor and column that do
//! not fit) and computes the [`DatasetVersion`].
//!
//! [`Dataset::from_manifest`] takes a manifest the coordinator already built
//! from the same source: nothing is read until a shard of a file is
//! converted, and then only that file's footer ([`Dataset::footer`]), checked
//! against the manifest. A cluster node converts only the shards it owns, so
//! it reads only the footers of files it owns shards of.

use crate::error::{RemoteError, SourceError};
pub use crate::footer::Footer;
use crate::remote::Remote;
use crate::schema::{Resolved, resolve_view};
use granary_proto::wire::DatasetInfo;
use granary_proto::{DatasetVersion, FileEntry, Manifest, PlanKey, RowGroupEntry, ShardId, View};
use object_store::path::Path as StorePath;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// One file of the dataset.
pub struct DatasetFile {
    /// Object path.
    pub path: StorePath,
    /// Object size.
    pub size: u64,
    /// The manifest's version tag (ETag, or `mtime:MICROS`): every read of
    /// the file is pinned to it.
    pub version_tag: String,
    /// Its footer, once read.
    footer: tokio::sync::OnceCell<Footer>,
}

impl DatasetFile {
    /// A reader of this file through `remote`, every read pinned to the
    /// registered ETag.
    pub fn reader(&self, remote: &Remote) -> crate::remote::RemoteFile {
        remote.file(self.path.clone(), self.size).pinned_to(&self.version_tag)
    }
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
    /// What seeds batch order (the same files anywhere give the same key).
    pub plan_key: PlanKey,
    /// Files in manifest order.
    pub files: Vec<DatasetFile>,
    /// The source.
    pub remote: Remote,
    /// Whether each footer's bytes are kept once read, for peers that ask
    /// this node for them (a cluster's nodes); else a peer's ask reads
    /// them again.
    keep_raw_footers: bool,
}

/// Opening a dataset failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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

/// Bytes the jagged tensors of `resolved` take in row group `rg`, from its
/// column chunks' metadata: a list's leaf value count (nulls and empty
/// rows included: an upper bound) times the tensor's element size; a byte
/// column's unencoded bytes, or where the writer did not record them its
/// uncompressed size. `None` without jagged tensors.
fn jagged_values_bytes(rg: &parquet::file::metadata::RowGroupMetaData, resolved: &Resolved) -> Option<u64> {
    use parquet::basic::Type;
    let jagged: Vec<_> = resolved.tensors.iter().filter(|t| t.kind == crate::schema::Kind::Jagged).collect();
    if jagged.is_empty() {
        return None;
    }
    let schema = rg.schema_descr();
    let mut total = 0u64;
    for t in jagged {
        for (i, col) in rg.columns().iter().enumerate() {
            if schema.get_column_root(i).name() != t.columns[0] {
                continue;
            }
            let bytes = match col.column_type() {
                Type::BYTE_ARRAY | Type::FIXED_LEN_BYTE_ARRAY => {
                    col.unencoded_byte_array_data_bytes().unwrap_or_else(|| col.uncompressed_size())
                }
                _ => col.num_values().saturating_mul(t.dtype.size_bytes() as i64),
            };
            total = total.saturating_add(bytes.max(0) as u64);
        }
    }
    Some(total)
}

/// What identifies one version of an object: its ETag, else its
/// modification time.
fn version_tag(m: &object_store::ObjectMeta) -> String {
    m.e_tag.clone().unwrap_or_else(|| format!("mtime:{}", m.last_modified.timestamp_micros()))
}

/// The SHA-256 of a footer's bytes, in lowercase hex, as a manifest
/// records it ([`FileEntry::footer_sha256`]).
pub fn footer_sha256(raw: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, raw);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Footer reads in flight at once while a dataset is opened (listed and
/// registered): enough to hide a store's request latency, few enough that
/// a registration does not crowd the store or hold many footers' bytes
/// before they are checked.
pub const FOOTER_READS: usize = 32;

impl Dataset {
    /// Lists `remote`, reads every footer ([`FOOTER_READS`] at a time) and
    /// resolves `view`.
    pub async fn open(name: &str, remote: Remote, view: View) -> Result<Self, OpenError> {
        Self::open_reporting(name, remote, view, &|_, _| {}).await
    }

    /// [`Dataset::open`], telling `footers_read(done, files)` once the
    /// source is listed (0 done) and after every footer read.
    pub async fn open_reporting(
        name: &str,
        remote: Remote,
        view: View,
        footers_read: &(dyn Fn(u64, u64) + Send + Sync),
    ) -> Result<Self, OpenError> {
        Self::open_keeping(name, remote, view, footers_read, true).await
    }

    /// [`Dataset::open_reporting`] that keeps no footer once its manifest
    /// entry is made (each is read again when first needed): what a
    /// registration needs, without a parsed footer per file in memory
    /// (about 1 GB at 20,000 files of 50 row groups, issue 31).
    pub async fn open_manifest(
        name: &str,
        remote: Remote,
        view: View,
        footers_read: &(dyn Fn(u64, u64) + Send + Sync),
    ) -> Result<Self, OpenError> {
        Self::open_keeping(name, remote, view, footers_read, false).await
    }

    async fn open_keeping(
        name: &str,
        remote: Remote,
        view: View,
        footers_read: &(dyn Fn(u64, u64) + Send + Sync),
        keep_footers: bool,
    ) -> Result<Self, OpenError> {
        use futures::StreamExt;
        let metas = remote.list_parquet().await?;
        let total = metas.len() as u64;
        footers_read(0, total);
        let mut files = Vec::with_capacity(metas.len());
        let mut entries = Vec::with_capacity(metas.len());
        let mut layouts = None;
        // Footers are read up to FOOTER_READS at a time, in listing order:
        // one after another, 100,000 files at 20 ms a request took over
        // half an hour (issue 31); the manifest keeps the listing's order.
        let mut footers = futures::stream::iter(metas)
            .map(|m| {
                let mut f = remote.file(m.location.clone(), m.size).pinned_to(&version_tag(&m));
                async move {
                    let raw = f.footer_bytes().await;
                    (m, f, raw)
                }
            })
            .buffered(FOOTER_READS);
        while let Some((m, f, raw)) = footers.next().await {
            let path = m.location.to_string();
            // Messages name the file as a person finds it again.
            let shown = f.shown();
            let raw = raw?;
            let md = Arc::new(crate::remote::decode_footer(&shown, &raw)?);
            let metadata = ArrowReaderMetadata::try_new(md, ArrowReaderOptions::new())
                .map_err(|source| RemoteError::Parquet { path: shown.clone(), source })?;
            let resolved = resolve_view(&view, metadata.schema(), &shown)?;
            match &layouts {
                None => layouts = Some(resolved.layouts.clone()),
                Some(first) if *first != resolved.layouts => {
                    return Err(OpenError::Inconsistent { file: shown, got: resolved.layouts, want: first.clone() });
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
                    values_bytes: jagged_values_bytes(rg, &resolved),
                })
                .collect();
            let tag = version_tag(&m);
            entries.push(FileEntry {
                path: path.clone(),
                size_bytes: m.size,
                version_tag: tag.clone(),
                row_groups,
                footer_sha256: Some(footer_sha256(&raw)),
            });
            let footer = match keep_footers {
                true => Some(Footer::split(&shown, &metadata, Arc::new(resolved), None)?),
                false => None,
            };
            files.push(DatasetFile {
                path: m.location,
                size: m.size,
                version_tag: tag,
                footer: tokio::sync::OnceCell::new_with(footer),
            });
            footers_read(files.len() as u64, total);
        }
        drop(footers);
        let manifest = Manifest {
            source: granary_proto::manifest::canonical_source(remote.url()).to_string(),
            files: entries,
            tensors: layouts.unwrap_or_default(),
        };
        let version = manifest.version(&view);
        let plan_key = manifest.plan_key(&view);
        Ok(Self { name: name.to_string(), view, manifest, version, plan_key, files, remote, keep_raw_footers: false })
    }

    /// A dataset version described by `manifest` (built by whoever listed
    /// the source, normally the coordinator) read through `remote`. Reads
    /// nothing: footers are read when first needed.
    pub fn from_manifest(name: &str, remote: Remote, view: View, manifest: Manifest) -> Result<Self, OpenError> {
        let files = manifest
            .files
            .iter()
            .map(|f| {
                // The manifest holds paths as the store prints them.
                let path = StorePath::parse(&f.path).map_err(|e| RemoteError::Open {
                    url: f.path.clone(),
                    reason: format!("not an object path: {e}"),
                })?;
                Ok(DatasetFile {
                    path,
                    size: f.size_bytes,
                    version_tag: f.version_tag.clone(),
                    footer: tokio::sync::OnceCell::new(),
                })
            })
            .collect::<Result<Vec<_>, OpenError>>()?;
        let version = manifest.version(&view);
        let plan_key = manifest.plan_key(&view);
        Ok(Self { name: name.to_string(), view, manifest, version, plan_key, files, remote, keep_raw_footers: true })
    }

    /// The footer's bytes of file `index` as stored, for a peer: those
    /// kept, else read again (and checked against the manifest's SHA-256).
    pub async fn footer_bytes(&self, index: usize) -> Result<bytes::Bytes, SourceError> {
        if let Some(raw) = self.footer(index).await?.raw.clone() {
            return Ok(raw);
        }
        let file = self.files.get(index).ok_or(SourceError::UnknownFile(index))?;
        let raw = file.reader(&self.remote).footer_bytes().await?;
        match &self.manifest.files[index].footer_sha256 {
            Some(want) if footer_sha256(&raw) != *want => {
                Err(self.changed(index, format!("footer SHA-256 {}, registered {want}", footer_sha256(&raw))))
            }
            _ => Ok(raw),
        }
    }

    /// The footer of file `index`, read (once) if not read yet, and checked
    /// against the manifest: a file whose row groups or tensor layouts
    /// differ from what was registered is an error naming it, never a
    /// misread shard.
    pub async fn footer(&self, index: usize) -> Result<&Footer, SourceError> {
        self.footer_via(index, None).await
    }

    /// The footer of file `index` if it is held already.
    pub fn held_footer(&self, index: usize) -> Option<&Footer> {
        self.files.get(index)?.footer.get()
    }

    /// Like [`Dataset::footer`], but when the footer is not held yet it is
    /// first asked of `peer` (its name for logs, and a future giving the
    /// footer's bytes, from the node that reads this file's footer for the
    /// cluster). A peer that fails, or whose bytes do not decode, do not
    /// match the manifest or differ from the footer registered (its SHA-256),
    /// is logged naming the peer and the file, counted
    /// (`peer_footers_refused`), and the footer is read from remote storage
    /// instead: a crafted footer never reaches a conversion.
    pub async fn footer_via(
        &self,
        index: usize,
        peer: Option<(String, futures::future::BoxFuture<'_, Result<bytes::Bytes, String>>)>,
    ) -> Result<&Footer, SourceError> {
        let file = self.files.get(index).ok_or_else(|| SourceError::UnknownFile(index))?;
        file.footer
            .get_or_try_init(|| async {
                if let Some((peer, fetch)) = peer {
                    match fetch.await {
                        Ok(raw) => match self.check_footer(index, raw) {
                            Ok(footer) => {
                                self.remote.counters().peer_footers.fetch_add(1, Ordering::Relaxed);
                                return Ok(footer);
                            }
                            Err(e) => {
                                self.remote.counters().peer_footers_refused.fetch_add(1, Ordering::Relaxed);
                                tracing::warn!(%peer, file = %self.remote.shown(&file.path),
                                    "refused the footer a peer sent; reading it from remote storage: {e}")
                            }
                        },
                        Err(e) => tracing::warn!(%peer, file = %file.path,
                            "no footer from the peer; reading it from remote storage: {e}"),
                    }
                }
                let raw = match file.reader(&self.remote).footer_bytes().await {
                    Ok(raw) => raw,
                    Err(e) => return Err(self.replaced_or(index, e).await),
                };
                match self.check_footer(index, raw) {
                    Err(SourceError::Remote(e @ RemoteError::Parquet { .. })) => Err(self.replaced_or(index, e).await),
                    other => other,
                }
            })
            .await
    }

    /// `e`, or the clearer error that file `index` was replaced since the
    /// version was registered (its size or version tag changed).
    async fn replaced_or(&self, index: usize, e: RemoteError) -> SourceError {
        let file = &self.files[index];
        let entry = &self.manifest.files[index];
        if let Ok(now) = self.remote.head(&file.path).await {
            // Compared as reads are pinned: a tag made of a modification
            // time (the listing had no ETags) against the answer's time. An
            // ETag against it would call every file of such a store changed
            // whenever a read failed (a store answering 503s was reported
            // as "the file changed"; tests/outage.rs).
            let tag = version_tag(&now);
            if now.size != file.size || crate::remote::version_differs(&entry.version_tag, &now) {
                return self.changed(
                    index,
                    format!(
                        "{} bytes, version {tag}; registered {} bytes, version {}",
                        now.size, file.size, entry.version_tag
                    ),
                );
            }
        }
        e.into()
    }

    fn changed(&self, index: usize, what: String) -> SourceError {
        SourceError::Remote(RemoteError::Parquet {
            path: self.remote.shown(&self.files[index].path),
            source: parquet::errors::ParquetError::General(format!(
                "the file changed since dataset version {} was registered: {what}",
                self.version
            )),
        })
    }

    /// Decodes footer bytes of file `index` and checks them against the
    /// manifest (row groups) and the view (tensor layouts).
    fn check_footer(&self, index: usize, raw: bytes::Bytes) -> Result<Footer, SourceError> {
        let path = self.remote.shown(&self.files[index].path);
        let entry = &self.manifest.files[index];
        if let Some(want) = &entry.footer_sha256 {
            let got = footer_sha256(&raw);
            if got != *want {
                return Err(self.changed(index, format!("footer SHA-256 {got}, registered {want}")));
            }
        }
        let md = crate::remote::decode_footer(&path, &raw)?;
        let metadata = ArrowReaderMetadata::try_new(Arc::new(md), ArrowReaderOptions::new())
            .map_err(|source| RemoteError::Parquet { path: path.clone(), source })?;
        // Rows and compressed bytes of every row group: the compressed sizes
        // tell apart files of the same shape, so a footer can never be
        // applied to another file's bytes.
        let rgs: Vec<(u64, u64)> = metadata
            .metadata()
            .row_groups()
            .iter()
            .map(|rg| (rg.num_rows().max(0) as u64, rg.compressed_size().max(0) as u64))
            .collect();
        let want: Vec<(u64, u64)> = entry.row_groups.iter().map(|g| (g.rows, g.compressed_bytes)).collect();
        if rgs != want {
            return Err(
                self.changed(index, format!("row groups (rows, compressed bytes) {rgs:?}, registered {want:?}"))
            );
        }
        let resolved = resolve_view(&self.view, metadata.schema(), &path)
            .map_err(|e| self.changed(index, format!("the view no longer fits: {e}")))?;
        if resolved.layouts != self.manifest.tensors {
            return Err(self.changed(index, format!("tensor layouts {:?}", resolved.layouts)));
        }
        let keep = self.keep_raw_footers.then(|| raw.clone());
        Ok(Footer::split(&path, &metadata, Arc::new(resolved), keep)?)
    }

    /// What a trainer needs to plan.
    pub fn info(&self) -> DatasetInfo {
        DatasetInfo {
            name: self.name.clone(),
            version: self.version,
            plan_key: self.plan_key,
            tensors: self.manifest.tensors.clone(),
            shards: self.manifest.shards(),
            files: self.manifest.files.iter().map(|f| f.path.clone()).collect(),
            source_bytes: self.manifest.total_file_bytes(),
            mapping_budget_bytes: u64::MAX,
        }
    }

    /// The file and row group of `shard`, if it exists.
    pub fn locate(&self, shard: ShardId) -> Result<(&DatasetFile, usize), SourceError> {
        let file = self.files.get(shard.file as usize).ok_or(SourceError::UnknownShard(shard))?;
        let rg = shard.row_group as usize;
        if rg >= self.manifest.files[shard.file as usize].row_groups.len() {
            return Err(SourceError::UnknownShard(shard));
        }
        Ok((file, rg))
    }

    /// Converted size of `shard` in bytes (exact: the chunk layout's
    /// length); `None` when a tensor is jagged (its values are counted only
    /// in the decoded row group).
    pub fn chunk_len(&self, shard: ShardId) -> Option<usize> {
        let rows = self.manifest.files.get(shard.file as usize)?.row_groups.get(shard.row_group as usize)?.rows;
        granary_proto::ChunkLayout::new(self.version, shard, rows, &self.manifest.tensors).ok().map(|l| l.total_len())
    }

    /// What a chunk of `shard` from elsewhere (a peer) must be: its exact
    /// length, or with jagged tensors its rows and tensors. `None` for an
    /// unknown shard.
    pub fn expected(&self, shard: ShardId) -> Option<granary_proto::chunk::Expected> {
        let rows = self.manifest.files.get(shard.file as usize)?.row_groups.get(shard.row_group as usize)?.rows;
        Some(match self.chunk_len(shard) {
            Some(len) => granary_proto::chunk::Expected::Len(len as u64),
            None => granary_proto::chunk::Expected::Shape { rows, tensors: self.manifest.tensors.clone().into() },
        })
    }

    /// [`Dataset::chunk_len`], or with jagged tensors an estimate: the
    /// dense tensors and the row offsets exactly, and the jagged tensors'
    /// values from the footer's column chunk metadata
    /// ([`RowGroupEntry::values_bytes`]; four times the row group's
    /// compressed bytes where the manifest lacks it). For memory admission
    /// and prefetch budgets, never for checking a chunk. 0 for an unknown
    /// shard.
    pub fn chunk_len_estimate(&self, shard: ShardId) -> u64 {
        if let Some(exact) = self.chunk_len(shard) {
            return exact as u64;
        }
        let Some(g) =
            self.manifest.files.get(shard.file as usize).and_then(|f| f.row_groups.get(shard.row_group as usize))
        else {
            return 0;
        };
        let empty = vec![0u64; self.manifest.tensors.len()];
        granary_proto::ChunkLayout::with_values(self.version, shard, g.rows, &self.manifest.tensors, &empty)
            .map_or(0, |l| l.total_len() as u64)
            .saturating_add(g.values_bytes.unwrap_or_else(|| g.compressed_bytes.saturating_mul(4)))
    }
}
