//! The epoch plan: which rows a rank sees, in which order, in which batches.
//!
//! A rank's plan is a pure function of (the dataset's plan key, seed, epoch,
//! world size, rank, batch size, shuffle settings, drop_last) and the
//! manifest's shard list. The plan key ([`PlanKey`]) hashes what gives the
//! data its shape (file names relative to the source, rows per row group,
//! the view), not where the files live: the same files in another bucket or
//! folder give the same order. It does not depend on nodes, caches, threads or timing, so two
//! runs with the same parameters deliver the same rows in the same batches.
//!
//! Construction, in order:
//! 1. **Shard order.** With shuffle, the shards are permuted by a generator
//!    seeded from (plan key, seed, epoch); without, manifest order.
//! 2. **Rank split.** The rows of the ordered shards form one sequence of `N`
//!    rows; rank `r` takes the contiguous range `[r*N/W, (r+1)*N/W)`, so
//!    ranks differ by at most one row and each rank touches about `1/W` of
//!    the shards (good locality for its node).
//! 3. **Window shuffle.** With shuffle, the rank's rows are cut at shard
//!    boundaries into windows of `window_shards` shard segments, and rows are
//!    permuted inside each window, so at most a window of chunks is needed at
//!    once.
//!    With [`Shuffle::Blocks`] rows keep their order here (see step 5).
//! 4. **Batches.** Every rank gets the same number of batches `K`, so
//!    data-parallel steps stay in lockstep. With `drop_last`, `K = floor(q/B)`
//!    for `q = floor(N/W)` and every batch is full. Without it,
//!    `K = ceil(max_rows/B)`; a rank fills batches greedily but keeps at
//!    least one row for each remaining batch, so its last batches may be
//!    short. Each row then appears exactly once per epoch, except where that
//!    is impossible: when `N < W`, or when `B = 1` and `W` does not divide
//!    `N`, a rank with fewer rows than `K` repeats its own first rows
//!    (wrap-around padding) to keep the batch count equal.
//! 5. **Block shuffle** ([`Shuffle::Blocks`] only). The batches are
//!    permuted inside consecutive groups of `window_batches` batches. Each
//!    batch is then a contiguous run of the rank's rows, so a batch that does
//!    not cross a shard boundary is one run of rows of one chunk, which the
//!    client hands out in place, without copying.
//!
//! ## Windowed or block shuffle
//! A windowed shuffle mixes rows of `window_shards` shards inside every
//! batch: a batch is close to a uniform sample of the window, and
//! consecutive batches are nearly independent. A block shuffle only shuffles
//! which contiguous run of rows a batch is: rows that sit next to each other
//! in a row group (often written in time or user order) train together in
//! the same batch every epoch, and only the batch order and the shard order
//! change between epochs. That is the usual trade of recommendation
//! training on click logs, where one pass over huge data matters more than
//! per-batch mixing; where rows inside a row group are correlated and the
//! model is sensitive to it, keep the windowed shuffle (and its copy).
//!
//! Resume state is the pair (epoch, batch index).

use crate::ids::{PlanKey, ShardId};
use crate::manifest::ShardRows;
use crate::rng::{Rng, seed_of};
use thiserror::Error;

mod cursor;
mod global;
mod walk;

pub use cursor::PlanCursor;
pub use global::{GlobalCursor, GlobalParams, GlobalPlan};
pub use shuffle_def::Shuffle;
pub use walk::{Cursor, Walk};

// rkyv derives undocumented resolver types for enums with fields.
#[allow(missing_docs)]
mod shuffle_def {

    /// How rows are shuffled.
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
    pub enum Shuffle {
        /// Manifest order, no shuffling.
        Off,
        /// Shards permuted per epoch; rows shuffled within windows of this many
        /// shard segments.
        Windowed {
            /// Shard segments per shuffle window (at least 1).
            window_shards: u32,
        },
        /// Shards permuted per epoch; rows keep their order, so every batch
        /// is a contiguous run of the rank's rows, and batches are permuted
        /// within groups of this many consecutive batches.
        Blocks {
            /// Consecutive batches per permuted group (at least 1).
            window_batches: u32,
        },
    }
}

/// Everything the plan depends on besides the shard list.
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
pub struct PlanParams {
    /// The job's seed.
    pub seed: u64,
    /// Epoch number, from 0.
    pub epoch: u64,
    /// Number of data-parallel ranks.
    pub world_size: u32,
    /// This rank, `0..world_size`.
    pub rank: u32,
    /// Rows per batch.
    pub batch_size: u32,
    /// Shuffle settings.
    pub shuffle: Shuffle,
    /// Drop rows that do not fill a whole batch on every rank.
    pub drop_last: bool,
}

/// One row of the dataset, addressed by shard index (into the manifest's
/// shard list) and row within the shard.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct RowRef {
    /// Index into the manifest's shard list.
    pub shard_index: u32,
    /// Row within the shard.
    pub row: u32,
}

