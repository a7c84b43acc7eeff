//! A trainer's kept chunk mappings (issue 29): bounded in bytes by the
//! lower of its own setting and its node's advice, least recently used
//! out.

use crate::Chunk;
use granary_proto::{DatasetVersion, ShardId};
use std::collections::HashMap;

/// Recently used chunk mappings, bounded in bytes, least recently used out.
pub(super) struct MappingCache {
    /// The trainer's own setting ([`super::LocalSource::mapping_cache`]).
    pub(super) own_bytes: u64,
    /// The lower of the own setting and the node's latest advice.
    pub(super) budget_bytes: u64,
    pub(super) bytes: u64,
    pub(super) tick: u64,
    pub(super) entries: HashMap<(DatasetVersion, ShardId), (Chunk, u64)>,
}

impl MappingCache {
    pub(super) fn get(&mut self, key: (DatasetVersion, ShardId)) -> Option<Chunk> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(&key).map(|(c, used)| {
            *used = tick;
            c.clone()
        })
    }

    /// Takes the node's advice `bytes`: the budget becomes the lower of
    /// it and the trainer's own setting (so a later, larger advice raises
    /// it again, never past the setting), letting go of the least
    /// recently used mappings past it.
    pub(super) fn cap(&mut self, bytes: u64) {
        self.budget_bytes = bytes.min(self.own_bytes);
        self.evict_until_fits(0);
    }

    pub(super) fn evict_until_fits(&mut self, len: u64) {
        while self.bytes + len > self.budget_bytes {
            let Some(oldest) = self.entries.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| *k) else {
                break;
            };
            if let Some((c, _)) = self.entries.remove(&oldest) {
                self.bytes -= c.bytes().len() as u64;
            }
        }
    }

    pub(super) fn insert(&mut self, key: (DatasetVersion, ShardId), chunk: Chunk) {
        let len = chunk.bytes().len() as u64;
        if len > self.budget_bytes {
            return;
        }
        self.evict_until_fits(len);
        self.tick += 1;
        if let Some((old, _)) = self.entries.insert(key, (chunk, self.tick)) {
            self.bytes -= old.bytes().len() as u64;
        }
        self.bytes += len;
    }
}
