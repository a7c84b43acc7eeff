//! `granary`: one binary for every role.
//!
//! - `granary demo` — the main job on an embedded local default.
//! - `granary node --config node.toml` — the node daemon.
//! - `granary dataset gen` — write the synthetic dataset.
//! - `granary bench local` — the single-host scenario benchmark.
//! - `granary bench placement` — the placement function at cluster scale.
//! - `granary bench failover` — leader kills in a coordinator group of real processes.
//! - `granary stats --socket PATH` — a node's counters.
//! - `granary coordinator --id N --listen ADDR --peers ... --data-dir DIR` — a coordinator voter.
//! - `granary certs init --out DIR` — the cluster CA and role certificates.
//! - `granary dataset add|ls|show|placement` — datasets registered with the coordinators.
//! - `granary status` — leader, voters, nodes with leases, placement epoch.
//! - `granary trainer ...` — one trainer rank (used by the demo).

mod cluster;
mod demo;
mod demo_cluster;
mod trainer;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "granary", version, about = "A distributed cache fabric that keeps GPUs fed")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole single-host path on a generated dataset and report.
    Demo(demo::DemoArgs),
    /// Run a coordinator voter.
    Coordinator(cluster::CoordinatorArgs),
    /// Cluster certificates.
    #[command(subcommand)]
    Certs(cluster::CertsCommand),
    /// Leader, term, voters, nodes with leases, placement epoch and shards per node.
    Status(cluster::ConnectArgs),
    /// Run a node daemon.
    Node {
        /// Path of node.toml.
        #[arg(long)]
        config: PathBuf,
    },
    /// Dataset tools.
    #[command(subcommand)]
    Dataset(DatasetCommand),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Print a node's counters.
    Stats {
        /// The node's socket.
        #[arg(long)]
        socket: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// One trainer rank, driven over stdin/stdout (used by the demo).
    #[command(hide = true)]
    Trainer(trainer::TrainerArgs),
}

#[derive(Subcommand)]
enum DatasetCommand {
    /// Write the synthetic recommendation dataset.
    Gen(GenArgs),
    #[command(flatten)]
    Cluster(cluster::ClusterDatasetCommand),
}

