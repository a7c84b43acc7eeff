//! The global plan: one sequence of global batches per epoch, whatever the
//! world size, of which every rank takes its slice (issue 32).
//!
//! The rank plan ([`super::plan_rank`]) depends on the world size: rank `r`
//! of `W` takes the `r`-th `1/W` of the epoch's rows, so a job restarted on
//! another number of ranks gets other streams and cannot resume its epoch.
//! The global plan depends on (plan key, seed, epoch, global batch `G`,
//! canonical partitions `P`, shuffle, drop_last) and the shard list, never
//! on the world size:
//!
//! 1. **Shard order**, as the rank plan: permuted from (plan key, seed,
//!    epoch) unless the shuffle is `Off`.
//! 2. **Canonical partitions.** The ordered rows are cut into `P`
//!    contiguous partitions, partition `p` sized in proportion to its
//!    **share** `c_p = floor((p+1)G/P) - floor(pG/P)` of each global batch
//!    (so every partition runs out at about the same step). `P` is chosen
//!    at job start and fixed for the job, like Mosaic Streaming's
//!    `num_canonical_nodes`; `1 <= P <= G`.
//! 3. **Shuffle inside a partition.** `Windowed`: rows are permuted within
//!    windows of `window_shards` shard segments of the partition. `Blocks`:
//!    rows keep their order; the partition is cut into chunks of `c_p`
//!    rows and the full chunks are permuted within groups of
//!    `window_batches` (a short last chunk stays last). `Off`: neither.
//!    Seeds are (plan key, seed, epoch, `P`, `p`, window or group): not the
//!    world size.
//! 4. **The global sequence** `S` is round after round; round `k` is, for
//!    `p` in order, partition `p`'s `k`-th chunk of `c_p` rows (fewer once
//!    the partition runs out). **Global step** `k` is rows `[kG, (k+1)G)` of
//!    `S`: `floor(N/G)` steps with `drop_last` (the last `N mod G` rows of
//!    `S` are not delivered that epoch), else `ceil(N/G)`, the last one
//!    short.
//! 5. **Ranks.** With `W` ranks (`W` divides `G`), rank `r` takes rows
//!    `[r*L/W, (r+1)*L/W)` of each step of `L` rows: `G/W` rows of every full
//!    step; of a short last step, its share rounded (ranks differ by at most
//!    one row, and a rank gets an empty last batch when the step has fewer
//!    rows than there are ranks).
//!
//! So the concatenation of the ranks' batches of step `k` is the same rows
//! in the same order for every `W` dividing `G`, and a job stopped after
//! step `k` resumes at step `k + 1` on any such `W` with no row lost or
//! repeated. Locality: a full round is exactly one step, and partitions sit
//! in order inside it, so rank `r`'s slice of a step lies in the
//! partitions around `[rP/W, (r+1)P/W]`: a rank reads about `1/W` of the
//! shards in each window, and a node prefetches along its ranks'
//! partitions.

use super::{PlanError, RowRef, Shuffle, segments_of, shard_order};
use crate::ids::PlanKey;
use crate::manifest::ShardRows;
use crate::rng::{Rng, seed_of};

/// Seed domain of a partition's window shuffle.
const WINDOW_TAG: u64 = 0x474c_4f42_5749_4e44;
/// Seed domain of a partition's chunk groups (`Blocks`).
const GROUP_TAG: u64 = 0x474c_4f42_4752_5550;

/// Everything a global plan depends on besides the shard list: no world
/// size, no rank.
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
pub struct GlobalParams {
    /// The job's seed.
    pub seed: u64,
    /// Epoch number, from 0.
    pub epoch: u64,
    /// Rows of one global step, all ranks together.
    pub global_batch: u32,
    /// Canonical partitions, fixed for the job (`1..=global_batch`).
    pub partitions: u32,
    /// Shuffle settings.
    pub shuffle: Shuffle,
    /// Deliver only full global steps.
    pub drop_last: bool,
}

/// One canonical partition: its rows in plan order, a window at a time.
#[derive(Debug)]
struct Partition {
    /// Its rows, as segments of shards in the epoch's shard order.
    segments: Vec<(u32, u32, u32)>,
    /// Where each segment starts in the partition.
    segment_starts: Vec<u64>,
    /// Rows in it.
    rows: u64,
    /// Its rows per round, `c_p`.
    share: u64,
    /// `Windowed`: where each window of segments starts, and the window
    /// last materialised (its index and rows).
    window_starts: Vec<u64>,
    window: Option<(usize, Vec<RowRef>)>,
    /// `Blocks`: the chunk permutation of the group last used.
    group: Option<(u64, Vec<u64>)>,
}

