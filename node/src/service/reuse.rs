//! A new version's shard served from an older version's chunk of the same
//! content ([`crate::content`]): the chunk the tier holds (in RAM, or on
//! SSD from before a restart), restamped as the new version's shard. No
//! remote read, no conversion (issue 43). The tier then keeps one copy of
//! the content: the older version's is dropped unless a trainer on this
//! node reads that version now.

use super::Node;
use crate::shm::{ChunkWriter, SealedChunk};
use crate::tier::ChunkKey;
use granary_proto::ChunkView;
use granary_proto::chunk::Verify;
use granary_proto::manifest::ContentKey;
use std::sync::atomic::Ordering;

impl Node {
    /// What `key`'s shard holds, if its dataset version is open here.
    pub(super) fn content_of(&self, key: ChunkKey) -> Option<ContentKey> {
        let ds = self.dataset(key.version).ok()?;
        ds.manifest.content_key(&ds.view, key.shard.file, key.shard.row_group)
    }

    /// `key`'s chunk entered the tier: a later version holding the same
    /// content may take it.
    pub(super) fn record_content(&self, key: ChunkKey) {
        if let Some(content) = self.content_of(key) {
            self.inner.content.record(content, key);
        }
    }

    /// The chunk of `key` made from another version's chunk of the same
    /// content that the tier holds, if there is one: checked against
    /// `key`'s manifest (rows and tensors) and restamped. `None` (a load
    /// reads and converts it) when there is none, or it cannot be used.
    pub(super) async fn reused(&self, key: ChunkKey) -> Option<SealedChunk> {
        let content = self.content_of(key)?;
        let held = self.inner.content.lookup(content).filter(|k| *k != key)?;
        let (chunk, _) = self.inner.tier.get(held).await.ok()??;
        let ds = self.dataset(key.version).ok()?;
        let rows = ds.manifest.files.get(key.shard.file as usize)?.row_groups.get(key.shard.row_group as usize)?.rows;
        let view = ChunkView::parse(chunk.bytes(), Verify::HeaderOnly).ok()?;
        if let Err(why) = view.header().conforms(rows, &ds.manifest.tensors) {
            tracing::warn!(shard = %key.shard, from = %held.version, "a chunk of the same content does not fit: {why}");
            return None;
        }
        let mut out = ChunkWriter::new(chunk.len()).ok()?;
        view.restamp_into(key.version, key.shard, out.as_mut_slice()).ok()?;
        let sealed = out.seal().ok()?;
        self.inner.counters.reused.fetch_add(1, Ordering::Relaxed);
        // One copy of a content in the tier: the older version's goes
        // unless a trainer here reads that version now (then both are
        // read, and both are kept). Asked for again later, it is
        // restamped back from this one.
        let source_in_use =
            self.dataset(held.version).is_ok_and(|d| self.inner.holds.in_use(&(d.name.clone(), held.version)));
        if !source_in_use {
            self.inner.tier.remove(held);
        }
        tracing::debug!(shard = %key.shard, from = %held.version, "shard served from another version's chunk");
        Some(sealed)
    }

    /// Shards served from another version's chunk of the same content
    /// since start.
    pub fn chunks_reused(&self) -> u64 {
        self.inner.counters.reused.load(Ordering::Relaxed)
    }
}
