//! Prefetch along one rank's plan, as a pure window over the shard order.
//!
//! [`plan_order`] computes the shards of the rank's epoch in the order it
//! needs them (the same plan the trainer computes, [`rank_shard_order`],
//! without the rows), then the new shards of its next `epochs_ahead`
//! epochs. [`PrefetchWindow`] keeps the next shards of that order loading,
//! up to a byte budget ahead of the last shard the rank asked for (always
//! at least one). Later epochs' shards come only after the current
//! epoch's, so they never delay it; those that would arrive as guest copies
//! are issued only while the rank's guest copies fit the guest area, so
//! looking ahead never evicts copies the current epoch still needs.
//! The shell (`service::Follower`) spawns a load per [`Issue`].

use granary_proto::plan::PlanError;
use granary_proto::{PlanKey, ShardId, ShardRows, Walk};
use std::collections::{HashMap, HashSet};

/// A rank's prefetch order: shards with their chunk sizes, this epoch's
/// first (`epoch_len` of them), then the new shards of later epochs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefetchOrder {
    /// Shards in the order the plan first needs them, with chunk sizes.
    pub order: Vec<(ShardId, u64)>,
    /// Entries from here on belong to later epochs.
    pub epoch_len: usize,
}

/// The order of `walk`'s epoch from the rank's position (a resumed rank's
/// node does not load what the rank already read) and the new shards of its
/// next `epochs_ahead` epochs, from their starts; `size` gives a shard's
/// chunk length.
pub fn plan_order(
    key: PlanKey,
    shards: &[ShardRows],
    walk: &Walk,
    epochs_ahead: u64,
    size: impl Fn(ShardId) -> u64,
) -> Result<PrefetchOrder, PlanError> {
    let with_size = |i: &u32| {
        let s = shards[*i as usize].shard;
        (s, size(s))
    };
    // Only the shard order is needed (from the epoch's start: computed a
    // window at a time, not by materialising the rank's rows).
    let mut order: Vec<(ShardId, u64)> = walk.shard_order(key, shards)?.iter().map(with_size).collect();
    let epoch_len = order.len();
    let mut seen: HashSet<ShardId> = order.iter().map(|(s, _)| *s).collect();
    for ahead in 1..=epochs_ahead {
        if seen.len() == shards.len() {
            break;
        }
        let later = walk.in_epoch(walk.epoch().wrapping_add(ahead));
        let later_order = later.shard_order(key, shards)?;
        order.extend(later_order.iter().map(with_size).filter(|(s, _)| seen.insert(*s)));
    }
    Ok(PrefetchOrder { order, epoch_len })
}

/// A load the window wants issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Issue {
    /// The shard.
    pub shard: ShardId,
    /// True for a later epoch's shard (prefetch "ahead").
    pub later: bool,
}

/// The prefetch window of one rank.
#[derive(Debug)]
pub struct PrefetchWindow {
    order: Vec<(ShardId, u64)>,
    /// Position of each of this epoch's shards in `order`.
    position: HashMap<ShardId, usize>,
    epoch_len: usize,
    budget_bytes: u64,
    guest_capacity_bytes: u64,
    /// Bytes of guest copies this window's loads bring in.
    guest_bytes: u64,
    /// Index in `order` of the first shard the rank has not asked for yet.
    next: usize,
    /// Index in `order` of the first shard not yet issued.
    issued: usize,
}

impl PrefetchWindow {
    /// A window over `order` keeping up to `budget_bytes` ahead of the rank
    /// (0 turns prefetch off), and later epochs' guest copies within
    /// `guest_capacity_bytes`.
    pub fn new(order: PrefetchOrder, budget_bytes: u64, guest_capacity_bytes: u64) -> Self {
        let position = order.order[..order.epoch_len].iter().enumerate().map(|(i, (s, _))| (*s, i)).collect();
        Self {
            order: order.order,
            position,
            epoch_len: order.epoch_len,
            budget_bytes,
            guest_capacity_bytes,
            guest_bytes: 0,
            next: 0,
            issued: 0,
        }
    }

