//! `granary bench local`: the single-host data path against its baselines.
//!
//! Scenarios, all on one generated dataset, in one run:
//! - `copy`: the machine's ceiling. An epoch's batches assembled once in
//!   advance and held in RAM; an epoch only hands each to the consumer. No
//!   loader can feed the consumer faster.
//! - `ceiling`: every chunk already converted and held in this process
//!   ([`MemorySource`]); same plan, same batch assembly, same consumer:
//!   Granary's own assembly without the node.
//! - `assembly`: the ceiling's batches made by one assembly thread and
//!   consumed by nobody: what one core's gather of shuffled rows costs.
//! - `naive`: an embedded node with no cache and no prefetch: every epoch
//!   reads, decodes and converts every shard again (the failure mode).
//! - `cold`: epoch 0 through the node daemon and its Unix socket, with remote
//!   storage throttled to a fixed bandwidth and latency.
//! - `warm`: the following epochs through the same daemon (windowed shuffle).
//! - `blocks`: the same daemon, block shuffle ([`Shuffle::Blocks`]): batches
//!   that are one run of one chunk are views into chunk memory.
//!
//! With `jagged`, the dataset also has list and byte columns (`hist`,
//! `cats`, `blob`) served as jagged tensors, and one more scenario runs:
//! - `warm_fixed`: warm epochs through the same daemon of a fixed-width
//!   dataset (the generator's dense columns only) of the same converted
//!   size, so `warm_bytes_vs_fixed` compares the bytes/s of jagged and
//!   fixed-width batches measured side by side.
//!
//! `copy`, `ceiling`, `warm` and `blocks` epochs alternate, so drift in the
//! machine's load hits them alike, and all four consume a batch the same
//! way: every tensor copied into one staging buffer
//! ([`crate::consume::Staging`]). `naive` and `cold` checksum every batch
//! instead (they are bounded by decoding and the remote link); one more
//! checksummed epoch of `warm`, `blocks` and `ceiling` after the timed ones
//! proves that every path delivered the same bytes. The machine's memory
//! copy bandwidth (one thread, all threads) is measured in the same run.

use crate::consume::{Staging, memcpy_gbps};
use crate::report::{Conditions, gbps, median, ratio};
use anyhow::{Context, Result};
use granary_client::ChunkSource;
use granary_client::{Batch, Loader, LoaderConfig, MemorySource, PlanKind};
use granary_node::EmbeddedNode;
use granary_node::config::{DatasetConfig, NodeConfig, ViewRef};
use granary_proto::{AlignedBuf, Shuffle};
use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::{NodeProcess, proc_memory};
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
    /// Batches per permuted group of the `blocks` scenario.
    pub window_batches: u32,
    /// The loader's assembly threads (0: its default for this machine).
    pub assembly_threads: usize,
    /// Generate list and byte columns and serve them as jagged tensors;
    /// also measure warm epochs of a fixed-width dataset of the same size.
    pub jagged: bool,
    /// Canonical partitions of the `warm_global` and `blocks_global`
    /// scenarios: `warm` and `blocks` walking the global plan (global batch
    /// `batch_size`, one rank) instead of the rank plan.
    pub global_partitions: u32,
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
            window_batches: 16,
            assembly_threads: 0,
            jagged: false,
            global_partitions: 1,
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
    /// warm rows/s over copy rows/s: how close the daemon path comes to the
    /// fastest feed the consumer could have.
    pub warm_vs_copy: f64,
    /// blocks (block shuffle, views) rows/s over copy rows/s.
    pub blocks_vs_copy: f64,
    /// warm_global (the global plan) rows/s over warm (the rank plan)
    /// rows/s, alternating epochs of one run. Target: within noise of 1.
    pub warm_global_vs_warm: f64,
    /// blocks_global rows/s over blocks rows/s.
    pub blocks_global_vs_blocks: f64,
    /// Of the blocks_global scenario's batches, the share handed out as views.
    pub blocks_global_view_share: f64,
    /// warm rows/s over what this machine's cores can do when every row is
    /// gathered once by the loader and copied once by the consumer:
    /// `cores / (1 / assembly + 1 / copy)`, from the `assembly` (one thread,
    /// nothing consumed) and `copy` scenarios of the same run.
    pub warm_vs_cpu_bound: f64,
    /// That bound, rows/s.
    pub cpu_bound_rows_per_s: f64,
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
    pub node_memory: granary_testkit::harness::ProcMemory,
    /// Of which: bytes of chunk memory files the node held.
    pub node_chunk_memory_bytes: u64,
    /// Source (Parquet) bytes.
    pub source_bytes: u64,
    /// Converted bytes of the whole dataset.
    pub converted_bytes: u64,
    /// Whether every scenario delivered byte-identical batch streams.
    pub streams_identical: bool,
    /// Of the blocks scenario's batches, the share handed out as views.
    pub blocks_view_share: f64,
    /// The copy scenario's bytes per second over one thread's `memcpy`.
    pub copy_vs_memcpy: f64,
    /// The machine's memory copy bandwidth, one thread, GB/s.
    pub memcpy_1t_gbps: f64,
    /// The machine's memory copy bandwidth, all threads, GB/s.
    pub memcpy_all_gbps: f64,
    /// Threads of `memcpy_all_gbps`.
    pub memcpy_threads: usize,
    /// The loader's assembly threads in this run.
    pub assembly_threads: usize,
    /// With `jagged`: warm jagged bytes/s over warm fixed-width bytes/s
    /// (`warm_fixed`), the same daemon, datasets of the same converted
    /// size. Target >= 0.8.
    pub warm_bytes_vs_fixed: Option<f64>,
    /// Options of the run.
    pub opts: LocalOpts,
    /// Commit, cores, profile.
    pub conditions: Conditions,
}

