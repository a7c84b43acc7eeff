//! What one dataset version contains, and the hash that names it.
//!
//! The manifest is produced by listing the source and reading every Parquet
//! footer. The [`DatasetVersion`] is a hash over a canonical encoding of the
//! manifest and the view, written field by field here (not through a
//! serialisation library) so that the version of a dataset never changes
//! with a dependency upgrade.

use crate::ids::{DatasetVersion, PlanKey, ShardId};
use crate::view::{TensorLayout, View};
use xxhash_rust::xxh3::Xxh3;

mod compact;
mod pieces;

pub use compact::{CompactError, MAGIC as COMPACT_MAGIC};
pub use pieces::{Blob, MANIFEST_PIECE_BYTES, ManifestPieces, PieceError, piece_digest};

/// One row group of a file.
#[derive(
    Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub struct RowGroupEntry {
    /// Rows in the row group.
    pub rows: u64,
    /// Compressed bytes of the row group's column chunks.
    pub compressed_bytes: u64,
    /// Bytes the view's jagged tensors' values decode to, from the column
    /// chunks' metadata (an upper bound: a list's value count, nulls and
    /// empty rows included, times the element size; a byte column's
    /// unencoded bytes). `None` without jagged tensors, or from a manifest
    /// that predates it. For memory and prefetch estimates only: not part
    /// of the version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values_bytes: Option<u64>,
}

/// One Parquet file of the dataset.
#[derive(
    Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub struct FileEntry {
    /// Object path relative to the store root.
    pub path: String,
    /// Object size in bytes.
    pub size_bytes: u64,
    /// The store's version tag (ETag, or modification time); a changed
    /// object gets a new tag and so a new dataset version.
    pub version_tag: String,
    /// Row groups in file order.
    pub row_groups: Vec<RowGroupEntry>,
    /// SHA-256 of the file's footer as registered (lowercase hex): a footer
    /// from a peer, or read again from the store, is used only if it
    /// matches, so a node with a valid certificate cannot make others
    /// convert wrong tensors by serving crafted column offsets. `None` in
    /// manifests registered before it was recorded (checked by row groups
    /// only). Not part of [`Manifest::version`]: the version tag already
    /// pins the file's bytes, and versions stay what they were.
    #[serde(default)]
    pub footer_sha256: Option<String>,
}

/// `url` as a manifest records it: trailing slashes removed (but never the
/// `//` of `scheme://`), so `file:///data/` and `file:///data` name the same
/// source and give the same dataset version on every node and coordinator.
pub fn canonical_source(url: &str) -> &str {
    let trimmed = url.trim_end_matches('/');
    if trimmed.ends_with(':') { url } else { trimmed }
}

/// The files of a dataset version and the tensor layouts its view resolves to.
#[derive(
    Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub struct Manifest {
    /// Source URL prefix, as [`canonical_source`] writes it.
    pub source: String,
    /// Files sorted by path.
    pub files: Vec<FileEntry>,
    /// The view resolved against the schema.
    pub tensors: Vec<TensorLayout>,
}

/// A shard and its row count, in manifest order.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Debug,
    serde::Serialize,
    serde::Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct ShardRows {
    /// The shard.
    pub shard: ShardId,
    /// Rows in it.
    pub rows: u64,
}

impl Manifest {
    /// Every shard in manifest order: files by path, row groups in file order.
    pub fn shards(&self) -> Vec<ShardRows> {
        let mut out = Vec::new();
        for (f, file) in self.files.iter().enumerate() {
            for (g, rg) in file.row_groups.iter().enumerate() {
                out.push(ShardRows { shard: ShardId { file: f as u32, row_group: g as u32 }, rows: rg.rows });
            }
        }
        out
    }

    /// Total rows.
    pub fn total_rows(&self) -> u64 {
        // Saturating: the counts come from footers and other processes.
        self.files.iter().flat_map(|f| &f.row_groups).fold(0u64, |n, g| n.saturating_add(g.rows))
    }

