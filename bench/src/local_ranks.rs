//! `granary bench local --ranks N`: N trainer processes on one node daemon.
//!
//! The data-parallel case of one host: N `granary trainer` processes, each
//! one rank of a world of N (`LOCAL_WORLD_SIZE` = N, so each loader takes
//! its share of the cores), all consuming by copying every batch into a
//! staging buffer. Three sets of ranks run the same epochs, alternating:
//! - `copy`: each rank assembled one epoch of its batches in advance and
//!   only hands them to its consumer: the machine's ceiling for N processes;
//! - `warm`: the daemon's warm epochs, windowed shuffle;
//! - `blocks`: the daemon's warm epochs, block shuffle (views where a
//!   batch is one run of one chunk).
//!
//! Each epoch's rate is the rows of all ranks over the time from starting
//! them to the last rank's last batch; a scenario's rate is the median.
//!
//! Before the timed epochs, the warm and blocks ranks run
//! [`WARMUP_EPOCHS`] untimed ones. A rank's shards change every epoch (the
//! shard order is permuted and the rank split follows it), and the first
//! time a rank reads a chunk it maps the chunk's memory file, which costs a
//! page-table entry per 4 KiB page; a long job pays that once per chunk and
//! rank, a short benchmark would pay it in every epoch it measures. The
//! warm-up epochs' rates are reported too.

use crate::local::{LocalOpts, generate, start_daemon};
use crate::report::{Conditions, median, ratio};
use anyhow::Result;
use granary_testkit::harness::{TrainerProcess, run_epoch, spawn_ranks};
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

/// The result of `bench local --ranks N`.
#[derive(Clone, Debug, Serialize)]
pub struct RanksSummary {
    /// Always "ranks".
    pub scenario: &'static str,
    /// Trainer processes.
    pub ranks: u32,
    /// Aggregate rows/s of the copy ranks (median epoch).
    pub copy_rows_per_s: f64,
    /// Aggregate rows/s of the warm ranks (median epoch).
    pub warm_rows_per_s: f64,
    /// Aggregate rows/s of the block-shuffle ranks (median epoch).
    pub blocks_rows_per_s: f64,
    /// warm over copy.
    pub warm_vs_copy: f64,
    /// blocks over copy.
    pub blocks_vs_copy: f64,
    /// Seconds of the cold epoch (epoch 0, warm ranks).
    pub cold_secs: f64,
    /// Every timed epoch's aggregate rows/s: copy, warm, blocks.
    pub epochs: Vec<[f64; 3]>,
    /// The warm-up epochs' aggregate rows/s: warm, blocks.
    pub warmup_epochs: Vec<[f64; 2]>,
    /// Options of the run.
    pub opts: LocalOpts,
    /// Commit, cores, profile.
    pub conditions: Conditions,
}

/// Untimed epochs of the warm and blocks ranks before the timed ones: after
/// eight, a rank has read (and mapped) a given chunk with probability
/// 1 - (1 - 1/N)^8 (0.90 for 4 ranks).
pub const WARMUP_EPOCHS: u64 = 8;

/// Runs the three sets of ranks; `say` receives one line per step.
pub fn run(exe: &Path, opts: &LocalOpts, ranks: u32, mut say: impl FnMut(&str)) -> Result<RanksSummary> {
    let work = tempfile::tempdir()?;
    let (data, report) = generate(work.path(), opts, &mut say)?;
    // Converted chunks are about the size of the Parquet here, give or take
    // compression: the SSD tier and the mapping caches get room for twice.
    let room = 2 * report.bytes;
    let (daemon, socket) = start_daemon(exe, work.path(), &data, opts, room, None)?;
    let sockets = vec![socket; ranks.max(1) as usize];
    let mut common = vec![
        "--batch-size".to_string(),
        opts.batch_size.to_string(),
        "--seed".into(),
        "1".into(),
        "--window".into(),
        opts.window_shards.to_string(),
        "--consume".into(),
        "copy".into(),
        "--mapping-cache-bytes".into(),
        room.max(granary_client::local::DEFAULT_MAPPING_CACHE_BYTES).to_string(),
    ];
    if opts.assembly_threads > 0 {
        common.extend(["--assembly-threads".to_string(), opts.assembly_threads.to_string()]);
    }
    let with = |extra: &[&str]| common.iter().cloned().chain(extra.iter().map(|s| s.to_string())).collect::<Vec<_>>();
    let timeout = Duration::from_secs(600);

    say(&format!("cold: epoch 0 over {} ranks", sockets.len()));
    let (mut warm, _) = spawn_ranks(exe, &sockets, &with(&[]))?;
    let cold = run_epoch(&mut warm, 0, timeout, |_, _| {})?;
    let window_batches = opts.window_batches.to_string();
    let (mut blocks, _) = spawn_ranks(exe, &sockets, &with(&["--window-batches", &window_batches]))?;
    say("copy ranks: assembling one epoch each in advance");
    let (mut copy, _) = spawn_ranks(exe, &sockets, &with(&["--preassembled"]))?;

    say(&format!("warm and blocks: {WARMUP_EPOCHS} untimed epochs; then copy, warm and blocks, alternating"));
    let rate = |ranks: &mut [TrainerProcess], e: u64| -> Result<f64> {
        let out = run_epoch(ranks, e, timeout, |_, _| {})?;
        Ok(ratio(out.rows as f64, out.secs))
    };
    let (mut c, mut w, mut b) = (Vec::new(), Vec::new(), Vec::new());
    let mut warmup_epochs = Vec::new();
    for e in 1..=WARMUP_EPOCHS {
        warmup_epochs.push([rate(&mut warm, e)?, rate(&mut blocks, e)?]);
    }
    for e in WARMUP_EPOCHS + 1..WARMUP_EPOCHS + opts.epochs.max(2) {
        c.push(rate(&mut copy, e)?);
        w.push(rate(&mut warm, e)?);
        b.push(rate(&mut blocks, e)?);
    }
    drop((copy, warm, blocks));
    daemon.stop();
    let epochs = (0..c.len()).map(|i| [c[i], w[i], b[i]]).collect();
    let (copy, warm, blocks) = (median(&c), median(&w), median(&b));
    Ok(RanksSummary {
        scenario: "ranks",
        ranks: sockets.len() as u32,
        copy_rows_per_s: copy,
        warm_rows_per_s: warm,
        blocks_rows_per_s: blocks,
        warm_vs_copy: ratio(warm, copy),
        blocks_vs_copy: ratio(blocks, copy),
        cold_secs: cold.secs,
        epochs,
        warmup_epochs,
        opts: opts.clone(),
        conditions: Conditions::current(),
    })
}