    /// The rank asked for `shard`: the window moves past it. False for a
    /// shard not of this epoch, which changes nothing (and issues nothing).
    pub fn handle_asked(&mut self, shard: ShardId) -> bool {
        match self.position.get(&shard) {
            Some(&p) => {
                self.next = self.next.max(p + 1);
                true
            }
            None => false,
        }
    }

    /// The next load to issue, if the budget has room; `arrives_as_guest`
    /// says whether loading a shard would bring a new guest copy (another
    /// live node owns it and none is held). Call until it returns None.
    pub fn poll_issue(&mut self, arrives_as_guest: impl FnOnce(ShardId) -> bool) -> Option<Issue> {
        if self.budget_bytes == 0 {
            return None;
        }
        self.issued = self.issued.max(self.next);
        let &(shard, bytes) = self.order.get(self.issued)?;
        let ahead: u64 = self.order[self.next..self.issued].iter().map(|(_, b)| b).sum();
        if ahead + bytes > self.budget_bytes && self.issued > self.next {
            return None;
        }
        let later = self.issued >= self.epoch_len;
        let incoming = if arrives_as_guest(shard) { bytes } else { 0 };
        if later && self.guest_bytes + incoming > self.guest_capacity_bytes {
            return None;
        }
        self.guest_bytes += incoming;
        self.issued += 1;
        Some(Issue { shard, later })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(i: u32) -> ShardId {
        ShardId { file: 0, row_group: i }
    }

    fn order(sizes: &[u64], epoch_len: usize) -> PrefetchOrder {
        PrefetchOrder { order: sizes.iter().enumerate().map(|(i, b)| (s(i as u32), *b)).collect(), epoch_len }
    }

    fn drain(w: &mut PrefetchWindow, guest: impl Fn(ShardId) -> bool) -> Vec<Issue> {
        std::iter::from_fn(|| w.poll_issue(&guest)).collect()
    }

    #[test]
    fn the_window_keeps_the_budget_ahead_of_the_rank() {
        let mut w = PrefetchWindow::new(order(&[10, 10, 10, 10, 10], 5), 25, 0);
        let issued = drain(&mut w, |_| false);
        assert_eq!(issued.iter().map(|i| i.shard).collect::<Vec<_>>(), vec![s(0), s(1)]);
        w.handle_asked(s(0));
        assert_eq!(drain(&mut w, |_| false), vec![Issue { shard: s(2), later: false }]);
        // Asking for a shard behind the window changes nothing.
        assert!(w.handle_asked(s(0)));
        assert!(drain(&mut w, |_| false).is_empty());
        // Nor does a shard of no epoch of this window (nothing to top up).
        assert!(!w.handle_asked(ShardId { file: 9, row_group: 9 }));
    }

    #[test]
    fn a_chunk_over_the_budget_is_still_issued_alone() {
        let mut w = PrefetchWindow::new(order(&[100, 100], 2), 10, 0);
        assert_eq!(drain(&mut w, |_| false).len(), 1);
        w.handle_asked(s(0));
        assert_eq!(drain(&mut w, |_| false), vec![Issue { shard: s(1), later: false }]);
    }

    #[test]
    fn a_zero_budget_turns_prefetch_off() {
        let mut w = PrefetchWindow::new(order(&[1, 1], 2), 0, 100);
        assert!(drain(&mut w, |_| false).is_empty());
    }

    #[test]
    fn later_epochs_come_after_this_one_and_their_guests_fit_the_guest_area() {
        // Three shards this epoch, three of later epochs; every later shard
        // arrives as a guest of 10 bytes and the guest area holds 15.
        let mut w = PrefetchWindow::new(order(&[10, 10, 10, 10, 10, 10], 3), 1000, 15);
        let issued = drain(&mut w, |sh| sh.row_group >= 3);
        assert_eq!(
            issued,
            vec![
                Issue { shard: s(0), later: false },
                Issue { shard: s(1), later: false },
                Issue { shard: s(2), later: false },
                Issue { shard: s(3), later: true },
            ],
            "a second later guest would pass the guest area"
        );
        // Shards of this epoch count against the guest area only when they
        // are later-epoch prefetches: none were.
        let mut w = PrefetchWindow::new(order(&[10, 10, 10, 10], 3), 1000, 0);
        assert_eq!(drain(&mut w, |_| true).len(), 3, "this epoch's guests are never held back");
    }

    #[test]
    fn later_shards_already_held_are_issued_freely() {
        let mut w = PrefetchWindow::new(order(&[10, 10, 10, 10], 1), 1000, 0);
        assert_eq!(drain(&mut w, |_| false).len(), 4);
    }

    #[test]
    fn the_order_is_the_ranks_epoch_then_the_new_shards_of_later_epochs() {
        use granary_proto::Shuffle;
        let shards: Vec<ShardRows> = (0..12).map(|i| ShardRows { shard: s(i), rows: 100 }).collect();
        let params = granary_proto::PlanParams {
            seed: 7,
            epoch: 0,
            rank: 0,
            world_size: 2,
            batch_size: 10,
            drop_last: false,
            shuffle: Shuffle::Windowed { window_shards: 2 },
        };
        let v = PlanKey(9);
        let walk = Walk::Rank { params, start: 0 };
        let o = plan_order(v, &shards, &walk, 3, |sh| u64::from(sh.row_group)).expect("plan");
        let own = granary_proto::rank_shard_order(v, &shards, &params).expect("plan");
        assert_eq!(o.epoch_len, own.len());
        let mut seen = HashSet::new();
        assert!(o.order.iter().all(|(sh, _)| seen.insert(*sh)), "each shard once");
        assert!(o.order.iter().all(|(sh, b)| *b == u64::from(sh.row_group)), "sizes attached");
        assert_eq!(o, plan_order(v, &shards, &walk, 3, |sh| u64::from(sh.row_group)).expect("plan"), "pure");
        let none = plan_order(v, &shards, &walk, 0, |_| 0).expect("plan");
        assert_eq!(none.order.len(), none.epoch_len);
    }

    #[test]
    fn a_resumed_rank_is_prefetched_from_where_it_stands() {
        use granary_proto::{GlobalParams, Shuffle};
        let shards: Vec<ShardRows> = (0..12).map(|i| ShardRows { shard: s(i), rows: 100 }).collect();
        let params = granary_proto::PlanParams {
            seed: 7,
            epoch: 0,
            rank: 1,
            world_size: 2,
            batch_size: 50,
            drop_last: false,
            shuffle: Shuffle::Blocks { window_batches: 1 },
        };
        let v = PlanKey(9);
        let whole = plan_order(v, &shards, &Walk::Rank { params, start: 0 }, 0, |_| 1).expect("plan");
        // Two batches per shard: from batch 6 the rank's first three shards
        // are behind it, and the node does not load them again.
        let resumed = plan_order(v, &shards, &Walk::Rank { params, start: 6 }, 0, |_| 1).expect("plan");
        assert_eq!(resumed.order, whole.order[3..]);
        // The same for a slice of a global plan, whose later epochs start
        // from their first step.
        let global = GlobalParams {
            seed: 7,
            epoch: 0,
            global_batch: 100,
            partitions: 2,
            shuffle: Shuffle::Blocks { window_batches: 1 },
            drop_last: false,
        };
        let walk = |start| Walk::Global { params: global, world_size: 2, rank: 1, start };
        let whole = plan_order(v, &shards, &walk(0), 0, |_| 1).expect("plan");
        let resumed = plan_order(v, &shards, &walk(6), 1, |_| 1).expect("plan");
        assert_eq!(resumed.order[..resumed.epoch_len], whole.order[3..]);
    }
}
