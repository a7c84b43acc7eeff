//! Batch assembly: copying a batch's rows out of their chunks.
//!
//! Pure and single-threaded: [`Runs::plan`] groups a batch's rows into
//! *runs* (consecutive rows of one chunk that land consecutively in the
//! batch) once per batch, and [`assemble`] copies every tensor over those
//! runs into its row-major place in the batch's one buffer. The loader calls it from as
//! many threads as it is configured for, one batch per call, so the bytes of
//! a batch never depend on the thread count.
//!
//! ## Why this shape
//! - **Tensor by tensor.** Each destination buffer is written front to back,
//!   and each tensor's source rows lie in one column-block of a chunk (chunks
//!   store each tensor contiguously), so the narrow tensors' sources stay in
//!   cache while the batch is gathered.
//! - **Runs, not rows.** A shuffled batch is one-row runs and costs a fixed
//!   width move per row; an unshuffled or block-shuffled batch is a handful
//!   of long runs and costs a handful of `memcpy` calls.
//! - **Widths known at compile time** for the common row sizes, so a 4- or
//!   16-byte row is one or two moves, not a call into `memcpy` with a length
//!   to branch on. Other widths take `copy_from_slice` with a run-time length.
//! - **Source rows asked for ahead** (x86_64; elsewhere no prefetch). A shuffled batch reads rows at random
//!   places of a window of chunks (tens of MB), so each row waits on memory
//!   and the hardware prefetcher cannot guess the next one. The kernels
//!   prefetch the run [`PREFETCH_RUNS`] ahead: on the 2-core VM this took
//!   one thread's gather of shuffled 748-byte rows from 2.3 to 3.3 GB/s
//!   (`bench local --assembly-threads 1`, docs/BENCHMARKS.md), where the
//!   consumer's copy of the same bytes runs at 11-17 GB/s.

use crate::hostbuf::Placement;
use crate::source::Chunk;
use granary_proto::{RowRef, TensorLayout};

/// How many runs ahead the kernels prefetch their source rows (8 and 16
/// were alike in a scratch test of the kernel; 4 and 32 slower).
const PREFETCH_RUNS: usize = 8;

/// Bytes of a run prefetched at most: a longer run is sequential, and the
/// hardware prefetcher follows it.
const PREFETCH_BYTES: usize = 1024;

/// Asks the cache for the first [`PREFETCH_BYTES`] of `run`'s source bytes.
#[inline(always)]
fn prefetch(run: &Run, sources: &[&[u8]], rb: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let start = run.src as usize * rb;
        let Some(src) = sources.get(run.slot as usize).and_then(|s| s.get(start..)) else { return };
        let n = (run.len as usize * rb).min(PREFETCH_BYTES).min(src.len());
        if n == 0 {
            return;
        }
        let mut off = 0;
        while off < n {
            // SAFETY: a prefetch is a hint that never faults and changes
            // nothing the program can observe; the address lies inside
            // `src`. SSE is part of the x86_64 baseline.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(src.as_ptr().add(off).cast()) };
            off += 64;
        }
        // A row that starts mid-line ends in one more line.
        // SAFETY: as above; `n - 1` is inside `src`.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(src.as_ptr().add(n - 1).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (run, sources, rb);
}

/// Consecutive rows of one chunk that land consecutively in the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Run {
    /// First row of the run in the batch.
    pub dst: u32,
    /// Index of the run's chunk in the chunk list [`assemble`] is given.
    pub slot: u32,
    /// First row of the run in its chunk.
    pub src: u32,
    /// Rows in the run (at least 1).
    pub len: u32,
}

/// The runs of one batch.
#[derive(Default, Debug)]
pub(crate) struct Runs {
    runs: Vec<Run>,
    rows: usize,
}