    /// Total size of the source files in bytes.
    pub fn total_file_bytes(&self) -> u64 {
        self.files.iter().fold(0u64, |n, f| n.saturating_add(f.size_bytes))
    }

    /// Bytes per converted row, over all tensors.
    pub fn row_bytes(&self) -> usize {
        self.tensors.iter().map(TensorLayout::row_bytes).sum()
    }

    /// The version of this manifest under `view`.
    pub fn version(&self, view: &View) -> DatasetVersion {
        let mut h = Canon(Xxh3::new());
        h.str("granary-manifest-v1");
        h.str(&self.source);
        h.u64(self.files.len() as u64);
        for f in &self.files {
            h.str(&f.path);
            h.u64(f.size_bytes);
            h.str(&f.version_tag);
            h.u64(f.row_groups.len() as u64);
            for g in &f.row_groups {
                h.u64(g.rows);
                h.u64(g.compressed_bytes);
            }
        }
        h.layouts(&self.tensors);
        h.view(view);
        DatasetVersion(h.0.digest128().to_le_bytes())
    }
}

/// What one chunk holds, whichever version it was made for
/// ([`Manifest::content_key`]): two versions whose shards share it may
/// serve each other's chunk, restamped
/// ([`crate::ChunkView::restamp_into`]).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ContentKey(pub [u8; 16]);

impl Manifest {
    /// The content of row group `row_group` of file `file` under `view`:
    /// the object (the source, its path, size and store tag: an overwritten
    /// object is another), the row group (its index, rows and compressed
    /// bytes), and the tensors it is converted into (the resolved layouts
    /// and the view's tensors, with their columns, casts, fills and list
    /// options). Not the other files: a new day's file leaves every older
    /// file's chunks the same. `None` when the file or row group is not in
    /// this manifest.
    pub fn content_key(&self, view: &View, file: u32, row_group: u32) -> Option<ContentKey> {
        let f = self.files.get(file as usize)?;
        let g = f.row_groups.get(row_group as usize)?;
        let mut h = Canon(Xxh3::new());
        h.str("granary-chunk-content-v1");
        h.str(&self.source);
        h.str(&f.path);
        h.u64(f.size_bytes);
        h.str(&f.version_tag);
        h.u64(u64::from(row_group));
        h.u64(g.rows);
        h.u64(g.compressed_bytes);
        h.layouts(&self.tensors);
        h.view(view);
        Some(ContentKey(h.0.digest128().to_le_bytes()))
    }

    /// The key that seeds batch order ([`PlanKey`]): each file's path
    /// relative to the deepest folder holding every file, its rows per row
    /// group, and the view's tensors (names, dtypes, columns, casts,
    /// fills). Not the source URL, sizes, compressed bytes or store tags:
    /// the same rows in the same files give the same order wherever they
    /// live, however they were compressed.
    pub fn plan_key(&self, view: &View) -> PlanKey {
        let mut h = Canon(Xxh3::new());
        h.str("granary-plan-key-v1");
        let common = common_folder(self.files.iter().map(|f| f.path.as_str()));
        h.u64(self.files.len() as u64);
        for f in &self.files {
            h.str(&f.path[common..]);
            h.u64(f.row_groups.len() as u64);
            for g in &f.row_groups {
                h.u64(g.rows);
            }
        }
        h.view(view);
        PlanKey(h.0.digest())
    }
}

/// The length of the longest folder prefix (up to and including a `/`)
/// that every path shares.
fn common_folder<'a>(mut paths: impl Iterator<Item = &'a str>) -> usize {
    let Some(first) = paths.next() else { return 0 };
    let mut len = first.rfind('/').map_or(0, |i| i + 1);
    for p in paths {
        let shared = first.as_bytes()[..len].iter().zip(p.as_bytes()).take_while(|(a, b)| a == b).count();
        len = first[..shared].rfind('/').map_or(0, |i| i + 1);
    }
    len
}

/// Marks a tensor's `hash` option in [`Canon::view`] ("HASHIDS\0").
const HASH_TAG: u64 = u64::from_le_bytes(*b"HASHIDS\0");

