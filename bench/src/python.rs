//! `granary bench python`: the Python client against the Rust client on
//! the same node and data, and against numpy copying batches already in
//! RAM, in one run.
//!
//! Scenarios, on one generated dataset served by one node daemon (every
//! chunk converted and in its RAM tier before anything is timed):
//! - `rust`: this process's `granary_client::Loader`; a batch is consumed
//!   by taking every tensor's bytes (what a typed view costs), nothing more;
//! - `python`: `granary.Loader` in a Python process (`python_bench.py`); a
//!   batch is consumed by making every tensor's numpy array (a view, no
//!   copy), nothing more. `python / rust` is the binding's cost;
//! - `rust_copy` and `python_copy`: the same loaders, every tensor copied
//!   into a preallocated staging buffer (what a trainer moving the batch
//!   into its framework or a pinned slot does);
//! - `numpy_copy`: one epoch's batches copied into Python's memory first,
//!   then each copied into the same staging as `python_copy`: no loader
//!   can feed a Python trainer faster than this. `python_copy /
//!   numpy_copy` is how close Granary comes to it.
//!
//! The scenarios alternate epoch by epoch, so drift in the machine's load
//! hits them alike; each rate is the median over its epochs. Both clients
//! use the same plan (seed, batch size, shuffle) and the loader's default
//! assembly threads; after the timed epochs the Python client's batch
//! checksums of one epoch are compared with the Rust client's.

use crate::consume::Staging;
use crate::local::{Consume, DaemonSettings, EpochMeasure, LocalOpts, Scenario, generate, run_epoch, scenario};
use crate::report::{Conditions, ratio};
use anyhow::{Context, Result, anyhow, bail};
use granary_client::{Loader, LoaderConfig};
use granary_testkit::harness::NodeProcess;
use serde::Serialize;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

/// The Python half, run from a temporary file.
const SCRIPT: &str = include_str!("python_bench.py");

/// The job's seed (both clients).
const SEED: u64 = 5;

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct PythonOpts {
    /// Rows in the generated dataset.
    pub rows: u64,
    /// Rows per row group (shard).
    pub row_group_rows: u64,
    /// Rows per batch.
    pub batch_size: u32,
    /// Timed epochs per scenario.
    pub epochs: u64,
    /// RAM tier of the daemon.
    pub ram_bytes: u64,
    /// The Python interpreter (with `granary` installed).
    pub python: String,
    /// Generate list and byte columns and serve them as jagged tensors
    /// (`granary.Jagged` in Python: its offsets and values are made and
    /// copied like any array).
    pub jagged: bool,
}

impl Default for PythonOpts {
    fn default() -> Self {
        Self {
            rows: 400_000,
            row_group_rows: 10_000,
            batch_size: 4096,
            epochs: 15,
            ram_bytes: 1 << 30,
            python: "python3".into(),
            jagged: false,
        }
    }
}

/// The summary line.
#[derive(Clone, Debug, Serialize)]
pub struct PythonSummary {
    /// Always "summary".
    pub scenario: &'static str,
    /// python rows/s over rust rows/s (views, nothing copied). Target >= 0.9.
    pub python_vs_rust: f64,
    /// python_copy rows/s over numpy_copy rows/s: the loader against
    /// copying batches already in RAM.
    pub python_vs_numpy_copy: f64,
    /// python_copy rows/s over rust_copy rows/s.
    pub python_copy_vs_rust_copy: f64,
    /// What the Python client adds per batch, microseconds: taking a
    /// batch that is already assembled and making its arrays
    /// (`python_ready_us`), less the Rust client taking one and its tensors'
    /// bytes (`rust_ready_us`). Target < 20.
    pub per_batch_overhead_us: f64,
    /// Python: median microseconds of `next()` and the arrays of a batch
    /// already waiting in a queue 32 batches deep.
    pub python_ready_us: f64,
    /// Rust: the same for `EpochStream::next` and every tensor's bytes.
    pub rust_ready_us: f64,
    /// The same overhead from the epoch rates (`batch_size / python -
    /// batch_size / rust`): an epoch's noise (10% of 400 µs a batch here)
    /// swamps it; kept to show that.
    pub per_batch_from_rates_us: f64,
    /// Whether the Python client's batches were the Rust client's.
    pub streams_identical: bool,
    /// Batches per epoch.
    pub batches_per_epoch: usize,
    /// The interpreter and its numpy.
    pub python_version: String,
    /// Options of the run.
    pub opts: PythonOpts,
    /// Commit, cores, profile.
    pub conditions: Conditions,
}

