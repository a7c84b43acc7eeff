//! `granary demo`: the single-host path, end to end, on a fresh machine.
//!
//! 1. Generates the recommendation dataset in a temporary folder.
//! 2. Serves it as remote storage with a latency per request and a bandwidth
//!    cap shared by all requests (the node's throttle over `file://`).
//! 3. Starts a node daemon and N trainer processes, runs the epochs in
//!    lockstep with progress bars, and reports per epoch rows/s, GB/s, the
//!    ratio to the in-RAM ceiling (measured in the same run by trainers that
//!    first copy every chunk into their own memory), remote bytes read against
//!    the dataset size, and conversions.
//! 4. Runs everything again with different prefetch, loader and converter
//!    settings and a cold cache, and checks that every rank received the same
//!    batches, byte for byte, in the same order.
//!
//! With `--nodes N` (N ≥ 2) it runs a cluster instead ([`crate::demo_cluster`]).

use anyhow::{Result, bail};
use clap::Args;
use granary_bench::local::DaemonSettings;
use granary_bench::report::{gbps, ratio};
use granary_client::LocalSource;
use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::{NodeProcess, TrainerEvent, TrainerProcess};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Demo options; every default is the embedded local default.
#[derive(Args, Clone, Debug)]
pub struct DemoArgs {
    /// Rows in the generated dataset.
    #[arg(long, default_value_t = 400_000)]
    pub rows: u64,
    /// Parquet files.
    #[arg(long, default_value_t = 8)]
    pub files: u32,
    /// Rows per row group (one shard).
    #[arg(long, default_value_t = 10_000)]
    pub row_group_rows: u64,
    /// Trainer processes (single node).
    #[arg(long, default_value_t = 4)]
    pub ranks: u32,
    /// Node daemons; 2 or more runs a cluster with a coordinator.
    #[arg(long, default_value_t = 1)]
    pub nodes: u32,
    /// Trainer ranks per node daemon (cluster).
    #[arg(long, default_value_t = 2)]
    pub ranks_per_node: u32,
    /// Epochs.
    #[arg(long, default_value_t = 3)]
    pub epochs: u64,
    /// Rows per batch.
    #[arg(long, default_value_t = 1024)]
    pub batch_size: u32,
    /// Remote latency per request, ms.
    #[arg(long, default_value_t = 20)]
    pub latency_ms: u64,
    /// Remote bandwidth shared by all requests (of one node), MiB/s.
    #[arg(long, default_value_t = 200)]
    pub bandwidth_mib: u64,
    /// RAM tier, MiB.
    #[arg(long, default_value_t = 1024)]
    pub ram_mib: u64,
    /// Print JSON lines instead of tables and bars.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Debug, Serialize)]
struct EpochRow {
    event: &'static str,
    epoch: u64,
    rows: u64,
    bytes: u64,
    secs: f64,
    rows_per_s: f64,
    gb_per_s: f64,
    vs_ceiling: f64,
    remote_bytes: u64,
    source_bytes: u64,
    conversions: u64,
}

pub(crate) struct Pass {
    epochs: Vec<EpochRow>,
    /// (rank, epoch) -> digest
    pub(crate) digests: BTreeMap<(u32, u64), String>,
}

pub(crate) struct Settings {
    prefetch_bytes: u64,
    loads: usize,
    convert_threads: usize,
    prefetch_batches: usize,
    /// Batch assembly threads per rank (0: the loader's default).
    assembly_threads: usize,
    ceiling: bool,
}

pub fn run(a: DemoArgs) -> Result<()> {
    if a.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    if a.nodes > 1 {
        return crate::demo_cluster::run(a);
    }
    let Setup { started, exe, work, data, bars, source_bytes } = Setup::new(&a)?;
    let bandwidth = a.bandwidth_mib << 20;
    let say = |s: String| {
        if !a.json {
            say_to(&bars, s);
        }
    };
    say(format!(
        "remote storage: file:// throttled to {} MiB/s shared, {} ms per request; {} ranks x {} epochs, batch {}",
        a.bandwidth_mib, a.latency_ms, a.ranks, a.epochs, a.batch_size
    ));

    let first = Settings {
        prefetch_bytes: 256 << 20,
        loads: 4,
        convert_threads: 2,
        prefetch_batches: 2,
        assembly_threads: 0,
        ceiling: false,
    };
    let main = pass(&exe, &a, work.path(), "run", &first, &data, bandwidth, source_bytes, &bars)?;
    let ceiling = pass(
        &exe,
        &a,
        work.path(),
        "ceiling",
        &Settings { ceiling: true, ..first },
        &data,
        bandwidth,
        source_bytes,
        &bars,
    )?;
    let ceiling_rps = {
        let rows: u64 = ceiling.epochs.iter().map(|e| e.rows).sum();
        let secs: f64 = ceiling.epochs.iter().map(|e| e.secs).sum();
        ratio(rows as f64, secs)
    };
    let second = replay_settings();
    let replay = pass(&exe, &a, work.path(), "replay", &second, &data, bandwidth, source_bytes, &bars)?;

    let identical = main.digests == replay.digests && main.digests == ceiling.digests;
    let mut rows_out = main.epochs.clone();
    for r in &mut rows_out {
        r.vs_ceiling = ratio(r.rows_per_s, ceiling_rps);
    }
    if a.json {
        for r in &rows_out {
            println!("{}", serde_json::to_string(r)?);
        }
        println!(
            "{}",
            serde_json::json!({
                "event": "summary",
                "ceiling_rows_per_s": ceiling_rps,
                "deterministic": identical,
                "ranks": a.ranks,
                "epochs": a.epochs,
                "source_bytes": source_bytes,
                "bandwidth_bytes_per_s": bandwidth,
                "latency_ms": a.latency_ms,
                "secs": started.elapsed().as_secs_f64(),
            })
        );
    } else {
        println!();
        println!(
            "{:>5} {:>12} {:>7} {:>11} {:>24} {:>12}",
            "epoch", "rows/s", "GB/s", "vs ceiling", "remote read / dataset", "conversions"
        );
        for r in &rows_out {
            println!(
                "{:>5} {:>12.0} {:>7.2} {:>10.2}x {:>11.1} / {:>5.1} MB {:>12}",
                r.epoch,
                r.rows_per_s,
                r.gb_per_s,
                r.vs_ceiling,
                r.remote_bytes as f64 / 1e6,
                r.source_bytes as f64 / 1e6,
                r.conversions
            );
        }
        println!("in-RAM ceiling (same run, same plan, {} ranks): {:.0} rows/s", a.ranks, ceiling_rps);
        println!(
            "determinism: {} — every rank's batch checksums over {} epochs are {} in a second run with prefetch {} MiB -> {} MiB, loads {} -> {}, converter threads {} -> {}, loader lookahead {} -> {} batches, assembly threads {} -> {}, and a cold cache",
            if identical { "OK" } else { "MISMATCH" },
            a.epochs,
            if identical { "identical" } else { "NOT identical" },
            first.prefetch_bytes >> 20,
            second.prefetch_bytes >> 20,
            first.loads,
            second.loads,
            first.convert_threads,
            second.convert_threads,
            first.prefetch_batches,
            second.prefetch_batches,
            if first.assembly_threads == 0 {
                granary_client::default_assembly_threads_for(a.ranks as usize)
            } else {
                first.assembly_threads
            },
            second.assembly_threads
        );
        println!("total {:.1}s", started.elapsed().as_secs_f64());
    }
    if !identical {
        bail!("batch streams differ between runs");
    }
    Ok(())
}

/// The second run's settings: everything that must not change the batches
/// is changed.
pub(crate) fn replay_settings() -> Settings {
    Settings {
        prefetch_bytes: 24 << 20,
        loads: 1,
        convert_threads: 1,
        prefetch_batches: 5,
        assembly_threads: 3,
        ceiling: false,
    }
}

/// What both demos start from: the binary, a work folder holding the
/// generated dataset, and the progress bars (hidden with `--json`).
pub(crate) struct Setup {
    pub(crate) started: Instant,
    pub(crate) exe: PathBuf,
    pub(crate) work: tempfile::TempDir,
    pub(crate) data: PathBuf,
    pub(crate) bars: MultiProgress,
    /// Parquet bytes of the dataset.
    pub(crate) source_bytes: u64,
}

impl Setup {
    pub(crate) fn new(a: &DemoArgs) -> Result<Self> {
        let started = Instant::now();
        let exe = std::env::current_exe()?;
        let work = tempfile::tempdir()?;
        let data = work.path().join("data");
        let bars = MultiProgress::new();
        if a.json {
            bars.set_draw_target(ProgressDrawTarget::hidden());
        }
        let source_bytes = generate(a, &data, &bars)?.bytes;
        Ok(Self { started, exe, work, data, bars, source_bytes })
    }
}

/// Generates the demo dataset into `data` with a progress bar.
fn generate(a: &DemoArgs, data: &Path, bars: &MultiProgress) -> Result<datagen::GenReport> {
    let gen_bar = bars.add(ProgressBar::new(a.rows));
    gen_bar.set_style(style("generating dataset"));
    let spec = GenSpec {
        seed: 42,
        rows: a.rows,
        files: a.files,
        row_group_rows: a.row_group_rows,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    let report = datagen::generate(data, &spec, |n| gen_bar.set_position(n))?;
    gen_bar.finish_and_clear();
    if !a.json {
        say_to(
            bars,
            format!(
                "dataset: {} rows, {} files, {} shards, {:.1} MB of Parquet at {}",
                report.rows,
                report.files.len(),
                a.rows.div_ceil(a.row_group_rows),
                report.bytes as f64 / 1e6,
                data.display()
            ),
        );
    }
    Ok(report)
}

/// Prints a line above the progress bars, or plainly when they are hidden
/// (output is not a terminal).
pub(crate) fn say_to(bars: &MultiProgress, line: String) {
    if bars.is_hidden() {
        println!("{line}");
    } else {
        let _ = bars.println(line);
    }
}

pub(crate) fn style(prefix: &str) -> ProgressStyle {
    ProgressStyle::with_template(&format!("{prefix:>18} [{{bar:40}}] {{pos}}/{{len}} {{msg}}"))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn pass(
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
    std::fs::create_dir_all(&dir)?;
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
    };
    std::fs::write(&config, settings.toml())?;
    let node = NodeProcess::spawn(exe, &config, &socket, &dir.join("node.log"), Duration::from_secs(60))?;
    let stats_conn = LocalSource::connect(&socket)?;
    let mut ranks = Vec::new();
    for r in 0..a.ranks {
        let mut args = vec![
            "--socket".to_string(),
            socket.display().to_string(),
            "--rank".into(),
            r.to_string(),
            "--world".into(),
            a.ranks.to_string(),
            "--batch-size".into(),
            a.batch_size.to_string(),
            "--seed".into(),
            "2026".into(),
            "--prefetch-batches".into(),
            s.prefetch_batches.to_string(),
            "--assembly-threads".into(),
            s.assembly_threads.to_string(),
        ];
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
