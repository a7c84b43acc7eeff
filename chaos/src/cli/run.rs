//! `granary-chaos run`: the real processes under seeded faults
//! (`granary_chaos::run`). It prepares the job once (dataset, fault-free
//! single-node reference), then runs each seed on a fresh cluster. Human
//! output: one line per seed (its faults, time, remote reads, verdict; a
//! failing seed's violations and its replay command), then a summary;
//! `--json`: one JSON line per seed and a last `summary` line.

use anyhow::{Result, bail};
use clap::Args;
use granary_chaos::run::{self, RunConfig, SeedReport};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

/// `granary-chaos run`.
#[derive(Args)]
pub(crate) struct RunArgs {
    /// Seeds to run, from `--from`.
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Run this one seed only (a replay).
    #[arg(long, conflicts_with_all = ["seeds", "from"])]
    seed: Option<u64>,
    /// Node daemons.
    #[arg(long, default_value_t = 3)]
    nodes: u32,
    /// Trainer ranks per node.
    #[arg(long, default_value_t = 2)]
    ranks_per_node: u32,
    /// Epochs of the job.
    #[arg(long, default_value_t = 3)]
    epochs: u64,
    /// Process and network fault events per seed at most (one SSD fault of
    /// the filesystem or of a write may come on top).
    #[arg(long, default_value_t = 3)]
    max_faults: u32,
    /// Keep every seed's folder (logs, configs; a passing seed's SSD files
    /// are removed) here instead of a temporary folder that is removed at
    /// the end.
    #[arg(long)]
    keep: Option<PathBuf>,
    /// One JSON line per seed, then a summary line.
    #[arg(long)]
    json: bool,
}

/// Runs `granary-chaos run`.
pub(crate) fn run(a: &RunArgs, granary: &std::path::Path) -> Result<()> {
    if a.nodes < 2 || a.ranks_per_node == 0 || a.epochs == 0 {
        bail!("--nodes must be at least 2, --ranks-per-node and --epochs at least 1");
    }
    let (work, _tmp) = super::work_dir(a.keep.as_deref(), "granary-chaos-")?;
    let mut cfg = RunConfig::new(granary.to_path_buf(), work.clone());
    // This binary runs a seed's byzantine node (`granary-chaos node`).
    cfg.forger = std::env::current_exe().ok();
    cfg.nodes = a.nodes;
    cfg.ranks_per_node = a.ranks_per_node;
    cfg.epochs = a.epochs;
    cfg.max_faults = a.max_faults;
    let (from, count) = match a.seed {
        Some(s) => (s, 1),
        None => (a.from, a.seeds),
    };
    let started = Instant::now();
    let json = a.json;
    let mut say = |s: &str| {
        if !json {
            eprintln!("{s}");
        }
    };
    let job = run::prepare(&cfg, &mut say)?;
    let tiers = run::Tiers::for_job(&job);
    say(&format!(
        "reference: {} ranks x {} epochs in {:.1} s ({} MiB converted); now {count} seed(s) on {} voters and {} nodes \
         (RAM tier {} MiB, guest area {} MiB, memory budget {} MiB each)",
        cfg.nodes * cfg.ranks_per_node,
        cfg.epochs,
        job.reference_secs,
        job.converted_bytes >> 20,
        cfg.voters,
        cfg.nodes,
        tiers.ram_bytes >> 20,
        tiers.guest_bytes >> 20,
        tiers.memory_budget(&job) >> 20,
    ));
    let mut by_fault: BTreeMap<String, u64> = BTreeMap::new();
    let (mut violations, mut failed) = (0usize, 0u64);
    for seed in from..from.saturating_add(count) {
        let r = run::run_seed(&cfg, &job, seed)?;
        for (k, v) in &r.by_fault {
            *by_fault.entry(k.clone()).or_default() += v;
        }
        violations += r.violations.len();
        failed += u64::from(!r.violations.is_empty());
        if json {
            println!("{}", serde_json::json!({"scenario": "seed", "report": &r}));
        } else {
            print_seed(&r);
        }
        if r.violations.is_empty() {
            if a.keep.is_none() {
                // Passing seeds leave nothing behind; failing ones keep
                // their logs until the temporary folder goes.
                let _ = std::fs::remove_dir_all(&r.dir);
            } else {
                // Kept, but without the nodes' SSD files (a soak of
                // hundreds of seeds would fill the disk).
                run::remove_ssd_files(&r.dir);
            }
        }
    }
    let faults: u64 = by_fault.values().sum();
    let secs = started.elapsed().as_secs_f64();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "scenario": "summary", "seeds": count, "faults": faults, "violations": violations,
                "failed_seeds": failed, "by_fault": by_fault, "secs": secs,
            })
        );
    } else {
        let by: Vec<String> = by_fault.iter().map(|(k, v)| format!("{v} {k}")).collect();
        println!(
            "{count} seeds in {secs:.0} s: {faults} faults ({}), {violations} violations in {failed} seeds",
            by.join(", ")
        );
    }
    if failed > 0 {
        if a.keep.is_none() {
            eprintln!("(logs of failing seeds are removed with the temporary folder; --keep DIR keeps them)");
        }
        bail!("{failed} of {count} seeds broke an invariant");
    }
    Ok(())
}

