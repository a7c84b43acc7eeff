//! `granary demo` on one node: the single-host path, end to end.
//!
//! 1. Generates the recommendation dataset in a temporary folder.
//! 2. Serves it as remote storage with a latency per request and a bandwidth
//!    cap shared by all requests (the node's throttle over `file://`).
//! 3. Starts a node daemon and N trainer processes, runs the epochs in
//!    lockstep with progress bars, and reports per epoch rows/s, GB/s, the
//!    ratio to the in-RAM ceiling (measured in the same run by trainers that
//!    first copy every chunk into their own memory), remote bytes read against
//!    the dataset size, and conversions.
//! 4. Runs everything again with different prefetch, loader and converter
//!    settings and a cold cache, and checks that every rank received the same
//!    batches, byte for byte, in the same order.

use super::args::DemoArgs;
use super::pass::{Settings, pass, replay_settings};
use super::report::say_to;
use super::setup::Setup;
use anyhow::{Result, bail};
use granary_bench::report::ratio;

/// Runs the single-node demo (`a.nodes` = 1).
pub(super) fn run(a: DemoArgs) -> Result<()> {
    let Setup { started, exe, work, data, bars, source_bytes } = Setup::new(&a)?;
    let bandwidth = a.bandwidth_mib << 20;
    let say = |s: String| {
        if !a.json {
            say_to(&bars, s);
        }
    };
    say(format!(
        "remote storage: file:// throttled to {} MiB/s shared, {} ms per request; {} ranks x {} epochs, batch {}",
        a.bandwidth_mib, a.latency_ms, a.ranks, a.epochs, a.batch_size
    ));

    let first = Settings {
        prefetch_bytes: 256 << 20,
        loads: 4,
        convert_threads: 2,
        prefetch_batches: 2,
        assembly_threads: 0,
        ceiling: false,
    };
    let main = pass(&exe, &a, work.path(), "run", &first, &data, bandwidth, source_bytes, &bars)?;
    let ceiling = pass(
        &exe,
        &a,
        work.path(),
        "ceiling",
        &Settings { ceiling: true, ..first },
        &data,
        bandwidth,
        source_bytes,
        &bars,
    )?;
    let ceiling_rps = {
        let rows: u64 = ceiling.epochs.iter().map(|e| e.rows).sum();
        let secs: f64 = ceiling.epochs.iter().map(|e| e.secs).sum();
        ratio(rows as f64, secs)
    };
    let second = replay_settings();
    let replay = pass(&exe, &a, work.path(), "replay", &second, &data, bandwidth, source_bytes, &bars)?;

    let identical = main.digests == replay.digests && main.digests == ceiling.digests;
    let mut rows_out = main.epochs.clone();
    for r in &mut rows_out {
        r.vs_ceiling = ratio(r.rows_per_s, ceiling_rps);
    }
    if a.json {
        for r in &rows_out {
            println!("{}", serde_json::to_string(r)?);
        }
        println!(
            "{}",
            serde_json::json!({
                "event": "summary",
                "ceiling_rows_per_s": ceiling_rps,
                "deterministic": identical,
                "ranks": a.ranks,
                "epochs": a.epochs,
                "source_bytes": source_bytes,
                "bandwidth_bytes_per_s": bandwidth,
                "latency_ms": a.latency_ms,
                "secs": started.elapsed().as_secs_f64(),
            })
        );
    } else {
        println!();
        println!(
            "{:>5} {:>12} {:>7} {:>11} {:>24} {:>12}",
            "epoch", "rows/s", "GB/s", "vs ceiling", "remote read / dataset", "conversions"
        );
        for r in &rows_out {
            println!(
                "{:>5} {:>12.0} {:>7.2} {:>10.2}x {:>11.1} / {:>5.1} MB {:>12}",
                r.epoch,
                r.rows_per_s,
                r.gb_per_s,
                r.vs_ceiling,
                r.remote_bytes as f64 / 1e6,
                r.source_bytes as f64 / 1e6,
                r.conversions
            );
        }
        println!("in-RAM ceiling (same run, same plan, {} ranks): {:.0} rows/s", a.ranks, ceiling_rps);
        println!(
            "determinism: {} — every rank's batch checksums over {} epochs are {} in a second run with prefetch {} MiB -> {} MiB, loads {} -> {}, converter threads {} -> {}, loader lookahead {} -> {} batches, assembly threads {} -> {}, and a cold cache",
            if identical { "OK" } else { "MISMATCH" },
            a.epochs,
            if identical { "identical" } else { "NOT identical" },
            first.prefetch_bytes >> 20,
            second.prefetch_bytes >> 20,
            first.loads,
            second.loads,
            first.convert_threads,
            second.convert_threads,
            first.prefetch_batches,
            second.prefetch_batches,
            if first.assembly_threads == 0 {
                granary_client::default_assembly_threads_for(a.ranks as usize)
            } else {
                first.assembly_threads
            },
            second.assembly_threads
        );
        println!("total {:.1}s", started.elapsed().as_secs_f64());
    }
    if !identical {
        bail!("batch streams differ between runs");
    }
    Ok(())
}
