//! What both demos start from: the binary to spawn as daemons and ranks, a
//! temporary work folder, the generated dataset in it, and the progress bars.
//! The dataset's seed is fixed, so runs with the same flags serve the same
//! bytes.

use super::args::DemoArgs;
use super::report::{say_to, style};
use anyhow::Result;
use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::LocalClusterSpec;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What both demos start from: the binary, a work folder holding the
/// generated dataset, and the progress bars (hidden with `--json`).
pub(super) struct Setup {
    /// When the demo started (its total time includes generating the data).
    pub(super) started: Instant,
    /// This binary, spawned as daemons, the coordinator and ranks.
    pub(super) exe: PathBuf,
    /// The temporary work folder; removed when dropped.
    pub(super) work: tempfile::TempDir,
    /// The dataset's folder inside `work`.
    pub(super) data: PathBuf,
    /// Every progress bar, and the lines printed above them.
    pub(super) bars: MultiProgress,
    /// Parquet bytes of the dataset.
    pub(super) source_bytes: u64,
}

impl Setup {
    /// Creates the work folder and generates the dataset into it.
    pub(super) fn new(a: &DemoArgs) -> Result<Self> {
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
        jagged: a.jagged,
        ..GenSpec::default()
    };
    let report = datagen::generate(data, &spec, |n| gen_bar.set_position(n))?;
    gen_bar.finish_and_clear();
    if !a.json {
        say_to(
            bars,
            format!(
                "dataset: {} rows{}, {} files, {} shards, {:.1} MB of Parquet at {}",
                report.rows,
                if a.jagged { " with list and byte columns (jagged tensors hist, cats, blob)" } else { "" },
                report.files.len(),
                a.rows.div_ceil(a.row_group_rows),
                report.bytes as f64 / 1e6,
                data.display()
            ),
        );
    }
    Ok(report)
}

/// The demo's cluster: one voter and `--nodes` node daemons, each with the
/// demo's RAM tier and its own throttled link to remote storage.
pub(super) fn cluster_spec(a: &DemoArgs) -> LocalClusterSpec {
    LocalClusterSpec {
        voters: 1,
        nodes: a.nodes,
        ram_bytes: a.ram_mib << 20,
        guest_bytes: a.ram_mib << 20,
        ssd_bytes: None,
        prefetch_bytes: 256 << 20,
        loads: 4,
        convert_threads: 2,
        throttle: Some((a.latency_ms, a.bandwidth_mib << 20)),
        lease_ms: 1500,
        view: Some(datagen::view_toml(a.jagged)),
        ..LocalClusterSpec::default()
    }
}
