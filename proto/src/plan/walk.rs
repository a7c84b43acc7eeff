//! Which plan a rank walks, from where: the rank plan ([`super::plan_rank`],
//! fixed world size) or its slice of a global plan ([`super::GlobalPlan`],
//! any world size dividing the global batch), from a batch on. A loader
//! walks it ([`Cursor`]); a `Follow` carries it to the node, which
//! prefetches along the same shard order ([`Walk::shard_order`]) from the
//! rank's position, not from the start of its epoch.

use super::global::{GlobalCursor, GlobalParams, check_world};
use super::{
    PLAN_BYTES_PER_SHARD, PlanCost, PlanCursor, PlanError, PlanParams, RowRef, Shuffle, plan_cost, rank_shard_order,
};
use crate::ids::PlanKey;
use crate::manifest::ShardRows;

// rkyv derives undocumented resolver types for enums with fields.
#[allow(missing_docs)]
mod walk_def {
    use super::*;

    /// A rank's plan and where in its epoch the rank starts.
    #[derive(
        Clone,
        Copy,
        PartialEq,
        Eq,
        Debug,
        serde::Serialize,
        serde::Deserialize,
        rkyv::Archive,
        rkyv::Serialize,
        rkyv::Deserialize,
    )]
    pub enum Walk {
        /// The rank plan of `params`, from batch `start`.
        Rank {
            /// The plan parameters (world size and rank among them).
            params: PlanParams,
            /// The first batch the rank reads.
            start: u64,
        },
        /// Rank `rank` of `world_size` in the global plan of `params`, from
        /// global step `start`.
        Global {
            /// The global plan's parameters.
            params: GlobalParams,
            /// Ranks now (divides the global batch).
            world_size: u32,
            /// This rank.
            rank: u32,
            /// The first global step the rank reads.
            start: u64,
        },
    }
}

pub use walk_def::Walk;

/// A rank walking its plan: batches one at a time, and which shards it
/// still needs.
#[allow(missing_debug_implementations)]
pub enum Cursor {
    /// The rank plan.
    Rank(PlanCursor),
    /// A slice of a global plan.
    Global(GlobalCursor),
}

impl Walk {
    /// The epoch walked.
    pub fn epoch(&self) -> u64 {
        match self {
            Walk::Rank { params, .. } => params.epoch,
            Walk::Global { params, .. } => params.epoch,
        }
    }

    /// The rank walking it.
    pub fn rank(&self) -> u32 {
        match self {
            Walk::Rank { params, .. } => params.rank,
            Walk::Global { rank, .. } => *rank,
        }
    }

    /// The first batch walked.
    pub fn start(&self) -> u64 {
        match self {
            Walk::Rank { start, .. } | Walk::Global { start, .. } => *start,
        }
    }

    /// Rows of a full batch of this rank.
    pub fn batch_rows(&self) -> u32 {
        match self {
            Walk::Rank { params, .. } => params.batch_size,
            Walk::Global { params, world_size, .. } => params.global_batch / (*world_size).max(1),
        }
    }

    /// The same rank's walk of epoch `epoch`, from its first batch.
    pub fn in_epoch(&self, epoch: u64) -> Walk {
        match *self {
            Walk::Rank { params, .. } => Walk::Rank { params: PlanParams { epoch, ..params }, start: 0 },
            Walk::Global { params, world_size, rank, .. } => {
                Walk::Global { params: GlobalParams { epoch, ..params }, world_size, rank, start: 0 }
            }
        }
    }

    /// Checks the parameters without planning anything.
    pub fn check(&self) -> Result<(), PlanError> {
        match self {
            Walk::Rank { params, .. } => {
                if params.world_size == 0 || params.rank >= params.world_size {
                    return Err(PlanError::BadRank { rank: params.rank, world_size: params.world_size });
                }
                if params.batch_size == 0 {
                    return Err(PlanError::ZeroBatch);
                }
                zero_window(params.shuffle)
            }
            Walk::Global { params, world_size, rank, .. } => {
                if params.global_batch == 0 {
                    return Err(PlanError::ZeroBatch);
                }
                if params.partitions == 0 || params.partitions > params.global_batch {
                    return Err(PlanError::BadPartitions {
                        partitions: params.partitions,
                        global_batch: params.global_batch,
                    });
                }
                check_world(params, *world_size, *rank)?;
                zero_window(params.shuffle)
            }
        }
    }

