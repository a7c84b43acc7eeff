//! [`PlanCursor`]: the plan of [`super::plan_rank`] walked batch by batch,
//! generating one shuffle window at a time. The rules are the parent
//! module's (steps 1 to 5); this file only keeps the walk's state, and the
//! parent's proptests check that it gives the same batches from any start.

use super::{PlanError, PlanParams, RowRef, Shuffle, Split, batch_ends, block_order, global_row, split, window_rows};
use crate::ids::PlanKey;
use crate::manifest::ShardRows;

/// A rank's plan walked batch by batch, holding only the shuffle windows
/// the next batch reads (a [`RankPlan`] holds every row of the epoch: 8
/// bytes a row, a gigabyte per rank for a billion-row dataset over eight
/// ranks). Gives the same batches as [`plan_rank`], by proptest.
pub struct PlanCursor {
    key: PlanKey,
    params: PlanParams,
    shards: Vec<ShardRows>,
    split: Split,
    batch_ends: Vec<usize>,
    /// Rows of the rank's own sequence (before padding or truncation).
    own_rows: usize,
    /// Rows the batches hold: positions at or past it are never handed
    /// out (`drop_last`), so they are not counted as pending.
    rows_len: usize,
    /// Start position of each window in the rank's sequence.
    window_starts: Vec<usize>,
    /// Generated rows not yet handed out, from position `buffer_start`.
    buffer: std::collections::VecDeque<RowRef>,
    buffer_start: usize,
    /// The next window to generate.
    next_window: usize,
    /// Generated, not yet handed out rows, per shard index (with
    /// [`Shuffle::Blocks`]: every row not yet handed out this epoch).
    pending: Vec<u32>,
    next_batch: usize,
    /// With [`Shuffle::Blocks`]: where each segment starts in the rank's
    /// sequence, and the current group's source batches.
    segment_starts: Vec<usize>,
    group: Option<(usize, Vec<usize>)>,
}

impl PlanCursor {
    /// A cursor at batch `start` of the plan for `params`.
    pub fn new(key: PlanKey, shards: &[ShardRows], params: &PlanParams, start: usize) -> Result<Self, PlanError> {
        let mut split = split(key, shards, params)?;
        if let Shuffle::Off | Shuffle::Blocks { .. } = params.shuffle {
            // Unshuffled rows come in segment order whatever the window:
            // generate them a segment at a time.
            split.window = 1;
        }
        let own_rows =
            usize::try_from(split.hi - split.lo).map_err(|_| PlanError::TooManyRows { rows: split.hi - split.lo })?;
        let w = u64::from(params.world_size);
        let (batch_ends, rows_len) =
            batch_ends(split.total, w, u64::from(params.batch_size), own_rows, params.drop_last);
        let mut window_starts = Vec::new();
        let mut pos = 0usize;
        let mut largest = 0usize;
        for win in split.segments.chunks(split.window) {
            window_starts.push(pos);
            let n = win.iter().map(|&(_, a, e)| (e - a) as usize).sum::<usize>();
            largest = largest.max(n);
            pos += n;
        }
        // Row counts come from footers: a window that cannot be allocated is
        // an error here, not an abort in the loader's thread later.
        Vec::<RowRef>::new().try_reserve_exact(largest).map_err(|_| PlanError::TooManyRows { rows: largest as u64 })?;
        let next_batch = start.min(batch_ends.len());
        let first = if next_batch == 0 { 0 } else { batch_ends[next_batch - 1] };
        // Start at the window holding the first row to hand out.
        let next_window = window_starts.partition_point(|&p| p <= first).saturating_sub(1);
        let buffer_start = window_starts.get(next_window).copied().unwrap_or(own_rows);
        let mut cursor = Self {
            key,
            params: *params,
            shards: shards.to_vec(),
            split,
            batch_ends,
            own_rows,
            rows_len,
            window_starts,
            buffer: std::collections::VecDeque::new(),
            buffer_start,
            next_window,
            pending: vec![0; shards.len()],
            next_batch,
            segment_starts: Vec::new(),
            group: None,
        };
        if let Shuffle::Blocks { .. } = params.shuffle {
            // Every row handed out this epoch is pending from the start;
            // the batches before `start` are then walked off.
            let mut pos = 0usize;
            let last = cursor.rows_len.min(cursor.own_rows);
            for &(s, a, e) in &cursor.split.segments {
                cursor.segment_starts.push(pos);
                let n = (e - a) as usize;
                cursor.pending[s as usize] += (pos + n).min(last).saturating_sub(pos) as u32;
                pos += n;
            }
            cursor.next_batch = 0;
            while cursor.next_batch < next_batch && cursor.next_batch_pieces(|_, _, _| {}) {}
        } else {
            cursor.skip_to(first);
        }
        Ok(cursor)
    }

    /// Number of batches (equal on every rank of the job).
    pub fn num_batches(&self) -> usize {
        self.batch_ends.len()
    }

    /// The parameters the plan was made from.
    pub fn params(&self) -> &PlanParams {
        &self.params
    }

    /// Whether rows of shard `shard_index` are still to be handed out from
    /// the windows generated so far (with [`Shuffle::Blocks`]: at all this
    /// epoch). A shard's rows all lie in one window (one group's batches, or
    /// a group's neighbours, with blocks), so once a shard has been seen and
    /// this is false, the epoch needs it no more (except a wrap-around
    /// padding row in the last batch, or with blocks anywhere in the last
    /// group).
    pub fn pending(&self, shard_index: u32) -> bool {
        self.pending.get(shard_index as usize).is_some_and(|&n| n > 0)
    }