/// How an epoch consumes its batches.
pub enum Consume<'a> {
    /// Checksum every batch (the epoch's digest proves which bytes came).
    Checksum,
    /// Copy every batch into a staging buffer, as a trainer would.
    Copy(&'a mut Staging),
    /// Nothing: measures how fast batches are made.
    Drop,
}

/// Runs one epoch, consuming every batch.
pub fn run_epoch(loader: &Loader, epoch: u64, consume: Consume<'_>) -> Result<EpochMeasure> {
    consume_epoch(epoch, loader.epoch(epoch)?.map(|b| b.map_err(anyhow::Error::from)), consume)
}

/// Consumes one epoch of batches, timing it.
fn consume_epoch<B: std::borrow::Borrow<Batch>>(
    epoch: u64,
    batches: impl Iterator<Item = Result<B>>,
    mut consume: Consume<'_>,
) -> Result<EpochMeasure> {
    let start = Instant::now();
    let mut rows = 0u64;
    let mut bytes = 0u64;
    let mut digest = xxhash_rust::xxh3::Xxh3::new();
    for batch in batches {
        let batch = batch?;
        let batch = batch.borrow();
        rows += batch.rows() as u64;
        match &mut consume {
            Consume::Checksum => {
                bytes += batch.byte_len() as u64;
                digest.update(&batch.checksum().to_le_bytes());
            }
            Consume::Copy(staging) => bytes += staging.consume(batch),
            Consume::Drop => bytes += batch.byte_len() as u64,
        }
    }
    Ok(EpochMeasure { epoch, rows, bytes, secs: start.elapsed().as_secs_f64(), digest: digest.digest() })
}

/// A scenario's rate is the median over its epochs: epochs are short and
/// the machine is shared, so one descheduled epoch must not decide it.
pub(crate) fn scenario(name: &str, epochs: Vec<EpochMeasure>) -> Scenario {
    let rows_per_s = median(&epochs.iter().map(|e| ratio(e.rows as f64, e.secs)).collect::<Vec<_>>());
    let gb_per_s = median(&epochs.iter().map(|e| gbps(e.bytes, e.secs)).collect::<Vec<_>>());
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
    /// The view has the generator's jagged tensors too
    /// ([`datagen::view_toml`]).
    pub jagged: bool,
    /// Also serve the generated (fixed-width) dataset in this folder, as
    /// `fixed`.
    pub fixed_dir: Option<&'a Path>,
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
        s += &datagen::view_toml(self.jagged).replace("[[tensor]]", "[[dataset.view.tensor]]");
        if let Some(fixed) = self.fixed_dir {
            s += &format!(
                "\n[[dataset]]\nname = \"fixed\"\nsource = \"file://{}\"\n\n[dataset.view]\n",
                fixed.display()
            );
            s += &datagen::VIEW_TOML.replace("[[tensor]]", "[[dataset.view.tensor]]");
        }
        s
    }
}

