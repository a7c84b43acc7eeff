//! `granary bench local`: the single-host data path against its baselines.
//!
//! Scenarios, all on one generated dataset, in one run:
//! - `ceiling`: every chunk already converted and held in this process
//!   ([`MemorySource`]); same plan, same batch assembly, same consumer. Its
//!   epochs alternate with the `warm` ones.
//! - `naive`: an embedded node with no cache and no prefetch: every epoch
//!   reads, decodes and converts every shard again (the failure mode).
//! - `cold`: epoch 0 through the node daemon and its Unix socket, with remote
//!   storage throttled to a fixed bandwidth and latency.
//! - `warm`: the following epochs through the same daemon.
//!
//! Every consumer computes each batch's checksum, so every scenario reads
//! every byte it is given.

use crate::harness::{NodeProcess, proc_memory};
use crate::report::{Conditions, gbps, ratio};
use anyhow::{Context, Result};
use granary_client::ChunkSource;
use granary_client::{Loader, LoaderConfig, MemorySource};
use granary_node::EmbeddedNode;
use granary_node::config::{DatasetConfig, NodeConfig, ViewRef};
use granary_node::datagen::{self, GenSpec};
use granary_proto::{AlignedBuf, Shuffle};
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct LocalOpts {
    /// Rows in the generated dataset.
    pub rows: u64,
    /// Files.
    pub files: u32,
    /// Rows per row group (shard).
    pub row_group_rows: u64,
    /// Rows per batch.
    pub batch_size: u32,
    /// Epochs per scenario (the first daemon epoch is `cold`).
    pub epochs: u64,
    /// Simulated remote latency per request.
    pub latency_ms: u64,
    /// Simulated remote bandwidth, shared by all requests.
    pub bandwidth_bytes_per_s: u64,
    /// RAM tier of the daemon.
    pub ram_bytes: u64,
    /// Shuffle window in shards.
    pub window_shards: u32,
    /// Parquet compression of the generated files.
    pub compression: String,
    /// Feature values of the generated files.
    pub values: datagen::Values,
}

impl Default for LocalOpts {
    fn default() -> Self {
        Self {
            rows: 500_000,
            files: 5,
            row_group_rows: 10_000,
            batch_size: 1024,
            epochs: 9,
            latency_ms: 20,
            bandwidth_bytes_per_s: 200 << 20,
            ram_bytes: 1 << 30,
            window_shards: 4,
            compression: "snappy".into(),
            values: datagen::Values::Uniform,
        }
    }
}

/// One epoch's measurement.
#[derive(Clone, Debug, Serialize)]
pub struct EpochMeasure {
    /// Epoch.
    pub epoch: u64,
    /// Rows delivered.
    pub rows: u64,
    /// Tensor bytes delivered.
    pub bytes: u64,
    /// Wall seconds.
    pub secs: f64,
    /// Hash of the sequence of batch checksums.
    pub digest: u64,
}

/// One scenario's result.
#[derive(Clone, Debug, Serialize)]
pub struct Scenario {
    /// Scenario name.
    pub scenario: String,
    /// Rows per second over the measured epochs.
    pub rows_per_s: f64,
    /// Tensor GB/s over the measured epochs.
    pub gb_per_s: f64,
    /// The measured epochs.
    pub epochs: Vec<EpochMeasure>,
}

/// The summary line.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Always "summary".
    pub scenario: &'static str,
    /// warm rows/s over ceiling rows/s.
    pub warm_vs_ceiling: f64,
    /// warm rows/s over naive rows/s.
    pub warm_vs_naive: f64,
    /// cold epoch seconds over (source bytes / bandwidth).
    pub cold_vs_bound: f64,
    /// remote bytes read over all daemon epochs / source bytes.
    pub remote_read_ratio: f64,
    /// node footprint / (RAM tier + 10% + 128 MiB).
    pub node_rss_over_budget: f64,
    /// Node footprint in bytes: anonymous + file RSS + chunk memory files.
    pub node_footprint_bytes: u64,
    /// Of which: the daemon's resident memory (anonymous, file, shared).
    pub node_memory: crate::harness::ProcMemory,
    /// Of which: bytes of chunk memory files the node held.
    pub node_chunk_memory_bytes: u64,
    /// Source (Parquet) bytes.
    pub source_bytes: u64,
    /// Converted bytes of the whole dataset.
    pub converted_bytes: u64,
    /// Whether every scenario delivered byte-identical batch streams.
    pub streams_identical: bool,
    /// Options of the run.
    pub opts: LocalOpts,
    /// Commit, cores, profile.
    pub conditions: Conditions,
}

/// Runs one epoch, consuming every batch.
pub fn run_epoch(loader: &Loader, epoch: u64) -> Result<EpochMeasure> {
    let start = Instant::now();
    let mut rows = 0u64;
    let mut bytes = 0u64;
    let mut digest = xxhash_rust::xxh3::Xxh3::new();
    for batch in loader.epoch(epoch)? {
        let batch = batch?;
        rows += batch.rows() as u64;
        bytes += (0..batch.layouts().len()).map(|i| batch.tensor_bytes(i).len() as u64).sum::<u64>();
        digest.update(&batch.checksum().to_le_bytes());
    }
    Ok(EpochMeasure { epoch, rows, bytes, secs: start.elapsed().as_secs_f64(), digest: digest.digest() })
}

