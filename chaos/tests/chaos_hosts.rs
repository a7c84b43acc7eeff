//! `granary-chaos hosts`: issue 14's two cost targets on hosts made of
//! network namespaces (three hosts on a bridge, each with a voter and a
//! node daemon, two ranks per node, 40 shards over 1 MiB/s links): node 3
//! stopped for 6 s, and host 3's link down for 6 s, from 1.5 s into the
//! cold epoch, each against the same job without the fault. Checked:
//! every rank's batch stream is unchanged, the warm epochs read nothing
//! remote and convert nothing, conversions beyond the fault-free run's stay
//! within what the node held or was loading, and the cold epoch's extra
//! time stays near the fault and a lease (the command's own check is
//! exact; this debug build on a shared 2-core machine gets 5 s of slack,
//! the release figures are in docs/TESTING.md).
//!
//! Needs root and iproute2; without them it says "skipped" and why.

use serde_json::Value;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_granary-chaos");

/// The `granary` binary whose processes the run starts: beside this one
/// (`cargo test --workspace` builds both).
fn granary() -> std::path::PathBuf {
    let path = std::path::Path::new(BIN).with_file_name(format!("granary{}", std::env::consts::EXE_SUFFIX));
    assert!(path.is_file(), "{} is missing: cargo build -p granary (cargo test --workspace builds it)", path.display());
    path
}

fn run(fault: &str) -> Option<Value> {
    let out = Command::new(BIN)
        .arg("--granary")
        .arg(granary())
        .args(["hosts", "--fault", fault, "--json"])
        .env("GRANARY_LOG", "info,openraft=warn")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run granary-chaos hosts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("makes network namespaces") || stderr.contains("making hosts of network namespaces") {
        granary_testkit::skip::skipped(stderr.lines().find(|l| l.starts_with("Error")).unwrap_or(&stderr));
        return None;
    }
    let lines: Vec<Value> = stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let run = lines.iter().find(|l| l["scenario"] == "hosts").cloned();
    let run = run.unwrap_or_else(|| panic!("no run line ({}):\n{stdout}\n{stderr}", out.status));
    eprintln!("{fault}: exit {}, {run}", out.status);
    Some(run)
}

fn check(fault: &str) {
    let Some(r) = run(fault) else { return };
    assert_eq!(r["same_streams"], true, "{r}");
    let warm = |k: &str| r["faulted"][k].as_array().unwrap().iter().skip(1).map(|v| v.as_u64().unwrap()).sum::<u64>();
    // An epoch's counters are read once no node has a load in flight, so
    // a cold-epoch load that outlasts the epoch's last rank counts in it.
    assert_eq!(warm("remote_bytes"), 0, "warm epochs read nothing remote: {r}");
    assert_eq!(warm("conversions"), 0, "warm epochs convert nothing: {r}");
    let extra = r["extra_conversions"].as_i64().unwrap();
    let exposed = r["faulted"]["exposed"].as_i64().unwrap();
    assert!(extra <= exposed, "{extra} extra conversions, {exposed} exposed: {r}");
    let (cold, allowed) = (r["extra_cold_secs"].as_f64().unwrap(), r["allowed_secs"].as_f64().unwrap());
    // The fault happened: its thread read the node's counters and applied
    // it (a failed signal or link change ends the run with an error). Its
    // cost in time is not a proof: a debug build's fault-free cold epoch
    // on two shared cores varies by several seconds (20.2 s and 24.4 s in
    // one CI run), more than a partition of 6 s may cost.
    assert!(r["faulted"]["exposed"].as_u64().is_some_and(|e| e > 0), "the fault exposed nothing: {r}");
    // 5 s of slack: the debug fault-free cold epoch alone spread over 4.2 s
    // (above), and a CI run of the stop missed 3 s of slack by 0.8 s
    // (+12.8 s; the release build's runs: +2.6 to +4.6 s). Before issue 14's
    // fixes the stop cost +15 s, over this bound still.
    assert!(cold <= allowed + 5.0, "+{cold:.1} s of cold epoch, {allowed:.1} s allowed: {r}");
}

/// One after the other: each run makes its own hosts, and two at once
/// would share the machine's two cores.
#[test]
fn a_node_stopped_or_a_host_cut_off_for_6_s_on_namespace_hosts_costs_about_its_absence() {
    check("stop");
    check("partition");
}