/// An epoch's global plan. Pure: the same inputs give the same steps, byte
/// for byte, on every process and for every world size.
#[derive(Debug)]
pub struct GlobalPlan {
    key: PlanKey,
    params: GlobalParams,
    parts: Vec<Partition>,
    /// `C_p`: where partition `p`'s rows start inside a full round.
    offsets: Vec<u64>,
    /// Rounds in which every partition gives its whole share.
    full_rounds: u64,
    /// Rows in the epoch (`N`).
    total: u64,
    /// Global steps.
    steps: u64,
}

impl GlobalPlan {
    /// The global plan of `shards` (the manifest's shard list) under `params`.
    pub fn new(key: PlanKey, shards: &[ShardRows], params: &GlobalParams) -> Result<Self, PlanError> {
        let (g, p) = (u64::from(params.global_batch), u64::from(params.partitions));
        if g == 0 {
            return Err(PlanError::ZeroBatch);
        }
        if p == 0 || p > g {
            return Err(PlanError::BadPartitions { partitions: params.partitions, global_batch: params.global_batch });
        }
        if let Shuffle::Windowed { window_shards: 0 } | Shuffle::Blocks { window_batches: 0 } = params.shuffle {
            return Err(PlanError::ZeroWindow);
        }
        if let Some(s) = shards.iter().find(|s| s.rows > u64::from(u32::MAX)) {
            return Err(PlanError::ShardTooLarge(s.shard));
        }
        let order = shard_order(key, shards.len(), params.seed, params.epoch, params.shuffle);
        let total: u64 = shards.iter().map(|s| s.rows).sum();
        let offsets: Vec<u64> = (0..=p).map(|i| i * g / p).collect();
        let bound = |c: u64| (u128::from(total) * u128::from(c) / u128::from(g)) as u64;
        let mut parts = Vec::with_capacity(p as usize);
        for i in 0..p as usize {
            let (lo, hi) = (bound(offsets[i]), bound(offsets[i + 1]));
            let segments = segments_of(&order, shards, lo, hi);
            let mut segment_starts = Vec::with_capacity(segments.len());
            let mut at = 0u64;
            for &(_, a, e) in &segments {
                segment_starts.push(at);
                at += u64::from(e - a);
            }
            let window_starts = match params.shuffle {
                Shuffle::Windowed { window_shards } => {
                    segment_starts.iter().step_by(window_shards as usize).copied().collect()
                }
                Shuffle::Off | Shuffle::Blocks { .. } => Vec::new(),
            };
            parts.push(Partition {
                segments,
                segment_starts,
                rows: hi - lo,
                share: offsets[i + 1] - offsets[i],
                window_starts,
                window: None,
                group: None,
            });
        }
        let full_rounds = parts.iter().map(|q| q.rows / q.share).min().unwrap_or(0);
        let steps = if params.drop_last { total / g } else { total.div_ceil(g) };
        Ok(Self { key, params: *params, parts, offsets, full_rounds, total, steps })
    }

    /// The parameters the plan was made from.
    pub fn params(&self) -> &GlobalParams {
        &self.params
    }

    /// Global steps in the epoch (every rank has this many batches).
    pub fn num_steps(&self) -> u64 {
        self.steps
    }

    /// Rows the epoch delivers, all ranks together: every row, or with
    /// `drop_last` the full steps' rows.
    pub fn num_rows(&self) -> u64 {
        self.total.min(self.steps * u64::from(self.params.global_batch))
    }

    /// Rows of global step `step`: the global batch size, or fewer for a
    /// short last step.
    pub fn step_rows(&self, step: u64) -> u64 {
        let g = u64::from(self.params.global_batch);
        self.num_rows().saturating_sub(step.saturating_mul(g)).min(g)
    }

    /// Whether rank `rank` of `world_size` can walk this plan: the world
    /// size divides the global batch, and the rank is in the world.
    pub fn check_world(&self, world_size: u32, rank: u32) -> Result<(), PlanError> {
        check_world(&self.params, world_size, rank)
    }

    /// Positions in the global sequence of rank `rank`'s slice of step
    /// `step` with `world_size` ranks.
    pub fn rank_span(&self, step: u64, world_size: u32, rank: u32) -> Result<(u64, u64), PlanError> {
        let g = self.params.global_batch;
        self.check_world(world_size, rank)?;
        if step >= self.steps {
            return Err(PlanError::StepPastEnd { step, steps: self.steps });
        }
        let (len, w, r) = (self.step_rows(step), u64::from(world_size), u64::from(rank));
        let start = step * u64::from(g);
        Ok((start + r * len / w, start + (r + 1) * len / w))
    }