/// Parameters that admit no plan.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlanError {
    /// `world_size` is zero or `rank` is not below it.
    #[error("rank {rank} is not in a world of {world_size}")]
    BadRank {
        /// The rank given.
        rank: u32,
        /// The world size given.
        world_size: u32,
    },
    /// `batch_size` is zero.
    #[error("batch size must be at least 1")]
    ZeroBatch,
    /// A shuffle window of zero shards (or a block group of zero batches).
    #[error("a shuffle window (window_shards, window_batches) must be at least 1")]
    ZeroWindow,
    /// A shard with more rows than a plan can address.
    #[error("shard {0} has more than 2^32 rows")]
    ShardTooLarge(ShardId),
    /// The rank's rows do not fit in memory.
    #[error("a plan of {rows} rows for one rank cannot be allocated")]
    TooManyRows {
        /// Rows of the rank's plan.
        rows: u64,
    },
    /// A global plan's canonical partitions are zero or more than the
    /// rows of a global batch.
    #[error("{partitions} canonical partitions with a global batch of {global_batch} rows: need 1 to {global_batch}")]
    BadPartitions {
        /// The partitions given.
        partitions: u32,
        /// The global batch given.
        global_batch: u32,
    },
    /// A global plan's world size that does not divide its global batch.
    #[error(
        "a world of {world_size} ranks cannot split a global batch of {global_batch} rows evenly: the world size \
         must divide the global batch"
    )]
    WorldNotDividingBatch {
        /// The world size given.
        world_size: u32,
        /// The global batch.
        global_batch: u32,
    },
    /// A rank plan asked of a loader that walks the global plan.
    #[error("this loader walks the global plan: its batches are slices of GlobalPlan's steps, not a rank plan")]
    NotTheRankPlan,
    /// A global step past the epoch's last.
    #[error("step {step} is past the epoch's {steps} global steps")]
    StepPastEnd {
        /// The step asked for.
        step: u64,
        /// Steps in the epoch.
        steps: u64,
    },
}

/// A rank's plan for one epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankPlan {
    params: PlanParams,
    rows: Vec<RowRef>,
    batch_ends: Vec<usize>,
    shard_order: Vec<u32>,
}

impl RankPlan {
    /// The parameters the plan was made from.
    pub fn params(&self) -> &PlanParams {
        &self.params
    }

    /// Number of batches (equal on every rank of the job).
    pub fn num_batches(&self) -> usize {
        self.batch_ends.len()
    }

    /// Rows of batch `i`, in order.
    pub fn batch(&self, i: usize) -> &[RowRef] {
        let start = if i == 0 { 0 } else { self.batch_ends[i - 1] };
        &self.rows[start..self.batch_ends[i]]
    }

    /// Total rows delivered to this rank this epoch.
    pub fn num_rows(&self) -> usize {
        self.batch_ends.last().copied().unwrap_or(0)
    }

    /// Shard indices in the order the rank first needs them: the order a
    /// node prefetches in.
    pub fn shard_order(&self) -> &[u32] {
        &self.shard_order
    }

    /// Index of the first batch that needs shard `shard_index`, if any.
    pub fn first_batch_needing(&self, shard_index: u32) -> Option<usize> {
        let pos = self.rows.iter().position(|r| r.shard_index == shard_index)?;
        Some(self.batch_ends.partition_point(|&end| end <= pos))
    }
}

/// Steps 1 and 2 of a rank's plan, shared by [`plan_rank`] and
/// [`rank_shard_order`].
struct Split {
    /// The epoch's shard order (indices into the manifest's shards).
    order: Vec<u32>,
    /// This rank's segments: (shard index, first row, end row).
    segments: Vec<(u32, u32, u32)>,
    /// Rows in the dataset.
    total: u64,
    /// This rank's range of the ordered row sequence.
    lo: u64,
    hi: u64,
    /// Segments per shuffle window.
    window: usize,
}

fn split(key: PlanKey, shards: &[ShardRows], params: &PlanParams) -> Result<Split, PlanError> {
    let w = u64::from(params.world_size);
    if params.world_size == 0 || params.rank >= params.world_size {
        return Err(PlanError::BadRank { rank: params.rank, world_size: params.world_size });
    }
    if params.batch_size == 0 {
        return Err(PlanError::ZeroBatch);
    }
    if let Shuffle::Windowed { window_shards: 0 } | Shuffle::Blocks { window_batches: 0 } = params.shuffle {
        return Err(PlanError::ZeroWindow);
    }
    if let Some(s) = shards.iter().find(|s| s.rows > u64::from(u32::MAX)) {
        return Err(PlanError::ShardTooLarge(s.shard));
    }

    // 1. Shard order.
    let order = shard_order(key, shards.len(), params.seed, params.epoch, params.shuffle);

    // 2. This rank's contiguous range of the ordered row sequence.
    let total: u64 = shards.iter().map(|s| s.rows).sum();
    let r = u64::from(params.rank);
    let lo = (u128::from(total) * u128::from(r) / u128::from(w)) as u64;
    let hi = (u128::from(total) * u128::from(r + 1) / u128::from(w)) as u64;
    let segments = segments_of(&order, shards, lo, hi);
    let window = match params.shuffle {
        Shuffle::Off | Shuffle::Blocks { .. } => segments.len().max(1),
        Shuffle::Windowed { window_shards } => window_shards as usize,
    };
    Ok(Split { order, segments, total, lo, hi, window })
}