/// Checks that `python` can import `granary` and numpy; returns their
/// versions, or says how to install the package.
pub fn check_python(python: &str) -> Result<String> {
    let out = Command::new(python)
        .args([
            "-c",
            "import sys, numpy, granary; print(sys.version.split()[0], 'numpy', numpy.__version__, 'granary', granary.__version__)",
        ])
        .output()
        .map_err(|e| anyhow!("cannot run {python:?} ({e}): pass --python PATH of an interpreter with granary installed"))?;
    if !out.status.success() {
        bail!(
            "{python} cannot import granary: {}\ninstall it with `pip install ./python` from the repository (in a venv: \
             python3 -m venv .venv && .venv/bin/pip install ./python, then --python .venv/bin/python)",
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("").trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The Python process, driven one command per line.
struct PyClient {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    log: std::path::PathBuf,
}

impl PyClient {
    fn ask(&mut self, cmd: &str, epoch: u64) -> Result<serde_json::Value> {
        writeln!(self.stdin, "{cmd} {epoch}").context("writing to the Python client")?;
        self.stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        if line.is_empty() {
            let _ = self.child.wait();
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            bail!("the Python client stopped at `{cmd} {epoch}`:\n{log}");
        }
        serde_json::from_str(&line).with_context(|| format!("the Python client's answer {line:?}"))
    }

    fn epoch(&mut self, cmd: &str, epoch: u64) -> Result<EpochMeasure> {
        let v = self.ask(cmd, epoch)?;
        let num = |k: &str| v[k].as_f64().ok_or_else(|| anyhow!("no {k} in {v}"));
        Ok(EpochMeasure {
            epoch,
            rows: num("rows")? as u64,
            bytes: num("bytes")? as u64,
            secs: num("secs")?,
            digest: 0,
        })
    }
}

impl Drop for PyClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Rust client's median microseconds to take a batch that is already
/// assembled (a loader 32 batches ahead, given a second to fill its queue)
/// and its tensors' bytes: the counterpart of the Python `ready` command.
fn rust_ready_us(socket: &Path, batch_size: u32, epoch: u64) -> Result<f64> {
    let cfg = LoaderConfig { seed: SEED, prefetch_batches: 32, ..LoaderConfig::new("ads", batch_size) };
    let ahead = Loader::connect(socket, cfg)?;
    let mut it = ahead.epoch(epoch)?;
    std::thread::sleep(Duration::from_secs(1));
    let mut costs = Vec::new();
    for _ in 0..32.min(it.num_batches()) {
        let t0 = std::time::Instant::now();
        let b = it.next().ok_or_else(|| anyhow!("the epoch ended early"))??;
        let bytes = b.byte_len();
        std::hint::black_box(bytes);
        costs.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    Ok(crate::report::median(&costs))
}

/// Runs every scenario; `say` receives one line per step.
pub fn run(exe: &Path, opts: &PythonOpts, mut say: impl FnMut(&str)) -> Result<(Vec<Scenario>, PythonSummary)> {
    let python_version = check_python(&opts.python)?;
    let work = tempfile::tempdir()?;
    let gen_opts = LocalOpts {
        rows: opts.rows,
        files: 4,
        row_group_rows: opts.row_group_rows,
        jagged: opts.jagged,
        ..LocalOpts::default()
    };
    // 748 bytes a converted row (150 + 32 f32, 2 i64, 1 f32), about 4,300
    // with the jagged columns (blob's 1-4 KiB, hist's and cats' values,
    // three row offsets): every chunk must stay in the RAM tier for warm
    // epochs to be warm.
    let converted = opts.rows * if opts.jagged { 4_300 } else { crate::local::FIXED_ROW_BYTES };
    if converted > opts.ram_bytes / 10 * 9 {
        bail!("{} rows convert to {converted} bytes: more than the RAM tier holds (--ram-mib)", opts.rows);
    }
    let (data, _) = generate(work.path(), &gen_opts, &mut say)?;
    let socket = work.path().join("node.sock");
    let config = work.path().join("node.toml");
    let settings = DaemonSettings {
        socket: &socket,
        ssd_dir: None,
        ssd_bytes: 0,
        data_dir: &data,
        ram_bytes: opts.ram_bytes,
        prefetch_bytes: 256 << 20,
        loads: 4,
        convert_threads: 2,
        throttle: None,
        jagged: opts.jagged,
        fixed_dir: None,
    };
    std::fs::write(&config, settings.toml())?;
    let _daemon = NodeProcess::spawn(exe, &config, &socket, &work.path().join("node.log"), Duration::from_secs(60))
        .context("starting the node daemon")?;
    let cfg = LoaderConfig { seed: SEED, ..LoaderConfig::new("ads", opts.batch_size) };
    let loader = Loader::connect(&socket, cfg)?;
    let batches_per_epoch = loader.num_batches(0)?;
    say("converting every chunk (epoch 0, untimed)");
    run_epoch(&loader, 0, Consume::Drop)?;

    let script = work.path().join("python_bench.py");
    std::fs::write(&script, SCRIPT)?;
    let log = work.path().join("python.log");
    let mut child = Command::new(&opts.python)
        .arg(&script)
        .arg(&socket)
        .args(["ads", &opts.batch_size.to_string(), &SEED.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("starting {}", opts.python))?;
    let stdin = child.stdin.take().context("the Python client's stdin")?;
    let stdout = BufReader::new(child.stdout.take().context("the Python client's stdout")?);
    let mut py = PyClient { child, stdin, stdout, log };
    say("warming the Python client and keeping one epoch in its RAM (untimed)");
    py.ask("python", 0)?;
    py.ask("load_copy", 0)?;

    let mut staging = Staging::new(0);
    let names = ["rust", "python", "rust_copy", "python_copy", "numpy_copy"];
    let mut runs: Vec<Vec<EpochMeasure>> = vec![Vec::new(); names.len()];
    for e in 1..=opts.epochs {
        say(&format!("epoch {e} of {}: rust, python, rust_copy, python_copy, numpy_copy", opts.epochs));
        runs[0].push(run_epoch(&loader, e, Consume::Drop)?);
        runs[1].push(py.epoch("python", e)?);
        runs[2].push(run_epoch(&loader, e, Consume::Copy(&mut staging))?);
        runs[3].push(py.epoch("python_copy", e)?);
        runs[4].push(py.epoch("numpy_copy", e)?);
    }
    say("the cost of taking a ready batch, each client");
    let py_ready_us = py.ask("ready", 1)?["us"].as_f64().ok_or_else(|| anyhow!("no ready time"))?;
    let rust_ready_us = rust_ready_us(&socket, opts.batch_size, 1)?;
    let want: Vec<u64> = loader.epoch(1)?.map(|b| b.map(|b| b.checksum())).collect::<Result<_, _>>()?;
    let got: Vec<u64> = serde_json::from_value(py.ask("checksums", 1)?["checksums"].take())?;
    let scenarios: Vec<Scenario> = names.iter().zip(runs).map(|(n, r)| scenario(n, r)).collect();
    let rate = |n: &str| scenarios.iter().find(|s| s.scenario == n).map_or(0.0, |s| s.rows_per_s);
    let per_batch = |r: f64| ratio(f64::from(opts.batch_size), r) * 1e6;
    let summary = PythonSummary {
        scenario: "summary",
        python_vs_rust: ratio(rate("python"), rate("rust")),
        python_vs_numpy_copy: ratio(rate("python_copy"), rate("numpy_copy")),
        python_copy_vs_rust_copy: ratio(rate("python_copy"), rate("rust_copy")),
        per_batch_overhead_us: py_ready_us - rust_ready_us,
        python_ready_us: py_ready_us,
        rust_ready_us,
        per_batch_from_rates_us: per_batch(rate("python")) - per_batch(rate("rust")),
        streams_identical: got == want,
        batches_per_epoch,
        python_version,
        opts: opts.clone(),
        conditions: Conditions::current(),
    };
    Ok((scenarios, summary))
}
