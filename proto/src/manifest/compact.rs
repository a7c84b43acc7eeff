//! The manifest's compact binary form: what the coordinator's log and
//! snapshots carry, and what nodes fetch in pieces.
//!
//! A manifest of a million row groups is tens of megabytes as JSON and
//! about eight as this form: each row group is its rows and compressed
//! bytes as LEB128 varints, and each path is stored as the length it shares
//! with the previous path plus the rest (paths are sorted, so a folder is
//! written once). The form is written field by field, like the version
//! hash, so a dependency upgrade never changes it.
//!
//! Layout (`n` is a varint, `str` a varint length and UTF-8 bytes):
//! - magic `GRMANIF1`;
//! - `source: str`;
//! - tensors: `n`, then per tensor `name: str`, `dtype: str`, flags
//!   (bit 0: jagged), then the shape as `n` and one varint per dimension;
//! - files: `n`, then per file: the path (`shared: n`, `rest: str`), its
//!   size, its version tag (`str`), its footer hash (0: none; 1: `str`;
//!   2: 32 bytes, a lowercase hex SHA-256 packed), then the row groups
//!   (`n`, then per group rows, compressed bytes, and values bytes as 0 for
//!   none or 1 + the value).
//!
//! Decoding never trusts a count: each is checked against the bytes left
//! (every element takes at least one byte) before anything is allocated, and
//! an error names the field and the offset where the bytes went wrong.

use super::{FileEntry, Manifest, RowGroupEntry};
use crate::dtype::DType;
use crate::view::TensorLayout;

/// The first bytes of every compact manifest (the form's version is its
/// last byte).
pub const MAGIC: &[u8; 8] = b"GRMANIF1";

/// Why bytes are not a compact manifest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompactError {
    /// The bytes do not start with [`MAGIC`] (another format or version).
    #[error("not a compact manifest (no GRMANIF1 magic)")]
    Magic,
    /// The bytes end inside `field`.
    #[error("compact manifest ends inside {field} at byte {offset}")]
    Truncated {
        /// What was being read.
        field: &'static str,
        /// Where.
        offset: usize,
    },
    /// `field` holds a value that cannot be.
    #[error("compact manifest: {field} at byte {offset}: {reason}")]
    Malformed {
        /// What was being read.
        field: &'static str,
        /// Where.
        offset: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// Bytes follow the last file.
    #[error("compact manifest: {extra} bytes after the last file")]
    Trailing {
        /// How many.
        extra: usize,
    },
}

impl Manifest {
    /// This manifest in the compact binary form (see the module docs).
    pub fn to_compact(&self) -> Vec<u8> {
        let rgs: usize = self.files.iter().map(|f| f.row_groups.len()).sum();
        let mut w = Writer(Vec::with_capacity(64 + self.files.len() * 48 + rgs * 8));
        w.0.extend_from_slice(MAGIC);
        w.str(&self.source);
        w.n(self.tensors.len() as u64);
        for t in &self.tensors {
            w.str(&t.name);
            w.str(t.dtype.name());
            w.n(u64::from(t.jagged));
            w.n(t.shape.len() as u64);
            for &d in &t.shape {
                w.n(u64::from(d));
            }
        }
        w.n(self.files.len() as u64);
        let mut previous = "";
        for f in &self.files {
            let shared = shared_prefix(previous, &f.path);
            w.n(shared as u64);
            w.str(&f.path[shared..]);
            previous = &f.path;
            w.n(f.size_bytes);
            w.str(&f.version_tag);
            match f.footer_sha256.as_deref() {
                None => w.n(0),
                Some(hex) => match packed_sha256(hex) {
                    Some(raw) => {
                        w.n(2);
                        w.0.extend_from_slice(&raw);
                    }
                    None => {
                        w.n(1);
                        w.str(hex);
                    }
                },
            }
            w.n(f.row_groups.len() as u64);
            for g in &f.row_groups {
                w.n(g.rows);
                w.n(g.compressed_bytes);
                w.n(g.values_bytes.map_or(0, |v| v.saturating_add(1)));
            }
        }
        w.0
    }