/// Marks a tensor's `cross` option in [`Canon::view`] ("CROSSIDS").
const CROSS_TAG: u64 = u64::from_le_bytes(*b"CROSSIDS");

/// Marks a tensor's `transform` steps in [`Canon::view`] ("TRANSFRM").
const TRANSFORM_TAG: u64 = u64::from_le_bytes(*b"TRANSFRM");

/// Length-prefixed, little-endian canonical encoder feeding a hasher.
struct Canon(Xxh3);

impl Canon {
    /// Resolved tensor layouts: each one's name, dtype and shape.
    fn layouts(&mut self, tensors: &[TensorLayout]) {
        self.u64(tensors.len() as u64);
        for t in tensors {
            self.str(&t.name);
            self.str(t.dtype.name());
            // A jagged tensor's rank carries the top bit, so a dense
            // tensor hashes as it always did and the two never collide.
            self.u64(t.shape.len() as u64 | if t.jagged { 1 << 63 } else { 0 });
            for &d in &t.shape {
                self.u64(u64::from(d));
            }
        }
    }

    /// The view: each tensor's name, dtype, columns, cast and fill.
    fn view(&mut self, view: &View) {
        self.u64(view.tensors.len() as u64);
        for t in &view.tensors {
            self.str(&t.name);
            self.str(t.dtype.name());
            self.u64(t.columns.len() as u64);
            for c in &t.columns {
                self.str(c);
            }
            self.u64(u64::from(t.cast));
            // A tensor without list options hashes as it always did (0 or
            // 1, then the fill); one with them as 2 and 3, then them.
            let options = u64::from(t.has_jagged_options()) * 2;
            match t.fill {
                None => self.u64(options),
                Some(v) => {
                    self.u64(options + 1);
                    self.u64(v.to_bits());
                }
            }
            if t.has_jagged_options() {
                let opt = |v: Option<u32>| v.map_or(0, |n| 1 + u64::from(n));
                self.u64(opt(t.max_len));
                self.u64(opt(t.pad_to));
                self.u64(match t.truncate {
                    None => 0,
                    Some(crate::view::Truncate::KeepFirst) => 1,
                    Some(crate::view::Truncate::KeepLast) => 2,
                });
                self.u64(u64::from(t.null_rows == crate::view::NullRows::Empty));
            }
            // After everything else, and only when declared: a view
            // without it hashes as it always did.
            if let Some(h) = t.hash {
                self.u64(HASH_TAG);
                self.u64(h.buckets);
            }
            if let Some(c) = t.cross {
                self.u64(CROSS_TAG);
                self.u64(c.buckets);
            }
            if !t.transform.is_empty() {
                self.u64(TRANSFORM_TAG);
                self.u64(t.transform.len() as u64);
                for step in &t.transform {
                    self.str(step);
                }
            }
        }
    }

