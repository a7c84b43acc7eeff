//! What a benchmark's trainer does with a batch, and the machine's own copy
//! bandwidth to hold it against.
//!
//! A real trainer moves every batch somewhere: into pinned memory for a
//! device copy, or into the tensors of a framework. [`Staging`] stands for
//! that: it copies every tensor of a batch into one preallocated buffer at
//! 64-byte-aligned offsets (the layout of a GPU staging slot), so a
//! scenario measured with it is fed at most as fast as one `memcpy` of the
//! batch per batch allows. The `copy` scenario of `bench local` runs the
//! same consumer over batches assembled in advance: the fastest any loader
//! could feed it.
//!
//! [`memcpy_gbps`] measures the machine's limit directly, with one thread
//! and with all of them.

use granary_client::Batch;
use granary_proto::AlignedBuf;
use std::time::Instant;

/// A preallocated staging buffer every batch is copied into.
pub struct Staging {
    buf: AlignedBuf,
}

impl Staging {
    /// A staging buffer of `bytes` bytes, every page touched once.
    pub fn new(bytes: usize) -> Self {
        Self { buf: AlignedBuf::zeroed(bytes) }
    }

    /// Copies every part of `batch` in (a jagged tensor's row offsets and
    /// values, a dense tensor's bytes), one after another at 64-byte
    /// aligned offsets; returns the bytes copied. Grows (once) if the batch
    /// does not fit.
    pub fn consume(&mut self, batch: &Batch) -> u64 {
        let need: usize = batch.parts().map(|p| p.len().next_multiple_of(64)).sum();
        if need > self.buf.len() {
            self.buf = AlignedBuf::zeroed(need);
        }
        let dst = self.buf.as_mut_slice();
        let (mut at, mut copied) = (0usize, 0u64);
        for src in batch.parts() {
            dst[at..at + src.len()].copy_from_slice(src);
            at += src.len().next_multiple_of(64);
            copied += src.len() as u64;
        }
        // Keep the copy from being optimised away.
        std::hint::black_box(&self.buf);
        copied
    }
}

/// The machine's memory copy bandwidth in GB/s (10^9 bytes copied per
/// second): `threads` threads each copying their own `bytes / threads`
/// region between two buffers, pages touched beforehand; the best of
/// `rounds`.
pub fn memcpy_gbps(threads: usize, bytes: usize, rounds: usize) -> f64 {
    let threads = threads.max(1);
    let part = (bytes / threads).max(64);
    let mut pairs: Vec<(AlignedBuf, AlignedBuf)> = (0..threads)
        .map(|k| {
            let mut src = AlignedBuf::zeroed(part);
            // Distinct bytes, so no page can be shared or deduplicated.
            for (i, b) in src.as_mut_slice().iter_mut().enumerate().step_by(4096) {
                *b = (i / 4096 + k) as u8;
            }
            (src, AlignedBuf::zeroed(part))
        })
        .collect();
    let mut best = 0.0f64;
    for _ in 0..rounds.max(1) {
        let start = Instant::now();
        std::thread::scope(|scope| {
            for (src, dst) in pairs.iter_mut() {
                scope.spawn(move || {
                    dst.as_mut_slice().copy_from_slice(src.as_slice());
                    std::hint::black_box(&dst);
                });
            }
        });
        let secs = start.elapsed().as_secs_f64();
        best = best.max(crate::report::gbps((part * threads) as u64, secs));
    }
    best
}
