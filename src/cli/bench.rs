//! `granary bench`: the benchmark scenarios, each run by
//! [`granary_bench`] and printed here as a human table or, with `--json`,
//! one JSON object per scenario and a summary line.
//!
//! - `local`: naive, cold, copy, ceiling, warm and block-shuffle scenarios
//!   on one host (trainer processes on one daemon with `--ranks` > 1).
//! - `placement`: the placement function at cluster scale.
//! - `cluster`: 1, 2 and 4 node daemons with a coordinator on loopback.
//! - `failover`: leader kills in a coordinator group of real processes.
//! - `scale`: a dataset of many row groups on many simulated nodes against
//!   a coordinator group of real processes (issue 31).
//! - `quic-serve` (hidden): the bare-QUIC peer `cluster` measures against.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::path::PathBuf;

/// `granary bench`.
#[derive(Subcommand)]
pub(crate) enum BenchCommand {
    /// ceiling, naive, warm and cold on one host.
    Local(LocalArgs),
    /// The Python client (`granary` package) against the Rust client on
    /// the same node and data, and against numpy copying batches already
    /// in RAM.
    Python(PythonArgs),
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
        certs: PathBuf,
        /// Largest answer, bytes.
        #[arg(long)]
        bytes: u64,
    },
    /// A coordinator group (real processes) with a dataset of many row
    /// groups and many simulated nodes: registration against its footer
    /// reads, log entry and snapshot sizes, snapshot install, voter memory,
    /// re-placement on a leave and a join with the API's latency meanwhile,
    /// watch bytes per node, failover. Runs a tenth of the size first, to
    /// show how cost grows.
    Scale {
        /// Row groups of the dataset.
        #[arg(long, default_value_t = 1_000_000)]
        row_groups: u64,
        /// Files they are spread over.
        #[arg(long, default_value_t = 20_000)]
        files: u64,
        /// Simulated nodes.
        #[arg(long, default_value_t = 1_000)]
        nodes: u64,
        /// Skip the run at a tenth of the size.
        #[arg(long)]
        no_growth: bool,
        /// Election timeout of the voters, ms.
        #[arg(long, default_value_t = 500)]
        election_timeout_ms: u64,
        /// Node lease, ms (heartbeats every quarter of it).
        #[arg(long, default_value_t = 10_000)]
        lease_ms: u64,
        /// Nodes of the fleet run after: each its own certificate, address
        /// and connection, doing what a node does at a node's cadence (the
        /// default 3 s lease); 0 skips it.
        #[arg(long, default_value_t = 1_000)]
        fleet_nodes: u64,
        /// Row groups of the fleet's dataset.
        #[arg(long, default_value_t = 100_000)]
        fleet_row_groups: u64,
        /// The fleet's steady state before its leader kill, seconds.
        #[arg(long, default_value_t = 60)]
        fleet_steady_s: u64,
        /// JSON lines: one per run, the summary last.
        #[arg(long)]
        json: bool,
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

/// Options of `granary bench local`.
#[derive(Args)]
pub(crate) struct LocalArgs {
    /// Also draw rows/s per epoch per scenario, the ceiling dashed, as an
    /// SVG file here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Rows in the generated dataset (default 500,000; 100,000 with
    /// --jagged, whose rows are about 4.5 times larger).
    #[arg(long)]
    rows: Option<u64>,
    /// Also generate list and byte columns (hist, cats, blob) and serve
    /// them as jagged tensors; a fixed-width dataset of the same converted
    /// size is measured beside it (warm_fixed, warm_bytes_vs_fixed).
    #[arg(long)]
    jagged: bool,
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
    values: granary_testkit::datagen::Values,
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
    /// Canonical partitions of the global plan's scenarios (warm_global,
    /// blocks_global; one rank, global batch = --batch-size).
    #[arg(long, default_value_t = 1)]
    global_partitions: u32,
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

/// Options of `granary bench python`.
#[derive(Args)]
pub(crate) struct PythonArgs {
    /// Rows in the generated dataset (default 400,000; 160,000 with
    /// --jagged, whose rows are about 6 times larger: 40 batches an epoch).
    #[arg(long)]
    rows: Option<u64>,
    /// Also generate list and byte columns (hist, cats, blob) and serve
    /// them as jagged tensors (granary.Jagged in Python).
    #[arg(long)]
    jagged: bool,
    /// Rows per batch.
    #[arg(long, default_value_t = 4096)]
    batch_size: u32,
    /// Timed epochs per scenario (each lasts tens of milliseconds here:
    /// the median of many steadies the ratios).
    #[arg(long, default_value_t = 15)]
    epochs: u64,
    /// RAM tier of the daemon, MiB.
    #[arg(long, default_value_t = 1024)]
    ram_mib: u64,
    /// The Python interpreter with the `granary` package installed
    /// (`pip install ./python`).
    #[arg(long, default_value = "python3")]
    python: String,
    /// One JSON object per scenario, then a summary line.
    #[arg(long)]
    json: bool,
}

/// Options of `granary bench cluster`.
#[derive(Args)]
pub(crate) struct ClusterArgs {
    /// Also draw rows/s per rank per epoch per cluster size, one node
    /// serving as many ranks dashed, as an SVG file here.
    #[arg(long)]
    plot: Option<PathBuf>,
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

/// Runs a `bench` subcommand.
pub(crate) fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Local(a) => bench_local(a),
        BenchCommand::Python(a) => bench_python(a),
        BenchCommand::Placement { shards, nodes, json } => bench_placement(shards, nodes, json),
        BenchCommand::Cluster(a) => bench_cluster(a),
        BenchCommand::QuicServe { certs, bytes } => granary_bench::cluster::serve_raw_quic(&certs, bytes),
        BenchCommand::Failover { voters, rounds, election_timeout_ms, heartbeat_ms, json } => {
            let opts = granary_bench::failover::FailoverOpts { voters, rounds, election_timeout_ms, heartbeat_ms };
            bench_failover(&opts, json)
        }
        BenchCommand::Scale {
            row_groups,
            files,
            nodes,
            no_growth,
            election_timeout_ms,
            lease_ms,
            fleet_nodes,
            fleet_row_groups,
            fleet_steady_s,
            json,
        } => {
            let big = granary_bench::scale::ScaleOpts { row_groups, files, nodes, election_timeout_ms, lease_ms };
            let fleet = (fleet_nodes > 0).then(|| granary_bench::scale::FleetOpts {
                nodes: fleet_nodes,
                row_groups: fleet_row_groups,
                steady: std::time::Duration::from_secs(fleet_steady_s),
                election_timeout_ms,
                lease_ms: 3_000,
            });
            super::bench_scale::run(big, !no_growth, fleet, json)
        }
    }
}

/// `bench cluster`: runs the cluster scenarios, then prints their table and
/// the summary against the targets, or JSON lines.
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
    if let Some(path) = &a.plot {
        write_plot(path, &granary_bench::plot::cluster_svg(&r, opts.rows)?, json)?;
    }
    if json {
        for s in &r.nodes {
            println!("{}", serde_json::to_string(s)?);
        }
        println!("{}", serde_json::to_string(&r.transfer)?);
        println!("{}", serde_json::to_string(&r.two_jobs)?);
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
    let j = &r.two_jobs;
    println!(
        "two jobs at once     remote read ratio {:.4} (target <= 1.01), conversions per shard {:.3} (target 1): {} \
         ranks of the rank plan and {} of the global plan (global batch {})",
        j.remote_read_ratio, j.conversions_per_shard, j.ranks_rank_plan, j.ranks_global_plan, j.global_batch
    );
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

/// `bench local`: runs the scenarios in this process, or as trainer
/// processes on one daemon with `--ranks` > 1, and prints them.
fn bench_local(a: LocalArgs) -> Result<()> {
    let opts = granary_bench::local::LocalOpts {
        rows: a.rows.unwrap_or(if a.jagged { 100_000 } else { 500_000 }),
        jagged: a.jagged,
        row_group_rows: a.row_group_rows,
        batch_size: a.batch_size,
        epochs: a.epochs.max(2),
        latency_ms: a.latency_ms,
        bandwidth_bytes_per_s: a.bandwidth_mib << 20,
        ram_bytes: a.ram_mib << 20,
        compression: a.compression,
        values: a.values,
        window_batches: a.window_batches,
        global_partitions: a.global_partitions,
        assembly_threads: a.assembly_threads,
        ..Default::default()
    };
    let exe = std::env::current_exe()?;
    let json = a.json;
    if a.ranks > 1 && a.jagged {
        anyhow::bail!("--jagged runs the one-rank scenarios; run it without --ranks");
    }
    if a.ranks > 1 && a.plot.is_some() {
        anyhow::bail!("--plot draws the one-rank scenarios epoch by epoch; run it without --ranks");
    }
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
    if let Some(path) = &a.plot {
        write_plot(path, &granary_bench::plot::local_svg(&scenarios)?, json)?;
    }
    if json {
        for s in &scenarios {
            println!("{}", serde_json::to_string(s)?);
        }
        println!("{}", serde_json::to_string(&summary)?);
        return Ok(());
    }
    println!("{:<10} {:>12} {:>8} {:>10}", "scenario", "rows/s", "GB/s", "epochs");
    for s in &scenarios {
        println!("{:<10} {:>12.0} {:>8.2} {:>10}", s.scenario, s.rows_per_s, s.gb_per_s, s.epochs.len());
    }
    println!();
    println!("warm / copy          {:.3}   (target >= 0.85)", summary.warm_vs_copy);
    if let Some(r) = summary.warm_bytes_vs_fixed {
        println!("warm bytes / fixed   {r:.3}   (target >= 0.8: jagged GB/s over a fixed-width dataset's, same size)");
    }
    println!(
        "blocks / copy        {:.3}   (target >= 0.95; {:.0}% of its batches were views)",
        summary.blocks_vs_copy,
        100.0 * summary.blocks_view_share
    );
    println!(
        "global plan / rank   {:.3} warm, {:.3} blocks ({:.0}% views)   (target: within noise of 1; {} canonical \
         partitions)",
        summary.warm_global_vs_warm,
        summary.blocks_global_vs_blocks,
        100.0 * summary.blocks_global_view_share,
        opts.global_partitions
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

/// Writes a chart, and says where on stderr (stdout stays the results).
fn write_plot(path: &std::path::Path, svg: &str, json: bool) -> Result<()> {
    std::fs::write(path, svg).with_context(|| format!("writing the plot to {}", path.display()))?;
    if !json {
        eprintln!("· plot written to {}", path.display());
    }
    Ok(())
}

/// `bench python`: the Python client against the Rust client and numpy.
fn bench_python(a: PythonArgs) -> Result<()> {
    let opts = granary_bench::python::PythonOpts {
        rows: a.rows.unwrap_or(if a.jagged { 160_000 } else { 400_000 }),
        jagged: a.jagged,
        batch_size: a.batch_size,
        epochs: a.epochs.max(1),
        ram_bytes: a.ram_mib << 20,
        python: a.python,
        ..Default::default()
    };
    let exe = std::env::current_exe()?;
    let json = a.json;
    let (scenarios, s) = granary_bench::python::run(&exe, &opts, |line| {
        if !json {
            eprintln!("· {line}");
        }
    })?;
    if json {
        for sc in &scenarios {
            println!("{}", serde_json::to_string(sc)?);
        }
        println!("{}", serde_json::to_string(&s)?);
        return Ok(());
    }
    println!("{:<12} {:>12} {:>8} {:>8}", "scenario", "rows/s", "GB/s", "epochs");
    for sc in &scenarios {
        println!("{:<12} {:>12.0} {:>8.2} {:>8}", sc.scenario, sc.rows_per_s, sc.gb_per_s, sc.epochs.len());
    }
    println!();
    println!("python / rust          {:.3}   (target >= 0.9; views, nothing copied)", s.python_vs_rust);
    println!(
        "per-batch overhead     {:.1} µs (target < 20; a ready batch: Python {:.1} µs, Rust {:.1} µs)",
        s.per_batch_overhead_us, s.python_ready_us, s.rust_ready_us
    );
    println!("python_copy / numpy    {:.3}   (numpy copying batches already in RAM)", s.python_vs_numpy_copy);
    println!("python_copy / rust     {:.3}", s.python_copy_vs_rust_copy);
    println!("streams identical      {}", s.streams_identical);
    println!(
        "conditions: commit {} · {} cores · {} build · {} rows · batch {} · {} batches an epoch · Python {}",
        s.conditions.commit,
        s.conditions.cores,
        s.conditions.profile,
        opts.rows,
        opts.batch_size,
        s.batches_per_epoch,
        s.python_version
    );
    Ok(())
}

/// `bench placement`: places, removes a node, adds one, and prints the
/// balance, speed and movement.
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

/// `bench failover`: prints one line per leader kill, then the summary.
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
