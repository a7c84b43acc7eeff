//! The RAM/SSD chunk tier, on foyer's hybrid cache.
//!
//! RAM holds [`SealedChunk`]s weighted by their byte length; with an SSD
//! folder, every chunk is also written to foyer's block engine when it is
//! inserted (write-on-insertion), so a restarted node recovers its chunks
//! from disk instead of reading remote storage again.
//!
//! foyer drops a disk write silently when its flush buffers are full. To
//! make "admitted to SSD" mean "written to SSD", inserts that go to disk are
//! serialised and each waits for the engine to finish flushing before the
//! next is submitted, so the submit queue never holds more than one chunk
//! and the buffer pool (one block: the largest chunk) never
//! overflows. Disk writes happen off the request path.
//!
//! Everything read back from disk is validated as a chunk (header and
//! payload checksum) while it is decoded, and must be the chunk of the key
//! asked for (dataset version and shard in its header); a corrupt or
//! misplaced entry is reported as [`TierError::Corrupt`], removed, and the
//! caller reads the shard again.

use crate::shm::SealedChunk;
use foyer::{
    BlockEngineConfig, CacheProperties, Code, DeviceBuilder, FsDeviceBuilder, Hint, HybridCache, HybridCacheBuilder,
    HybridCachePolicy, LruConfig, RecoverMode, Source,
};
use granary_proto::chunk::Verify;
use granary_proto::{ChunkView, DatasetVersion, ShardId};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Cache key: one shard of one dataset version.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub(crate) struct ChunkKey {
    /// Dataset version.
    pub version: DatasetVersion,
    /// Shard.
    pub shard: ShardId,
}

impl Code for ChunkKey {
    fn encode(&self, w: &mut impl Write) -> foyer::Result<()> {
        w.write_all(&self.version.0).map_err(foyer::Error::io_error)?;
        w.write_all(&self.shard.file.to_le_bytes()).map_err(foyer::Error::io_error)?;
        w.write_all(&self.shard.row_group.to_le_bytes()).map_err(foyer::Error::io_error)
    }

    fn decode(r: &mut impl Read) -> foyer::Result<Self> {
        let mut b = [0u8; 24];
        r.read_exact(&mut b).map_err(foyer::Error::io_error)?;
        let mut v = [0u8; 16];
        v.copy_from_slice(&b[..16]);
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Ok(Self { version: DatasetVersion(v), shard: ShardId { file: word(16), row_group: word(20) } })
    }

    fn estimated_size(&self) -> usize {
        24
    }
}

/// Cache value: a sealed chunk.
#[derive(Clone, Debug)]
pub(crate) struct ChunkValue(pub Arc<SealedChunk>);

/// Largest chunk accepted back from disk (bounds a corrupt length prefix).
const MAX_CHUNK_BYTES: u64 = 4 << 30;

impl Code for ChunkValue {
    fn encode(&self, w: &mut impl Write) -> foyer::Result<()> {
        let bytes = self.0.bytes();
        w.write_all(&(bytes.len() as u64).to_le_bytes()).map_err(foyer::Error::io_error)?;
        w.write_all(bytes).map_err(foyer::Error::io_error)
    }

    fn decode(r: &mut impl Read) -> foyer::Result<Self> {
        let corrupt = |m: String| foyer::Error::io_error(std::io::Error::new(std::io::ErrorKind::InvalidData, m));
        let mut len = [0u8; 8];
        r.read_exact(&mut len).map_err(foyer::Error::io_error)?;
        let len = u64::from_le_bytes(len);
        if len == 0 || len > MAX_CHUNK_BYTES {
            return Err(corrupt(format!("cached chunk claims {len} bytes")));
        }
        let mut w = crate::shm::ChunkWriter::new(len as usize).map_err(foyer::Error::io_error)?;
        r.read_exact(w.as_mut_slice()).map_err(foyer::Error::io_error)?;
        ChunkView::parse(w.as_mut_slice(), Verify::Full)
            .map_err(|e| corrupt(format!("cached chunk is corrupt: {e}")))?;
        Ok(Self(Arc::new(w.seal().map_err(foyer::Error::io_error)?)))
    }

    fn estimated_size(&self) -> usize {
        8 + self.0.len()
    }
}