    fn u64(&mut self, v: u64) {
        self.0.update(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.0.update(s.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::view::TensorSpec;

    fn manifest() -> (Manifest, View) {
        let m = Manifest {
            source: "file:///data".into(),
            files: vec![FileEntry {
                path: "a.parquet".into(),
                size_bytes: 100,
                version_tag: "t1".into(),
                row_groups: vec![RowGroupEntry { rows: 10, compressed_bytes: 50, values_bytes: None }],
                footer_sha256: None,
            }],
            tensors: vec![TensorLayout { name: "x".into(), dtype: DType::F32, shape: vec![], jagged: false }],
        };
        let v = View { tensors: vec![TensorSpec::new("x", DType::F32, &["x"])] };
        (m, v)
    }

    #[test]
    fn a_trailing_slash_does_not_change_the_source() {
        assert_eq!(canonical_source("file:///data/"), "file:///data");
        assert_eq!(canonical_source("file:///data"), "file:///data");
        assert_eq!(canonical_source("s3://bucket/prefix//"), "s3://bucket/prefix");
        assert_eq!(canonical_source("s3://bucket"), "s3://bucket");
        assert_eq!(canonical_source("file:///"), "file:///");
    }

    #[test]
    fn a_new_day_leaves_the_older_files_content_and_anything_else_changes_it() {
        let (m, v) = manifest();
        let day1 = m.content_key(&v, 0, 0).expect("in the manifest");
        assert_eq!(m.content_key(&v, 0, 1), None);
        assert_eq!(m.content_key(&v, 1, 0), None);
        // A new file sorted before it: another version, another index,
        // the same content.
        let mut grown = m.clone();
        let mut new_day = grown.files[0].clone();
        new_day.path = "0-new.parquet".into();
        grown.files.insert(0, new_day);
        assert_ne!(grown.version(&v), m.version(&v));
        assert_eq!(grown.content_key(&v, 1, 0), Some(day1));
        assert_ne!(grown.content_key(&v, 0, 0), Some(day1));
        // The object overwritten, another view or source: another content.
        let mut m2 = m.clone();
        m2.files[0].version_tag = "t2".into();
        assert_ne!(m2.content_key(&v, 0, 0), Some(day1));
        let mut v2 = v.clone();
        v2.tensors[0].fill = Some(0.0);
        assert_ne!(m.content_key(&v2, 0, 0), Some(day1));
        let mut m3 = m.clone();
        m3.source = "file:///elsewhere".into();
        assert_ne!(m3.content_key(&v, 0, 0), Some(day1));
    }

    #[test]
    fn version_changes_with_any_input_and_only_then() {
        let (m, v) = manifest();
        let base = m.version(&v);
        assert_eq!(base, m.clone().version(&v.clone()));
        let mut m2 = m.clone();
        m2.files[0].version_tag = "t2".into();
        assert_ne!(base, m2.version(&v));
        let mut v2 = v.clone();
        v2.tensors[0].fill = Some(0.0);
        assert_ne!(base, m.version(&v2));
        let mut m3 = m.clone();
        m3.files[0].row_groups[0].rows = 11;
        assert_ne!(base, m3.version(&v));
    }

    #[test]
    fn the_plan_key_is_the_same_wherever_the_files_live_and_changes_with_their_rows() {
        let (mut m, v) = manifest();
        let second = FileEntry { path: "b.parquet".into(), ..m.files[0].clone() };
        m.files.push(second);
        let here = |source: &str, folder: &str, tag: &str, compressed: u64| {
            let mut c = m.clone();
            c.source = source.into();
            for f in &mut c.files {
                f.path = format!("{folder}{}", f.path);
                f.version_tag = tag.into();
                f.row_groups[0].compressed_bytes = compressed;
            }
            c
        };
        let a = here("file:///data/ads", "data/ads/", "inode-1", 50);
        let b = here("s3://bucket/train/ads", "train/ads/", "\"md5\"", 70);
        assert_eq!(a.plan_key(&v), b.plan_key(&v), "another place, tags, compression: the same order");
        assert_ne!(a.version(&v), b.version(&v), "but another version");
        let mut rows = a.clone();
        rows.files[1].row_groups[0].rows = 11;
        assert_ne!(a.plan_key(&v), rows.plan_key(&v));
        let mut renamed = a.clone();
        renamed.files[1].path = "data/ads/c.parquet".into();
        assert_ne!(a.plan_key(&v), renamed.plan_key(&v));
        let mut view = v.clone();
        view.tensors[0].cast = true;
        assert_ne!(a.plan_key(&v), a.plan_key(&view));
    }

    #[test]
    fn the_common_folder_ends_at_a_slash() {
        assert_eq!(common_folder(["a/b/c.parquet", "a/b/d.parquet"].into_iter()), 4);
        assert_eq!(common_folder(["a/b1/c", "a/b2/c"].into_iter()), 2);
        assert_eq!(common_folder(["x.parquet"].into_iter()), 0);
        assert_eq!(common_folder(["d/x.parquet"].into_iter()), 2);
        assert_eq!(common_folder(std::iter::empty()), 0);
    }
}