/// A scenario's rate is the median over its epochs: epochs are short and
/// the machine is shared, so one descheduled epoch must not decide it.
fn scenario(name: &str, epochs: Vec<EpochMeasure>) -> Scenario {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => 0.0,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    };
    let rows_per_s = median(epochs.iter().map(|e| ratio(e.rows as f64, e.secs)).collect());
    let gb_per_s = median(epochs.iter().map(|e| gbps(e.bytes, e.secs)).collect());
    Scenario { scenario: name.into(), rows_per_s, gb_per_s, epochs }
}

/// What a benchmark or demo daemon is started with.
#[derive(Clone, Debug)]
pub struct DaemonSettings<'a> {
    /// Unix socket.
    pub socket: &'a Path,
    /// SSD tier folder.
    pub ssd_dir: Option<&'a Path>,
    /// SSD tier capacity (reserved on disk when the daemon starts).
    pub ssd_bytes: u64,
    /// Folder of the generated Parquet files (served as `file://`).
    pub data_dir: &'a Path,
    /// RAM tier.
    pub ram_bytes: u64,
    /// Prefetch budget per rank.
    pub prefetch_bytes: u64,
    /// Concurrent shard loads.
    pub loads: usize,
    /// Converter threads.
    pub convert_threads: usize,
    /// Simulated remote: (latency ms, bandwidth bytes/s).
    pub throttle: Option<(u64, u64)>,
}

impl DaemonSettings<'_> {
    /// The node config as TOML text (the daemon reads a file).
    pub fn toml(&self) -> String {
        let mut s = format!(
            "socket = {:?}\nram_bytes = {}\nprefetch_bytes = {}\nmax_concurrent_loads = {}\nconvert_threads = {}\n",
            self.socket, self.ram_bytes, self.prefetch_bytes, self.loads, self.convert_threads
        );
        if let Some(d) = self.ssd_dir {
            s += &format!("ssd_dir = {d:?}\nssd_bytes = {}\n", self.ssd_bytes);
        }
        if let Some((latency_ms, bw)) = self.throttle {
            s += &format!("\n[throttle]\nlatency_ms = {latency_ms}\nbandwidth_bytes_per_s = {bw}\n");
        }
        s += &format!(
            "\n[[dataset]]\nname = \"ads\"\nsource = \"file://{}\"\n\n[dataset.view]\n",
            self.data_dir.display()
        );
        // The view's tensors as an array of tables under [dataset.view].
        s += &datagen::VIEW_TOML.replace("[[tensor]]", "[[dataset.view.tensor]]");
        s
    }
}

fn embedded_config(data_dir: &Path, ram_bytes: u64, prefetch_bytes: u64) -> Result<NodeConfig> {
    Ok(NodeConfig {
        datasets: vec![DatasetConfig {
            name: "ads".into(),
            source: format!("file://{}", data_dir.display()),
            view: ViewRef::Inline(datagen::view()),
        }],
        ram_bytes,
        prefetch_bytes,
        ..NodeConfig::default()
    })
}