/// Where a hit came from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum HitTier {
    /// The RAM tier.
    Ram,
    /// The SSD tier.
    Ssd,
}

/// A tier operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TierError {
    /// The SSD folder cannot be used.
    #[error("SSD tier at {dir}: {reason}")]
    Open {
        /// The folder.
        dir: PathBuf,
        /// Why.
        reason: String,
    },
    /// A disk entry failed validation; it has been removed.
    #[error("SSD entry for {shard} is corrupt: {reason}")]
    Corrupt {
        /// The shard.
        shard: ShardId,
        /// What was wrong.
        reason: String,
    },
}

/// SSD settings.
#[derive(Clone, Debug)]
pub(crate) struct SsdConfig {
    /// Folder of the block files.
    pub dir: PathBuf,
    /// Capacity in bytes.
    pub capacity_bytes: u64,
    /// Block size: the largest chunk stored.
    pub block_bytes: u64,
}

/// The RAM/SSD tier.
pub(crate) struct ChunkTier {
    cache: HybridCache<ChunkKey, ChunkValue>,
    ssd: Option<SsdConfig>,
    disk_turn: tokio::sync::Mutex<()>,
}

impl ChunkTier {
    /// Opens the tier; with `ssd`, recovers the chunks already on disk.
    pub(crate) async fn open(ram_bytes: u64, ssd: Option<SsdConfig>) -> Result<Self, TierError> {
        let builder = HybridCacheBuilder::new()
            .with_name("granary-chunks")
            .with_policy(HybridCachePolicy::WriteOnInsertion)
            .memory(ram_bytes as usize)
            // One shard: foyer splits the capacity evenly between shards,
            // and the tier holds few, large chunks (one lookup per chunk
            // request, so there is no contention to spread).
            .with_shards(1)
            .with_weighter(|_k: &ChunkKey, v: &ChunkValue| v.0.len())
            .storage();
        let cache = match &ssd {
            None => builder.build().await,
            Some(s) => {
                let err = |reason: String| TierError::Open { dir: s.dir.clone(), reason };
                if s.block_bytes < 2 * FOYER_PAGE || !s.block_bytes.is_multiple_of(FOYER_PAGE) {
                    return Err(err(format!(
                        "ssd_block_bytes is {}: it must be a multiple of {FOYER_PAGE} and at least {}",
                        s.block_bytes,
                        2 * FOYER_PAGE
                    )));
                }
                if s.capacity_bytes < 2 * s.block_bytes {
                    return Err(err(format!(
                        "ssd_bytes ({}) holds fewer than two blocks of ssd_block_bytes ({})",
                        s.capacity_bytes, s.block_bytes
                    )));
                }
                std::fs::create_dir_all(&s.dir).map_err(|e| err(e.to_string()))?;
                // Probe writability with a real file: foyer's errors for an
                // unwritable folder are less specific. An empty one: a
                // restarted node whose filesystem filled up meanwhile holds
                // its space already (its files are reserved), and a byte
                // written here would fail it for nothing (`granary-chaos
                // run`'s fill_ssd fault).
                let probe = s.dir.join(".granary-write-probe");
                std::fs::File::create(&probe).map_err(|e| err(format!("not writable: {e}")))?;
                let _ = std::fs::remove_file(&probe);
                check_free_space(&s.dir, s.capacity_bytes).map_err(err)?;
                // Direct I/O: chunks are written once and read rarely, so
                // copying them through the page cache only costs CPU and
                // memory that the trainers need.
                let device = FsDeviceBuilder::new(&s.dir)
                    .with_capacity(s.capacity_bytes as usize)
                    .with_direct(true)
                    .build()
                    .map_err(|e| err(e.to_string()))?;
                let block = s.block_bytes as usize;
                builder
                    .with_engine_config(
                        BlockEngineConfig::new(device)
                            .with_block_size(block)
                            .with_buffer_pool_size(block)
                            .with_submit_queue_size_threshold(2 * block),
                    )
                    .with_recover_mode(RecoverMode::Quiet)
                    .build()
                    .await
            }
        }
        .map_err(|e| TierError::Open {
            dir: ssd.as_ref().map(|s| s.dir.clone()).unwrap_or_default(),
            reason: e.to_string(),
        })?;
        if let Some(s) = &ssd
            && let Err(reason) = reserve_files(&s.dir)
        {
            let _ = cache.close().await;
            return Err(TierError::Open { dir: s.dir.clone(), reason });
        }
        Ok(Self { cache, ssd, disk_turn: tokio::sync::Mutex::new(()) })
    }