#[derive(Args)]
struct GenArgs {
    /// Output folder.
    #[arg(long)]
    out: PathBuf,
    /// Total rows.
    #[arg(long, default_value_t = 100_000)]
    rows: u64,
    /// Number of files.
    #[arg(long, default_value_t = 4)]
    files: u32,
    /// Rows per row group.
    #[arg(long, default_value_t = 10_000)]
    row_group_rows: u64,
    /// none, snappy, zstd, lz4 or gzip.
    #[arg(long, default_value = "snappy")]
    compression: String,
    /// Feature values: uniform (random floats, plain encoding) or mixed
    /// (continuous, count-like and bucketised features, dictionary-encoded).
    #[arg(long, default_value = "uniform")]
    values: granary_node::datagen::Values,
    /// Seed of every value.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// ceiling, naive, warm and cold on one host.
    Local(LocalArgs),
    /// Place shards over nodes, remove one node, add one: balance, speed
    /// and movement of the placement function.
    Placement {
        /// Shards to place.
        #[arg(long, default_value_t = 1_000_000)]
        shards: usize,
        /// Nodes of equal weight.
        #[arg(long, default_value_t = 10_000)]
        nodes: usize,
        /// Print one JSON line.
        #[arg(long)]
        json: bool,
    },
    /// 1, 2 and 4 node daemons with a coordinator (processes on loopback):
    /// remote reads, the cold epoch against its bound, warm rows/s per rank,
    /// and peer chunk transfer against bare QUIC and kernel TCP.
    Cluster(ClusterArgs),
    /// Serve bare quinn streams for `bench cluster`'s transfer scenario
    /// (prints the address, serves until stdin closes).
    #[command(hide = true)]
    QuicServe {
        /// The cluster's certificate folder (the `node` identity is used).
        #[arg(long)]
        certs: std::path::PathBuf,
        /// Largest answer, bytes.
        #[arg(long)]
        bytes: u64,
    },
    /// Kill the leader of a coordinator group (real processes) again and
    /// again: time to a new leader and to a committed write; no
    /// acknowledged write lost after a full restart.
    Failover {
        /// Voters (3 or 5).
        #[arg(long, default_value_t = 3)]
        voters: u64,
        /// Leader kills.
        #[arg(long, default_value_t = 5)]
        rounds: u32,
        /// Election timeout lower bound (the upper bound is 1.25 times it).
        #[arg(long, default_value_t = 500)]
        election_timeout_ms: u64,
        /// Leader heartbeat interval.
        #[arg(long, default_value_t = 100)]
        heartbeat_ms: u64,
        /// JSON lines: one per round, the summary last.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct LocalArgs {
    /// Rows in the generated dataset.
    #[arg(long, default_value_t = 500_000)]
    rows: u64,
    /// Rows per row group.
    #[arg(long, default_value_t = 10_000)]
    row_group_rows: u64,
    /// Rows per batch.
    #[arg(long, default_value_t = 1024)]
    batch_size: u32,
    /// Epochs per scenario (the daemon's first epoch is the cold one).
    #[arg(long, default_value_t = 9)]
    epochs: u64,
    /// Parquet compression: none, snappy, zstd, lz4, gzip.
    #[arg(long, default_value = "snappy")]
    compression: String,
    /// Feature values of the generated dataset: uniform or mixed (see
    /// `granary dataset gen --help`).
    #[arg(long, default_value = "uniform")]
    values: granary_node::datagen::Values,
    /// Simulated remote latency per request, ms.
    #[arg(long, default_value_t = 20)]
    latency_ms: u64,
    /// Simulated remote bandwidth, MiB/s.
    #[arg(long, default_value_t = 200)]
    bandwidth_mib: u64,
    /// RAM tier of the daemon, MiB.
    #[arg(long, default_value_t = 1024)]
    ram_mib: u64,
    /// Batches per permuted group of the block-shuffle scenario.
    #[arg(long, default_value_t = 16)]
    window_batches: u32,
    /// The loader's batch assembly threads (0: its default for this machine).
    #[arg(long, default_value_t = 0)]
    assembly_threads: usize,
    /// Trainer processes: 1 runs every scenario in this process; more runs
    /// copy, warm and block-shuffle ranks as processes on one daemon.
    #[arg(long, default_value_t = 1)]
    ranks: u32,
    /// One JSON object per scenario, then a summary line.
    #[arg(long)]
    json: bool,
}

fn main() -> Result<()> {
    // object_store's HTTP client needs a process-wide TLS provider (ring).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    // The daemon logs its lifecycle; interactive commands only problems.
    let default = if matches!(cli.command, Command::Node { .. } | Command::Coordinator(_)) {
        "info,openraft=warn"
    } else {
        "warn,foyer=error"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("GRANARY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only on a terminal: daemons usually log to files.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();
    match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Node { config } => run_node(&config),
        Command::Dataset(DatasetCommand::Gen(a)) => generate(a),
        Command::Dataset(DatasetCommand::Cluster(c)) => cluster::dataset(c),
        Command::Coordinator(a) => cluster::run_coordinator(a),
        Command::Certs(c) => cluster::certs(c),
        Command::Status(c) => cluster::status(c),
        Command::Bench(BenchCommand::Local(a)) => bench_local(a),
        Command::Bench(BenchCommand::Placement { shards, nodes, json }) => bench_placement(shards, nodes, json),
        Command::Bench(BenchCommand::Cluster(a)) => bench_cluster(a),
        Command::Bench(BenchCommand::QuicServe { certs, bytes }) => {
            granary_bench::cluster::serve_raw_quic(&certs, bytes)
        }
        Command::Bench(BenchCommand::Failover { voters, rounds, election_timeout_ms, heartbeat_ms, json }) => {
            let opts = granary_bench::failover::FailoverOpts { voters, rounds, election_timeout_ms, heartbeat_ms };
            bench_failover(&opts, json)
        }
        Command::Stats { socket, json } => stats(&socket, json),
        Command::Trainer(a) => trainer::run(a),
    }
}

/// Caps glibc's malloc arenas for the daemon. Its many short-lived decode
/// buffers, allocated and freed on different runtime threads, otherwise
/// spread over one arena per thread that each keep their freed memory:
/// measured with a 128 MiB RAM tier, the daemon's anonymous memory went from
/// ~150 MiB to ~95 MiB with two arenas (docs/BENCHMARKS.md).
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; it is called before the
    // runtime starts any thread, and M_ARENA_MAX takes any positive value.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn run_node(config: &std::path::Path) -> Result<()> {
    limit_malloc_arenas();
    let cfg = granary_node::NodeConfig::load(config)?;
    let socket = cfg.socket.clone().unwrap_or_else(granary_node::daemon::default_socket);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let node = granary_node::Node::start(&cfg).await?;
        let membership = match &cfg.cluster {
            Some(c) => {
                let ssd = if cfg.ssd_dir.is_some() { cfg.ssd_bytes } else { 0 };
                Some(granary_node::peer::ClusterHandle::start(&node, c, cfg.ram_bytes, ssd)?)
            }
            None => None,
        };
        let shutdown = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
        };
        granary_node::daemon::serve(node.clone(), &socket, shutdown).await.with_context(|| format!("serving {}", socket.display()))?;
        if let Some(m) = membership {
            m.stop();
        }
        node.close().await;
        tracing::info!("node stopped");
        Ok(())
    })
}