    /// The next batch's index and rows (into `out`, cleared first), or
    /// `None` after the last batch.
    pub fn next_batch(&mut self, out: &mut Vec<RowRef>) -> Option<usize> {
        let i = self.next_batch;
        if let Shuffle::Blocks { .. } = self.params.shuffle {
            out.clear();
            let more = self.next_batch_pieces(|s, a, b| out.extend((a..b).map(|row| RowRef { shard_index: s, row })));
            return more.then_some(i);
        }
        let end = *self.batch_ends.get(i)?;
        let start = if i == 0 { 0 } else { self.batch_ends[i - 1] };
        out.clear();
        // The rank's own rows, drained from the buffer in one go.
        let own_end = end.min(self.own_rows);
        if start < own_end {
            self.skip_to(start);
            self.fill_to(own_end - 1);
            let n = (own_end - start).min(self.buffer.len());
            for r in self.buffer.drain(..n) {
                self.pending[r.shard_index as usize] -= 1;
                out.push(r);
            }
            self.buffer_start += n;
        }
        // Wrap-around padding (at most a row or two, at the end).
        for pos in start.max(self.own_rows)..end {
            out.push(self.padding_row(pos - self.own_rows));
        }
        self.next_batch += 1;
        Some(i)
    }

    /// [`Shuffle::Blocks`]: hands out the next batch as pieces (shard index,
    /// first row, end row), in order, to `piece`; false after the last batch.
    pub(super) fn next_batch_pieces(&mut self, mut piece: impl FnMut(u32, u32, u32)) -> bool {
        let Shuffle::Blocks { window_batches } = self.params.shuffle else { return false };
        let i = self.next_batch;
        if i >= self.batch_ends.len() {
            return false;
        }
        let wb = window_batches as usize;
        let g = i / wb;
        if self.group.as_ref().is_none_or(|(at, _)| *at != g) {
            let n = wb.min(self.batch_ends.len() - g * wb);
            self.group = Some((g, block_order(self.key, &self.params, g, n)));
        }
        let j = g * wb + self.group.as_ref().map_or(0, |(_, order)| order[i - g * wb]);
        let (start, end) = (if j == 0 { 0 } else { self.batch_ends[j - 1] }, self.batch_ends[j]);
        // The rank's own rows: contiguous positions, so pieces of segments.
        let own_end = end.min(self.own_rows);
        let mut k = self.segment_starts.partition_point(|&p| p <= start).saturating_sub(1);
        let mut pos = start;
        while pos < own_end {
            let (s, a, e) = self.split.segments[k];
            let seg_start = self.segment_starts[k];
            let (from, to) = (pos - seg_start, (own_end - seg_start).min((e - a) as usize));
            piece(s, a + from as u32, a + to as u32);
            self.pending[s as usize] -= (to - from) as u32;
            pos = seg_start + to;
            k += 1;
        }
        // Wrap-around padding (at most a row or two, in the source batch
        // that ends the sequence: with blocks, somewhere in the last group).
        for pos in start.max(self.own_rows)..end {
            let r = self.padding_row(pos - self.own_rows);
            piece(r.shard_index, r.row, r.row + 1);
        }
        self.next_batch += 1;
        true
    }

    /// Generates windows until `pos` is buffered (or the rows run out).
    fn fill_to(&mut self, pos: usize) {
        while self.buffer_start + self.buffer.len() <= pos && self.next_window < self.window_starts.len() {
            let wi = self.next_window;
            let segs: Vec<(u32, u32, u32)> =
                self.split.segments.chunks(self.split.window).nth(wi).map(<[_]>::to_vec).unwrap_or_default();
            let mut rows = Vec::new();
            window_rows(self.key, &self.params, wi, &segs, &mut rows);
            // Rows past the batches (`drop_last`) are never handed out.
            let at = self.buffer_start + self.buffer.len();
            rows.truncate(self.rows_len.saturating_sub(at));
            for r in &rows {
                self.pending[r.shard_index as usize] += 1;
            }
            self.buffer.extend(rows);
            self.next_window += 1;
        }
    }

    /// Drops buffered rows before `pos` without handing them out (a cursor
    /// that starts mid-epoch).
    fn skip_to(&mut self, pos: usize) {
        let pos = pos.min(self.own_rows);
        while self.buffer_start < pos {
            self.fill_to(self.buffer_start);
            match self.buffer.pop_front() {
                Some(r) => {
                    self.pending[r.shard_index as usize] -= 1;
                    self.buffer_start += 1;
                }
                None => break,
            }
        }
    }

    fn padding_row(&self, i: usize) -> RowRef {
        if self.own_rows == 0 {
            let r = u64::from(self.params.rank);
            return global_row(&self.split.order, &self.shards, r % self.split.total.max(1));
        }
        // Padding repeats rows[i % own_rows], and K exceeds the rank's own
        // rows by at most one (B = 1 with W not dividing N), so `i` is 0:
        // the rank's first row, which the first window holds, regenerated
        // here (once an epoch, in the last batch or, with blocks, the last
        // group).
        let first = &self.split.segments[..self.split.window.min(self.split.segments.len())];
        let mut rows = Vec::new();
        window_rows(self.key, &self.params, 0, first, &mut rows);
        rows.get(i % self.own_rows).or(rows.first()).copied().unwrap_or(RowRef { shard_index: 0, row: 0 })
    }
}