    /// Looks a chunk up in RAM, then on SSD.
    pub(crate) async fn get(&self, key: ChunkKey) -> Result<Option<(Arc<SealedChunk>, HitTier)>, TierError> {
        match self.cache.get(&key).await {
            Ok(Some(e)) if e.source() == Source::Disk => {
                // What the disk gives back must be the chunk asked for, not
                // only a valid chunk: foyer finds entries by the key's hash,
                // and a file can be damaged or swapped (issue 29).
                let chunk = e.value().0.clone();
                let header = ChunkView::parse(chunk.bytes(), Verify::HeaderOnly).map(|v| {
                    let h = v.header();
                    (h.dataset_version, h.shard)
                });
                match header {
                    Ok((version, shard)) if version == key.version && shard == key.shard => {
                        Ok(Some((chunk, HitTier::Ssd)))
                    }
                    found => {
                        self.cache.remove(&key);
                        let reason = match found {
                            Ok((version, shard)) => format!("it holds {shard} of version {version}"),
                            Err(e) => e.to_string(),
                        };
                        Err(TierError::Corrupt { shard: key.shard, reason })
                    }
                }
            }
            Ok(Some(e)) => Ok(Some((e.value().0.clone(), HitTier::Ram))),
            Ok(None) => Ok(None),
            Err(e) => {
                self.cache.remove(&key);
                Err(TierError::Corrupt { shard: key.shard, reason: e.to_string() })
            }
        }
    }

    /// Inserts a chunk into RAM and, with an SSD tier, writes it to disk
    /// before returning. Chunks larger than the SSD block size stay in RAM
    /// only (logged).
    pub(crate) async fn insert(&self, key: ChunkKey, chunk: Arc<SealedChunk>) {
        let Some(ssd) = &self.ssd else {
            self.cache.insert(key, ChunkValue(chunk));
            return;
        };
        if !fits_block(chunk.len() as u64, ssd.block_bytes) {
            tracing::warn!(shard = %key.shard, bytes = chunk.len(), block = ssd.block_bytes,
                "chunk is larger than the SSD block size; kept in RAM only (raise ssd_block_bytes)");
            self.cache.memory().insert(key, ChunkValue(chunk));
            return;
        }
        let _turn = self.disk_turn.lock().await;
        self.cache.insert(key, ChunkValue(chunk));
        self.cache.storage().wait().await;
    }

    /// True when the chunk is in RAM or (probably) on SSD.
    pub(crate) fn contains(&self, key: ChunkKey) -> bool {
        self.cache.contains(&key)
    }

    /// Drops a chunk from RAM and SSD (a collected version's).
    pub(crate) fn remove(&self, key: ChunkKey) {
        self.cache.remove(&key);
    }

    /// Whether chunks outlive the process (an SSD tier is configured).
    pub(crate) fn has_ssd(&self) -> bool {
        self.ssd.is_some()
    }

    /// Flushes and closes the tier.
    pub(crate) async fn close(&self) {
        if let Err(e) = self.cache.close().await {
            tracing::warn!(error = %e, "closing the chunk tier");
        }
    }
}

/// foyer's I/O page: block sizes and entries are multiples of it.
const FOYER_PAGE: u64 = 4096;

/// Whether foyer's block engine stores a chunk of `len` bytes in blocks of
/// `block` bytes. An entry is foyer's 36-byte header, our 24-byte key and
/// our 8-byte length prefix plus the chunk, rounded up to a page, and must
/// fit a block less its 4 KiB blob index (foyer-storage 0.22
/// `Buffer::push`, `max_entry_size`). A larger entry is dropped by foyer
/// without an error, so the tier must not rely on it being written.
fn fits_block(len: u64, block: u64) -> bool {
    let entry = (36 + 24 + 8 + len).div_ceil(FOYER_PAGE) * FOYER_PAGE;
    entry + FOYER_PAGE <= block
}

/// Bytes the files directly in `dir` occupy on disk.
fn allocated_in(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries.flatten().filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.blocks() * 512).sum()
}