    /// Batches in the walk's epoch (equal on every rank), without walking
    /// it.
    pub fn num_batches(&self, key: PlanKey, shards: &[ShardRows]) -> Result<usize, PlanError> {
        match self {
            Walk::Rank { params, .. } => Ok(PlanCursor::new(key, shards, params, 0)?.num_batches()),
            Walk::Global { params, world_size, rank, .. } => {
                check_world(params, *world_size, *rank)?;
                let steps = super::GlobalPlan::new(key, shards, params)?.num_steps();
                Ok(usize::try_from(steps).unwrap_or(usize::MAX))
            }
        }
    }

    /// The walk's cursor, at its first batch.
    pub fn cursor(&self, key: PlanKey, shards: &[ShardRows]) -> Result<Cursor, PlanError> {
        match self {
            Walk::Rank { params, start } => {
                let start = usize::try_from(*start).unwrap_or(usize::MAX);
                Ok(Cursor::Rank(PlanCursor::new(key, shards, params, start)?))
            }
            Walk::Global { params, world_size, rank, start } => {
                Ok(Cursor::Global(GlobalCursor::new(key, shards, params, *world_size, *rank, *start)?))
            }
        }
    }

    /// The shards the walk reads, in the order it first needs them, from
    /// its first batch: what a node prefetches along.
    pub fn shard_order(&self, key: PlanKey, shards: &[ShardRows]) -> Result<Vec<u32>, PlanError> {
        // From the epoch's start, without materialising rows.
        if let Walk::Rank { params, start: 0 } = self {
            return rank_shard_order(key, shards, params);
        }
        let mut seen = vec![false; shards.len()];
        let mut order = Vec::new();
        let mut note = |rows: &[RowRef]| {
            for r in rows {
                if !std::mem::replace(&mut seen[r.shard_index as usize], true) {
                    order.push(r.shard_index);
                }
            }
        };
        let mut rows: Vec<RowRef> = Vec::new();
        match self {
            Walk::Rank { params, start } => {
                let start = usize::try_from(*start).unwrap_or(usize::MAX);
                let mut cursor = PlanCursor::new(key, shards, params, start)?;
                while cursor.next_batch(&mut rows).is_some() {
                    note(&rows);
                }
            }
            // The plan's steps alone: a cursor would also count what the
            // rank needs of each shard, which an order does not use.
            Walk::Global { params, world_size, rank, start } => {
                let mut plan = super::GlobalPlan::new(key, shards, params)?;
                plan.check_world(*world_size, *rank)?;
                for k in (*start).min(plan.num_steps())..plan.num_steps() {
                    plan.rank_batch(k, *world_size, *rank, &mut rows)?;
                    note(&rows);
                }
            }
        }
        Ok(order)
    }

    /// The most memory walking it holds at once (see [`plan_cost`]), from
    /// row counts alone, so a node refuses a huge plan before planning it.
    pub fn cost(&self, shards: &[ShardRows]) -> PlanCost {
        match self {
            Walk::Rank { params, .. } => plan_cost(shards, params),
            Walk::Global { params, world_size, .. } => global_cost(shards, params, *world_size),
        }
    }
}

fn zero_window(shuffle: Shuffle) -> Result<(), PlanError> {
    match shuffle {
        Shuffle::Windowed { window_shards: 0 } | Shuffle::Blocks { window_batches: 0 } => Err(PlanError::ZeroWindow),
        _ => Ok(()),
    }
}

/// [`Walk::cost`] of a global plan: per partition a rank reads (at most
/// `ceil(P/W) + 1` of them in a step, every one with a world of one), a
/// shuffle window of rows (`Windowed`) or a group's chunk permutation
/// (`Blocks`); per shard its tables and the rank's pending count. No batch
/// list is kept.
fn global_cost(shards: &[ShardRows], params: &GlobalParams, world_size: u32) -> PlanCost {
    let total: u64 = shards.iter().map(|s| s.rows).fold(0, u64::saturating_add);
    let g = u64::from(params.global_batch.max(1));
    let p = u64::from(params.partitions.max(1));
    let batches = total.div_ceil(g);
    let read = p.min(p.div_ceil(u64::from(world_size.max(1))).saturating_add(1));
    let window_entries = match params.shuffle {
        Shuffle::Off => 0,
        Shuffle::Windowed { window_shards } => {
            let mut rows: Vec<u64> = shards.iter().map(|s| s.rows).collect();
            rows.sort_unstable_by(|a, b| b.cmp(a));
            let window: u64 = rows.iter().take(window_shards as usize).fold(0, |a, &r| a.saturating_add(r));
            window.saturating_mul(read).min(total)
        }
        Shuffle::Blocks { window_batches } => batches.min(u64::from(window_batches)).saturating_mul(read),
    };
    let per_shard = (shards.len() as u64).saturating_mul(PLAN_BYTES_PER_SHARD);
    let bytes = window_entries.saturating_mul(8).saturating_add(per_shard).saturating_add(p.saturating_mul(64));
    PlanCost { batches, window_entries, bytes }
}