impl Runs {
    /// Groups `rows` into runs; `slot_of` names the chunk slot of a shard
    /// index (every row's shard must have one).
    pub(crate) fn plan(&mut self, rows: &[RowRef], mut slot_of: impl FnMut(u32) -> u32) {
        self.runs.clear();
        self.rows = rows.len();
        let mut last_shard = u32::MAX;
        let mut last_slot = 0;
        for (k, r) in rows.iter().enumerate() {
            if r.shard_index != last_shard {
                last_shard = r.shard_index;
                last_slot = slot_of(r.shard_index);
            }
            if let Some(run) = self.runs.last_mut()
                && run.slot == last_slot
                && run.src.checked_add(run.len) == Some(r.row)
            {
                run.len += 1;
                continue;
            }
            // A batch holds at most u32::MAX rows (its size is a u32).
            self.runs.push(Run { dst: k as u32, slot: last_slot, src: r.row, len: 1 });
        }
    }

    /// The runs, in batch order.
    pub(crate) fn runs(&self) -> &[Run] {
        &self.runs
    }

    /// Rows in the batch.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Values in the batch of each tensor (0 for a dense one), its rows'
    /// offsets read from `chunks` (by slot).
    /// Empty when no tensor is jagged (nothing to count, nothing allocated).
    pub(crate) fn values(&self, chunks: &[Chunk], layouts: &[TensorLayout]) -> Vec<u64> {
        if !layouts.iter().any(|l| l.jagged) {
            return Vec::new();
        }
        (0..layouts.len())
            .map(|t| {
                if !layouts[t].jagged {
                    return 0;
                }
                self.runs
                    .iter()
                    .map(|run| {
                        let o = chunks[run.slot as usize].row_offsets(t).unwrap_or(&[]);
                        let (a, b) = (run.src as usize, (run.src + run.len) as usize);
                        match (o.get(a), o.get(b)) {
                            (Some(a), Some(b)) => b - a,
                            _ => 0,
                        }
                    })
                    .sum()
            })
            .collect()
    }
}

/// Copies a batch's rows (`runs`, over `chunks`) into `dst`, tensor `t`
/// row-major at `placements[t]` (of a jagged tensor, its row offsets
/// rebased to the batch's first value, then its values; sized by
/// [`Runs::values`]).
pub(crate) fn assemble(
    runs: &Runs,
    chunks: &[Chunk],
    layouts: &[TensorLayout],
    placements: &[Placement],
    dst: &mut [u8],
) {
    let mut sources: Vec<&[u8]> = Vec::with_capacity(chunks.len());
    let mut offsets: Vec<&[u64]> = Vec::with_capacity(chunks.len());
    for (t, (layout, p)) in layouts.iter().zip(placements).enumerate() {
        sources.clear();
        sources.extend(chunks.iter().map(|c| c.tensor_bytes(t)));
        let (head, values) = dst.split_at_mut(p.offset);
        let values = &mut values[..p.len];
        match p.row_offsets {
            None => copy_tensor(runs.runs(), &sources, layout.row_bytes(), values),
            Some(at) => {
                offsets.clear();
                offsets.extend(chunks.iter().map(|c| c.row_offsets(t).unwrap_or(&[])));
                // The buffer is 64-byte aligned and so is `at`.
                let out: &mut [u64] = bytemuck::cast_slice_mut(&mut head[at..at + (runs.rows() + 1) * 8]);
                copy_jagged(runs.runs(), &offsets, &sources, layout.row_bytes(), out, values);
            }
        }
    }
}