/// Refuses an SSD capacity the filesystem cannot hold: free space plus what
/// the tier's files already occupy (a restarted node) must cover it.
fn check_free_space(dir: &Path, capacity: u64) -> Result<(), String> {
    let st = rustix::fs::statvfs(dir).map_err(|e| format!("statvfs: {e}"))?;
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    let held = allocated_in(dir);
    if free.saturating_add(held) < capacity {
        return Err(format!(
            "ssd_bytes is {capacity} but the filesystem has {free} bytes free (and the tier's files hold {held}); \
             lower ssd_bytes or free space"
        ));
    }
    Ok(())
}

/// Allocates every byte of the block files foyer created in `dir`.
///
/// foyer creates them sparse (`set_len`), so a filesystem that fills up
/// later (another process, a smaller disk than configured) fails its writes
/// with ENOSPC, and foyer 0.22's block manager then panics on its tasks and
/// poisons its state (`assertion failed: inserted` in `on_writing_finish`):
/// the SSD tier stops working. Reserving the space up front means writes
/// into the files never need new disk blocks. A filesystem without
/// `fallocate` keeps the sparse files, with a warning.
fn reserve_files(dir: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("listing: {e}"))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() || meta.len() == 0 {
            continue;
        }
        let file =
            std::fs::OpenOptions::new().write(true).open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        match rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, meta.len()) {
            Ok(()) => {}
            Err(rustix::io::Errno::OPNOTSUPP) => {
                tracing::warn!(dir = %dir.display(),
                    "the filesystem cannot reserve space (no fallocate); if it fills up, the SSD tier stops storing chunks");
                return Ok(());
            }
            Err(e) => {
                return Err(format!(
                    "reserving {} bytes for {}: {e}; lower ssd_bytes or free space",
                    meta.len(),
                    path.display()
                ));
            }
        }
    }
    Ok(())
}

/// Guest copies: chunks of shards other nodes own, fetched from them, kept
/// in RAM only and bounded in bytes on their own, so they are always
/// evicted before any chunk this node owns (they never compete with the
/// owned tier) and never written to SSD.
pub(crate) struct GuestArea {
    cache: foyer::Cache<ChunkKey, Arc<SealedChunk>>,
}

impl GuestArea {
    /// An area of `capacity_bytes` (0 keeps no guest copies).
    pub(crate) fn new(capacity_bytes: u64) -> Self {
        // One shard: foyer splits the capacity evenly between shards, and a
        // guest area holds a few large chunks (accessed once per chunk
        // request, so there is no contention to spread). LRU: copies are
        // fetched for upcoming reads, so the least recently used one is the
        // one most likely consumed already, and a new copy is never refused
        // for being seen less often than old ones.
        let cache = foyer::CacheBuilder::new(capacity_bytes.max(1) as usize)
            .with_shards(1)
            // Regular copies all in the high-priority pool; copies fetched
            // ahead (low priority) are evicted first.
            .with_eviction_config(LruConfig { high_priority_pool_ratio: 1.0 })
            .with_name("guests")
            .with_weighter(|_k: &ChunkKey, v: &Arc<SealedChunk>| v.len())
            .build();
        Self { cache }
    }

    /// The guest copy of `key`, if kept. `now`: a copy kept for a later
    /// epoch is needed now, so it becomes a regular copy.
    pub(crate) fn get(&self, key: ChunkKey, now: bool) -> Option<Arc<SealedChunk>> {
        let e = self.cache.get(&key)?;
        let chunk = e.value().clone();
        if now && e.properties().hint() == Hint::Low {
            drop(e);
            self.cache.insert_with_properties(key, chunk.clone(), CacheProperties::default().with_hint(Hint::Normal));
        }
        Some(chunk)
    }

    /// Keeps a guest copy. Copies fetched ahead for a later epoch
    /// (`ahead`) are evicted before any other (least recently used first
    /// among each kind), so looking ahead never pushes out a copy an epoch
    /// in progress needs.
    pub(crate) fn insert(&self, key: ChunkKey, chunk: Arc<SealedChunk>, ahead: bool) {
        if chunk.len() as u64 <= self.cache.capacity() as u64 {
            let hint = if ahead { Hint::Low } else { Hint::Normal };
            self.cache.insert_with_properties(key, chunk, CacheProperties::default().with_hint(hint));
        }
    }

