//! One pass: a node daemon with its own cache, throttled remote storage
//! (`file://` with a latency per request and a shared bandwidth cap) and
//! `--ranks` trainer processes, run in lockstep through every epoch. It
//! returns per-epoch throughput and the daemon's counters, and every rank's
//! batch digest per epoch, which is what the determinism checks compare.
//!
//! The single-node demo runs three passes (main, in-RAM ceiling, replay with
//! [`replay_settings`]); the cluster demo runs one as its reference.

use super::args::DemoArgs;
use super::report::style;
use anyhow::{Result, bail};
use granary_bench::local::DaemonSettings;
use granary_bench::report::{gbps, ratio};
use granary_client::LocalSource;
use granary_testkit::harness::{NodeProcess, TrainerEvent, TrainerProcess, rank_args};
use indicatif::{MultiProgress, ProgressBar};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One epoch of a pass, as a table row or a JSON line.
#[derive(Clone, Debug, Serialize)]
pub(super) struct EpochRow {
    /// Always `"epoch"`, the JSON line's kind.
    pub(super) event: &'static str,
    /// Epoch number, from 0.
    pub(super) epoch: u64,
    /// Rows delivered to all ranks.
    pub(super) rows: u64,
    /// Batch bytes delivered to all ranks.
    pub(super) bytes: u64,
    /// Wall time of the epoch, all ranks in lockstep.
    pub(super) secs: f64,
    /// `rows / secs`.
    pub(super) rows_per_s: f64,
    /// `bytes / secs`, GB/s.
    pub(super) gb_per_s: f64,
    /// Rows/s over the in-RAM ceiling's; the pass leaves it 0 and the
    /// single-node demo fills it in once the ceiling pass has run.
    pub(super) vs_ceiling: f64,
    /// Remote bytes read by the daemon so far.
    pub(super) remote_bytes: u64,
    /// Parquet bytes of the dataset.
    pub(super) source_bytes: u64,
    /// Shards converted by the daemon so far.
    pub(super) conversions: u64,
}

/// What a pass measured.
pub(super) struct Pass {
    /// One row per epoch, in order.
    pub(super) epochs: Vec<EpochRow>,
    /// (rank, epoch) -> digest
    pub(super) digests: BTreeMap<(u32, u64), String>,
}

/// The daemon's and the ranks' settings for one pass; none of them may
/// change the batches.
pub(super) struct Settings {
    /// The daemon's prefetch budget per rank.
    pub(super) prefetch_bytes: u64,
    /// The daemon's concurrent shard loads.
    pub(super) loads: usize,
    /// The daemon's converter threads.
    pub(super) convert_threads: usize,
    /// Batches each rank's loader prepares ahead.
    pub(super) prefetch_batches: usize,
    /// Batch assembly threads per rank (0: the loader's default).
    pub(super) assembly_threads: usize,
    /// Ranks copy every chunk into their own memory first (the in-RAM
    /// ceiling).
    pub(super) ceiling: bool,
}

/// The second run's settings: everything that must not change the batches
/// is changed.
pub(super) fn replay_settings() -> Settings {
    Settings {
        prefetch_bytes: 24 << 20,
        loads: 1,
        convert_threads: 1,
        prefetch_batches: 5,
        assembly_threads: 3,
        ceiling: false,
    }
}

/// Starts a node daemon in `dir` (its socket, config, SSD tier and log
/// there) serving the dataset at `data` through the throttle; returns it
/// and its socket.
pub(super) fn daemon(
    exe: &Path,
    a: &DemoArgs,
    dir: &Path,
    s: &Settings,
    data: &Path,
    bandwidth: u64,
    source_bytes: u64,
) -> Result<(NodeProcess, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let socket = dir.join("node.sock");
    let config = dir.join("node.toml");
    let ssd = dir.join("ssd");
    let settings = DaemonSettings {
        socket: &socket,
        ssd_dir: Some(&ssd),
        // Room for every chunk twice (converted chunks are about the size
        // of the Parquet here; foyer reclaims whole blocks).
        ssd_bytes: (2 * source_bytes).max(1 << 30),
        data_dir: data,
        ram_bytes: a.ram_mib << 20,
        prefetch_bytes: s.prefetch_bytes,
        loads: s.loads,
        convert_threads: s.convert_threads,
        throttle: Some((a.latency_ms, bandwidth)),
        jagged: a.jagged,
        fixed_dir: None,
    };
    std::fs::write(&config, settings.toml())?;
    let node = NodeProcess::spawn(exe, &config, &socket, &dir.join("node.log"), Duration::from_secs(60))?;
    Ok((node, socket))
}