impl Cursor {
    /// Batches in the epoch, equal on every rank.
    pub fn num_batches(&self) -> usize {
        match self {
            Cursor::Rank(c) => c.num_batches(),
            Cursor::Global(c) => c.num_batches(),
        }
    }

    /// The next batch's rows into `out`, and its index; None at the end.
    pub fn next_batch(&mut self, out: &mut Vec<RowRef>) -> Option<usize> {
        match self {
            Cursor::Rank(c) => c.next_batch(out),
            Cursor::Global(c) => c.next_batch(out),
        }
    }

    /// Whether a later batch still reads shard `shard_index`.
    pub fn pending(&self, shard_index: u32) -> bool {
        match self {
            Cursor::Rank(c) => c.pending(shard_index),
            Cursor::Global(c) => c.pending(shard_index),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ShardId;

    fn shards(rows: &[u64]) -> Vec<ShardRows> {
        rows.iter()
            .enumerate()
            .map(|(i, &r)| ShardRows { shard: ShardId { file: i as u32, row_group: 0 }, rows: r })
            .collect()
    }

    #[test]
    fn a_walk_from_a_batch_orders_only_the_shards_it_still_reads() {
        let shards = shards(&[10, 10, 10, 10, 10, 10, 10, 10]);
        let params = PlanParams {
            seed: 3,
            epoch: 1,
            world_size: 2,
            rank: 1,
            batch_size: 5,
            shuffle: Shuffle::Blocks { window_batches: 1 },
            drop_last: false,
        };
        let key = PlanKey(9);
        let whole = Walk::Rank { params, start: 0 };
        let order = whole.shard_order(key, &shards).expect("valid");
        assert_eq!(order, rank_shard_order(key, &shards, &params).expect("valid"));
        assert_eq!(order.len(), 4, "half of the shards");
        // Batches of 5 rows, two per shard: from batch 4 the first two
        // shards are behind the rank.
        let resumed = Walk::Rank { params, start: 4 }.shard_order(key, &shards).expect("valid");
        assert_eq!(resumed, order[2..]);

        let global = GlobalParams {
            seed: 3,
            epoch: 1,
            global_batch: 10,
            partitions: 2,
            shuffle: Shuffle::Off,
            drop_last: false,
        };
        let from = |start| Walk::Global { params: global, world_size: 2, rank: 1, start };
        assert_eq!(from(0).shard_order(key, &shards).expect("valid"), [4, 5, 6, 7], "rank 1 reads partition 1");
        assert_eq!(from(4).shard_order(key, &shards).expect("valid"), [6, 7]);
        assert_eq!(from(0).batch_rows(), 5);
        assert_eq!(
            from(3).in_epoch(2),
            Walk::Global { params: GlobalParams { epoch: 2, ..global }, world_size: 2, rank: 1, start: 0 }
        );
    }

    #[test]
    fn checks_name_what_admits_no_plan() {
        let global =
            GlobalParams { seed: 0, epoch: 0, global_batch: 8, partitions: 2, shuffle: Shuffle::Off, drop_last: false };
        let walk = |world_size| Walk::Global { params: global, world_size, rank: 0, start: 0 };
        assert_eq!(walk(4).check(), Ok(()));
        assert_eq!(walk(3).check(), Err(PlanError::WorldNotDividingBatch { world_size: 3, global_batch: 8 }));
        let many = Walk::Global { params: GlobalParams { partitions: 9, ..global }, world_size: 1, rank: 0, start: 0 };
        assert!(matches!(many.check(), Err(PlanError::BadPartitions { .. })));
    }

    #[test]
    fn a_global_walk_costs_a_window_per_partition_it_reads() {
        let shards = shards(&[1000; 64]);
        let global = GlobalParams {
            seed: 0,
            epoch: 0,
            global_batch: 64,
            partitions: 16,
            shuffle: Shuffle::Windowed { window_shards: 4 },
            drop_last: false,
        };
        let cost = |world_size| Walk::Global { params: global, world_size, rank: 0, start: 0 }.cost(&shards);
        assert_eq!(cost(16).window_entries, 2 * 4000, "one partition and its neighbour");
        assert_eq!(cost(1).window_entries, 16 * 4000, "every partition");
        assert!(cost(1).bytes > cost(16).bytes);
    }
}
