//! One trainer's session with the node: the plan it follows, whose shards
//! are prefetched ahead of it, and its requests, each of which moves the
//! prefetch window past the shard asked for. The daemon keeps one per
//! connection; the embedded node one per process. Both used to keep their
//! own follower and advance it by hand.

use crate::service::{Follower, Node, Shared};
use granary_proto::{DatasetVersion, ShardId};

/// A trainer's session (see the module doc).
pub struct Session {
    node: Node,
    follower: Option<Follower>,
}

impl Session {
    /// A session on `node` that follows no plan yet.
    pub fn new(node: Node) -> Self {
        Self { node, follower: None }
    }

    /// From now on, prefetch along `follower`'s plan (replacing any plan
    /// followed before).
    pub fn follow(&mut self, follower: Follower) {
        if self.follower.is_none() {
            self.node.loader_started();
        }
        self.follower = Some(follower);
    }

    /// The trainer asked for `shard` (or said it will read it from memory
    /// it already holds): prefetch moves past it. Must run inside the
    /// node's runtime (prefetch spawns loads).
    pub fn touch(&mut self, shard: ShardId) {
        if let Some(f) = self.follower.as_mut() {
            f.advance(shard);
        }
    }

    /// The chunk of `shard` for the trainer, after [`Session::touch`].
    pub async fn chunk(&mut self, version: DatasetVersion, shard: ShardId) -> Shared {
        self.touch(shard);
        self.node.chunk(version, shard).await
    }
}

impl Drop for Session {
    /// A session that followed a plan was a loader: it no longer shares
    /// the mapping advice.
    fn drop(&mut self) {
        if self.follower.is_some() {
            self.node.loader_ended();
        }
    }
}