fn embedded_config(data_dir: &Path, ram_bytes: u64, prefetch_bytes: u64, jagged: bool) -> Result<NodeConfig> {
    let view = toml::from_str::<granary_proto::View>(&datagen::view_toml(jagged))?.validated()?;
    Ok(NodeConfig {
        datasets: vec![DatasetConfig {
            name: "ads".into(),
            source: format!("file://{}", data_dir.display()),
            view: ViewRef::Inline(view),
        }],
        ram_bytes,
        prefetch_bytes,
        ..NodeConfig::default()
    })
}

/// Bytes a converted row of the generator's fixed-width view takes (150 +
/// 32 f32, 2 i64, 1 f32).
pub(crate) const FIXED_ROW_BYTES: u64 = 748;

/// Generates the benchmark's dataset under `work/data`.
pub(crate) fn generate(
    work: &Path,
    opts: &LocalOpts,
    say: &mut impl FnMut(&str),
) -> Result<(std::path::PathBuf, datagen::GenReport)> {
    let data = work.join("data");
    say(&format!("generating {} rows", opts.rows));
    let spec = GenSpec {
        seed: 7,
        rows: opts.rows,
        files: opts.files,
        row_group_rows: opts.row_group_rows,
        compression: opts.compression.clone(),
        values: opts.values,
        jagged: opts.jagged,
    };
    let report = datagen::generate(&data, &spec, |_| {})?;
    Ok((data, report))
}

/// Starts the benchmark's node daemon over `data` with throttled remote
/// storage; returns it and its socket.
pub(crate) fn start_daemon(
    exe: &Path,
    work: &Path,
    data: &Path,
    opts: &LocalOpts,
    converted_bytes: u64,
    fixed: Option<(&Path, u64)>,
) -> Result<(NodeProcess, std::path::PathBuf)> {
    let socket = work.join("node.sock");
    let config = work.join("node.toml");
    let ssd = work.join("ssd");
    let settings = DaemonSettings {
        socket: &socket,
        ssd_dir: Some(&ssd),
        // Room for every chunk twice (foyer reclaims whole blocks).
        ssd_bytes: (2 * converted_bytes).max(1 << 30),
        data_dir: data,
        // The fixed-width dataset's chunks on top of the RAM tier asked for.
        ram_bytes: opts.ram_bytes + fixed.map_or(0, |(_, bytes)| bytes),
        prefetch_bytes: 256 << 20,
        loads: 4,
        convert_threads: 2,
        throttle: Some((opts.latency_ms, opts.bandwidth_bytes_per_s)),
        jagged: opts.jagged,
        fixed_dir: fixed.map(|(dir, _)| dir),
    };
    std::fs::write(&config, settings.toml())?;
    let daemon = NodeProcess::spawn(exe, &config, &socket, &work.join("node.log"), Duration::from_secs(60))
        .context("starting the node daemon")?;
    Ok((daemon, socket))
}

