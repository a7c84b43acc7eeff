//! `granary bench cluster` at a toy size: every scenario's JSON line comes
//! out, and the two jobs of issue 32 (the rank plan and the global plan, at
//! once on one cluster) cost the cluster one read and one conversion per
//! shard (the real sizes are in docs/BENCHMARKS.md).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_granary");

#[test]
fn two_jobs_on_one_cluster_read_and_convert_each_shard_once() {
    let out = Command::new(BIN)
        .args(["bench", "cluster", "--rows", "20000", "--row-group-rows", "2000", "--nodes", "2", "--epochs", "2"])
        .args(["--transfer-rounds", "1", "--bandwidth-mib", "50", "--latency-ms", "1", "--json"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run granary");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    let jobs = lines.iter().find(|l| l["scenario"] == "two_jobs").expect("a two_jobs line");
    assert_eq!(jobs["rows_per_epoch"], serde_json::json!([40_000, 40_000]), "both jobs got every row: {jobs}");
    assert_eq!(jobs["conversions_per_shard"], 1.0, "{jobs}");
    let read = jobs["remote_read_ratio"].as_f64().expect("remote_read_ratio");
    assert!(read <= 1.01, "each shard read once for both jobs: {jobs}");
    let summary = lines.last().expect("a summary line");
    assert_eq!(summary["scenario"], "summary");
    assert_eq!(summary["two_jobs_conversions_per_shard"], 1.0, "{summary}");
}
