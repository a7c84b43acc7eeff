//! `granary-chaos hosts`: issue 14's two cost targets (a node stopped, or
//! its host cut off, for S seconds in the cold epoch) on hosts made of
//! network namespaces (`granary_chaos::hosts`), each run against the same
//! job without the fault. Needs root and iproute2. Human output: what runs,
//! then one line per run with its verdict; `--json`: one JSON line per run
//! and a last `summary` line.

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};
use granary_chaos::hosts::{self, HostFault, HostsConfig};
use std::path::PathBuf;
use std::time::Duration;

/// `granary-chaos hosts`.
#[derive(Args)]
pub(crate) struct HostsArgs {
    /// The fault: `stop` (SIGSTOP, then SIGCONT) or `partition` (the
    /// node's host link down, then up).
    #[arg(long, value_enum)]
    fault: FaultArg,
    /// How long the fault lasts, in seconds.
    #[arg(long, default_value_t = 6.0)]
    fault_secs: f64,
    /// Runs (each a fault-free run and a faulted one).
    #[arg(long, default_value_t = 1)]
    runs: u32,
    /// Each node's link to remote storage, MiB/s (the cold epoch must
    /// outlast the fault).
    #[arg(long, default_value_t = 1)]
    bandwidth_mib: u64,
    /// Keep the runs' folders (logs, configs) here instead of a temporary
    /// folder.
    #[arg(long)]
    keep: Option<PathBuf>,
    /// One JSON line per run, then a summary line.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum FaultArg {
    /// SIGSTOP, then SIGCONT.
    Stop,
    /// The host's link down, then up.
    Partition,
}

/// Runs `granary-chaos hosts`.
pub(crate) fn run(a: &HostsArgs, granary: &std::path::Path) -> Result<()> {
    if !(a.fault_secs > 0.0 && a.fault_secs < 60.0) || a.runs == 0 || a.bandwidth_mib == 0 {
        bail!("--fault-secs must be between 0 and 60, --runs and --bandwidth-mib at least 1");
    }
    granary_chaos::netns::Hosts::available()
        .map_err(|e| anyhow::anyhow!("granary-chaos hosts makes network namespaces: {e}"))?;
    let (work, _tmp) = super::work_dir(a.keep.as_deref(), "granary-hosts-")?;
    let fault = match a.fault {
        FaultArg::Stop => HostFault::Stop,
        FaultArg::Partition => HostFault::Partition,
    };
    let mut cfg = HostsConfig::new(granary.to_path_buf(), work, fault);
    cfg.fault_for = Duration::from_secs_f64(a.fault_secs);
    cfg.bandwidth = a.bandwidth_mib << 20;
    let mut missed_runs = 0;
    for run in 0..a.runs {
        let mut say = |s: &str| {
            if !a.json {
                eprintln!("run {run}: {s}");
            }
        };
        let r = hosts::run(&cfg, &mut say)?;
        let missed = r.missed();
        missed_runs += u32::from(!missed.is_empty());
        if a.json {
            let mut v = serde_json::to_value(&r)?;
            v["scenario"] = "hosts".into();
            v["run"] = run.into();
            v["extra_cold_secs"] = r.extra_cold_secs().into();
            v["allowed_secs"] = r.allowed_secs().into();
            v["extra_conversions"] = r.extra_conversions().into();
            v["missed"] = serde_json::to_value(&missed)?;
            println!("{v}");
        } else {
            let (wc, wb) = r.warm();
            println!(
                "{} {:.0} s on hosts, run {run}: cold epoch {:.1} s -> {:.1} s (+{:.1} s, target <= {:.1} s); \
                 conversions {} -> {} (+{}; the node held or was loading {}); warm epochs: {wc} conversions, {wb} remote bytes; \
                 streams {}{}",
                match r.fault {
                    HostFault::Stop => "stop",
                    HostFault::Partition => "partition",
                },
                r.fault_secs,
                r.calm.epoch_secs[0],
                r.faulted.epoch_secs[0],
                r.extra_cold_secs(),
                r.allowed_secs(),
                r.calm.conversions.iter().sum::<u64>(),
                r.faulted.conversions.iter().sum::<u64>(),
                r.extra_conversions(),
                r.faulted.exposed.unwrap_or(0),
                if r.same_streams { "identical" } else { "DIFFER" },
                if missed.is_empty() { String::new() } else { format!("  MISSED: {}", missed.join("; ")) }
            );
        }
    }
    if a.json {
        println!("{}", serde_json::json!({"scenario": "summary", "runs": a.runs, "missed": missed_runs}));
    }
    if missed_runs > 0 {
        bail!("{missed_runs} of {} runs missed a target", a.runs);
    }
    Ok(())
}