/// Runs one pass in `work/name` and stops its daemon and ranks.
#[allow(clippy::too_many_arguments)]
pub(super) fn pass(
    exe: &Path,
    a: &DemoArgs,
    work: &Path,
    name: &str,
    s: &Settings,
    data: &Path,
    bandwidth: u64,
    source_bytes: u64,
    bars: &MultiProgress,
) -> Result<Pass> {
    let dir = work.join(name);
    let (node, socket) = daemon(exe, a, &dir, s, data, bandwidth, source_bytes)?;
    let stats_conn = LocalSource::connect(&socket)?;
    let mut ranks = Vec::new();
    for r in 0..a.ranks {
        let mut args = rank_args(&socket, r, a.ranks);
        args.extend([
            "--batch-size".into(),
            a.batch_size.to_string(),
            "--seed".into(),
            "2026".into(),
            "--prefetch-batches".into(),
            s.prefetch_batches.to_string(),
            "--assembly-threads".into(),
            s.assembly_threads.to_string(),
        ]);
        if s.ceiling {
            args.push("--ceiling".into());
        }
        ranks.push(TrainerProcess::spawn(exe, r, a.ranks as usize, &args)?);
    }
    let timeout = Duration::from_secs(300);
    let mut batches = 0;
    for t in &ranks {
        match t.next_event(timeout)? {
            TrainerEvent::Ready { batches: b, .. } => batches = b,
            TrainerEvent::Error { message, .. } => bail!("rank {} failed: {message}\n{}", t.rank, node.log_tail()),
            other => bail!("unexpected event {other:?}"),
        }
    }
    let mut out = Pass { epochs: Vec::new(), digests: BTreeMap::new() };
    for epoch in 0..a.epochs {
        let rank_bars: Vec<ProgressBar> = ranks
            .iter()
            .map(|t| {
                let b = bars.add(ProgressBar::new(batches));
                b.set_style(style(&format!("{name} e{epoch} rank {}", t.rank)));
                b
            })
            .collect();
        let start = Instant::now();
        for t in &mut ranks {
            t.start_epoch(epoch)?;
        }
        let (mut rows, mut bytes) = (0u64, 0u64);
        for (t, bar) in ranks.iter().zip(&rank_bars) {
            loop {
                match t.next_event(timeout)? {
                    TrainerEvent::Progress { done, .. } => bar.set_position(done),
                    TrainerEvent::Epoch { rows: r, bytes: b, digest, .. } => {
                        rows += r;
                        bytes += b;
                        out.digests.insert((t.rank, epoch), digest);
                        bar.finish_and_clear();
                        break;
                    }
                    TrainerEvent::Error { message, .. } => {
                        bail!("rank {} failed: {message}\n{}", t.rank, node.log_tail())
                    }
                    other => bail!("unexpected event {other:?}"),
                }
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let stats = stats_conn.stats()?;
        out.epochs.push(EpochRow {
            event: "epoch",
            epoch,
            rows,
            bytes,
            secs,
            rows_per_s: ratio(rows as f64, secs),
            gb_per_s: gbps(bytes, secs),
            vs_ceiling: 0.0,
            remote_bytes: stats.remote_bytes,
            source_bytes,
            conversions: stats.conversions,
        });
    }
    for t in ranks {
        t.finish(Duration::from_secs(30))?;
    }
    node.stop();
    Ok(out)
}
