//! What a node does with a chunk a peer sent (the shell of
//! `crate::fabric::verify`, whose module doc gives the rules): keep it as
//! a guest copy, or, when drawn for verification, convert the shard here
//! too and keep whichever is right, quarantining a peer that lied.

use super::Node;
use crate::error::FetchError;
use crate::fabric::owners::Cluster;
use crate::fabric::verify::{Quarantined, Verdict, compare};
use crate::shm::SealedChunk;
use crate::tier::ChunkKey;
use granary_proto::NodeId;
use std::sync::atomic::Ordering;

impl Node {
    /// The chunk of `key` that `from` sent, and whether it is kept as a
    /// guest copy: unverified, it is one (even for a shard this node owns,
    /// handed over or moved here meanwhile); verified, it is this node's
    /// own when the placement names this node its owner; when it differs
    /// from this node's own conversion, that conversion is returned instead
    /// and `from` is quarantined. A verification that cannot convert
    /// (remote storage failing) keeps the peer's chunk as an unverified
    /// guest, logged.
    pub(super) async fn take_peer_chunk(
        &self,
        cluster: &Cluster,
        key: ChunkKey,
        chunk: SealedChunk,
        from: NodeId,
    ) -> Result<(SealedChunk, bool), FetchError> {
        if !cluster.verify_next(key.version, key.shard) {
            return Ok((chunk, true));
        }
        let own = match self.inner.loads.acquire().await {
            Ok(permit) => self.convert_here(key, permit, false).await,
            Err(e) => Err(FetchError::ShuttingDown(e)),
        };
        let own = match own {
            Ok(own) => own,
            Err(e) => {
                tracing::warn!(shard = %key.shard, peer = %from,
                    "could not verify the chunk a peer sent (keeping it as an unverified guest copy): {e}");
                return Ok((chunk, true));
            }
        };
        let c = &self.inner.counters;
        match compare(chunk.bytes(), own.bytes()) {
            Verdict::Same => {
                c.peer_verified.fetch_add(1, Ordering::Relaxed);
                let owned = cluster.placed_owner(key.version, key.shard) == Some(cluster.me());
                Ok((own, !owned))
            }
            Verdict::Unlike { peer, own: rules } => {
                tracing::warn!(peer = %from, site = %self.site(key), peer_converter = peer, own_converter = rules,
                    "a peer's chunk was made by other converter rules (a build of another version): serving this \
                     node's own conversion, holding nothing against the peer");
                let owned = cluster.placed_owner(key.version, key.shard) == Some(cluster.me());
                Ok((own, !owned))
            }
            Verdict::Differs { at } => {
                c.peer_mismatched.fetch_add(1, Ordering::Relaxed);
                let why = Quarantined { version: key.version, shard: key.shard, at };
                if cluster.quarantine(from, why) {
                    // Any guest copy may have come from it.
                    self.inner.guests.clear();
                }
                tracing::error!(peer = %from, site = %self.site(key), version = %key.version, first_difference = at,
                    "a peer sent a chunk that differs from this node's own conversion: serving this node's own, \
                     and quarantining the peer (asked for nothing more while this node runs)");
                Ok((own, false))
            }
        }
    }
}