fn generate(a: GenArgs) -> Result<()> {
    let spec = granary_node::datagen::GenSpec {
        seed: a.seed,
        rows: a.rows,
        files: a.files,
        row_group_rows: a.row_group_rows,
        compression: a.compression,
        values: a.values,
    };
    let bar = indicatif::ProgressBar::new(a.rows);
    if a.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let report = granary_node::datagen::generate(&a.out, &spec, |n| bar.set_position(n))?;
    bar.finish_and_clear();
    let view_path = a.out.join("view.toml");
    std::fs::write(&view_path, granary_node::datagen::VIEW_TOML)?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"files": report.files, "rows": report.rows, "bytes": report.bytes, "view": view_path})
        );
    } else {
        println!(
            "wrote {} rows in {} files ({:.1} MB) to {}; view: {}",
            report.rows,
            report.files.len(),
            report.bytes as f64 / 1e6,
            a.out.display(),
            view_path.display()
        );
    }
    Ok(())
}

/// Options of `granary bench cluster`.
#[derive(clap::Args)]
struct ClusterArgs {
    /// Rows in the generated dataset.
    #[arg(long, default_value_t = 400_000)]
    rows: u64,
    /// Rows per row group (one shard).
    #[arg(long, default_value_t = 10_000)]
    row_group_rows: u64,
    /// Epochs per cluster (the first is cold).
    #[arg(long, default_value_t = 3)]
    epochs: u64,
    /// Cluster sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    nodes: Vec<u32>,
    /// Trainer ranks per node.
    #[arg(long, default_value_t = 1)]
    ranks_per_node: u32,
    /// Remote bandwidth of each node's link, MiB/s.
    #[arg(long, default_value_t = 25)]
    bandwidth_mib: u64,
    /// Remote latency per request, ms.
    #[arg(long, default_value_t = 20)]
    latency_ms: u64,
    /// Rounds over the chunks in the transfer scenario (the three ways take
    /// turns; medians are reported).
    #[arg(long, default_value_t = 5)]
    transfer_rounds: u32,
    /// Keep the dataset, node configs and logs in this (new or empty)
    /// folder instead of a temporary one.
    #[arg(long)]
    keep_dir: Option<PathBuf>,
    /// JSON lines: one per scenario, the summary last.
    #[arg(long)]
    json: bool,
}

fn bench_cluster(a: ClusterArgs) -> Result<()> {
    let opts = granary_bench::cluster::ClusterOpts {
        rows: a.rows,
        row_group_rows: a.row_group_rows,
        epochs: a.epochs.max(2),
        node_counts: a.nodes,
        ranks_per_node: a.ranks_per_node.max(1),
        bandwidth_bytes_per_s: a.bandwidth_mib << 20,
        latency_ms: a.latency_ms,
        transfer_rounds: a.transfer_rounds.max(1),
        keep_dir: a.keep_dir,
        ..Default::default()
    };
    let exe = std::env::current_exe()?;
    let json = a.json;
    let r = granary_bench::cluster::run(&exe, &opts, |line| {
        if !json {
            eprintln!("· {line}");
        }
    })?;
    if json {
        for s in &r.nodes {
            println!("{}", serde_json::to_string(s)?);
        }
        println!("{}", serde_json::to_string(&r.transfer)?);
        println!("{}", serde_json::to_string(&r.summary)?);
        return Ok(());
    }
    println!(
        "{:<24} {:>5} {:>5} {:>22} {:>10} {:>13} {:>11} {:>10}",
        "scenario", "nodes", "ranks", "epoch s", "cold/bound", "warm rows/s/r", "remote/data", "peer MB"
    );
    for s in &r.nodes {
        let secs: Vec<String> = s.epoch_secs.iter().map(|x| format!("{x:.2}")).collect();
        println!(
            "{:<24} {:>5} {:>5} {:>22} {:>10.3} {:>13.0} {:>11.4} {:>10.1}",
            s.scenario,
            s.nodes,
            s.ranks,
            secs.join(" "),
            s.cold_vs_bound,
            s.warm_rows_per_s_per_rank,
            s.remote_read_ratio,
            s.peer_bytes as f64 / 1e6
        );
    }
    let t = &r.transfer;
    println!(
        "transfer ({} rounds of {} chunks, {:.0} MB, {} at once; medians): peer {:.0} MB/s, bare quinn {:.0} MB/s \
         (server in this process: {:.0}), kernel TCP {:.0} MB/s",
        t.rounds,
        t.chunks,
        t.bytes as f64 / 1e6,
        t.concurrency,
        t.peer_mb_s,
        t.quic_raw_mb_s,
        t.quic_raw_in_process_mb_s,
        t.tcp_raw_mb_s
    );
    let s = &r.summary;
    println!();
    println!("with {} nodes:", s.nodes);
    println!("remote read ratio    {:.4}  (target <= 1.01)", s.remote_read_ratio);
    println!("cold / bound         {:.3}   (target <= 1.25)", s.cold_vs_bound);
    println!("peer / bare quinn    {:.3}   (target >= 0.8)", s.peer_vs_quic_raw);
    println!("peer / kernel TCP    {:.3}", s.peer_vs_tcp_raw);
    println!("warm / single node   {:.3}   (target >= 0.9; one node serving as many ranks)", s.warm_vs_single_node);
    println!(
        "conditions: commit {} · {} cores · {} build · {} rows · {:.1} MB Parquet · {} MiB/s per node",
        s.conditions.commit,
        s.conditions.cores,
        s.conditions.profile,
        opts.rows,
        s.source_bytes as f64 / 1e6,
        s.bandwidth_bytes_per_s >> 20
    );
    Ok(())
}