/// Step 1: the epoch's shard order (indices into the manifest's shards),
/// permuted from (plan key, seed, epoch) unless the shuffle is `Off`.
/// Shared by the rank plan and the global plan ([`global`]).
fn shard_order(key: PlanKey, count: usize, seed: u64, epoch: u64, shuffle: Shuffle) -> Vec<u32> {
    let mut order: Vec<u32> = (0..count as u32).collect();
    if let Shuffle::Windowed { .. } | Shuffle::Blocks { .. } = shuffle {
        Rng::new(seed_of(&[key.0, seed, epoch, 0x5348_4152_4453])).shuffle(&mut order);
    }
    order
}

/// The rows `[lo, hi)` of the ordered row sequence as segments (shard
/// index, first row, end row), in order. Shards hold at most 2^32 rows
/// (checked by the callers).
fn segments_of(order: &[u32], shards: &[ShardRows], lo: u64, hi: u64) -> Vec<(u32, u32, u32)> {
    let mut segments = Vec::new();
    let mut pos = 0u64;
    for &s in order {
        if pos >= hi {
            break;
        }
        let rows = shards[s as usize].rows;
        let (start, end) = (pos.max(lo), (pos + rows).min(hi));
        if start < end {
            segments.push((s, (start - pos) as u32, (end - pos) as u32));
        }
        pos += rows;
    }
    segments
}

/// The most rows one shuffle window of a rank's plan can hold: what
/// planning it materialises at once (a [`RowRef`], 8 bytes, each). The
/// rows of the `window_shards` largest shards, at most the rank's share
/// of the dataset; 0 for `Off` and `Blocks`, which materialise no rows.
/// Cheap (no plan is built), so a node can refuse a plan before it
/// spends anything on it.
pub fn window_rows_bound(shards: &[ShardRows], params: &PlanParams) -> u64 {
    let Shuffle::Windowed { window_shards } = params.shuffle else { return 0 };
    let total: u64 = shards.iter().map(|s| s.rows).fold(0, u64::saturating_add);
    let rank_rows = total.div_ceil(u64::from(params.world_size.max(1)));
    let mut rows: Vec<u64> = shards.iter().map(|s| s.rows).collect();
    rows.sort_unstable_by(|a, b| b.cmp(a));
    let largest: u64 = rows.iter().take(window_shards as usize).fold(0, |a, &r| a.saturating_add(r));
    largest.min(rank_rows)
}

/// Bytes per shard that planning one rank keeps in tables (the shard
/// order, the shard list, pending counts, segments and their starts, the
/// first-seen marks and the shard order it returns), rounded up.
const PLAN_BYTES_PER_SHARD: u64 = 64;

/// What planning one rank costs in memory, from row counts alone
/// ([`plan_cost`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PlanCost {
    /// The rank's batches (a batch end of 8 bytes each).
    pub batches: u64,
    /// Entries of the largest shuffle window it materialises (8 bytes
    /// each): rows with `Windowed` ([`window_rows_bound`]), a group's batch
    /// permutation with `Blocks`, none with `Off`.
    pub window_entries: u64,
    /// The most bytes planning holds at once: both of the above and
    /// [`PLAN_BYTES_PER_SHARD`] per shard (saturating).
    pub bytes: u64,
}

/// The most memory planning one rank holds at once ([`PlanCursor`],
/// [`rank_shard_order`]), for every shuffle. Cheap (nothing is planned or
/// allocated; saturating, so absurd parameters give a huge number, never an
/// overflow), so a node refuses a plan before it spends anything on it: a
/// `Follow` with batch 1 and a block window of `u32::MAX` over a billion
/// rows is refused here, not met by a 16 GB allocation.
pub fn plan_cost(shards: &[ShardRows], params: &PlanParams) -> PlanCost {
    let total: u64 = shards.iter().map(|s| s.rows).fold(0, u64::saturating_add);
    let rank_rows = total.div_ceil(u64::from(params.world_size.max(1)));
    let batches = rank_rows.div_ceil(u64::from(params.batch_size.max(1)));
    let window_entries = match params.shuffle {
        Shuffle::Off => 0,
        Shuffle::Windowed { .. } => window_rows_bound(shards, params),
        Shuffle::Blocks { window_batches } => batches.min(u64::from(window_batches)),
    };
    let per_shard = (shards.len() as u64).saturating_mul(PLAN_BYTES_PER_SHARD);
    let bytes = batches.saturating_add(window_entries).saturating_mul(8).saturating_add(per_shard);
    PlanCost { batches, window_entries, bytes }
}

