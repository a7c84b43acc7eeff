//! Which chunk the tier holds for each content ([`ContentKey`]): when a
//! new version of a dataset keeps an older version's file and view, its
//! shard's chunk is the older one's, restamped, instead of a remote read
//! and a conversion (issue 43).
//!
//! The index maps a content to the key it was stored under. With an SSD
//! tier it is kept beside it, in `content-index`: 40-byte records
//! appended as chunks enter the tier (content, dataset version, file,
//! row group), read back when the node starts, so a node restarted with a
//! new day's file added finds the older days' chunks on its SSD. A record
//! cut short by a crash is ignored; an entry whose chunk the tier no
//! longer holds is a miss like any other. The file is rewritten from the
//! map when it holds more than twice the entries the map does.

use crate::tier::ChunkKey;
use granary_proto::manifest::ContentKey;
use granary_proto::{DatasetVersion, ShardId};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The file in the SSD folder.
pub(crate) const FILE_NAME: &str = "content-index";

/// Bytes of one record.
const RECORD: usize = 40;

/// Entries kept at most; past it the oldest half of the map is dropped
/// (a miss, then a conversion, for their contents).
const MAX_ENTRIES: usize = 1 << 22;

/// Content to tier key, in memory and (with an SSD tier) on disk.
pub(crate) struct ContentIndex {
    inner: Mutex<Inner>,
}

struct Inner {
    map: HashMap<ContentKey, (ChunkKey, u64)>,
    /// Insertion counter, for dropping the oldest half.
    tick: u64,
    /// The file and the records it holds.
    file: Option<(PathBuf, std::fs::File, usize)>,
}

fn encode(content: ContentKey, key: ChunkKey) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    r[..16].copy_from_slice(&content.0);
    r[16..32].copy_from_slice(&key.version.0);
    r[32..36].copy_from_slice(&key.shard.file.to_le_bytes());
    r[36..40].copy_from_slice(&key.shard.row_group.to_le_bytes());
    r
}

fn decode(r: &[u8]) -> Option<(ContentKey, ChunkKey)> {
    let r: &[u8; RECORD] = r.try_into().ok()?;
    let word = |i: usize| u32::from_le_bytes([r[i], r[i + 1], r[i + 2], r[i + 3]]);
    let content = ContentKey(r[..16].try_into().ok()?);
    let version = DatasetVersion(r[16..32].try_into().ok()?);
    Some((content, ChunkKey { version, shard: ShardId { file: word(32), row_group: word(36) } }))
}

impl ContentIndex {
    /// An index in memory only (no SSD tier).
    pub(crate) fn in_memory() -> Self {
        Self { inner: Mutex::new(Inner { map: HashMap::new(), tick: 0, file: None }) }
    }

    /// The index kept in `dir` (the SSD folder): its records read back, a
    /// cut-short last one ignored. An unreadable file is started afresh
    /// (logged): the index is a cache of what the tier holds.
    pub(crate) fn open(dir: &Path) -> Self {
        let path = dir.join(FILE_NAME);
        let mut bytes = Vec::new();
        if let Ok(mut f) = std::fs::File::open(&path)
            && let Err(e) = f.read_to_end(&mut bytes)
        {
            tracing::warn!(path = %path.display(), error = %e, "content index unreadable; starting it afresh");
            bytes.clear();
        }
        let mut inner = Inner { map: HashMap::new(), tick: 0, file: None };
        for r in bytes.chunks_exact(RECORD) {
            if let Some((content, key)) = decode(r) {
                inner.tick += 1;
                inner.map.insert(content, (key, inner.tick));
            }
        }
        match inner.rewrite(path.clone()) {
            Ok(()) => {}
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "content index not kept on disk"),
        }
        Self { inner: Mutex::new(inner) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The key the tier holds `content` under, if it was stored.
    pub(crate) fn lookup(&self, content: ContentKey) -> Option<ChunkKey> {
        self.lock().map.get(&content).map(|(k, _)| *k)
    }

    /// `key`'s chunk, of `content`, entered the tier.
    pub(crate) fn record(&self, content: ContentKey, key: ChunkKey) {
        let mut inner = self.lock();
        if inner.map.get(&content).is_some_and(|(k, _)| *k == key) {
            return;
        }
        inner.tick += 1;
        let tick = inner.tick;
        inner.map.insert(content, (key, tick));
        if inner.map.len() > MAX_ENTRIES {
            let cut = tick - (MAX_ENTRIES as u64) / 2;
            inner.map.retain(|_, (_, t)| *t > cut);
        }
        let entries = inner.map.len();
        let Some((path, file, records)) = inner.file.as_mut() else { return };
        let appended = file.write_all(&encode(content, key));
        *records += 1;
        let (path, over) = (path.clone(), *records > 2 * entries + 1024);
        if let Err(e) = appended.and_then(|()| if over { inner.rewrite(path.clone()) } else { Ok(()) }) {
            tracing::warn!(path = %path.display(), error = %e, "content index not kept on disk from here");
            inner.file = None;
        }
    }

    /// Entries held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().map.len()
    }
}

impl Inner {
    /// Writes the map to `path` anew (through a temporary file renamed
    /// over it) and appends from there.
    fn rewrite(&mut self, path: PathBuf) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        let mut out = Vec::with_capacity(self.map.len() * RECORD);
        let mut entries: Vec<_> = self.map.iter().collect();
        entries.sort_by_key(|(_, (_, t))| *t);
        for (content, (key, _)) in entries {
            out.extend_from_slice(&encode(*content, *key));
        }
        std::fs::write(&tmp, &out)?;
        std::fs::rename(&tmp, &path)?;
        let file = std::fs::OpenOptions::new().append(true).open(&path)?;
        self.file = Some((path, file, self.map.len()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(v: u8, file: u32) -> ChunkKey {
        ChunkKey { version: DatasetVersion([v; 16]), shard: ShardId { file, row_group: 0 } }
    }

    #[test]
    fn records_come_back_after_a_restart_and_a_cut_record_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let index = ContentIndex::open(dir.path());
        index.record(ContentKey([1; 16]), key(1, 0));
        index.record(ContentKey([2; 16]), key(1, 1));
        index.record(ContentKey([1; 16]), key(2, 3));
        index.record(ContentKey([1; 16]), key(2, 3));
        drop(index);
        // A crash mid-append: half a record at the end.
        let path = dir.path().join(FILE_NAME);
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[7u8; 17]).unwrap();
        let again = ContentIndex::open(dir.path());
        assert_eq!(again.lookup(ContentKey([1; 16])), Some(key(2, 3)), "the latest record wins");
        assert_eq!(again.lookup(ContentKey([2; 16])), Some(key(1, 1)));
        assert_eq!(again.lookup(ContentKey([3; 16])), None);
        assert_eq!(again.len(), 2);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * RECORD as u64, "rewritten whole at start");
    }

    #[test]
    fn an_index_in_memory_keeps_nothing_on_disk() {
        let index = ContentIndex::in_memory();
        index.record(ContentKey([1; 16]), key(1, 0));
        assert_eq!(index.lookup(ContentKey([1; 16])), Some(key(1, 0)));
    }
}