/// Runs every scenario; `say` receives one line per step for progress.
pub fn run(exe: &Path, opts: &LocalOpts, mut say: impl FnMut(&str)) -> Result<(Vec<Scenario>, Summary)> {
    let work = tempfile::tempdir()?;
    let (data, report) = generate(work.path(), opts, &mut say)?;
    let loader_cfg = LoaderConfig {
        seed: 1,
        shuffle: Shuffle::Windowed { window_shards: opts.window_shards },
        assembly_threads: opts.assembly_threads,
        ..LoaderConfig::new("ads", opts.batch_size)
    };
    let blocks_cfg =
        LoaderConfig { shuffle: Shuffle::Blocks { window_batches: opts.window_batches }, ..loader_cfg.clone() };
    let global = PlanKind::Global { global_batch: opts.batch_size, partitions: opts.global_partitions };
    let global_cfg = LoaderConfig { plan: global, ..loader_cfg.clone() };
    let blocks_global_cfg = LoaderConfig { plan: global, ..blocks_cfg.clone() };

    say("memory copy bandwidth: one thread, then all");
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let memcpy_1t = memcpy_gbps(1, 256 << 20, 5);
    let memcpy_all = memcpy_gbps(threads, 256 << 20, 5);

    // ceiling: convert everything once, hold it in this process.
    say("ceiling: converting the whole dataset into memory");
    let embedded = EmbeddedNode::start(&embedded_config(&data, 8 << 30, 0, opts.jagged)?, 2)?;
    let info = embedded.describe("ads", None)?;
    let mut chunks = Vec::new();
    for s in &info.shards {
        let c = embedded.fetch(info.version, s.shard)?;
        chunks.push((s.shard, huge_page_copy(c.bytes())));
    }
    drop(embedded);
    let memory = Arc::new(MemorySource::new(info.clone(), chunks)?);
    let converted_bytes = memory.bytes_held() as u64;
    // With jagged tensors: a fixed-width dataset of the same converted size
    // (748 bytes a row), served beside it.
    let fixed = if opts.jagged {
        let rows = (converted_bytes / FIXED_ROW_BYTES).div_ceil(opts.row_group_rows).max(1) * opts.row_group_rows;
        say(&format!("warm_fixed: generating {rows} fixed-width rows of the same converted size"));
        let spec = GenSpec {
            seed: 8,
            rows,
            files: opts.files,
            row_group_rows: opts.row_group_rows,
            compression: opts.compression.clone(),
            values: opts.values,
            jagged: false,
        };
        let dir = work.path().join("fixed");
        datagen::generate(&dir, &spec, |_| {})?;
        Some((dir, rows * FIXED_ROW_BYTES))
    } else {
        None
    };
    let ceiling_cfg = loader_cfg.clone();
    let ceiling_loader = Loader::new(memory.clone(), ceiling_cfg.clone())?;
    let mut staging = Staging::new(
        info.tensors.iter().map(|t| (t.row_bytes() * opts.batch_size as usize).next_multiple_of(64)).sum(),
    );

    // copy: one epoch's batches, assembled in advance (buffers of their own).
    say("copy: assembling one epoch in advance");
    let assembled: Vec<Batch> = Loader::new(memory.clone(), loader_cfg.clone())?.epoch(1)?.collect::<Result<_, _>>()?;
    // naive: no cache, no prefetch; every epoch decodes and converts again.
    say("naive: decode and convert every epoch");
    let naive_node = Arc::new(EmbeddedNode::start(&embedded_config(&data, 0, 0, opts.jagged)?, 2)?);
    let loader = Loader::new(naive_node.clone(), loader_cfg.clone())?;
    let naive =
        scenario("naive", (0..opts.epochs).map(|e| run_epoch(&loader, e, Consume::Checksum)).collect::<Result<_>>()?);
    drop(loader);
    drop(naive_node);

    // cold and warm: the daemon with throttled remote storage.
    say("cold: epoch 0 through the daemon, remote storage throttled");
    let (daemon, socket) =
        start_daemon(exe, work.path(), &data, opts, converted_bytes, fixed.as_ref().map(|(d, b)| (d.as_path(), *b)))?;
    // Room to keep every chunk mapped (what a trainer sets through
    // `LoaderConfig::mapping_cache_bytes` for a dataset its host holds).
    let mapping_cache = (converted_bytes + (64 << 20)).max(granary_client::local::DEFAULT_MAPPING_CACHE_BYTES);
    let source = Arc::new(granary_client::LocalSource::connect(&socket)?.mapping_cache(mapping_cache));
    let loader = Loader::new(source.clone(), loader_cfg.clone())?;
    let blocks_loader = Loader::new(source.clone(), blocks_cfg.clone())?;
    let global_loader = Loader::new(source.clone(), global_cfg.clone())?;
    let blocks_global_loader = Loader::new(source.clone(), blocks_global_cfg.clone())?;
    let cold = scenario("cold", vec![run_epoch(&loader, 0, Consume::Checksum)?]);
    let remote_after_cold = source.stats()?.remote_bytes;
    // The fixed-width dataset's first epoch converts it: untimed, and its
    // remote reads are not the jagged dataset's.
    let fixed_loader = match &fixed {
        Some(_) => {
            say("warm_fixed: converting the fixed-width dataset (untimed)");
            let l = Loader::new(source.clone(), LoaderConfig { dataset: "fixed".into(), ..loader_cfg.clone() })?;
            run_epoch(&l, 0, Consume::Drop)?;
            Some(l)
        }
        None => None,
    };
    let fixed_remote = source.stats()?.remote_bytes - remote_after_cold;
    let mut fixed_epochs = Vec::new();
    // Copy, ceiling, warm and blocks epochs alternate, so drift in the
    // machine's load hits all alike.
    say("copy, ceiling, warm and blocks: later epochs, alternating");
    let (mut copy_epochs, mut ceiling_epochs, mut warm_epochs, mut blocks_epochs, mut assembly_epochs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut warm_global_epochs, mut blocks_global_epochs) = (Vec::new(), Vec::new());
    // assembly: the ceiling's batches made by one thread, consumed by none.
    let assembly_loader = Loader::new(memory.clone(), LoaderConfig { assembly_threads: 1, ..ceiling_cfg.clone() })?;
    // The blocks loader's first epoch fills its mapping cache: untimed (and
    // the global plan's loaders', as warm's was by the cold epoch).
    run_epoch(&blocks_loader, 0, Consume::Copy(&mut staging))?;
    run_epoch(&global_loader, 0, Consume::Copy(&mut staging))?;
    run_epoch(&blocks_global_loader, 0, Consume::Copy(&mut staging))?;
    for e in 1..opts.epochs.max(2) {
        copy_epochs.push(consume_epoch(e, assembled.iter().map(Ok), Consume::Copy(&mut staging))?);
        ceiling_epochs.push(run_epoch(&ceiling_loader, e, Consume::Copy(&mut staging))?);
        warm_epochs.push(run_epoch(&loader, e, Consume::Copy(&mut staging))?);
        blocks_epochs.push(run_epoch(&blocks_loader, e, Consume::Copy(&mut staging))?);
        warm_global_epochs.push(run_epoch(&global_loader, e, Consume::Copy(&mut staging))?);
        blocks_global_epochs.push(run_epoch(&blocks_global_loader, e, Consume::Copy(&mut staging))?);
        assembly_epochs.push(run_epoch(&assembly_loader, e, Consume::Drop)?);
        if let Some(l) = &fixed_loader {
            fixed_epochs.push(run_epoch(l, e, Consume::Copy(&mut staging))?);
        }
    }
    drop(fixed_loader);
    drop(assembly_loader);
    drop(assembled);
    let copy = scenario("copy", copy_epochs);
    let ceiling = scenario("ceiling", ceiling_epochs);
    let warm = scenario("warm", warm_epochs);
    let blocks = scenario("blocks", blocks_epochs);
    let warm_global = scenario("warm_global", warm_global_epochs);
    let blocks_global = scenario("blocks_global", blocks_global_epochs);
    let assembly = scenario("assembly", assembly_epochs);
    let warm_fixed = fixed.as_ref().map(|_| scenario("warm_fixed", fixed_epochs));

    // Which bytes came: one checksummed epoch of each path after the timed
    // ones, against the in-process ceiling and the naive node.
    say("checking every path delivered the same bytes");
    let check = 1;
    let warm_digest = run_epoch(&loader, check, Consume::Checksum)?.digest;
    let ceiling_digest = run_epoch(&ceiling_loader, check, Consume::Checksum)?.digest;
    let blocks_digest = run_epoch(&blocks_loader, check, Consume::Checksum)?.digest;
    let blocks_memory = Loader::new(memory.clone(), blocks_cfg.clone())?;
    let blocks_memory_digest = run_epoch(&blocks_memory, check, Consume::Checksum)?.digest;
    let global_digest = run_epoch(&global_loader, check, Consume::Checksum)?.digest;
    let global_memory_digest =
        run_epoch(&Loader::new(memory.clone(), global_cfg.clone())?, check, Consume::Checksum)?.digest;
    let view_share = |l: &Loader| -> Result<f64> {
        let (mut views, mut batches) = (0u64, 0u64);
        for b in l.epoch(check)? {
            views += u64::from(b?.is_view());
            batches += 1;
        }
        Ok(ratio(views as f64, batches as f64))
    };
    let blocks_view_share = view_share(&blocks_loader)?;
    let blocks_global_view_share = view_share(&blocks_global_loader)?;
    drop((global_loader, blocks_global_loader));
    drop(blocks_memory);
    drop(ceiling_loader);
    drop(memory);
    let stats = source.stats()?;
    let mem = proc_memory(daemon.pid())?;
    drop(blocks_loader);
    drop(loader);
    daemon.stop();

    let footprint = mem.rss_anon + mem.rss_file + stats.chunk_memory_bytes;
    let ram = opts.ram_bytes + fixed.as_ref().map_or(0, |(_, bytes)| *bytes);
    let budget = ram as f64 * 1.1 + (128u64 << 20) as f64;
    let bound_secs = report.bytes as f64 / opts.bandwidth_bytes_per_s as f64;
    let naive_digest = |e: u64| naive.epochs.iter().find(|x| x.epoch == e).map(|x| x.digest);
    let streams_identical = naive_digest(0) == Some(cold.epochs[0].digest)
        && naive_digest(check).is_none_or(|d| d == warm_digest)
        && warm_digest == ceiling_digest
        && blocks_digest == blocks_memory_digest
        && global_digest == global_memory_digest;
    let cpu_bound = ratio(threads as f64, ratio(1.0, assembly.rows_per_s) + ratio(1.0, copy.rows_per_s));
    let summary = Summary {
        scenario: "summary",
        warm_vs_copy: ratio(warm.rows_per_s, copy.rows_per_s),
        blocks_vs_copy: ratio(blocks.rows_per_s, copy.rows_per_s),
        warm_global_vs_warm: ratio(warm_global.rows_per_s, warm.rows_per_s),
        blocks_global_vs_blocks: ratio(blocks_global.rows_per_s, blocks.rows_per_s),
        blocks_global_view_share,
        warm_vs_cpu_bound: ratio(warm.rows_per_s, cpu_bound),
        cpu_bound_rows_per_s: cpu_bound,
        warm_vs_ceiling: ratio(warm.rows_per_s, ceiling.rows_per_s),
        warm_vs_naive: ratio(warm.rows_per_s, naive.rows_per_s),
        cold_vs_bound: ratio(cold.epochs[0].secs, bound_secs),
        remote_read_ratio: ratio((stats.remote_bytes - fixed_remote) as f64, report.bytes as f64),
        node_rss_over_budget: footprint as f64 / budget,
        node_footprint_bytes: footprint,
        node_memory: mem,
        node_chunk_memory_bytes: stats.chunk_memory_bytes,
        source_bytes: report.bytes,
        converted_bytes,
        streams_identical,
        blocks_view_share,
        copy_vs_memcpy: ratio(copy.gb_per_s, memcpy_1t),
        memcpy_1t_gbps: memcpy_1t,
        memcpy_all_gbps: memcpy_all,
        memcpy_threads: threads,
        assembly_threads: blocks_cfg.threads(),
        warm_bytes_vs_fixed: warm_fixed.as_ref().map(|f| ratio(warm.gb_per_s, f.gb_per_s)),
        opts: opts.clone(),
        conditions: Conditions::current(),
    };
    let mut scenarios = vec![copy, assembly, ceiling, naive, cold, warm, blocks, warm_global, blocks_global];
    scenarios.extend(warm_fixed);
    Ok((scenarios, summary))
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