/// The rows of window `wi` (its `segments`), shuffled as the plan shuffles
/// them, appended to `rows`.
fn window_rows(key: PlanKey, params: &PlanParams, wi: usize, segments: &[(u32, u32, u32)], rows: &mut Vec<RowRef>) {
    let first = rows.len();
    for &(s, a, b) in segments {
        rows.extend((a..b).map(|row| RowRef { shard_index: s, row }));
    }
    if let Shuffle::Windowed { .. } = params.shuffle {
        let (w, r) = (u64::from(params.world_size), u64::from(params.rank));
        let seed = seed_of(&[key.0, params.seed, params.epoch, w, r, wi as u64, 0x524f_5753]);
        Rng::new(seed).shuffle(&mut rows[first..]);
    }
}

/// Step 5: the source batch of each batch of group `group` (its `n`
/// batches), a permutation of `0..n`.
fn block_order(key: PlanKey, params: &PlanParams, group: usize, n: usize) -> Vec<usize> {
    let (w, r) = (u64::from(params.world_size), u64::from(params.rank));
    let seed = seed_of(&[key.0, params.seed, params.epoch, w, r, group as u64, 0x424c_4f43_4b53]);
    let mut order: Vec<usize> = (0..n).collect();
    Rng::new(seed).shuffle(&mut order);
    order
}

/// The shard indices of a rank's plan in the order it first needs them:
/// equal to `plan_rank(key, shards, params)?.shard_order()`, computed
/// one shuffle window at a time, so memory stays bounded by a window's rows
/// rather than the rank's whole epoch (a node computes it for every rank it
/// serves, for several epochs ahead).
pub fn rank_shard_order(key: PlanKey, shards: &[ShardRows], params: &PlanParams) -> Result<Vec<u32>, PlanError> {
    if let Shuffle::Blocks { .. } = params.shuffle {
        // Batches are contiguous runs: walk them as the cursor does, a
        // piece of a shard at a time (no rows are generated).
        let mut cursor = PlanCursor::new(key, shards, params, 0)?;
        let mut seen = vec![false; shards.len()];
        let mut out = Vec::new();
        while cursor.next_batch_pieces(|s, _, _| {
            if !std::mem::replace(&mut seen[s as usize], true) {
                out.push(s);
            }
        }) {}
        return Ok(out);
    }
    let sp = split(key, shards, params)?;
    let w = u64::from(params.world_size);
    let b = u64::from(params.batch_size);
    // drop_last keeps the first K*B rows; otherwise every row is kept.
    let keep = if params.drop_last { sp.total / w / b * b } else { u64::MAX };
    let mut seen = vec![false; shards.len()];
    let mut out = Vec::new();
    let mut note = |s: u32| {
        if !std::mem::replace(&mut seen[s as usize], true) {
            out.push(s);
        }
    };
    let mut emitted = 0u64;
    let mut rows: Vec<RowRef> = Vec::new();
    for (wi, win) in sp.segments.chunks(sp.window).enumerate() {
        if emitted >= keep {
            break;
        }
        match params.shuffle {
            // Unshuffled rows appear in segment order.
            Shuffle::Off => {
                for &(s, a, e) in win {
                    if emitted >= keep {
                        break;
                    }
                    note(s);
                    emitted += u64::from(e - a);
                }
            }
            Shuffle::Windowed { .. } | Shuffle::Blocks { .. } => {
                let n: u64 = win.iter().map(|&(_, a, e)| u64::from(e - a)).sum();
                rows.clear();
                usize::try_from(n)
                    .ok()
                    .and_then(|n| rows.try_reserve_exact(n).ok())
                    .ok_or(PlanError::TooManyRows { rows: n })?;
                window_rows(key, params, wi, win, &mut rows);
                let take = usize::try_from((keep - emitted).min(n)).unwrap_or(usize::MAX);
                for r in &rows[..take.min(rows.len())] {
                    note(r.shard_index);
                }
                emitted += n;
            }
        }
    }
    // Wrap-around padding gives a rank without rows one row of the global
    // order; a rank with rows only repeats its own.
    if !params.drop_last && sp.total > 0 && sp.hi == sp.lo {
        let r = u64::from(params.rank);
        note(global_row(&sp.order, shards, r % sp.total).shard_index);
    }
    Ok(out)
}