fn bench_local(a: LocalArgs) -> Result<()> {
    let opts = granary_bench::local::LocalOpts {
        rows: a.rows,
        row_group_rows: a.row_group_rows,
        batch_size: a.batch_size,
        epochs: a.epochs.max(2),
        latency_ms: a.latency_ms,
        bandwidth_bytes_per_s: a.bandwidth_mib << 20,
        ram_bytes: a.ram_mib << 20,
        compression: a.compression,
        values: a.values,
        window_batches: a.window_batches,
        assembly_threads: a.assembly_threads,
        ..Default::default()
    };
    let exe = std::env::current_exe()?;
    let json = a.json;
    if a.ranks > 1 {
        let s = granary_bench::local_ranks::run(&exe, &opts, a.ranks, |line| {
            if !json {
                eprintln!("· {line}");
            }
        })?;
        if json {
            println!("{}", serde_json::to_string(&s)?);
            return Ok(());
        }
        println!("{:<8} {:>12}   ({} trainer processes, one node daemon)", "scenario", "rows/s", s.ranks);
        for (name, r) in [("copy", s.copy_rows_per_s), ("warm", s.warm_rows_per_s), ("blocks", s.blocks_rows_per_s)] {
            println!("{name:<8} {r:>12.0}");
        }
        println!();
        println!("warm / copy          {:.3}   (target >= 0.85)", s.warm_vs_copy);
        println!("blocks / copy        {:.3}   (target >= 0.95)", s.blocks_vs_copy);
        println!("cold epoch           {:.2} s", s.cold_secs);
        println!(
            "conditions: commit {} · {} cores · {} build · {} rows · batch {}",
            s.conditions.commit, s.conditions.cores, s.conditions.profile, opts.rows, opts.batch_size
        );
        return Ok(());
    }
    let (scenarios, summary) = granary_bench::local::run(&exe, &opts, |line| {
        if !json {
            eprintln!("· {line}");
        }
    })?;
    if json {
        for s in &scenarios {
            println!("{}", serde_json::to_string(s)?);
        }
        println!("{}", serde_json::to_string(&summary)?);
        return Ok(());
    }
    println!("{:<8} {:>12} {:>8} {:>10}", "scenario", "rows/s", "GB/s", "epochs");
    for s in &scenarios {
        println!("{:<8} {:>12.0} {:>8.2} {:>10}", s.scenario, s.rows_per_s, s.gb_per_s, s.epochs.len());
    }
    println!();
    println!("warm / copy          {:.3}   (target >= 0.85)", summary.warm_vs_copy);
    println!(
        "blocks / copy        {:.3}   (target >= 0.95; {:.0}% of its batches were views)",
        summary.blocks_vs_copy,
        100.0 * summary.blocks_view_share
    );
    println!(
        "warm / cpu bound     {:.3}   ({:.0} rows/s: {} cores gathering every row once and copying it once)",
        summary.warm_vs_cpu_bound, summary.cpu_bound_rows_per_s, summary.conditions.cores
    );
    println!("warm / ceiling       {:.3}   (target >= 0.9)", summary.warm_vs_ceiling);
    println!("warm / naive         {:.1}   (target >= 15)", summary.warm_vs_naive);
    println!("cold / bound         {:.3}   (target <= 1.25)", summary.cold_vs_bound);
    println!("remote read ratio    {:.4}  (target <= 1.01)", summary.remote_read_ratio);
    println!("node memory / budget {:.3}   (target <= 1)", summary.node_rss_over_budget);
    println!("streams identical    {}", summary.streams_identical);
    println!(
        "memory copy          {:.2} GB/s one thread, {:.2} GB/s {} threads; copy scenario / one thread {:.3}",
        summary.memcpy_1t_gbps, summary.memcpy_all_gbps, summary.memcpy_threads, summary.copy_vs_memcpy
    );
    println!(
        "conditions: commit {} · {} cores · {} build · {} rows · batch {} · {} assembly threads",
        summary.conditions.commit,
        summary.conditions.cores,
        summary.conditions.profile,
        opts.rows,
        opts.batch_size,
        summary.assembly_threads
    );
    Ok(())
}