    /// Rank `rank`'s batch of step `step` with `world_size` ranks, into
    /// `out` (cleared first).
    pub fn rank_batch(
        &mut self,
        step: u64,
        world_size: u32,
        rank: u32,
        out: &mut Vec<RowRef>,
    ) -> Result<(), PlanError> {
        let (lo, hi) = self.rank_span(step, world_size, rank)?;
        out.clear();
        self.rows(lo, hi, out);
        Ok(())
    }

    /// The whole global batch of step `step` (what one rank of a world of
    /// one gets), into `out`.
    pub fn global_batch(&mut self, step: u64, out: &mut Vec<RowRef>) -> Result<(), PlanError> {
        self.rank_batch(step, 1, 0, out)
    }

    /// Per shard, how many rows rank `rank` of `world_size` reads of it from
    /// step `from` to the epoch's end. From the positions alone: the rank's
    /// runs in each partition, merged into intervals, count a segment's rows
    /// by arithmetic; only a shuffle window the rank reads part of is
    /// materialised (a rank that reads whole partitions, as with one rank
    /// or aligned partitions, materialises none).
    fn pending_counts(&mut self, world_size: u32, rank: u32, from: u64, shards: usize) -> Result<Vec<u32>, PlanError> {
        let mut covered: Vec<Vec<(u64, u64)>> = vec![Vec::new(); self.parts.len()];
        for k in from..self.steps {
            let (lo, hi) = self.rank_span(k, world_size, rank)?;
            let mut pos = lo;
            while pos < hi {
                let Some((p, at, run)) = self.locate(pos) else { break };
                let n = run.min(hi - pos);
                covered[p].push((at, at + n));
                pos += n;
            }
        }
        let mut pending = vec![0u32; shards];
        let mut rows = Vec::new();
        for (p, mut spans) in covered.into_iter().enumerate() {
            spans.sort_unstable();
            let merged = spans.into_iter().fold(Vec::<(u64, u64)>::new(), |mut m, (a, b)| {
                match m.last_mut() {
                    Some(last) if last.1 >= a => last.1 = last.1.max(b),
                    _ => m.push((a, b)),
                }
                m
            });
            let q = &self.parts[p];
            // The rank's rows of segment k inside [a, b).
            let add = |pending: &mut Vec<u32>, k: usize, a: u64, b: u64| {
                let (s, first, end) = q.segments[k];
                let (lo, hi) = (q.segment_starts[k], q.segment_starts[k] + u64::from(end - first));
                let n = b.min(hi).saturating_sub(a.max(lo));
                pending[s as usize] += n as u32;
            };
            // Spans of windows the rank reads part of: materialised below.
            let mut partial = Vec::new();
            match self.params.shuffle {
                Shuffle::Off | Shuffle::Blocks { .. } => {
                    for &(a, b) in &merged {
                        let first = q.segment_starts.partition_point(|&st| st <= a).saturating_sub(1);
                        let last = q.segment_starts.partition_point(|&st| st < b);
                        for k in first..last {
                            add(&mut pending, k, a, b);
                        }
                    }
                }
                Shuffle::Windowed { window_shards } => {
                    let ws = window_shards as usize;
                    for (wi, &start) in q.window_starts.iter().enumerate() {
                        let segs = wi * ws..((wi + 1) * ws).min(q.segments.len());
                        let end = q.window_starts.get(wi + 1).copied().unwrap_or(q.rows);
                        let inside: Vec<(u64, u64)> = merged
                            .iter()
                            .filter(|&&(a, b)| a < end && b > start)
                            .map(|&(a, b)| (a.max(start), b.min(end)))
                            .collect();
                        match inside[..] {
                            [] => {}
                            // The whole window: its segments' rows, unshuffled.
                            [(a, b)] if a == start && b == end => {
                                for k in segs {
                                    add(&mut pending, k, start, end);
                                }
                            }
                            _ => partial.extend(inside),
                        }
                    }
                }
            }
            for (a, b) in partial {
                rows.clear();
                self.partition_rows(p, a, b - a, &mut rows);
                for r in &rows {
                    pending[r.shard_index as usize] += 1;
                }
            }
        }
        Ok(pending)
    }

    /// Appends the rows at positions `[lo, hi)` of the global sequence.
    fn rows(&mut self, lo: u64, hi: u64, out: &mut Vec<RowRef>) {
        let mut pos = lo;
        while pos < hi {
            let Some((p, at, run)) = self.locate(pos) else { return };
            let n = run.min(hi - pos);
            self.partition_rows(p, at, n, out);
            pos += n;
        }
    }