/// Plans one rank's epoch. Pure: same inputs, same plan, byte for byte.
pub fn plan_rank(key: PlanKey, shards: &[ShardRows], params: &PlanParams) -> Result<RankPlan, PlanError> {
    let Split { order, segments, total, lo, hi, window } = split(key, shards, params)?;
    let w = u64::from(params.world_size);
    let r = u64::from(params.rank);

    // 3. Rows, window by window.
    // The row count comes from Parquet footers: a corrupt one must give an
    // error here, not abort the process on a failed allocation.
    let mut rows: Vec<RowRef> = Vec::new();
    usize::try_from(hi - lo)
        .ok()
        .and_then(|n| rows.try_reserve_exact(n).ok())
        .ok_or(PlanError::TooManyRows { rows: hi - lo })?;
    for (wi, win) in segments.chunks(window).enumerate() {
        window_rows(key, params, wi, win, &mut rows);
    }

    // 4. Batches.
    let (batch_ends, rows_len) = batch_ends(total, w, u64::from(params.batch_size), rows.len(), params.drop_last);
    if rows.len() > rows_len {
        rows.truncate(rows_len);
    } else if rows.len() < rows_len {
        // Wrap-around padding: only when N < W, or B = 1 with W not
        // dividing N. A rank with no rows of its own repeats a row of the
        // global order so it still has a row to give.
        if rows.is_empty() {
            rows.push(global_row(&order, shards, r % total));
        }
        let have = rows.len();
        for i in 0..rows_len - have {
            rows.push(rows[i % have]);
        }
    }

    // 5. Block shuffle: batches permuted within groups.
    let (rows, batch_ends) = match params.shuffle {
        Shuffle::Blocks { window_batches } => {
            let (mut out, mut ends) = (Vec::with_capacity(rows.len()), Vec::with_capacity(batch_ends.len()));
            for (g, group) in batch_ends.chunks(window_batches as usize).enumerate() {
                let first = g * window_batches as usize;
                for j in block_order(key, params, g, group.len()) {
                    let start = if first + j == 0 { 0 } else { batch_ends[first + j - 1] };
                    out.extend_from_slice(&rows[start..group[j]]);
                    ends.push(out.len());
                }
            }
            (out, ends)
        }
        Shuffle::Off | Shuffle::Windowed { .. } => (rows, batch_ends),
    };

    let mut seen = vec![false; shards.len()];
    let mut shard_order = Vec::new();
    for row in &rows {
        let s = row.shard_index as usize;
        if !seen[s] {
            seen[s] = true;
            shard_order.push(row.shard_index);
        }
    }
    Ok(RankPlan { params: *params, rows, batch_ends, shard_order })
}

/// The batch ends of a rank with `n` rows of its own, and the number of
/// rows its batches hold (fewer than `n` with `drop_last`, more with
/// wrap-around padding).
fn batch_ends(total: u64, w: u64, b: u64, n: usize, drop_last: bool) -> (Vec<usize>, usize) {
    let q = total / w;
    let max_rows = q + u64::from(!total.is_multiple_of(w));
    let mut ends = Vec::new();
    if drop_last {
        let k = q / b;
        ends.extend((1..=k).map(|i| (i * b) as usize));
        return (ends, (k * b) as usize);
    }
    if total == 0 {
        return (ends, 0);
    }
    let k = max_rows.div_ceil(b) as usize;
    let rows_len = n.max(k);
    let mut left = rows_len;
    let mut end = 0usize;
    for i in 0..k {
        let after = k - 1 - i;
        let size = (b as usize).min(left - after);
        end += size;
        left -= size;
        ends.push(end);
    }
    (ends, rows_len)
}

