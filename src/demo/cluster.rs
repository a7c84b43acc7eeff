//! `granary demo --nodes N`: the cluster, end to end, on one machine.
//!
//! 1. Generates the dataset (as the single-node demo does).
//! 2. Starts one coordinator voter and N node daemons as processes on
//!    loopback (a fresh certificate authority, the dataset registered on the
//!    coordinator); each node has its own link to remote storage, throttled
//!    to the demo's bandwidth and latency, so adding nodes adds remote
//!    bandwidth, as separate hosts would.
//! 3. Starts `--ranks-per-node` trainer ranks on each node (rank r on node
//!    r / ranks-per-node + 1) and runs the epochs in lockstep with progress
//!    bars. Per epoch: cluster rows/s, remote bytes read so far against the
//!    dataset size, chunk bytes fetched from peers so far, the share of chunk
//!    requests answered from a node's own tiers, and conversions.
//! 4. Runs the same ranks against one node daemon alone (no cluster, other
//!    prefetch and loader settings, a cold cache) and checks that every rank
//!    received the same batches in the same order: the batch stream depends
//!    on (dataset version, seed, epoch, rank layout), not on which node
//!    served which shard.

use super::args::DemoArgs;
use super::pass::{Pass, pass, replay_settings};
use super::report::{say_to, style};
use super::setup::{Setup, cluster_spec};
use anyhow::{Result, bail};
use granary_bench::report::{gbps, ratio};
use granary_testkit::harness::{ClusterCounters, LocalCluster, run_epoch, spawn_ranks};
use indicatif::ProgressBar;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// One epoch of the cluster, as a table row or a JSON line.
#[derive(Clone, Debug, Serialize)]
struct ClusterEpoch {
    event: &'static str,
    epoch: u64,
    rows: u64,
    bytes: u64,
    secs: f64,
    rows_per_s: f64,
    gb_per_s: f64,
    /// Remote bytes read by all nodes so far.
    remote_bytes: u64,
    /// Parquet bytes of the dataset.
    source_bytes: u64,
    /// Chunk bytes fetched from peers so far.
    peer_bytes: u64,
    /// Share of this epoch's chunk requests answered from the node's own
    /// RAM, SSD or guest area.
    local_hit_share: f64,
    /// Shards converted so far, all nodes.
    conversions: u64,
}

