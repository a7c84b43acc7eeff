//! Which chunk the tier holds for each content ([`ContentKey`]): when a
//! new version of a dataset keeps an older version's file and view, its
//! shard's chunk is the older one's, restamped, instead of a remote read
//! and a conversion (issue 43).
//!
//! The index maps a content to the key it was stored under. With an SSD
//! tier it is kept beside it, in `content-index`: a file of fixed-size
//! slots whose whole length is reserved when the node starts, as the
//! tier's own files are (a filesystem that fills up later cannot fail a
//! write to it). Each slot holds one record (content, dataset version,
//! file, row group, and a sequence number; 0: empty), written in place,
//! round the file: when every slot is used the oldest record is
//! overwritten. The records are read back when the node starts, so a node
//! restarted with a new day's file added finds the older days' chunks on
//! its SSD. A slot cut short by a crash fails its check and is ignored; an
//! entry whose chunk the tier no longer holds is a miss like any other.

use crate::tier::ChunkKey;
use granary_proto::manifest::ContentKey;
use granary_proto::{DatasetVersion, ShardId};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The file in the SSD folder.
pub(crate) const FILE_NAME: &str = "content-index";

/// Bytes of one slot: content 16, version 16, file 4, row group 4,
/// sequence 8, check 8.
const RECORD: usize = 56;

/// Slots the file holds at most (56 MiB): enough for 1M chunks.
const MAX_SLOTS: u64 = 1 << 20;

/// Entries kept in memory at most; past it the oldest half is dropped (a
/// miss, then a conversion, for their contents).
const MAX_ENTRIES: usize = 1 << 20;

/// Content to tier key, in memory and (with an SSD tier) on disk.
pub(crate) struct ContentIndex {
    inner: Mutex<Inner>,
}

struct Inner {
    map: HashMap<ContentKey, (ChunkKey, u64)>,
    /// The sequence number of the last record.
    seq: u64,
    /// The file and its slot count, while records are kept on disk.
    file: Option<(PathBuf, std::fs::File, u64)>,
}

fn encode(content: ContentKey, key: ChunkKey, seq: u64) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    r[..16].copy_from_slice(&content.0);
    r[16..32].copy_from_slice(&key.version.0);
    r[32..36].copy_from_slice(&key.shard.file.to_le_bytes());
    r[36..40].copy_from_slice(&key.shard.row_group.to_le_bytes());
    r[40..48].copy_from_slice(&seq.to_le_bytes());
    let check = xxhash_rust::xxh3::xxh3_64(&r[..48]);
    r[48..56].copy_from_slice(&check.to_le_bytes());
    r
}

/// A slot's record and its sequence number; `None` for an empty slot or
/// one that fails its check.
fn decode(r: &[u8]) -> Option<(ContentKey, ChunkKey, u64)> {
    let r: &[u8; RECORD] = r.try_into().ok()?;
    let word = |i: usize| u32::from_le_bytes([r[i], r[i + 1], r[i + 2], r[i + 3]]);
    let seq = u64::from_le_bytes(r[40..48].try_into().ok()?);
    let check = u64::from_le_bytes(r[48..56].try_into().ok()?);
    if seq == 0 || check != xxhash_rust::xxh3::xxh3_64(&r[..48]) {
        return None;
    }
    let content = ContentKey(r[..16].try_into().ok()?);
    let version = DatasetVersion(r[16..32].try_into().ok()?);
    Some((content, ChunkKey { version, shard: ShardId { file: word(32), row_group: word(36) } }, seq))
}

impl ContentIndex {
    /// An index in memory only (no SSD tier).
    pub(crate) fn in_memory() -> Self {
        Self { inner: Mutex::new(Inner { map: HashMap::new(), seq: 0, file: None }) }
    }