    /// Reads a manifest written by [`Manifest::to_compact`], checking every
    /// count and string against the bytes before using it.
    pub fn from_compact(bytes: &[u8]) -> Result<Manifest, CompactError> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(MAGIC.len(), "magic").ok() != Some(&MAGIC[..]) {
            return Err(CompactError::Magic);
        }
        let source = r.str("source")?;
        let count = r.count("tensor count", 3)?;
        let mut tensors = Vec::with_capacity(count);
        for _ in 0..count {
            let name = r.str("tensor name")?;
            let at = r.at;
            let dtype_name = r.str("tensor dtype")?;
            let dtype: DType = dtype_name.parse().map_err(|reason| r.malformed("tensor dtype", at, reason))?;
            let at = r.at;
            let jagged = match r.n("tensor flags")? {
                0 => false,
                1 => true,
                other => return Err(r.malformed("tensor flags", at, format!("unknown flags {other}"))),
            };
            let dims = r.count("tensor rank", 1)?;
            let mut shape = Vec::with_capacity(dims);
            for _ in 0..dims {
                let at = r.at;
                let d = r.n("tensor dimension")?;
                shape.push(u32::try_from(d).map_err(|_| r.malformed("tensor dimension", at, format!("{d} > u32")))?);
            }
            tensors.push(TensorLayout { name, dtype, shape, jagged });
        }
        let count = r.count("file count", 6)?;
        let mut files: Vec<FileEntry> = Vec::with_capacity(count);
        for _ in 0..count {
            let at = r.at;
            let shared = r.n("path prefix")?;
            let previous = files.last().map_or("", |f| f.path.as_str());
            let shared = usize::try_from(shared)
                .ok()
                .filter(|&s| s <= previous.len() && previous.is_char_boundary(s))
                .ok_or_else(|| {
                    r.malformed("path prefix", at, format!("shares {shared} bytes of a {}-byte path", previous.len()))
                })?;
            let mut path = previous[..shared].to_string();
            path.push_str(&r.str("path")?);
            let size_bytes = r.n("file size")?;
            let version_tag = r.str("version tag")?;
            let at = r.at;
            let footer_sha256 = match r.n("footer hash kind")? {
                0 => None,
                1 => Some(r.str("footer hash")?),
                2 => Some(hex(r.take(32, "footer hash")?)),
                other => return Err(r.malformed("footer hash kind", at, format!("unknown kind {other}"))),
            };
            let groups = r.count("row group count", 3)?;
            let mut row_groups = Vec::with_capacity(groups);
            for _ in 0..groups {
                let rows = r.n("row group rows")?;
                let compressed_bytes = r.n("row group bytes")?;
                let values_bytes = r.n("row group values bytes")?.checked_sub(1);
                row_groups.push(RowGroupEntry { rows, compressed_bytes, values_bytes });
            }
            files.push(FileEntry { path, size_bytes, version_tag, row_groups, footer_sha256 });
        }
        if r.at != bytes.len() {
            return Err(CompactError::Trailing { extra: bytes.len() - r.at });
        }
        Ok(Manifest { source, files, tensors })
    }
}

/// Bytes `a` and `b` share at the start, on a character boundary.
fn shared_prefix(a: &str, b: &str) -> usize {
    let n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    (0..=n).rev().find(|&i| b.is_char_boundary(i)).unwrap_or(0)
}

/// A 64-character lowercase hex string as its 32 bytes (`None` otherwise,
/// so that the string is kept as it was written).
fn packed_sha256(hex: &str) -> Option<[u8; 32]> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let b = hex.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = digit(b[2 * i])? << 4 | digit(b[2 * i + 1])?;
    }
    Some(out)
}