/// Runs the cluster demo (`a.nodes` ≥ 2).
pub(super) fn run(a: DemoArgs) -> Result<()> {
    if a.ranks_per_node == 0 {
        bail!("--ranks-per-node must be at least 1");
    }
    let world = a.nodes * a.ranks_per_node;
    let bandwidth = a.bandwidth_mib << 20;
    let Setup { started, exe, work, data, bars, source_bytes } = Setup::new(&a)?;
    let say = |s: String| {
        if !a.json {
            say_to(&bars, s);
        }
    };
    say(format!(
        "cluster: 1 coordinator, {} node daemons, {} ranks each ({world} ranks) x {} epochs, batch {}; each node's link to remote storage (file://) is throttled to {} MiB/s, {} ms per request",
        a.nodes, a.ranks_per_node, a.epochs, a.batch_size, a.bandwidth_mib, a.latency_ms
    ));

    let spinner = bars.add(ProgressBar::new_spinner());
    spinner.set_message("starting the coordinator and the node daemons");
    spinner.enable_steady_tick(Duration::from_millis(100));
    let spec = cluster_spec(&a);
    let cluster = LocalCluster::start(&exe, &work.path().join("cluster"), &data, spec)?;
    spinner.finish_and_clear();
    say(format!("cluster up: coordinator at {}, nodes {:?}", cluster.coordinator(), cluster.node_ids()));

    let sockets: Vec<PathBuf> = (0..world).map(|r| cluster.socket((r / a.ranks_per_node) as u64 + 1)).collect();
    let args: Vec<String> = ["--batch-size", &a.batch_size.to_string(), "--seed", "2026", "--prefetch-batches", "2"]
        .map(String::from)
        .into();
    let (mut ranks, batches) = spawn_ranks(&exe, &sockets, &args)?;
    let mut epochs = Vec::new();
    let mut digests = BTreeMap::new();
    let mut before = ClusterCounters::default();
    for epoch in 0..a.epochs {
        let rank_bars: Vec<ProgressBar> = ranks
            .iter()
            .map(|t| {
                let b = bars.add(ProgressBar::new(batches));
                let node = t.rank / a.ranks_per_node + 1;
                b.set_style(style(&format!("e{epoch} node {node} rank {}", t.rank)));
                b
            })
            .collect();
        let out = match run_epoch(&mut ranks, epoch, Duration::from_secs(300), |r, done| {
            rank_bars[r as usize].set_position(done)
        }) {
            Ok(o) => o,
            Err(e) => {
                bail!("{e:#}\n{}", cluster.log_tails());
            }
        };
        for b in rank_bars {
            b.finish_and_clear();
        }
        let now = cluster.total_stats()?;
        for (rank, d) in out.digests {
            digests.insert((rank, epoch), d);
        }
        epochs.push(ClusterEpoch {
            event: "epoch",
            epoch,
            rows: out.rows,
            bytes: out.bytes,
            secs: out.secs,
            rows_per_s: ratio(out.rows as f64, out.secs),
            gb_per_s: gbps(out.bytes, out.secs),
            remote_bytes: now.remote_bytes,
            source_bytes,
            peer_bytes: now.peer_fetched_bytes,
            local_hit_share: now.local_hit_share(&before),
            conversions: now.conversions,
        });
        before = now;
    }
    for t in ranks {
        t.finish(Duration::from_secs(30))?;
    }
    let failures = cluster.total_stats()?.peer_failures;
    drop(cluster);

    // The same ranks against one node daemon, other settings, cold cache.
    let one = DemoArgs { ranks: world, ..a.clone() };
    let reference: Pass =
        pass(&exe, &one, work.path(), "one-node", &replay_settings(), &data, bandwidth, source_bytes, &bars)?;
    let identical = reference.digests == digests;

    if a.json {
        for e in &epochs {
            println!("{}", serde_json::to_string(e)?);
        }
        println!(
            "{}",
            serde_json::json!({
                "event": "summary",
                "nodes": a.nodes,
                "ranks": world,
                "epochs": a.epochs,
                "deterministic": identical,
                "peer_failures": failures,
                "source_bytes": source_bytes,
                "bandwidth_bytes_per_s_per_node": bandwidth,
                "latency_ms": a.latency_ms,
                "secs": started.elapsed().as_secs_f64(),
            })
        );
    } else {
        println!();
        println!(
            "{:>5} {:>12} {:>7} {:>24} {:>11} {:>10} {:>12}",
            "epoch", "rows/s", "GB/s", "remote read / dataset", "peer bytes", "local hits", "conversions"
        );
        for e in &epochs {
            println!(
                "{:>5} {:>12.0} {:>7.2} {:>11.1} / {:>5.1} MB {:>8.1} MB {:>9.0}% {:>12}",
                e.epoch,
                e.rows_per_s,
                e.gb_per_s,
                e.remote_bytes as f64 / 1e6,
                e.source_bytes as f64 / 1e6,
                e.peer_bytes as f64 / 1e6,
                e.local_hit_share * 100.0,
                e.conversions
            );
        }
        println!(
            "determinism: {} — every rank's batch checksums over {} epochs are {} when one node daemon serves all {world} ranks alone (prefetch 24 MiB, 1 load, 1 converter thread, loader lookahead 5, 3 assembly threads, cold cache)",
            if identical { "OK" } else { "MISMATCH" },
            a.epochs,
            if identical { "identical" } else { "NOT identical" },
        );
        println!("total {:.1}s", started.elapsed().as_secs_f64());
    }
    if !identical {
        bail!("batch streams differ between the cluster and one node");
    }
    Ok(())
}