    /// Position `pos` of the global sequence: its partition, the offset in
    /// that partition's plan order, and how many rows of the same chunk
    /// follow from there (itself included). None past the sequence's end.
    fn locate(&mut self, pos: u64) -> Option<(usize, u64, u64)> {
        let g = u64::from(self.params.global_batch);
        let (mut round, mut within) = (pos / g, pos % g);
        if round >= self.full_rounds {
            // Past the full rounds (at most a few), walk the rounds.
            round = self.full_rounds;
            within = pos - self.full_rounds * g;
            loop {
                let size: u64 = (0..self.parts.len()).map(|p| self.chunk_len(p, round)).sum();
                if size == 0 {
                    return None;
                }
                if within < size {
                    break;
                }
                within -= size;
                round += 1;
            }
            for p in 0..self.parts.len() {
                let len = self.chunk_len(p, round);
                if within < len {
                    return Some((p, self.chunk_start(p, round) + within, len - within));
                }
                within -= len;
            }
            return None;
        }
        let p = self.offsets.partition_point(|&c| c <= within) - 1;
        let into = within - self.offsets[p];
        Some((p, self.chunk_start(p, round) + into, self.parts[p].share - into))
    }

    /// Rows partition `p` gives in round `round`.
    fn chunk_len(&self, p: usize, round: u64) -> u64 {
        let q = &self.parts[p];
        q.rows.saturating_sub(round.saturating_mul(q.share)).min(q.share)
    }

    /// Where partition `p`'s chunk of round `round` starts in its plan
    /// order: the round's own chunk, or with `Blocks` the chunk its group's
    /// permutation puts there.
    fn chunk_start(&mut self, p: usize, round: u64) -> u64 {
        let Shuffle::Blocks { window_batches } = self.params.shuffle else {
            return round * self.parts[p].share;
        };
        let (key, params) = (self.key, self.params);
        let q = &mut self.parts[p];
        let full = q.rows / q.share;
        if round >= full {
            return round * q.share;
        }
        let wb = u64::from(window_batches);
        let group = round / wb;
        if q.group.as_ref().is_none_or(|(g, _)| *g != group) {
            let n = wb.min(full - group * wb);
            let mut order: Vec<u64> = (0..n).collect();
            let seed =
                seed_of(&[key.0, params.seed, params.epoch, u64::from(params.partitions), p as u64, group, GROUP_TAG]);
            Rng::new(seed).shuffle(&mut order);
            q.group = Some((group, order));
        }
        // The group's permutation was stored just above when it was not
        // this group's.
        let order = q.group.as_ref().map(|(_, o)| o).expect("set above");
        (group * wb + order[(round - group * wb) as usize]) * q.share
    }

    /// Appends `n` rows of partition `p` from offset `at` of its plan order.
    fn partition_rows(&mut self, p: usize, at: u64, n: u64, out: &mut Vec<RowRef>) {
        let (key, params) = (self.key, self.params);
        let q = &mut self.parts[p];
        match params.shuffle {
            Shuffle::Off | Shuffle::Blocks { .. } => {
                let (mut pos, end) = (at, at + n);
                let mut k = q.segment_starts.partition_point(|&s| s <= pos) - 1;
                while pos < end {
                    let (s, a, e) = q.segments[k];
                    let from = pos - q.segment_starts[k];
                    let to = (end - q.segment_starts[k]).min(u64::from(e - a));
                    out.extend((a + from as u32..a + to as u32).map(|row| RowRef { shard_index: s, row }));
                    pos = q.segment_starts[k] + to;
                    k += 1;
                }
            }
            Shuffle::Windowed { window_shards } => {
                let (mut pos, end) = (at, at + n);
                while pos < end {
                    let wi = q.window_starts.partition_point(|&s| s <= pos) - 1;
                    if q.window.as_ref().is_none_or(|(i, _)| *i != wi) {
                        let first = wi * window_shards as usize;
                        let segs = &q.segments[first..(first + window_shards as usize).min(q.segments.len())];
                        let mut rows: Vec<RowRef> = Vec::new();
                        for &(s, a, e) in segs {
                            rows.extend((a..e).map(|row| RowRef { shard_index: s, row }));
                        }
                        let seed = seed_of(&[
                            key.0,
                            params.seed,
                            params.epoch,
                            u64::from(params.partitions),
                            p as u64,
                            wi as u64,
                            WINDOW_TAG,
                        ]);
                        Rng::new(seed).shuffle(&mut rows);
                        q.window = Some((wi, rows));
                    }
                    let start = q.window_starts[wi];
                    // The window was materialised just above when it was
                    // not this one.
                    let rows = q.window.as_ref().map(|(_, r)| r).expect("set above");
                    let take = (end - pos).min(start + rows.len() as u64 - pos);
                    let from = (pos - start) as usize;
                    out.extend_from_slice(&rows[from..from + take as usize]);
                    pos += take;
                }
            }
        }
    }
}

