//! Prefetch along one rank's plan: [`Follower`] keeps loading the shards of
//! the plan the trainer computes, up to `prefetch_bytes` ahead of the last
//! shard it asked for; the epoch's own shards first, then the next epochs'.

use super::{Node, PREFETCH_EPOCHS_AHEAD};
use crate::error::FetchError;
use crate::holds::VersionUse;
use granary_node_core::flight::Asker;
use granary_node_core::prefetch::{PrefetchWindow, plan_order};
use granary_proto::{DatasetVersion, ShardId, Walk};
use std::sync::atomic::Ordering;

impl Node {
    /// Whether a plan of `params` over `version` fits this node's limit
    /// (`max_plan_bytes`, for every shuffle): checked before planning takes
    /// one of the few planning slots, so a huge plan is refused at once and
    /// never holds up other ranks' plans.
    pub fn admit_follow(&self, version: DatasetVersion, walk: &Walk) -> Result<(), FetchError> {
        walk.check()?;
        let ds = self.dataset(version)?;
        let cost = walk.cost(&ds.manifest.shards());
        let limit = self.inner.max_plan_bytes;
        if cost.bytes > limit {
            return Err(FetchError::PlanTooLarge { cost, batch_size: walk.batch_rows(), limit });
        }
        Ok(())
    }

    /// Starts prefetching along one rank's plan: the shards of its epoch in
    /// the order it needs them from where it stands (a resumed rank's
    /// position, not its epoch's start), then the new shards of its next
    /// [`PREFETCH_EPOCHS_AHEAD`] epochs (every epoch's plan is known in
    /// advance). Later epochs' shards are fetched only while the budget
    /// ahead of the rank has room, after the current epoch's, so they never
    /// delay it; in a cluster their peer transfers overlap the current epoch
    /// (above all the cold one, which waits on remote storage) instead of
    /// stalling the next.
    pub fn follow(&self, version: DatasetVersion, walk: &Walk) -> Result<Follower, FetchError> {
        self.admit_follow(version, walk)?;
        let ds = self.dataset(version)?;
        let order =
            plan_order(ds.plan_key, &ds.manifest.shards(), walk, PREFETCH_EPOCHS_AHEAD, |s| ds.chunk_len_estimate(s))?;
        let window = PrefetchWindow::new(order, self.inner.prefetch_bytes, self.inner.guests.capacity_bytes());
        let used = self.inner.holds.use_version((ds.name.clone(), version));
        let mut f = Follower { node: self.clone(), version, window, _used: used };
        f.top_up();
        Ok(f)
    }
}

/// One prefetch load in the `prefetching` gauge, for as long as it lives
/// (a load that panics or is cancelled leaves the gauge too).
struct Prefetching(Node);

impl Prefetching {
    fn start(node: Node) -> Self {
        node.inner.counters.prefetching.fetch_add(1, Ordering::Relaxed);
        Self(node)
    }
}

impl Drop for Prefetching {
    fn drop(&mut self) {
        self.0.inner.counters.prefetching.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Prefetch for one rank's plan: the shell of a [`PrefetchWindow`], which
/// spawns a load for each shard the window issues.
pub struct Follower {
    node: Node,
    version: DatasetVersion,
    window: PrefetchWindow,
    /// Holds the version while the rank follows it.
    _used: VersionUse,
}

impl Follower {
    /// Records that the rank asked for `shard`, and prefetches ahead of it.
    pub fn advance(&mut self, shard: ShardId) {
        if self.window.handle_asked(shard) {
            self.top_up();
        }
    }

    /// Issues the loads the window wants.
    fn top_up(&mut self) {
        while let Some(issue) = self.window.poll_issue(|s| self.node.arrives_as_guest(self.version, s)) {
            let node = self.node.clone();
            let version = self.version;
            node.inner.counters.prefetched.fetch_add(1, Ordering::Relaxed);
            let counted = Prefetching::start(node.clone());
            tokio::spawn(async move {
                let _counted = counted;
                // Not a trainer's request: not timed as one.
                let asker = if issue.later { Asker::Ahead } else { Asker::Trainer };
                let _ = node.chunk_from(version, issue.shard, asker).await;
            });
        }
    }
}