fn hex(raw: &[u8]) -> String {
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

struct Writer(Vec<u8>);

impl Writer {
    fn n(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    fn str(&mut self, s: &str) {
        self.n(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn malformed(&self, field: &'static str, offset: usize, reason: impl Into<String>) -> CompactError {
        CompactError::Malformed { field, offset, reason: reason.into() }
    }

    fn take(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], CompactError> {
        let end = self.at.checked_add(len).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or(CompactError::Truncated { field, offset: self.at })?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn n(&mut self, field: &'static str) -> Result<u64, CompactError> {
        let start = self.at;
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.bytes.get(self.at).ok_or(CompactError::Truncated { field, offset: self.at })?;
            self.at += 1;
            let bits = u64::from(b & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(self.malformed(field, start, "varint over 64 bits"));
            }
            v |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.malformed(field, start, "varint over 10 bytes"))
    }

    /// A count of elements that take at least `min_bytes` each: more than
    /// the bytes left could hold is malformed, before anything is allocated.
    fn count(&mut self, field: &'static str, min_bytes: usize) -> Result<usize, CompactError> {
        let at = self.at;
        let n = self.n(field)?;
        let left = (self.bytes.len() - self.at) / min_bytes.max(1);
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= left)
            .ok_or_else(|| self.malformed(field, at, format!("{n} elements in {} bytes", self.bytes.len() - self.at)))
    }

    fn str(&mut self, field: &'static str) -> Result<String, CompactError> {
        let at = self.at;
        let len = self.count(field, 1)?;
        let raw = self.take(len, field)?;
        String::from_utf8(raw.to_vec()).map_err(|_| self.malformed(field, at, "not UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Manifest {
        let sha = "0123456789abcdef".repeat(4);
        Manifest {
            source: "s3://bucket/train".into(),
            files: vec![
                FileEntry {
                    path: "day=1/part-0.parquet".into(),
                    size_bytes: 1 << 30,
                    version_tag: "\"etag-1\"".into(),
                    row_groups: vec![
                        RowGroupEntry { rows: 50_000, compressed_bytes: 64 << 20, values_bytes: None },
                        RowGroupEntry { rows: 1, compressed_bytes: 0, values_bytes: Some(0) },
                    ],
                    footer_sha256: Some(sha),
                },
                FileEntry {
                    path: "day=1/part-1.parquet".into(),
                    size_bytes: 7,
                    version_tag: String::new(),
                    row_groups: vec![],
                    footer_sha256: Some("not hex".into()),
                },
                FileEntry {
                    path: "day=2/é.parquet".into(),
                    size_bytes: 0,
                    version_tag: "t".into(),
                    row_groups: vec![RowGroupEntry { rows: u64::MAX, compressed_bytes: 3, values_bytes: Some(9) }],
                    footer_sha256: None,
                },
            ],
            tensors: vec![
                TensorLayout { name: "x".into(), dtype: DType::F32, shape: vec![3, 4], jagged: false },
                TensorLayout { name: "tokens".into(), dtype: DType::I64, shape: vec![], jagged: true },
            ],
        }
    }

    #[test]
    fn a_manifest_round_trips_and_is_compact() {
        let m = sample();
        let bytes = m.to_compact();
        assert_eq!(Manifest::from_compact(&bytes).unwrap(), m);
        // The second path shares "day=1/part-" with the first.
        assert!(bytes.len() < 200, "{} bytes", bytes.len());
    }

    #[test]
    fn a_million_row_groups_take_about_eight_bytes_each() {
        let files = (0..20_000)
            .map(|f| FileEntry {
                path: format!("train/day={:03}/part-{f:05}.parquet", f / 200),
                size_bytes: 3 << 30,
                version_tag: format!("\"{:032x}\"", f * 7919),
                row_groups: (0..50)
                    .map(|g| RowGroupEntry { rows: 20_000 + g, compressed_bytes: 60_000_000 + g, values_bytes: None })
                    .collect(),
                footer_sha256: Some(format!("{:064x}", f)),
            })
            .collect();
        let m = Manifest { source: "s3://b/train".into(), files, tensors: sample().tensors };
        let bytes = m.to_compact();
        let per_group = bytes.len() as f64 / 1e6;
        assert!(per_group < 12.0, "{per_group} bytes per row group");
        assert_eq!(Manifest::from_compact(&bytes).unwrap(), m);
    }

    #[test]
    fn every_cut_short_or_extended_form_is_an_error() {
        let bytes = sample().to_compact();
        for len in 0..bytes.len() {
            assert!(Manifest::from_compact(&bytes[..len]).is_err(), "cut at {len} decoded");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Manifest::from_compact(&longer), Err(CompactError::Trailing { extra: 1 }));
        let mut other = bytes;
        other[7] = b'2';
        assert_eq!(Manifest::from_compact(&other), Err(CompactError::Magic));
    }

    #[test]
    fn a_huge_count_is_refused_before_allocating() {
        let mut bytes = MAGIC.to_vec();
        bytes.push(0); // empty source
        bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]); // 2^32 - 1 tensors
        match Manifest::from_compact(&bytes) {
            Err(CompactError::Malformed { field: "tensor count", offset: 9, .. }) => {}
            other => panic!("{other:?}"),
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut bytes = MAGIC.to_vec();
            bytes.extend_from_slice(&tail);
            let _ = Manifest::from_compact(&bytes);
        }

        #[test]
        fn any_byte_flipped_is_an_error_or_another_manifest(at in any::<prop::sample::Index>(), bit in 0u8..8) {
            let m = sample();
            let mut bytes = m.to_compact();
            let i = at.index(bytes.len());
            bytes[i] ^= 1 << bit;
            if let Ok(other) = Manifest::from_compact(&bytes) {
                prop_assert_ne!(other, m);
            }
        }
    }
}