/// One jagged tensor: every run's values from `values` (by slot) into
/// `dst_values`, one copy per run, and its row offsets from `offsets` (by
/// slot) into `dst_offsets` (rows + 1), rebased to the batch's first value.
/// `vb` is bytes per value.
pub(crate) fn copy_jagged(
    runs: &[Run],
    offsets: &[&[u64]],
    values: &[&[u8]],
    vb: usize,
    dst_offsets: &mut [u64],
    dst_values: &mut [u8],
) {
    let mut at = 0u64;
    for run in runs {
        let o = &offsets[run.slot as usize][run.src as usize..=(run.src + run.len) as usize];
        let (first, last) = (o[0], o[run.len as usize]);
        for (d, &x) in dst_offsets[run.dst as usize..][..run.len as usize].iter_mut().zip(o) {
            *d = at + (x - first);
        }
        let (s, d, n) = (first as usize * vb, at as usize * vb, (last - first) as usize * vb);
        dst_values[d..d + n].copy_from_slice(&values[run.slot as usize][s..s + n]);
        at += last - first;
    }
    if let Some(end) = dst_offsets.last_mut() {
        *end = at;
    }
}

/// One tensor: every run of rows from `sources` (by slot) into `dst`.
pub(crate) fn copy_tensor(runs: &[Run], sources: &[&[u8]], row_bytes: usize, dst: &mut [u8]) {
    match row_bytes {
        1 => copy_runs::<1>(runs, sources, dst),
        2 => copy_runs::<2>(runs, sources, dst),
        4 => copy_runs::<4>(runs, sources, dst),
        8 => copy_runs::<8>(runs, sources, dst),
        12 => copy_runs::<12>(runs, sources, dst),
        16 => copy_runs::<16>(runs, sources, dst),
        24 => copy_runs::<24>(runs, sources, dst),
        32 => copy_runs::<32>(runs, sources, dst),
        48 => copy_runs::<48>(runs, sources, dst),
        64 => copy_runs::<64>(runs, sources, dst),
        128 => copy_runs::<128>(runs, sources, dst),
        256 => copy_runs::<256>(runs, sources, dst),
        _ => copy_runs_any(runs, sources, row_bytes, dst),
    }
}

/// Runs with a compile-time row width: a one-row run is a fixed-size move.
fn copy_runs<const N: usize>(runs: &[Run], sources: &[&[u8]], dst: &mut [u8]) {
    for (k, run) in runs.iter().enumerate() {
        if let Some(ahead) = runs.get(k + PREFETCH_RUNS) {
            prefetch(ahead, sources, N);
        }
        let src = sources[run.slot as usize];
        let (s, d) = (run.src as usize * N, run.dst as usize * N);
        if run.len == 1 {
            let row: &[u8; N] = src[s..s + N].try_into().expect("a range of N bytes is N bytes");
            let out: &mut [u8; N] = (&mut dst[d..d + N]).try_into().expect("a range of N bytes is N bytes");
            *out = *row;
        } else {
            let n = run.len as usize * N;
            dst[d..d + n].copy_from_slice(&src[s..s + n]);
        }
    }
}