/// Whether rank `rank` of `world_size` can walk a global plan of `params`.
pub(super) fn check_world(params: &GlobalParams, world_size: u32, rank: u32) -> Result<(), PlanError> {
    if world_size == 0 || rank >= world_size {
        return Err(PlanError::BadRank { rank, world_size });
    }
    if !params.global_batch.is_multiple_of(world_size) {
        return Err(PlanError::WorldNotDividingBatch { world_size, global_batch: params.global_batch });
    }
    Ok(())
}

/// Rank `rank` of `world_size` walking a global plan from a step on: its
/// batches one at a time, and which shards it still needs (so a loader
/// drops a chunk after the last batch that reads it).
#[derive(Debug)]
pub struct GlobalCursor {
    plan: GlobalPlan,
    world_size: u32,
    rank: u32,
    next: u64,
    /// Per shard, this rank's rows of it not yet handed out.
    pending: Vec<u32>,
}

impl GlobalCursor {
    /// The walk of rank `rank` of `world_size` from step `start` (the
    /// epoch's end when past it).
    pub fn new(
        key: PlanKey,
        shards: &[ShardRows],
        params: &GlobalParams,
        world_size: u32,
        rank: u32,
        start: u64,
    ) -> Result<Self, PlanError> {
        let mut plan = GlobalPlan::new(key, shards, params)?;
        plan.check_world(world_size, rank)?;
        let next = start.min(plan.steps);
        let pending = plan.pending_counts(world_size, rank, next, shards.len())?;
        Ok(Self { plan, world_size, rank, next, pending })
    }

    /// Batches in the epoch (its global steps), equal on every rank.
    pub fn num_batches(&self) -> usize {
        usize::try_from(self.plan.steps).unwrap_or(usize::MAX)
    }

    /// The next batch's rows into `out`, and its index; None at the end.
    pub fn next_batch(&mut self, out: &mut Vec<RowRef>) -> Option<usize> {
        let k = self.next;
        self.plan.rank_batch(k, self.world_size, self.rank, out).ok()?;
        for r in out.iter() {
            // The counts are the rank's rows from its start (proptested), so
            // this never goes below zero; saturating keeps a bug a late
            // drop, never a panic.
            let n = &mut self.pending[r.shard_index as usize];
            *n = n.saturating_sub(1);
        }
        self.next += 1;
        usize::try_from(k).ok()
    }