/// The row at position `pos` of the ordered global sequence.
fn global_row(order: &[u32], shards: &[ShardRows], mut pos: u64) -> RowRef {
    for &s in order {
        let rows = shards[s as usize].rows;
        if pos < rows {
            return RowRef { shard_index: s, row: pos as u32 };
        }
        pos -= rows;
    }
    // Callers pass pos < total, so the loop always returns.
    RowRef { shard_index: order[0], row: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn shards(rows: &[u64]) -> Vec<ShardRows> {
        rows.iter()
            .enumerate()
            .map(|(i, &r)| ShardRows { shard: ShardId { file: i as u32 / 3, row_group: i as u32 % 3 }, rows: r })
            .collect()
    }

    fn params(seed: u64, epoch: u64, w: u32, r: u32, b: u32, window: u32, drop_last: bool) -> PlanParams {
        PlanParams { seed, epoch, world_size: w, rank: r, batch_size: b, shuffle: shuffle(window), drop_last }
    }

    /// 0: off; 1-3: windows of that many shards; 4 and up: blocks, in
    /// groups of `window - 3` batches.
    fn shuffle(window: u32) -> Shuffle {
        match window {
            0 => Shuffle::Off,
            1..=3 => Shuffle::Windowed { window_shards: window },
            _ => Shuffle::Blocks { window_batches: window - 3 },
        }
    }

    const V: PlanKey = PlanKey(7);

    #[test]
    fn without_shuffle_a_single_rank_reads_manifest_order() {
        let s = shards(&[2, 3]);
        let p = plan_rank(V, &s, &params(1, 0, 1, 0, 2, 0, false)).unwrap();
        let flat: Vec<(u32, u32)> =
            (0..p.num_batches()).flat_map(|i| p.batch(i).to_vec()).map(|r| (r.shard_index, r.row)).collect();
        assert_eq!(flat, [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]);
        assert_eq!(p.num_batches(), 3);
    }

    #[test]
    fn epochs_and_seeds_change_the_order() {
        let s = shards(&[50; 8]);
        let a = plan_rank(V, &s, &params(1, 0, 2, 0, 8, 2, false)).unwrap();
        let b = plan_rank(V, &s, &params(1, 1, 2, 0, 8, 2, false)).unwrap();
        let c = plan_rank(V, &s, &params(2, 0, 2, 0, 8, 2, false)).unwrap();
        assert_ne!(a.batch(0), b.batch(0));
        assert_ne!(a.batch(0), c.batch(0));
    }

    #[test]
    fn bad_parameters_are_refused() {
        let s = shards(&[5]);
        assert_eq!(
            plan_rank(V, &s, &params(0, 0, 2, 2, 1, 0, false)),
            Err(PlanError::BadRank { rank: 2, world_size: 2 })
        );
        assert_eq!(plan_rank(V, &s, &params(0, 0, 1, 0, 0, 0, false)), Err(PlanError::ZeroBatch));
    }

    fn all_ranks(s: &[ShardRows], p: PlanParams) -> Vec<RankPlan> {
        (0..p.world_size).map(|r| plan_rank(V, s, &PlanParams { rank: r, ..p }).unwrap()).collect()
    }

    /// Ranks without rows of their own (N < W) pad with a global row; the
    /// cursor gives it too, from any start.
    #[test]
    fn a_cursor_pads_a_rank_without_rows_like_the_plan() {
        let s = shards(&[2]);
        for b in [1, 3] {
            for r in 0..4 {
                for window in [0, 1, 5] {
                    let p = params(9, 1, 4, r, b, window, false);
                    let plan = plan_rank(V, &s, &p).unwrap();
                    for start in [0, 1, 5] {
                        let mut cursor = PlanCursor::new(V, &s, &p, start).unwrap();
                        let mut out = Vec::new();
                        while let Some(i) = cursor.next_batch(&mut out) {
                            assert_eq!(&out[..], plan.batch(i), "rank {r} batch {i} start {start}");
                        }
                    }
                }
            }
        }
    }

    proptest! {
        /// `pending` says exactly whether a shard's rows are still to come
        /// (the loader drops a chunk when it turns false).
        #[test]
        fn a_cursor_knows_which_shards_are_still_needed(rows in prop::collection::vec(0u64..40, 0..12), seed in any::<u64>(),
                                 w in 1u32..5, b in 1u32..9, window in 0u32..8, drop_last in any::<bool>()) {
            let s = shards(&rows);
            for r in 0..w {
                let p = params(seed, 4, w, r, b, window, drop_last);
                let plan = plan_rank(V, &s, &p).unwrap();
                // The last batch reading each shard (a padding row repeats
                // one of the rank's rows, so it appears twice).
                let mut last_use = vec![None; s.len()];
                let mut uses: BTreeMap<RowRef, usize> = BTreeMap::new();
                for i in 0..plan.num_batches() {
                    for row in plan.batch(i) {
                        last_use[row.shard_index as usize] = Some(i);
                        *uses.entry(*row).or_default() += 1;
                    }
                }
                let mut cursor = PlanCursor::new(V, &s, &p, 0).unwrap();
                let mut out = Vec::new();
                let mut seen = vec![false; s.len()];
                while let Some(i) = cursor.next_batch(&mut out) {
                    for row in &out {
                        seen[row.shard_index as usize] = true;
                    }
                    for (shard, used) in last_use.iter().enumerate() {
                        if !seen[shard] {
                            continue;
                        }
                        // A padding row at the very end may reuse a shard
                        // the cursor already let go (it fetches it again).
                        let padded_later = used.is_some_and(|u| u > i) && !cursor.pending(shard as u32);
                        if padded_later {
                            let later: Vec<RowRef> = (i + 1..plan.num_batches())
                                .flat_map(|k| plan.batch(k).to_vec())
                                .filter(|r| r.shard_index == shard as u32)
                                .collect();
                            prop_assert!(later.iter().all(|r| uses[r] > 1), "shard {} after batch {}", shard, i);
                            continue;
                        }
                        prop_assert_eq!(cursor.pending(shard as u32), used.is_some_and(|u| u > i), "shard {} after batch {}", shard, i);
                    }
                }
            }
        }

        #[test]
        fn a_cursor_gives_the_plans_batches_from_any_start(rows in prop::collection::vec(0u64..40, 0..12), seed in any::<u64>(),
                                 w in 1u32..6, b in 1u32..9, window in 0u32..8, drop_last in any::<bool>(), start in 0usize..20) {
            let s = shards(&rows);
            for r in 0..w {
                let p = params(seed, 2, w, r, b, window, drop_last);
                let plan = plan_rank(V, &s, &p).unwrap();
                let mut cursor = PlanCursor::new(V, &s, &p, start).unwrap();
                prop_assert_eq!(cursor.num_batches(), plan.num_batches());
                let mut out = Vec::new();
                let mut i = start.min(plan.num_batches());
                while let Some(got) = cursor.next_batch(&mut out) {
                    prop_assert_eq!(got, i);
                    prop_assert_eq!(&out[..], plan.batch(i));
                    i += 1;
                }
                prop_assert_eq!(i, plan.num_batches());
            }
        }

        #[test]
        fn the_shard_order_alone_equals_the_plans(rows in prop::collection::vec(0u64..40, 0..12), seed in any::<u64>(),
                                 w in 1u32..6, b in 1u32..9, window in 0u32..8, drop_last in any::<bool>()) {
            let s = shards(&rows);
            for r in 0..w {
                let p = params(seed, 5, w, r, b, window, drop_last);
                let plan = plan_rank(V, &s, &p).unwrap();
                prop_assert_eq!(rank_shard_order(V, &s, &p).unwrap(), plan.shard_order().to_vec());
            }
        }

        #[test]
        fn same_inputs_same_plan(rows in prop::collection::vec(0u64..40, 0..12), seed in any::<u64>(),
                                 w in 1u32..5, b in 1u32..9, window in 0u32..8, drop_last in any::<bool>()) {
            let s = shards(&rows);
            for r in 0..w {
                let p = params(seed, 3, w, r, b, window, drop_last);
                prop_assert_eq!(plan_rank(V, &s, &p).unwrap(), plan_rank(V, &s.clone(), &p).unwrap());
            }
        }

        #[test]
        fn equal_batch_counts_and_bounded_batches(rows in prop::collection::vec(0u64..40, 0..12), seed in any::<u64>(),
                                                  w in 1u32..6, b in 1u32..9, window in 0u32..8, drop_last in any::<bool>()) {
            let s = shards(&rows);
            let plans = all_ranks(&s, params(seed, 1, w, 0, b, window, drop_last));
            let k = plans[0].num_batches();
            for p in &plans {
                prop_assert_eq!(p.num_batches(), k);
                for i in 0..k {
                    let n = p.batch(i).len();
                    prop_assert!(n >= 1 && n <= b as usize);
                    if drop_last { prop_assert_eq!(n, b as usize); }
                }
            }
        }

        #[test]
        fn each_row_exactly_once_when_drop_last_is_off(rows in prop::collection::vec(0u64..40, 0..12), seed in any::<u64>(),
                                                        w in 1u32..6, b in 2u32..9, window in 0u32..8) {
            let s = shards(&rows);
            let total: u64 = rows.iter().sum();
            prop_assume!(total >= u64::from(w));
            let plans = all_ranks(&s, params(seed, 2, w, 0, b, window, false));
            let mut count: BTreeMap<RowRef, u32> = BTreeMap::new();
            for p in &plans {
                for i in 0..p.num_batches() {
                    for r in p.batch(i) { *count.entry(*r).or_default() += 1; }
                }
            }
            prop_assert_eq!(count.len() as u64, total);
            prop_assert!(count.values().all(|&c| c == 1));
            for (i, sh) in s.iter().enumerate() {
                for row in 0..sh.rows {
                    let key = RowRef { shard_index: i as u32, row: row as u32 };
                    prop_assert!(count.contains_key(&key));
                }
            }
        }

        #[test]
        fn padding_only_where_unavoidable(rows in prop::collection::vec(0u64..6, 1..4), w in 1u32..8) {
            // batch size 1: padding happens iff W does not divide N (or N < W).
            let s = shards(&rows);
            let total: u64 = rows.iter().sum();
            prop_assume!(total > 0);
            let plans = all_ranks(&s, params(5, 0, w, 0, 1, 1, false));
            let delivered: usize = plans.iter().map(RankPlan::num_rows).sum();
            let k = total.div_ceil(u64::from(w));
            prop_assert_eq!(delivered as u64, k * u64::from(w));
        }

        /// A block-shuffled plan is the rank's rows in sequence order, cut
        /// into the usual batches, with the batches permuted within groups.
        #[test]
        fn block_batches_are_contiguous_runs_permuted_within_groups(rows in prop::collection::vec(0u64..40, 0..12),
                                 seed in any::<u64>(), w in 1u32..5, b in 2u32..9, groups in 1u32..5, drop_last in any::<bool>()) {
            let s = shards(&rows);
            for r in 0..w {
                let p = |g| PlanParams { shuffle: Shuffle::Blocks { window_batches: g }, ..params(seed, 3, w, r, b, 0, drop_last) };
                let (unpermuted, blocks) = (plan_rank(V, &s, &p(1)).unwrap(), plan_rank(V, &s, &p(groups)).unwrap());
                // Groups of one batch keep the sequence: the segments' rows
                // in order (then padding, which only repeats rows).
                let sequence: Vec<RowRef> = split(V, &s, &p(1)).unwrap().segments.iter()
                    .flat_map(|&(sh, a, e)| (a..e).map(move |row| RowRef { shard_index: sh, row }))
                    .collect();
                let flat: Vec<RowRef> = (0..unpermuted.num_batches()).flat_map(|i| unpermuted.batch(i).to_vec()).collect();
                let n = flat.len().min(sequence.len());
                prop_assert_eq!(&flat[..n], &sequence[..n]);
                // Each group holds the same batches, in some order.
                prop_assert_eq!(blocks.num_batches(), unpermuted.num_batches());
                for g in (0..blocks.num_batches()).collect::<Vec<_>>().chunks(groups as usize) {
                    let mut got: Vec<&[RowRef]> = g.iter().map(|&i| blocks.batch(i)).collect();
                    let mut want: Vec<&[RowRef]> = g.iter().map(|&i| unpermuted.batch(i)).collect();
                    got.sort();
                    want.sort();
                    prop_assert_eq!(got, want);
                }
            }
        }

        /// The plan-memory bound covers, for every shuffle, what planning
        /// materialises: a batch end per batch, and a window's rows or a
        /// group's permutation.
        #[test]
        fn planning_stays_within_the_plan_cost(rows in prop::collection::vec(0u64..60, 0..16),
                                 seed in any::<u64>(), w in 1u32..5, b in 1u32..9, window in 0u32..5, groups in 1u32..7) {
            let s = shards(&rows);
            for r in 0..w {
                for p in [params(seed, 1, w, r, b, window, false),
                          PlanParams { shuffle: Shuffle::Blocks { window_batches: groups }, ..params(seed, 1, w, r, b, 0, false) }] {
                    let plan = plan_rank(V, &s, &p).unwrap();
                    let n = plan.num_batches() as u64;
                    let entries = match p.shuffle {
                        Shuffle::Off => 0,
                        Shuffle::Windowed { .. } => window_rows_bound(&s, &p),
                        Shuffle::Blocks { window_batches } => n.min(u64::from(window_batches)),
                    };
                    prop_assert!(8 * (n + entries) <= plan_cost(&s, &p).bytes, "{:?}", p);
                }
            }
        }

        #[test]
        fn no_window_holds_more_rows_than_the_bound(rows in prop::collection::vec(0u64..50, 0..16),
                                 seed in any::<u64>(), w in 1u32..5, window in 1u32..4) {
            let s = shards(&rows);
            for r in 0..w {
                let p = params(seed, 2, w, r, 4, window, false);
                let sp = split(V, &s, &p).unwrap();
                let most = sp.segments.chunks(sp.window).map(|win| win.iter().map(|&(_, a, e)| u64::from(e - a)).sum::<u64>()).max().unwrap_or(0);
                prop_assert!(most <= window_rows_bound(&s, &p), "{} rows in a window, bound {}", most, window_rows_bound(&s, &p));
            }
        }

        #[test]
        fn windows_bound_the_shards_in_flight(rows in prop::collection::vec(1u64..30, 1..16), seed in any::<u64>(), window in 1u32..4) {
            // Rows of window i never appear before rows of window i-1 end:
            // the set of distinct shards in any run of consecutive rows that
            // stays within one window is at most `window`.
            let s = shards(&rows);
            let p = plan_rank(V, &s, &params(seed, 0, 1, 0, 4, window, false)).unwrap();
            let all: Vec<RowRef> = (0..p.num_batches()).flat_map(|i| p.batch(i).to_vec()).collect();
            let per_window: Vec<_> = p.shard_order().chunks(window as usize).collect();
            let mut cursor = 0;
            for win in per_window {
                let n: u64 = win.iter().map(|&i| s[i as usize].rows).sum();
                let slice = &all[cursor..cursor + n as usize];
                prop_assert!(slice.iter().all(|r| win.contains(&r.shard_index)));
                cursor += n as usize;
            }
        }
    }

    /// Issue 29: a rank's plan over a billion rows with batch 1 and a block
    /// window of u32::MAX is priced (about 16 GB), not planned: the check
    /// allocates nothing however large the numbers.
    #[test]
    fn the_plan_cost_prices_a_huge_block_plan_without_planning_it() {
        let s: Vec<ShardRows> =
            (0..1000u32).map(|i| ShardRows { shard: ShardId { file: i, row_group: 0 }, rows: 1_000_000 }).collect();
        let p = PlanParams {
            seed: 1,
            epoch: 0,
            world_size: 1,
            rank: 0,
            batch_size: 1,
            shuffle: Shuffle::Blocks { window_batches: u32::MAX },
            drop_last: false,
        };
        assert_eq!(
            plan_cost(&s, &p),
            PlanCost { batches: 1_000_000_000, window_entries: 1_000_000_000, bytes: 16 * 1_000_000_000 + 64 * 1000 }
        );
        let absurd = vec![ShardRows { shard: ShardId { file: 0, row_group: 0 }, rows: u64::MAX }; 3];
        assert_eq!(plan_cost(&absurd, &p).bytes, u64::MAX, "saturates");
        let windowed = PlanParams { shuffle: Shuffle::Windowed { window_shards: 3 }, ..p };
        assert_eq!(plan_cost(&absurd, &windowed).bytes, u64::MAX, "saturates, windowed too");
        // The same rows in batches of 1,024 with the default window cost little.
        let small = PlanParams { batch_size: 1024, shuffle: Shuffle::Blocks { window_batches: 64 }, ..p };
        assert!(plan_cost(&s, &small).bytes < 16 << 20);
    }
}