    /// True when a guest copy of `key` is kept.
    pub(crate) fn contains(&self, key: ChunkKey) -> bool {
        self.cache.contains(&key)
    }

    /// Drops a guest copy (a collected version's).
    pub(crate) fn remove(&self, key: ChunkKey) {
        self.cache.remove(&key);
    }

    /// Drops every guest copy (a peer that sent some was quarantined).
    pub(crate) fn clear(&self) {
        self.cache.clear();
    }

    /// Capacity in bytes.
    pub(crate) fn capacity_bytes(&self) -> u64 {
        self.cache.capacity() as u64
    }

    /// Bytes of guest copies held.
    pub(crate) fn usage_bytes(&self) -> u64 {
        self.cache.usage() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> ChunkKey {
        ChunkKey { version: DatasetVersion([7; 16]), shard: ShardId { file: 0, row_group: i } }
    }

    fn chunk(len: usize) -> Arc<SealedChunk> {
        Arc::new(SealedChunk::copy_of(&vec![1u8; len]).expect("memory file"))
    }

    /// A valid chunk of exactly `len` bytes (a multiple of 64): one u8
    /// tensor whose rows fill the payload.
    fn chunk_of_len(len: usize, shard: ShardId) -> Arc<SealedChunk> {
        use granary_proto::{ChunkLayout, DType, TensorLayout};
        let t = [TensorLayout { name: "b".into(), dtype: DType::U8, shape: vec![], jagged: false }];
        let version = DatasetVersion([7; 16]);
        let empty = ChunkLayout::new(version, shard, 0, &t).expect("layout").total_len();
        let layout = ChunkLayout::new(version, shard, (len - empty) as u64, &t).expect("layout");
        assert_eq!(layout.total_len(), len);
        let mut buf = vec![0u8; len];
        buf[layout.tensor_range(0)].fill(9);
        layout.seal(&mut buf).expect("seal");
        Arc::new(SealedChunk::copy_of(&buf).expect("memory file"))
    }

    /// The largest chunk `fits_block` admits is really written: it is
    /// there after the tier is closed and opened again.
    #[tokio::test]
    async fn the_largest_chunk_a_block_admits_is_on_disk_after_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let block = 1u64 << 20;
        let ssd = SsdConfig { dir: dir.path().to_path_buf(), capacity_bytes: 4 * block, block_bytes: block };
        let largest = (0..block / 64).rev().map(|k| k * 64).find(|&n| fits_block(n, block)).expect("some size");
        assert!(!fits_block(largest + 64, block));
        let tier = ChunkTier::open(1, Some(ssd.clone())).await.expect("tier");
        tier.insert(key(1), chunk_of_len(largest as usize, key(1).shard)).await;
        tier.close().await;
        drop(tier);
        let tier = ChunkTier::open(1, Some(ssd)).await.expect("reopened");
        let (got, from) = tier.get(key(1)).await.expect("read").expect("on disk");
        assert_eq!((got.len() as u64, from), (largest, HitTier::Ssd));
    }