fn bench_placement(shards: usize, nodes: usize, json: bool) -> Result<()> {
    let b = granary_bench::placement::bench_placement(shards, nodes)?;
    if json {
        println!("{}", serde_json::to_string(&b)?);
        return Ok(());
    }
    println!("placed {} shards over {} nodes in {:.3} s (target < 1)", b.shards, b.nodes, b.assign_s);
    println!("max load / mean         {:.3}   (target <= 1.1)", b.max_over_mean);
    println!(
        "one node leaves: moved / ideal {:.3} (target <= 1.1), re-placed in {:.3} s, max / mean {:.3}",
        b.moved_on_leave_over_ideal, b.rebalance_leave_s, b.max_over_mean_after_leave
    );
    println!(
        "one node joins:  moved / ideal {:.3} (target <= 1.1), re-placed in {:.3} s, max / mean {:.3}",
        b.moved_on_join_over_ideal, b.rebalance_join_s, b.max_over_mean_after_join
    );
    println!("conditions: {:?}", granary_bench::report::Conditions::current());
    Ok(())
}

fn bench_failover(opts: &granary_bench::failover::FailoverOpts, json: bool) -> Result<()> {
    let exe = std::env::current_exe().context("locating the granary binary")?;
    let summary = granary_bench::failover::run(
        &exe,
        opts,
        |line| {
            if !json {
                println!("{line}");
            }
        },
        |r| {
            if json {
                println!("{}", serde_json::to_string(r).unwrap_or_default());
            } else {
                println!(
                    "round {}: killed voter-{}, voter-{} elected after {:.0} ms, write committed after {:.0} ms",
                    r.round, r.killed, r.new_leader, r.elected_ms, r.committed_ms
                );
            }
        },
    )?;
    if json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "{} voters, election timeout {}..{} ms (lower..upper bound): new leader after {:.0} ms (median), write committed after {:.0} ms (median), {:.0} ms (worst) = {:.2}x the election timeout (target <= 2)",
            summary.voters,
            summary.election_timeout_ms,
            summary.election_timeout_ms * 5 / 4,
            summary.elected_ms_median,
            summary.committed_ms_median,
            summary.committed_ms_max,
            summary.committed_over_election_timeout_max
        );
        println!(
            "writes acknowledged {}, found after killing and restarting every voter {} (missing: {:?})",
            summary.writes_acknowledged, summary.writes_found_after_restart, summary.writes_missing
        );
        println!("conditions: {:?}", granary_bench::report::Conditions::current());
    }
    Ok(())
}

fn stats(socket: &std::path::Path, json: bool) -> Result<()> {
    let s = granary_client::LocalSource::connect(socket)?.stats()?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "remote_bytes": s.remote_bytes, "remote_requests": s.remote_requests,
                "conversions": s.conversions, "converted_bytes": s.converted_bytes,
                "ram_hits": s.ram_hits, "ssd_hits": s.ssd_hits, "misses": s.misses, "joined": s.joined,
                "corrupt_entries": s.corrupt_entries, "prefetched": s.prefetched,
                "chunk_memory_bytes": s.chunk_memory_bytes,
                "peer_fetched": s.peer_fetched, "peer_fetched_bytes": s.peer_fetched_bytes,
                "peer_failures": s.peer_failures, "peer_served": s.peer_served,
                "guest_hits": s.guest_hits, "guest_bytes": s.guest_bytes,
            })
        );
    } else {
        println!("{s:#?}");
    }
    Ok(())
}
