//! `granary-chaos sim`: the deterministic simulation of the fabric's races
//! (`granary_chaos::sim`), over a range of seeds or one seed with its trace;
//! `granary-chaos run` is in [`super::run`].
//! Human output is a progress line, one line per failing seed with its
//! replay command, and a summary; `--json` gives one JSON line per seed and
//! a last `summary` line.

use anyhow::{Result, bail};
use clap::Args;
use granary_chaos::sim;
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Instant;

/// `granary-chaos sim`.
#[derive(Args)]
pub(crate) struct SimArgs {
    /// Seeds to run, from `--from`.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Run this one seed only (a replay).
    #[arg(long, conflicts_with_all = ["seeds", "from"])]
    seed: Option<u64>,
    /// With `--seed`: print the whole trace.
    #[arg(long, requires = "seed")]
    trace: bool,
    /// With `--seed`, when it fails: cut its schedule down to the fault
    /// episodes the failure needs (each removed in turn while the first
    /// invariant it broke still breaks), then calm the swarm's rates it
    /// does not need (loss, duplicates, watch lag, slow and corrupt reads,
    /// latency spreads), and print what is left. With `--trace`, the
    /// shrunk run's trace follows.
    #[arg(long, requires = "seed")]
    shrink: bool,
    /// One JSON line per seed, then a summary line.
    #[arg(long)]
    json: bool,
    /// Instead of swarm seeds: one named fault on a fixed 3-node,
    /// 40-shard cluster (node 2 stopped, or cut off from everyone, in the
    /// cold epoch, or killed and restarted), measured against the same run
    /// without it. With `--seed S --trace`: that run's trace.
    #[arg(long, value_enum)]
    scenario: Option<ScenarioKind>,
    /// With `--scenario`: how long the fault lasts, in seconds.
    #[arg(long, default_value_t = 6, requires = "scenario")]
    fault_secs: u64,
}

/// `--scenario`.
#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum ScenarioKind {
    /// SIGSTOP, then SIGCONT.
    Stop,
    /// Every link of the node cut both ways, then healed.
    Partition,
    /// SIGKILL, then a restart (its memory is gone).
    Crash,
}

/// Runs `granary-chaos sim`.
pub(crate) fn run(a: &SimArgs) -> Result<()> {
    if let Some(kind) = a.scenario {
        return scenario_run(a, kind);
    }
    sim_run(a)
}

/// `--shrink`: the fault episodes and rates a failing seed needs; with
/// `trace`, the shrunk run's trace after them.
fn print_shrunk(out: &mut impl Write, seed: u64, trace: bool) -> Result<()> {
    let Some(s) = sim::shrink(seed) else {
        return Ok(writeln!(out, "  shrink: the seed breaks no invariant")?);
    };
    writeln!(
        out,
        "  shrunk ({} runs): {} of its {} fault episodes still break {}:",
        s.runs,
        s.kept.len(),
        s.of,
        s.invariant
    )?;
    for e in &s.kept {
        let mut e = e.clone();
        e.sort_by_key(|(at, _)| *at);
        let events: Vec<String> =
            e.iter().map(|(at, f)| format!("at {:.3} s {}", *at as f64 / 1e6, f.describe())).collect();
        writeln!(out, "    {}", events.join("; "))?;
    }
    if s.calmed.is_empty() {
        writeln!(out, "  no rate could be calmed: the failure needs each one the swarm has")?;
    } else {
        let calmed: Vec<String> = s.calmed.iter().map(|(c, was)| format!("{} (was {was})", c.name())).collect();
        writeln!(out, "  calmed with the failure still there: {}", calmed.join(", "))?;
    }
    writeln!(out, "  shrunk swarm: {}", s.swarm)?;
    if trace {
        writeln!(out, "  the shrunk run's trace:")?;
        for line in sim::run_shrunk(seed, &s, true).trace.unwrap_or_default() {
            writeln!(out, "{line}")?;
        }
    } else {
        writeln!(out, "  its trace: granary-chaos sim --seed {seed} --shrink --trace")?;
    }
    Ok(())
}