/// Runs of any row width.
fn copy_runs_any(runs: &[Run], sources: &[&[u8]], rb: usize, dst: &mut [u8]) {
    for (k, run) in runs.iter().enumerate() {
        if let Some(ahead) = runs.get(k + PREFETCH_RUNS) {
            prefetch(ahead, sources, rb);
        }
        let src = sources[run.slot as usize];
        let (s, d, n) = (run.src as usize * rb, run.dst as usize * rb, run.len as usize * rb);
        dst[d..d + n].copy_from_slice(&src[s..s + n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(shard_index: u32, row: u32) -> RowRef {
        RowRef { shard_index, row }
    }

    #[test]
    fn consecutive_rows_of_one_chunk_form_one_run() {
        let mut runs = Runs::default();
        let rows = [r(0, 5), r(0, 6), r(0, 7), r(1, 8), r(1, 9), r(0, 8), r(0, 2)];
        runs.plan(&rows, |s| s);
        assert_eq!(
            runs.runs(),
            &[
                Run { dst: 0, slot: 0, src: 5, len: 3 },
                Run { dst: 3, slot: 1, src: 8, len: 2 },
                Run { dst: 5, slot: 0, src: 8, len: 1 },
                Run { dst: 6, slot: 0, src: 2, len: 1 },
            ]
        );
    }

    /// The row-at-a-time reference the kernels must equal.
    fn reference(rows: &[RowRef], sources: &[Vec<u8>], rb: usize) -> Vec<u8> {
        rows.iter().flat_map(|r| sources[r.shard_index as usize][r.row as usize * rb..][..rb].iter().copied()).collect()
    }

    proptest! {
        /// Every width (compile-time or not) and every mix of runs gives the
        /// bytes of copying row by row.
        #[test]
        fn kernels_equal_row_by_row_copying(
            rb in prop::sample::select(vec![1usize, 2, 3, 4, 8, 12, 16, 20, 24, 32, 48, 64, 100, 128, 256, 600]),
            picks in prop::collection::vec((0u32..3, 0u32..40, 1u32..6), 0..30),
        ) {
            let sources: Vec<Vec<u8>> =
                (0..3u8).map(|s| (0..50 * rb).map(|i| (i as u8).wrapping_mul(31).wrapping_add(s * 101)).collect()).collect();
            let rows: Vec<RowRef> = picks
                .iter()
                .flat_map(|&(s, row, len)| (row..(row + len).min(50)).map(move |x| r(s, x)))
                .collect();
            let mut runs = Runs::default();
            runs.plan(&rows, |s| s);
            let srcs: Vec<&[u8]> = sources.iter().map(Vec::as_slice).collect();
            let mut dst = vec![0u8; rows.len() * rb];
            copy_tensor(runs.runs(), &srcs, rb, &mut dst);
            prop_assert_eq!(dst, reference(&rows, &sources, rb));
        }

        /// A jagged tensor's kernel gives the values and rebased offsets of
        /// gathering row by row, for any row lengths (empty rows too) and
        /// any mix of runs.
        #[test]
        fn the_jagged_kernel_equals_row_by_row_gathering(
            vb in prop::sample::select(vec![1usize, 4, 8, 12]),
            lengths in prop::collection::vec(prop::collection::vec(0u64..9, 50), 3),
            picks in prop::collection::vec((0u32..3, 0u32..40, 1u32..6), 0..30),
        ) {
            let offsets: Vec<Vec<u64>> = lengths
                .iter()
                .map(|ls| std::iter::once(0).chain(ls.iter().scan(0, |acc, &l| { *acc += l; Some(*acc) })).collect())
                .collect();
            let sources: Vec<Vec<u8>> = offsets
                .iter()
                .enumerate()
                .map(|(s, o)| (0..o[50] as usize * vb).map(|i| (i as u8).wrapping_mul(13).wrapping_add(s as u8 * 7)).collect())
                .collect();
            let rows: Vec<RowRef> = picks
                .iter()
                .flat_map(|&(s, row, len)| (row..(row + len).min(50)).map(move |x| r(s, x)))
                .collect();
            let mut runs = Runs::default();
            runs.plan(&rows, |s| s);
            let (mut want_offsets, mut want_values) = (vec![0u64], Vec::new());
            for row in &rows {
                let o = &offsets[row.shard_index as usize];
                let (a, b) = (o[row.row as usize] as usize, o[row.row as usize + 1] as usize);
                want_values.extend_from_slice(&sources[row.shard_index as usize][a * vb..b * vb]);
                want_offsets.push(want_offsets.last().unwrap() + (b - a) as u64);
            }
            let offs: Vec<&[u64]> = offsets.iter().map(Vec::as_slice).collect();
            let srcs: Vec<&[u8]> = sources.iter().map(Vec::as_slice).collect();
            let (mut out_offsets, mut out_values) = (vec![u64::MAX; rows.len() + 1], vec![0u8; want_values.len()]);
            copy_jagged(runs.runs(), &offs, &srcs, vb, &mut out_offsets, &mut out_values);
            prop_assert_eq!(out_offsets, want_offsets);
            prop_assert_eq!(out_values, want_values);
        }
    }
}