/// Runs every scenario; `say` receives one line per step for progress.
pub fn run(exe: &Path, opts: &LocalOpts, mut say: impl FnMut(&str)) -> Result<(Vec<Scenario>, Summary)> {
    let work = tempfile::tempdir()?;
    let data = work.path().join("data");
    say(&format!("generating {} rows", opts.rows));
    let spec = GenSpec {
        seed: 7,
        rows: opts.rows,
        files: opts.files,
        row_group_rows: opts.row_group_rows,
        compression: opts.compression.clone(),
        values: opts.values,
    };
    let report = datagen::generate(&data, &spec, |_| {})?;
    let loader_cfg = LoaderConfig {
        seed: 1,
        shuffle: Shuffle::Windowed { window_shards: opts.window_shards },
        ..LoaderConfig::new("ads", opts.batch_size)
    };

    // ceiling: convert everything once, hold it in this process.
    say("ceiling: converting the whole dataset into memory");
    let embedded = EmbeddedNode::start(&embedded_config(&data, 8 << 30, 0)?, 2)?;
    let info = embedded.describe("ads")?;
    let mut chunks = Vec::new();
    for s in &info.shards {
        let c = embedded.fetch(info.version, s.shard)?;
        chunks.push((s.shard, huge_page_copy(c.bytes())));
    }
    drop(embedded);
    let memory = Arc::new(MemorySource::new(info.clone(), chunks)?);
    let converted_bytes = memory.bytes_held() as u64;
    let ceiling_loader = Loader::new(memory.clone(), loader_cfg.clone())?;

    // naive: no cache, no prefetch; every epoch decodes and converts again.
    say("naive: decode and convert every epoch");
    let naive_node = Arc::new(EmbeddedNode::start(&embedded_config(&data, 0, 0)?, 2)?);
    let loader = Loader::new(naive_node.clone(), loader_cfg.clone())?;
    let naive = scenario("naive", (0..opts.epochs).map(|e| run_epoch(&loader, e)).collect::<Result<_>>()?);
    drop(loader);
    drop(naive_node);

    // cold and warm: the daemon with throttled remote storage.
    let socket = work.path().join("node.sock");
    let config = work.path().join("node.toml");
    let ssd = work.path().join("ssd");
    let settings = DaemonSettings {
        socket: &socket,
        ssd_dir: Some(&ssd),
        // Room for every chunk twice (foyer reclaims whole blocks).
        ssd_bytes: (2 * converted_bytes).max(1 << 30),
        data_dir: &data,
        ram_bytes: opts.ram_bytes,
        prefetch_bytes: 256 << 20,
        loads: 4,
        convert_threads: 2,
        throttle: Some((opts.latency_ms, opts.bandwidth_bytes_per_s)),
    };
    std::fs::write(&config, settings.toml())?;
    say("cold: epoch 0 through the daemon, remote storage throttled");
    let daemon = NodeProcess::spawn(exe, &config, &socket, &work.path().join("node.log"), Duration::from_secs(60))
        .context("starting the node daemon")?;
    let source = Arc::new(granary_client::LocalSource::connect(&socket)?);
    let loader = Loader::new(source.clone(), loader_cfg)?;
    let cold = scenario("cold", vec![run_epoch(&loader, 0)?]);
    // Warm and ceiling epochs alternate, so drift in the machine's load hits
    // both alike.
    say("warm and ceiling: later epochs, alternating daemon and in-process memory");
    let mut ceiling_epochs = vec![run_epoch(&ceiling_loader, 0)?];
    let mut warm_epochs = Vec::new();
    for e in 1..opts.epochs.max(2) {
        warm_epochs.push(run_epoch(&loader, e)?);
        ceiling_epochs.push(run_epoch(&ceiling_loader, e)?);
    }
    let warm = scenario("warm", warm_epochs);
    let ceiling = scenario("ceiling", ceiling_epochs);
    drop(ceiling_loader);
    drop(memory);
    let stats = source.stats()?;
    let mem = proc_memory(daemon.pid())?;
    drop(loader);
    daemon.stop();

    let footprint = mem.rss_anon + mem.rss_file + stats.chunk_memory_bytes;
    let budget = opts.ram_bytes as f64 * 1.1 + (128u64 << 20) as f64;
    let bound_secs = report.bytes as f64 / opts.bandwidth_bytes_per_s as f64;
    let same = |a: &Scenario, b: &Scenario| {
        a.epochs.iter().all(|x| b.epochs.iter().find(|y| y.epoch == x.epoch).is_none_or(|y| y.digest == x.digest))
    };
    let daemon_epochs = Scenario {
        scenario: "daemon".into(),
        rows_per_s: 0.0,
        gb_per_s: 0.0,
        epochs: cold.epochs.iter().chain(&warm.epochs).cloned().collect(),
    };
    let summary = Summary {
        scenario: "summary",
        warm_vs_ceiling: ratio(warm.rows_per_s, ceiling.rows_per_s),
        warm_vs_naive: ratio(warm.rows_per_s, naive.rows_per_s),
        cold_vs_bound: ratio(cold.epochs[0].secs, bound_secs),
        remote_read_ratio: ratio(stats.remote_bytes as f64, report.bytes as f64),
        node_rss_over_budget: footprint as f64 / budget,
        node_footprint_bytes: footprint,
        node_memory: mem,
        node_chunk_memory_bytes: stats.chunk_memory_bytes,
        source_bytes: report.bytes,
        converted_bytes,
        streams_identical: same(&ceiling, &naive) && same(&ceiling, &daemon_epochs),
        opts: opts.clone(),
        conditions: Conditions::current(),
    };
    Ok((vec![ceiling, naive, cold, warm], summary))
}

/// A copy of `bytes` in a heap buffer whose whole 2 MiB extents are put in
/// transparent huge pages (`MADV_COLLAPSE`, Linux 6.1+, where the host
/// allows huge pages at all; elsewhere the advice is refused and the copy
/// stays in small pages). The node backs chunks with huge pages where the
/// host allows them for shared memory, so the in-RAM ceiling gets them too:
/// a ceiling in small pages pays TLB misses the warm path does not, and
/// would no longer bound it.
fn huge_page_copy(bytes: &[u8]) -> AlignedBuf {
    const HUGE: usize = 2 << 20;
    let mut buf = AlignedBuf::from_slice(bytes);
    let start = buf.as_mut_slice().as_mut_ptr() as usize;
    let (first, end) = (start.next_multiple_of(HUGE), (start + bytes.len()) / HUGE * HUGE);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if end > first {
        // SAFETY: advice only, on whole pages inside our own allocation;
        // collapsing keeps the bytes.
        unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_COLLAPSE) };
    }
    let _ = (first, end);
    buf
}