fn sim_run(a: &SimArgs) -> Result<()> {
    let (from, count) = match a.seed {
        Some(s) => (s, 1),
        None => (a.from, a.seeds),
    };
    let started = Instant::now();
    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut extra: BTreeMap<&'static str, u64> = BTreeMap::new();
    let (mut violations, mut failed, mut reads, mut shards, mut steps) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut stdout = std::io::stdout().lock();
    let mut last_progress = Instant::now();
    for (i, seed) in (from..from.saturating_add(count)).enumerate() {
        let o = sim::run(seed, a.trace && !a.shrink);
        for (k, v) in &o.faults {
            *faults.entry(k).or_default() += v;
        }
        for (k, v) in &o.extra_reads {
            *extra.entry(k).or_default() += v;
        }
        violations += o.violation_counts.values().sum::<u64>();
        failed += u64::from(!o.violations.is_empty());
        reads += o.remote_reads;
        shards += o.shards as u64;
        steps += o.steps;
        if let Some(trace) = &o.trace {
            for line in trace {
                writeln!(stdout, "{line}")?;
            }
        }
        if a.json {
            let line = serde_json::json!({
                "scenario": "sim", "seed": seed, "swarm": o.swarm.to_string(),
                "trace_hash": format!("{:016x}", o.trace_hash), "steps": o.steps, "sim_ms": o.sim_ms,
                "faults": o.faults, "violations": o.violations.iter().map(|v| serde_json::json!({
                    "invariant": v.invariant, "at_us": v.at, "detail": v.detail,
                })).collect::<Vec<_>>(),
                "remote_reads": o.remote_reads, "shards": o.shards, "extra_reads": o.extra_reads,
            });
            writeln!(stdout, "{line}")?;
        } else if !o.violations.is_empty() {
            writeln!(stdout, "seed {seed} FAILED ({})", o.swarm)?;
            for v in &o.violations {
                writeln!(stdout, "  {} at {:.3} s: {}", v.invariant, v.at as f64 / 1e6, v.detail)?;
            }
            writeln!(stdout, "  replay: granary-chaos sim --seed {seed} --trace")?;
            if a.shrink {
                print_shrunk(&mut stdout, seed, a.trace)?;
            }
        } else if a.seed.is_some() {
            writeln!(
                stdout,
                "seed {seed} ok: {} events, {:.1} s simulated, {} remote reads for {} shards, trace {:016x}",
                o.steps,
                o.sim_ms as f64 / 1e3,
                o.remote_reads,
                o.shards,
                o.trace_hash
            )?;
        }
        if !a.json && count > 1 && last_progress.elapsed().as_secs() >= 2 {
            last_progress = Instant::now();
            eprintln!("  {} of {count} seeds, {failed} failed", i + 1);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let rate = count as f64 / secs.max(1e-9) * 60.0;
    let injected: u64 = faults.values().sum();
    if a.json {
        let line = serde_json::json!({
            "scenario": "summary", "seeds": count, "faults": injected, "violations": violations,
            "failed_seeds": failed, "by_fault": faults, "seeds_per_minute": rate.round(),
            "events": steps, "remote_reads": reads, "shards": shards, "extra_reads": extra,
        });
        writeln!(stdout, "{line}")?;
    } else if count > 1 {
        let by: Vec<String> = faults.iter().map(|(k, v)| format!("{v} {k}")).collect();
        writeln!(
            stdout,
            "{count} seeds in {secs:.1} s ({rate:.0} seeds a minute on one core): {injected} faults ({}), \
             {violations} violations in {failed} seeds",
            by.join(", ")
        )?;
        writeln!(
            stdout,
            "remote reads: {reads} for {shards} shards ({:.2}x); beyond one per shard, by cause:",
            reads as f64 / shards.max(1) as f64
        )?;
        for (k, v) in &extra {
            writeln!(stdout, "  {v:>8}  {k}")?;
        }
    }
    if failed > 0 {
        bail!("{failed} of {count} seeds broke an invariant");
    }
    Ok(())
}

/// `--scenario`: the costs issue 14 sets targets for, over `--seeds` runs
/// (10 by default here is plenty: each run is a few milliseconds).
fn scenario_run(a: &SimArgs, kind: ScenarioKind) -> Result<()> {
    use granary_chaos::sim::scenario::{self, Kind};
    let kind = match kind {
        ScenarioKind::Stop => Kind::Stop,
        ScenarioKind::Partition => Kind::Partition,
        ScenarioKind::Crash => Kind::Crash,
    };
    let name = format!("{kind:?}").to_lowercase();
    let (from, seeds) = match a.seed {
        Some(seed) => (seed, 1),
        None => (a.from, a.seeds.min(10_000)),
    };
    let mut missed = 0;
    for seed in from..from.saturating_add(seeds) {
        let c = scenario::run(kind, a.fault_secs, 1_500, seed, a.trace && a.seed.is_some());
        for line in c.faulted.trace.iter().flatten() {
            println!("{line}");
        }
        let time_ok = c.extra_cold_ms() <= c.allowed_ms();
        let reads_ok = c.unexposed_rereads().is_empty();
        let warm_ok = c.forbidden_warm_reads() == 0;
        let ok = time_ok && reads_ok && warm_ok && c.faulted.violations.is_empty() && c.calm.violations.is_empty();
        missed += u64::from(!ok);
        if a.json {
            println!(
                "{}",
                serde_json::json!({
                    "scenario": name, "seed": seed, "fault_secs": a.fault_secs,
                    "cold_ms": c.calm.epoch_end_ms[0], "cold_faulted_ms": c.faulted.epoch_end_ms[0],
                    "extra_cold_ms": c.extra_cold_ms(), "allowed_ms": c.allowed_ms(),
                    "extra_reads": c.extra_reads(), "unexposed_rereads": c.unexposed_rereads(),
                    "warm_reads": c.warm_reads(), "violations": c.faulted.violations.len(), "ok": ok,
                })
            );
        } else {
            println!(
                "{name} {} s, seed {seed}: cold epoch {:.1} s -> {:.1} s (+{:.1} s, target <= {:.1} s); \
                 remote reads {} -> {} (+{}; read again though the fault did not expose them: {:?}); warm-epoch reads {}{}",
                a.fault_secs,
                c.calm.epoch_end_ms[0] as f64 / 1e3,
                c.faulted.epoch_end_ms[0] as f64 / 1e3,
                c.extra_cold_ms() as f64 / 1e3,
                c.allowed_ms() as f64 / 1e3,
                c.calm.remote_reads,
                c.faulted.remote_reads,
                c.extra_reads(),
                c.unexposed_rereads(),
                c.warm_reads(),
                if ok { "" } else { "  MISSED" }
            );
        }
    }
    if missed > 0 {
        bail!("{missed} of {seeds} runs missed a target");
    }
    Ok(())
}
