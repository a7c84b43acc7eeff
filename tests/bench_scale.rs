//! `granary bench scale` at a toy size: both runs and the summary come out
//! as JSON lines, with the figures the issue asks for measured (the real
//! sizes are in docs/BENCHMARKS.md, "At scale").

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_granary");

#[test]
fn bench_scale_measures_both_sizes_and_summarizes() {
    let out = Command::new(BIN)
        .args(["bench", "scale", "--row-groups", "600", "--files", "6", "--nodes", "6", "--lease-ms", "2000"])
        .args(["--fleet-nodes", "24", "--fleet-row-groups", "200", "--fleet-steady-s", "4", "--json"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run granary");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    for (run, rgs) in lines[..2].iter().zip([60, 600]) {
        assert_eq!(run["scenario"], "scale");
        assert_eq!(run["row_groups"], rgs);
        let entry = run["log_entry_max_bytes"].as_u64().expect("log_entry_max_bytes");
        assert!(entry > 0 && entry <= 1 << 20, "{run}");
        assert!(run["snapshot_bytes"].as_u64().is_some_and(|b| b > 0), "{run}");
        assert!(run["moved_shards"].as_u64().is_some_and(|m| m > 0), "a leave moves the leaver's shards: {run}");
        let (leave, whole) = (run["watch_bytes_per_node"].as_u64(), run["watch_whole_bytes"].as_u64());
        assert!(leave.is_some_and(|b| b > 0), "{run}");
        assert!(leave < whole, "a leave sends the watch less than the whole placement: {run}");
        assert!(run["voter_rss_bytes"].as_u64().is_some_and(|b| b > 0), "{run}");
        assert!(run["failover_s"].as_f64().is_some_and(|s| s > 0.0), "{run}");
        assert!(run["watch_storm_s"].as_f64().is_some_and(|s| s > 0.0), "every watcher had the placement: {run}");
        assert!(run["watch_storm_leader_rss_bytes"].as_u64().is_some_and(|b| b > 0), "{run}");
    }
    // The fleet: 24 nodes, each its own certificate, address and
    // connection; one connection per node at the leader, none at the
    // followers; every node back after the leader kill.
    let fleet = &lines[2];
    assert_eq!(fleet["scenario"], "fleet");
    assert_eq!(fleet["real_nodes"], 24);
    assert!(fleet["heartbeats"].as_u64().is_some_and(|b| b >= 24), "{fleet}");
    assert_eq!(fleet["heartbeats_failed"], 0, "{fleet}");
    assert_eq!(fleet["reregistrations"], 0, "{fleet}");
    assert_eq!(fleet["leader_connections_per_node"], 1, "{fleet}");
    assert_eq!(fleet["leader_connected_nodes"], 24, "{fleet}");
    assert_eq!(fleet["follower_node_connections"], 0, "{fleet}");
    assert!(fleet["reregister_after_failover_s"].as_f64().is_some_and(|s| s > 0.0), "{fleet}");
    assert!(fleet["rewatch_after_failover_s"].as_f64().is_some_and(|s| s > 0.0), "{fleet}");
    assert!(fleet["new_leader_connections_per_node"].as_u64().is_some_and(|n| n <= 3), "{fleet}");
    assert!(fleet["leader_rss_bytes"].as_u64().is_some_and(|b| b > 0), "{fleet}");
    let summary = &lines[3];
    assert_eq!(summary["real_nodes"], 24);
    assert_eq!(summary["leader_connections_per_node"], 1);
    assert_eq!(summary["scenario"], "summary");
    assert_eq!(summary["row_groups"], 600);
    assert_eq!(summary["size_ratio"], 10.0);
    for field in [
        "register_s",
        "snapshot_bytes_per_row_group",
        "snapshot_install_s",
        "replace_s",
        "watch_bytes_per_node_over_moved",
        "watch_bytes_per_node_over_share",
        "failover_vs_election_timeout",
        "register_growth",
        "rss_growth",
    ] {
        assert!(summary[field].as_f64().is_some(), "{field} missing: {summary}");
    }
}