    /// The index kept in `dir` (the SSD folder), with room for `slots`
    /// records (at most [`MAX_SLOTS`]): its records read back, and the
    /// file's length reserved. A file that cannot be read or reserved is
    /// not kept (logged): the index is a cache of what the tier holds.
    pub(crate) fn open(dir: &Path, slots: u64) -> Self {
        let path = dir.join(FILE_NAME);
        let slots = slots.clamp(1, MAX_SLOTS);
        let mut inner = Inner { map: HashMap::new(), seq: 0, file: None };
        let mut bytes = Vec::new();
        if let Ok(mut f) = std::fs::File::open(&path)
            && let Err(e) = f.read_to_end(&mut bytes)
        {
            tracing::warn!(path = %path.display(), error = %e, "content index unreadable; starting it afresh");
            bytes.clear();
        }
        let mut records: Vec<_> = bytes.chunks_exact(RECORD).filter_map(decode).collect();
        records.sort_by_key(|(_, _, seq)| *seq);
        // A smaller file than before keeps the newest records.
        let keep = records.len().saturating_sub(slots as usize);
        for (content, key, seq) in records.drain(keep..) {
            inner.seq = inner.seq.max(seq);
            inner.map.insert(content, (key, seq));
        }
        match reserve(&path, slots, &inner) {
            Ok(file) => inner.file = Some((path, file, slots)),
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
        inner.seq += 1;
        let seq = inner.seq;
        inner.map.insert(content, (key, seq));
        if inner.map.len() > MAX_ENTRIES {
            let cut = seq - (MAX_ENTRIES as u64) / 2;
            inner.map.retain(|_, (_, s)| *s > cut);
        }
        let Some((path, file, slots)) = inner.file.as_ref() else { return };
        let at = (seq - 1) % slots * RECORD as u64;
        if let Err(e) = std::os::unix::fs::FileExt::write_all_at(file, &encode(content, key, seq), at) {
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

/// The index file at `path`, `slots` slots long and its length allocated,
/// holding `inner`'s records in the slots their sequence numbers give.
fn reserve(path: &Path, slots: u64, inner: &Inner) -> std::io::Result<std::fs::File> {
    let len = slots * RECORD as u64;
    let mut out = vec![0u8; len as usize];
    for (content, (key, seq)) in &inner.map {
        let at = ((seq - 1) % slots) as usize * RECORD;
        out[at..at + RECORD].copy_from_slice(&encode(*content, *key, *seq));
    }
    let tmp = path.with_extension("tmp");
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&tmp)?;
    match rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, len) {
        Ok(()) | Err(rustix::io::Errno::OPNOTSUPP) => {}
        Err(e) => return Err(e.into()),
    }
    std::os::unix::fs::FileExt::write_all_at(&file, &out, 0)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(v: u8, file: u32) -> ChunkKey {
        ChunkKey { version: DatasetVersion([v; 16]), shard: ShardId { file, row_group: 0 } }
    }

    #[test]
    fn records_come_back_after_a_restart_and_a_torn_one_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let index = ContentIndex::open(dir.path(), 8);
        index.record(ContentKey([1; 16]), key(1, 0));
        index.record(ContentKey([2; 16]), key(1, 1));
        index.record(ContentKey([1; 16]), key(2, 3));
        index.record(ContentKey([1; 16]), key(2, 3));
        index.record(ContentKey([4; 16]), key(1, 4));
        drop(index);
        let path = dir.path().join(FILE_NAME);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 8 * RECORD as u64, "the whole length reserved");
        // A crash in the middle of the fourth record's write.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[7u8; 9], 3 * RECORD as u64 + 20).unwrap();
        let again = ContentIndex::open(dir.path(), 8);
        assert_eq!(again.lookup(ContentKey([1; 16])), Some(key(2, 3)), "the later record wins");
        assert_eq!(again.lookup(ContentKey([2; 16])), Some(key(1, 1)));
        assert_eq!(again.lookup(ContentKey([4; 16])), None, "its slot was torn");
        assert_eq!(again.len(), 2);
    }

    #[test]
    fn a_full_file_overwrites_its_oldest_records() {
        let dir = tempfile::tempdir().unwrap();
        let index = ContentIndex::open(dir.path(), 3);
        for n in 0..5u8 {
            index.record(ContentKey([n; 16]), key(1, u32::from(n)));
        }
        drop(index);
        let again = ContentIndex::open(dir.path(), 3);
        let kept: Vec<bool> = (0..5u8).map(|n| again.lookup(ContentKey([n; 16])).is_some()).collect();
        assert_eq!(kept, [false, false, true, true, true]);
        again.record(ContentKey([9; 16]), key(1, 9));
        drop(again);
        let smaller = ContentIndex::open(dir.path(), 2);
        assert_eq!(smaller.len(), 2, "a smaller file keeps the newest");
        assert!(smaller.lookup(ContentKey([9; 16])).is_some() && smaller.lookup(ContentKey([4; 16])).is_some());
    }

    #[test]
    fn an_index_in_memory_keeps_nothing_on_disk() {
        let index = ContentIndex::in_memory();
        index.record(ContentKey([1; 16]), key(1, 0));
        assert_eq!(index.lookup(ContentKey([1; 16])), Some(key(1, 0)));
    }
}