    /// Whether a later batch of this rank still reads shard `shard_index`.
    pub fn pending(&self, shard_index: u32) -> bool {
        self.pending.get(shard_index as usize).is_some_and(|&n| n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ShardId;
    use proptest::prelude::*;

    const V: PlanKey = PlanKey(11);

    fn shards(rows: &[u64]) -> Vec<ShardRows> {
        rows.iter()
            .enumerate()
            .map(|(i, &r)| ShardRows { shard: ShardId { file: i as u32 / 4, row_group: i as u32 % 4 }, rows: r })
            .collect()
    }

    /// 0: off; 1-3: windows of that many shards; 4 and up: blocks in groups
    /// of `kind - 3` chunks.
    fn shuffle(kind: u32) -> Shuffle {
        match kind {
            0 => Shuffle::Off,
            1..=3 => Shuffle::Windowed { window_shards: kind },
            _ => Shuffle::Blocks { window_batches: kind - 3 },
        }
    }

    fn params(g: u32, p: u32, kind: u32, drop_last: bool) -> GlobalParams {
        GlobalParams { seed: 5, epoch: 2, global_batch: g, partitions: p, shuffle: shuffle(kind), drop_last }
    }

    /// Every step's rows as a world of `w` delivers them: rank 0's batch,
    /// then rank 1's, ...
    fn by_world(plan: &mut GlobalPlan, w: u32, steps: std::ops::Range<u64>) -> Vec<Vec<RowRef>> {
        let mut out = Vec::new();
        let mut batch = Vec::new();
        for k in steps {
            let mut step = Vec::new();
            for r in 0..w {
                plan.rank_batch(k, w, r, &mut batch).expect("a valid step and rank");
                step.extend_from_slice(&batch);
            }
            out.push(step);
        }
        out
    }

    fn divisors(g: u32) -> Vec<u32> {
        (1..=g).filter(|w| g.is_multiple_of(*w)).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Every world size that divides the global batch delivers the same
        /// rows in the same order, step by step; over the epoch each row
        /// comes exactly once (with drop_last: the full steps' rows, each
        /// once).
        #[test]
        fn every_world_size_sees_one_global_order_and_each_row_once(
            rows in proptest::collection::vec(0u64..40, 0..24),
            g in 1u32..25,
            p_pick in 1u32..9,
            kind in 0u32..7,
            drop_last in any::<bool>(),
        ) {
            let shards = shards(&rows);
            let p = p_pick.min(g);
            let mut plan = GlobalPlan::new(V, &shards, &params(g, p, kind, drop_last)).expect("valid params");
            let steps = plan.num_steps();
            let one = by_world(&mut plan, 1, 0..steps);
            for w in divisors(g) {
                let mut fresh = GlobalPlan::new(V, &shards, &params(g, p, kind, drop_last)).expect("valid");
                prop_assert_eq!(&by_world(&mut fresh, w, 0..steps), &one, "world {}", w);
            }
            let mut seen: Vec<RowRef> = one.concat();
            let n: u64 = rows.iter().sum();
            prop_assert_eq!(seen.len() as u64, plan.num_rows());
            prop_assert_eq!(plan.num_rows(), if drop_last { n / u64::from(g) * u64::from(g) } else { n });
            seen.sort_unstable();
            seen.dedup();
            prop_assert_eq!(seen.len() as u64, plan.num_rows(), "a row came twice");
            for r in &seen {
                prop_assert!(u64::from(r.row) < rows[r.shard_index as usize], "{:?} is not a row", r);
            }
            for k in 0..steps {
                let full = k + 1 < steps || plan.step_rows(k) == u64::from(g);
                prop_assert!(full || !drop_last, "drop_last delivers only full steps");
            }
        }

        /// A job that stops after step k on W ranks and resumes on W' (both
        /// dividing G), with a new plan as a restarted process has,
        /// delivers the uninterrupted one-rank sequence: nothing lost,
        /// nothing repeated.
        #[test]
        fn a_resume_on_another_world_size_continues_the_same_sequence(
            rows in proptest::collection::vec(1u64..30, 1..16),
            g_pick in 0usize..6,
            p_pick in 1u32..5,
            kind in 0u32..7,
            drop_last in any::<bool>(),
            at in any::<prop::sample::Index>(),
            w_pick in any::<prop::sample::Index>(),
            w2_pick in any::<prop::sample::Index>(),
        ) {
            let g = [4u32, 6, 8, 12, 16, 24][g_pick];
            let p = p_pick.min(g);
            let shards = shards(&rows);
            let mut reference = GlobalPlan::new(V, &shards, &params(g, p, kind, drop_last)).expect("valid");
            let steps = reference.num_steps();
            prop_assume!(steps > 0);
            let whole = by_world(&mut reference, 1, 0..steps).concat();
            let ds = divisors(g);
            let (w, w2) = (ds[w_pick.index(ds.len())], ds[w2_pick.index(ds.len())]);
            let k = at.index(steps as usize + 1) as u64;
            let mut before = GlobalPlan::new(V, &shards, &params(g, p, kind, drop_last)).expect("valid");
            let mut after = GlobalPlan::new(V, &shards, &params(g, p, kind, drop_last)).expect("valid");
            let mut resumed = by_world(&mut before, w, 0..k).concat();
            resumed.extend(by_world(&mut after, w2, k..steps).concat());
            prop_assert_eq!(resumed, whole);
        }

        /// The counts a cursor starts with (by arithmetic where it can) are
        /// the rank's rows of each shard from its start, row by row.
        #[test]
        fn a_cursors_counts_are_the_ranks_rows_of_each_shard(
            rows in proptest::collection::vec(0u64..40, 1..20),
            g_pick in 0usize..4,
            p_pick in 1u32..7,
            kind in 0u32..7,
            drop_last in any::<bool>(),
            w_pick in any::<prop::sample::Index>(),
            r_pick in any::<prop::sample::Index>(),
            start in 0u64..6,
        ) {
            let g = [6u32, 8, 12, 24][g_pick];
            let p = p_pick.min(g);
            let shards = shards(&rows);
            let params = params(g, p, kind, drop_last);
            let ds = divisors(g);
            let w = ds[w_pick.index(ds.len())];
            let r = r_pick.index(w as usize) as u32;
            let cursor = GlobalCursor::new(V, &shards, &params, w, r, start).expect("valid");
            let mut plan = GlobalPlan::new(V, &shards, &params).expect("valid");
            let mut want = vec![0u32; shards.len()];
            let mut batch = Vec::new();
            for k in start.min(plan.num_steps())..plan.num_steps() {
                plan.rank_batch(k, w, r, &mut batch).expect("valid");
                for row in &batch {
                    want[row.shard_index as usize] += 1;
                }
            }
            prop_assert_eq!(&cursor.pending, &want);
        }

        /// With the partitions aligned to the ranks (W divides P, P divides
        /// G), a rank's rows in every full round come from its own
        /// partitions only, `[rP/W, (r+1)P/W)`; in general from at most
        /// `ceil((G/W) / floor(G/P)) + 1` partitions.
        #[test]
        fn a_rank_reads_its_own_partitions(
            rows in proptest::collection::vec(1u64..60, 1..30),
            g_pick in 0usize..4,
            p_pick in 0usize..4,
            kind in 0u32..7,
        ) {
            let g = [8u32, 12, 16, 24][g_pick];
            let p = [1u32, 2, 4, 8][p_pick].min(g);
            let shards = shards(&rows);
            let mut plan = GlobalPlan::new(V, &shards, &params(g, p, kind, false)).expect("valid");
            for w in divisors(g) {
                for k in 0..plan.full_rounds.min(plan.num_steps()) {
                    for r in 0..w {
                        let (lo, hi) = plan.rank_span(k, w, r).expect("valid");
                        let mut parts: Vec<usize> = (lo..hi).map(|pos| plan.locate(pos).expect("in the sequence").0).collect();
                        parts.dedup();
                        let bound = (u64::from(g / w)).div_ceil(u64::from(g / p)) + 1;
                        prop_assert!(parts.len() as u64 <= bound, "world {} rank {} step {}: {:?}", w, r, k, parts);
                        if p.is_multiple_of(w) && g.is_multiple_of(p) {
                            let own = (r * p / w) as usize..((r + 1) * p / w) as usize;
                            prop_assert!(parts.iter().all(|q| own.contains(q)), "{:?} outside {:?}", parts, own);
                        }
                    }
                }
            }
        }
    }

    /// The global order is published: a job's loss curve is compared across
    /// runs and world sizes by it. Changing the construction or a seed
    /// changes these rows, and must be a new plan kind, not an edit.
    #[test]
    fn the_global_order_is_pinned() {
        let shards: Vec<ShardRows> = [5u64, 3, 4, 6]
            .iter()
            .enumerate()
            .map(|(i, &r)| ShardRows { shard: ShardId { file: i as u32, row_group: 0 }, rows: r })
            .collect();
        // Rows (shard index, row) of the three steps, ranks in order.
        let pinned: [(Shuffle, &str); 3] = [
            (Shuffle::Off, "0.0 0.1 0.2 2.1 2.2 2.3 0.3 0.4 1.0 3.0 3.1 3.2 1.1 1.2 2.0 3.3 3.4 3.5"),
            (
                Shuffle::Windowed { window_shards: 2 },
                "0.2 1.2 1.1 3.3 3.4 3.0 0.1 1.0 0.0 2.1 3.1 3.2 0.3 0.4 2.0 3.5 2.2 2.3",
            ),
            (
                Shuffle::Blocks { window_batches: 2 },
                "0.3 0.4 1.0 3.0 3.1 3.2 0.0 0.1 0.2 2.1 2.2 2.3 1.1 1.2 2.0 3.3 3.4 3.5",
            ),
        ];
        for (shuffle, rows) in pinned {
            let p = GlobalParams { seed: 1, epoch: 0, global_batch: 6, partitions: 2, shuffle, drop_last: false };
            let mut plan = GlobalPlan::new(PlanKey(3), &shards, &p).expect("valid");
            let got: Vec<String> =
                by_world(&mut plan, 2, 0..3).concat().iter().map(|r| format!("{}.{}", r.shard_index, r.row)).collect();
            assert_eq!(got.join(" "), rows, "{shuffle:?}");
        }
    }

    #[test]
    fn steps_are_pure_whatever_was_asked_before() {
        let shards = shards(&[7, 30, 12, 0, 25, 9, 18, 40, 3, 11]);
        for kind in 0..7 {
            let p = params(12, 3, kind, false);
            let mut forward = GlobalPlan::new(V, &shards, &p).expect("valid");
            let steps = forward.num_steps();
            let all = by_world(&mut forward, 4, 0..steps);
            let mut backward = GlobalPlan::new(V, &shards, &p).expect("valid");
            for k in (0..backward.num_steps()).rev() {
                assert_eq!(by_world(&mut backward, 4, k..k + 1)[0], all[k as usize], "shuffle {kind}, step {k}");
            }
        }
    }

    #[test]
    fn a_cursor_walks_the_rank_slices_and_knows_what_it_still_needs() {
        let shards = shards(&[7, 30, 12, 0, 25, 9, 18, 40, 3, 11]);
        for kind in 0..7 {
            let p = params(12, 4, kind, kind % 2 == 0);
            let mut plan = GlobalPlan::new(V, &shards, &p).expect("valid");
            for (w, r, start) in [(1, 0, 0), (3, 1, 0), (4, 3, 5), (6, 2, 100)] {
                let mut cursor = GlobalCursor::new(V, &shards, &p, w, r, start).expect("valid");
                assert_eq!(cursor.num_batches() as u64, plan.num_steps());
                let mut rows = Vec::new();
                let mut expected = Vec::new();
                let mut k = start.min(plan.num_steps());
                while let Some(i) = cursor.next_batch(&mut rows) {
                    assert_eq!(i as u64, k);
                    plan.rank_batch(k, w, r, &mut expected).expect("valid");
                    assert_eq!(rows, expected);
                    // A shard the rest of the walk reads is pending; one it
                    // does not, not.
                    for s in 0..shards.len() as u32 {
                        let later = (k + 1..plan.num_steps()).any(|j| {
                            plan.rank_batch(j, w, r, &mut expected).expect("valid");
                            expected.iter().any(|row| row.shard_index == s)
                        });
                        assert_eq!(
                            cursor.pending(s),
                            later,
                            "shuffle {kind}, world {w}, rank {r}, step {k}, shard {s}"
                        );
                    }
                    k += 1;
                }
                assert_eq!(k, plan.num_steps());
            }
        }
        let err = GlobalCursor::new(V, &shards, &params(12, 4, 0, false), 5, 0, 0).expect_err("5 does not divide 12");
        assert!(matches!(err, PlanError::WorldNotDividingBatch { world_size: 5, global_batch: 12 }));
    }

    #[test]
    fn a_short_last_step_is_split_as_evenly_as_it_can_be() {
        // 20 rows, G = 8: steps of 8, 8 and 4 rows; four ranks get one row
        // each of the last step, eight ranks half of them none.
        let shards = shards(&[20]);
        let mut plan = GlobalPlan::new(V, &shards, &params(8, 2, 0, false)).expect("valid");
        assert_eq!((plan.num_steps(), plan.step_rows(2)), (3, 4));
        let mut batch = Vec::new();
        let sizes: Vec<usize> = (0..8)
            .map(|r| {
                plan.rank_batch(2, 8, r, &mut batch).expect("valid");
                batch.len()
            })
            .collect();
        assert_eq!(sizes, [0, 1, 0, 1, 0, 1, 0, 1]);
        let dropped = GlobalPlan::new(V, &shards, &params(8, 2, 0, true)).expect("valid");
        assert_eq!((dropped.num_steps(), dropped.num_rows()), (2, 16), "drop_last: the 4-row tail waits for no one");
    }

    #[test]
    fn parameters_without_a_plan_are_errors_naming_them() {
        let shards = shards(&[10, 10]);
        let err = |p: GlobalParams| GlobalPlan::new(V, &shards, &p).expect_err("invalid").to_string();
        assert!(err(params(0, 1, 0, false)).contains("batch size"));
        assert!(err(params(4, 0, 0, false)).contains("0 canonical partitions"));
        assert!(err(params(4, 5, 0, false)).contains("5 canonical partitions with a global batch of 4"));
        let zero_window = GlobalParams { shuffle: Shuffle::Windowed { window_shards: 0 }, ..params(4, 2, 0, false) };
        assert!(err(zero_window).contains("shuffle window"));
        let mut plan = GlobalPlan::new(V, &shards, &params(8, 2, 1, false)).expect("valid");
        let mut out = Vec::new();
        let e = plan.rank_batch(0, 3, 0, &mut out).expect_err("3 does not divide 8").to_string();
        assert!(e.contains("world of 3 ranks") && e.contains("global batch of 8"), "{e}");
        assert!(plan.rank_batch(0, 4, 4, &mut out).expect_err("rank 4 of 4").to_string().contains("rank 4"));
        let e = plan.rank_batch(3, 4, 0, &mut out).expect_err("past the end").to_string();
        assert!(e.contains("step 3 is past the epoch's 3"), "{e}");
    }
}