fn print_seed(r: &SeedReport) {
    let faults: Vec<String> =
        r.schedule.events.iter().map(|e| format!("at {:.1} s {}", e.at.as_secs_f64(), e.fault)).collect();
    let n = r.schedule.noise;
    let noise = if n.drop + n.duplicate + n.reorder > 0.0 || n.delay_ms > 0 {
        format!(
            "; links drop {:.1}%, duplicate {:.1}%, reorder {:.1}%, delay {} ms",
            n.drop * 100.0,
            n.duplicate * 100.0,
            n.reorder * 100.0,
            n.delay_ms
        )
    } else {
        String::new()
    };
    let cap = if n.bandwidth_mib > 0 {
        format!("; links capped at {} MiB/s ({} datagrams held back or dropped)", n.bandwidth_mib, r.relay_throttled)
    } else {
        String::new()
    };
    let byzantine = match r.schedule.byzantine {
        Some(node) => format!(
            "; node {node} forged every chunk it sent its peers: {} forged chunks caught, {} quarantines at the end",
            r.peer_mismatched, r.peers_quarantined
        ),
        None => String::new(),
    };
    let noise = noise + &cap + &byzantine;
    let st = r.store;
    let store = if st.errors + st.slowed + st.shortened + st.stalled > 0 {
        format!(
            "; store: {} of {} GETs answered 503, {} held back {} ms, {} cut short, {} stalled {} ms halfway",
            st.errors,
            st.gets,
            st.slowed,
            r.schedule.store.slow_ms,
            st.shortened,
            st.stalled,
            r.schedule.store.stall_ms
        )
    } else {
        String::new()
    };
    let lin = format!(
        "; coordinator client: {} ops, {} registrations acknowledged, {} failed, {}",
        r.lin.ops, r.lin.acknowledged, r.lin.failed, r.lin.verdict
    );
    let verdict = if r.violations.is_empty() { "ok".to_string() } else { "FAILED".to_string() };
    let ends: Vec<String> = r.epoch_ends.iter().map(|s| format!("{s:.1}")).collect();
    println!(
        "seed {}: {verdict} in {:.1} s (epochs end at {} s); remote reads {:.2}x the dataset (allowed {:.2}x), {} conversions, {} rank restarts, {} SSD chunks damaged, node memory at most {} of {} MiB; {}{noise}{store}{lin}",
        r.seed,
        r.secs,
        ends.join(", "),
        r.remote_ratio,
        r.remote_bound,
        r.conversions,
        r.rank_restarts,
        r.ssd_damaged,
        r.memory.values().map(|m| m.peak_footprint).max().unwrap_or(0) >> 20,
        r.memory_budget >> 20,
        faults.join("; "),
    );
    for v in &r.violations {
        println!("  {}: {}", v.invariant, v.detail);
    }
    if !r.violations.is_empty() {
        println!("  logs: {}", r.dir.display());
        println!("  replay: granary-chaos run --seed {}", r.seed);
    }
}