    /// Issue 29: a valid chunk read back from disk under another shard's
    /// key (a damaged or swapped file, a hash collision) is refused as
    /// corrupt, naming what it holds, and removed; before, any valid chunk
    /// was served as the key's.
    #[tokio::test]
    async fn a_disk_entry_holding_another_shard_is_refused_and_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let block = 1u64 << 20;
        let ssd = SsdConfig { dir: dir.path().to_path_buf(), capacity_bytes: 4 * block, block_bytes: block };
        let tier = ChunkTier::open(1, Some(ssd.clone())).await.expect("tier");
        tier.insert(key(1), chunk_of_len(4096, key(2).shard)).await;
        tier.insert(key(3), chunk_of_len(4096, key(3).shard)).await;
        tier.close().await;
        drop(tier);
        let tier = ChunkTier::open(1, Some(ssd)).await.expect("reopened");
        let err = tier.get(key(1)).await.expect_err("misplaced").to_string();
        assert!(err.contains(&key(1).shard.to_string()) && err.contains(&format!("holds {}", key(2).shard)), "{err}");
        assert!(tier.get(key(1)).await.expect("read").is_none(), "removed");
        let (got, from) = tier.get(key(3)).await.expect("read").expect("on disk");
        assert_eq!((got.len(), from), (4096, HitTier::Ssd));
    }

    /// Issue 30: a chunk an older build wrote in chunk format 1 (no jagged
    /// tensors) is never read as format 2: it is refused by its format,
    /// removed, and the shard converted again.
    #[tokio::test]
    async fn a_disk_entry_of_an_older_chunk_format_is_dropped_not_misread() {
        let dir = tempfile::tempdir().expect("tempdir");
        let block = 1u64 << 20;
        let ssd = SsdConfig { dir: dir.path().to_path_buf(), capacity_bytes: 4 * block, block_bytes: block };
        let tier = ChunkTier::open(1, Some(ssd.clone())).await.expect("tier");
        let mut old = chunk_of_len(4096, key(1).shard).bytes().to_vec();
        old[8..12].copy_from_slice(&1u32.to_le_bytes());
        tier.insert(key(1), Arc::new(SealedChunk::copy_of(&old).expect("memory file"))).await;
        tier.close().await;
        drop(tier);
        let tier = ChunkTier::open(1, Some(ssd)).await.expect("reopened");
        let err = tier.get(key(1)).await.expect_err("an older format").to_string();
        assert!(err.contains("chunk format 1 is not supported"), "{err}");
        assert!(tier.get(key(1)).await.expect("read").is_none(), "removed: the shard is converted again");
    }

    #[tokio::test]
    async fn block_sizes_foyer_cannot_use_are_refused_naming_the_setting() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (capacity_bytes, block_bytes) in [(1 << 20, 0), (1 << 20, 5000), (1 << 20, 1 << 20)] {
            let ssd = SsdConfig { dir: dir.path().to_path_buf(), capacity_bytes, block_bytes };
            let e = ChunkTier::open(1 << 20, Some(ssd)).await.err().expect("refused").to_string();
            assert!(e.contains("ssd_block_bytes"), "{e}");
        }
    }

    /// The whole capacity holds chunks (foyer's default 8 shards would
    /// split it and hold fewer).
    #[tokio::test]
    async fn ram_tier_holds_its_whole_capacity() {
        let len = 1 << 20;
        let tier = ChunkTier::open(4 * len as u64, None).await.expect("tier");
        for i in 0..4 {
            tier.insert(key(i), chunk(len)).await;
        }
        assert!((0..4).all(|i| tier.contains(key(i))), "4 chunks fit a 4-chunk tier");
        tier.insert(key(4), chunk(len)).await;
        assert_eq!((0..5).filter(|&i| tier.contains(key(i))).count(), 4, "a fifth evicts one");
    }

    #[test]
    fn guest_area_holds_its_whole_capacity_and_evicts_least_recently_used() {
        let len = 1 << 20;
        let guests = GuestArea::new(4 * len as u64);
        for i in 0..4 {
            guests.insert(key(i), chunk(len), false);
        }
        assert!((0..4).all(|i| guests.contains(key(i))));
        assert_eq!(guests.usage_bytes(), 4 * len as u64);
        assert!(guests.get(key(0), true).is_some());
        guests.insert(key(4), chunk(len), false);
        assert!(guests.contains(key(0)) && !guests.contains(key(1)));
        assert!((2..5).all(|i| guests.contains(key(i))));
    }

    #[test]
    fn guest_copies_fetched_ahead_are_evicted_first_unless_needed_now() {
        let len = 1 << 20;
        let guests = GuestArea::new(4 * len as u64);
        guests.insert(key(0), chunk(len), false);
        guests.insert(key(1), chunk(len), true);
        guests.insert(key(2), chunk(len), true);
        guests.insert(key(3), chunk(len), false);
        // Copy 2 is needed now: it becomes a regular copy.
        assert!(guests.get(key(2), true).is_some());
        guests.insert(key(4), chunk(len), false);
        assert!(!guests.contains(key(1)), "the copy fetched ahead goes first, though copy 0 is older");
        assert!([0, 2, 3, 4].iter().all(|&i| guests.contains(key(i))));
        guests.insert(key(5), chunk(len), false);
        assert!(!guests.contains(key(0)), "then the least recently used regular copy");
        assert!([2, 3, 4, 5].iter().all(|&i| guests.contains(key(i))));
    }
}
