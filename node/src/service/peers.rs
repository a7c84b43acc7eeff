//! What a node answers other nodes: a chunk it owns (or holds, for a
//! handoff) and a file's footer, each through the same single flight as its
//! trainers' requests; and a footer this node asks the peer that reads it.

use super::{Node, Shared};
use crate::error::FetchError;
use crate::tier::ChunkKey;
use granary_node_core::flight::Asker;
use granary_node_core::route::{FooterAnswer, answer_footer};
use granary_proto::{DatasetVersion, ShardId};
use std::sync::atomic::Ordering;
use tracing::Instrument;

impl Node {
    /// A chunk for another node (at `requester`, which placement epoch
    /// `epoch` told this node owns it): like [`Node::chunk`], but never
    /// forwarded to a third node (this node reads the shard itself if it
    /// must), and refused at once while this node's own load of it is
    /// asking `requester` (the two disagree about the owner) or asking a
    /// node an older placement named (see `granary_node_core::flight`).
    pub async fn chunk_for_peer(
        &self,
        version: DatasetVersion,
        shard: ShardId,
        requester: std::net::SocketAddr,
        epoch: u64,
    ) -> Shared {
        self.inner.counters.peer_served.fetch_add(1, Ordering::Relaxed);
        self.chunk_from(version, shard, Asker::Peer { addr: requester, epoch })
            .instrument(tracing::info_span!("serve_peer", peer = %requester, version = %version, shard = %shard))
            .await
    }

    /// A handoff ([`granary_proto::peer::PeerRequest::HandOver`]): the
    /// chunk of `shard` if this node holds it as its own (RAM, SSD: never
    /// a guest copy, a peer's chunk unverified, which a forgery would
    /// spread through) or a load of its own is reading it from remote
    /// storage; `None` (not held) otherwise, at once. Never starts a load,
    /// and never waits on a load that asks a peer, so a handoff cannot
    /// close a wait cycle.
    pub async fn held_for_peer(&self, version: DatasetVersion, shard: ShardId) -> Option<Shared> {
        let key = ChunkKey { version, shard };
        match self.inner.tier.get(key).await {
            Ok(Some((chunk, _))) => return Some(Ok(chunk)),
            Ok(None) => {}
            Err(e) => {
                self.inner.counters.corrupt.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(shard = %shard, error = %e, "corrupt SSD entry removed; not handing it over");
            }
        }
        // Only a load that holds its load permit and reads: one queued for
        // a permit may route again when it gets one, and a long queue is
        // no cheaper than the asker's own read.
        let mut rx = self.engine().reading(key)?.rx.clone();
        match rx.wait_for(Option::is_some).await {
            Ok(v) => v.clone(),
            Err(_) => None,
        }
    }

    /// A file's footer for another node: from memory, or read from remote
    /// storage by this node, never asked of a third node. A node that
    /// believes another node reads that footer (their placements disagree
    /// for now) answers at once that it does not, instead of joining its
    /// own load of the footer, which would be asking that other node: two
    /// nodes that each think the other reads a footer would otherwise wait
    /// on each other until the footer deadline.
    pub async fn footer_for_peer(&self, version: DatasetVersion, file: u32) -> Result<bytes::Bytes, FetchError> {
        let ds = self.dataset(version)?;
        if file as usize >= ds.files.len() {
            return Err(FetchError::UnknownFile(u64::from(file)));
        }
        let held = ds.held_footer(file as usize);
        let first = ShardId { file, row_group: 0 };
        let first_owner = || self.inner.cluster.get().and_then(|c| c.owner(version, first)).map(|o| o.node);
        match answer_footer(held.is_some(), if held.is_some() { None } else { first_owner() }) {
            FooterAnswer::NotOwner(owner) => Err(FetchError::NotFooterOwner { file, owner }),
            FooterAnswer::Held | FooterAnswer::ReadHere => Ok(ds.footer_bytes(file as usize).await?),
        }
    }

    /// In a cluster, the fetch of file `file`'s footer from the owner of
    /// its first row group (so each footer is read from remote storage
    /// once per cluster); `None` when this node owns it or is alone.
    pub(super) fn footer_from_peer(
        &self,
        version: DatasetVersion,
        file: u32,
    ) -> Option<(String, futures::future::BoxFuture<'static, Result<bytes::Bytes, String>>)> {
        let cluster = self.inner.cluster.get()?.clone();
        let owner = cluster.owner(version, ShardId { file, row_group: 0 })?;
        let file_size = self.dataset(version).ok()?.files.get(file as usize)?.size;
        let deadline = cluster.config().fetch_deadline.min(cluster.config().footer_deadline);
        let name = format!("{} at {}", owner.node, owner.addr);
        Some((
            name,
            Box::pin(async move {
                cluster
                    .link()
                    .fetch_footer(owner.addr, version, file, file_size, deadline)
                    .await
                    .map_err(|e| format!("{}: {e}", owner.node))
            }),
        ))
    }
}
