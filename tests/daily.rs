//! A dataset that changes every day, on a cluster (issue 43): a new day's
//! version converts only the new day. Once every voter speaks
//! `granary-raft/2` the leader turns on owners that follow content, so
//! the new version's shards of the days it shares start on the nodes that
//! hold their chunks, which restamp them instead of reading and
//! converting again (`coordinator/src/inherit.rs`; the placement figures:
//! its state tests).

use granary_client::{ChunkSource, Loader, LoaderConfig, LocalSource};
use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::{LocalCluster, LocalClusterSpec};
use std::path::Path;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_granary");
const TIMEOUT: Duration = Duration::from_secs(120);
const ROWS_PER_DAY: u64 = 2_000;
const ROW_GROUPS_PER_DAY: u64 = 4;

/// Day `n`'s file under `data/day=n/`; its size.
fn write_day(data: &Path, n: u64) -> u64 {
    let dir = data.join(format!("day={n}"));
    let spec = GenSpec {
        seed: 100 + n,
        rows: ROWS_PER_DAY,
        files: 1,
        row_group_rows: ROWS_PER_DAY / ROW_GROUPS_PER_DAY,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    datagen::generate(&dir, &spec, |_| {}).expect("generate");
    std::fs::read_dir(&dir).expect("day").map(|e| e.expect("entry").metadata().expect("metadata").len()).sum()
}

fn until(what: &str, c: &LocalCluster, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < TIMEOUT, "{what}\n{}", c.log_tails());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every row of `version` read through node `id`'s one rank.
fn read_all(c: &LocalCluster, id: u64, version: granary_proto::DatasetVersion) -> u64 {
    let cfg = LoaderConfig { seed: 1, version: Some(version), ..LoaderConfig::new("ads", 500) };
    let loader = Loader::connect(c.socket(id), cfg).expect("loader");
    loader.epoch(0).expect("epoch").map(|b| b.expect("batch").rows() as u64).sum()
}

/// Three days on three nodes, read once; then a fourth day. The version
/// with four days converts only the fourth day's row groups: the other
/// twelve shards start on the nodes that converted them, which reuse
/// their chunks. Remote reads are the new day's file, not the dataset.
#[test]
fn a_new_day_on_a_cluster_converts_only_the_new_day() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    for n in 1..=3 {
        write_day(&data, n);
    }
    let spec = LocalClusterSpec { nodes: 3, prefetch_bytes: 0, ..LocalClusterSpec::default() };
    let mut c = LocalCluster::prepare(Path::new(BIN), &tmp.path().join("cluster"), &data, spec).expect("cluster");
    until("the leader turns on owners that follow content", &c, || c.status().is_ok_and(|s| s.content_owners));
    c.start_nodes().expect("nodes");
    let ids = c.node_ids();
    c.wait_placement(&ids, 3, 1, TIMEOUT).expect("placement");
    let v1 = LocalSource::connect(c.socket(1)).expect("connect").describe("ads", None).expect("describe").version;
    assert_eq!(read_all(&c, 1, v1), 3 * ROWS_PER_DAY);

    let before = c.total_stats().expect("stats");
    let tier_bytes = |c: &LocalCluster| -> u64 {
        ids.iter().map(|&id| c.stats(id).map(|s| s.chunk_memory_bytes - s.guest_bytes).expect("stats")).sum()
    };
    let tier_before = tier_bytes(&c);
    let day4 = write_day(&data, 4);
    c.add_dataset("ads", &data).expect("register the new day");
    let current = |id| LocalSource::connect(c.socket(id)).and_then(|s| s.describe("ads", None)).map(|i| i.version);
    until("every node serves the new day's version", &c, || ids.iter().all(|&id| current(id).is_ok_and(|v| v != v1)));
    let v2 = current(1).expect("v2");
    assert_eq!(read_all(&c, 1, v2), 4 * ROWS_PER_DAY);
    let after = c.total_stats().expect("stats");

    let converted = after.conversions - before.conversions;
    let read = after.remote_bytes - before.remote_bytes;
    assert_eq!(converted, ROW_GROUPS_PER_DAY, "only the new day's row groups are converted\n{}", c.log_tails());
    assert!(read <= day4, "{read} bytes read remotely for a new day of {day4} bytes");
    // The nodes count what they reused: the three shared days' shards.
    let reused: u64 = ids
        .iter()
        .map(|&id| {
            let counters = LocalSource::connect(c.socket(id)).and_then(|s| s.counters()).expect("counters");
            counters.iter().find(|(n, _)| n == "chunks_reused").map_or(0, |(_, v)| *v)
        })
        .sum();
    assert_eq!(reused, 3 * ROW_GROUPS_PER_DAY);
    // One copy of each content in the tiers: four days' chunks, not seven
    // (no trainer reads the first version any more).
    let tier_after = tier_bytes(&c);
    assert!(
        tier_after * 3 <= tier_before * 4 + tier_before / 10,
        "the tiers hold {tier_after} bytes after the new day, {tier_before} before: the old copies stayed"
    );
    let out = std::process::Command::new(BIN)
        .args(["stats", "--json", "--socket"])
        .arg(c.socket(1))
        .output()
        .expect("granary stats");
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(stats["counters"]["chunks_reused"].is_u64(), "{stats}");
}

/// `granary demo --daily --json`: the window moved by a day converts only
/// the new day, reads about its bytes, and the old version's job reads
/// nothing from the store and the same bytes.
#[test]
fn the_daily_demo_converts_only_the_new_day() {
    let out = std::process::Command::new(BIN)
        .args(["demo", "--daily", "--json", "--nodes", "2", "--days", "4", "--rows", "16000"])
        .args(["--row-group-rows", "2000", "--latency-ms", "1"])
        .env("GRANARY_LOG", "warn")
        .output()
        .expect("run granary demo --daily");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "demo --daily failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let summary: serde_json::Value = stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .find(|v| v["scenario"] == "daily")
        .expect("a summary line");
    assert_eq!(summary["converts_only_the_new_day"], 1, "{summary}");
    assert_eq!(summary["new_version_conversions"], 2, "{summary}");
    assert_eq!(summary["new_version_rows"], 16_000, "{summary}");
    assert_eq!((summary["old_job_remote_bytes"].as_u64(), summary["old_job_identical"].as_u64()), (Some(0), Some(1)));
    assert!(summary["new_version_remote_over_new_day"].as_f64().is_some_and(|r| r <= 1.02), "{summary}");
}

/// Bad windows are clear errors at `view check`, naming the source: one
/// that matches no file, and a brace left open.
#[test]
fn a_window_that_names_nothing_or_is_malformed_is_a_clear_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    write_day(&data, 1);
    let view = tmp.path().join("view.toml");
    std::fs::write(&view, granary_testkit::datagen::VIEW_TOML).expect("view");
    let check = |source: String| {
        let out = std::process::Command::new(BIN)
            .args(["view", "check", "--source", &source, "--view"])
            .arg(&view)
            .output()
            .expect("granary view check");
        assert!(!out.status.success(), "{source} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let ok = std::process::Command::new(BIN)
        .args(["view", "check", "--source", &format!("file://{}/day={{1..3}}/", data.display()), "--view"])
        .arg(&view)
        .output()
        .expect("granary view check");
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let none = check(format!("file://{}/day={{7..9}}/", data.display()));
    assert!(none.contains("day={7..9}/") && none.contains("no .parquet file"), "{none}");
    let open = check(format!("file://{}/day={{7..9/", data.display()));
    assert!(open.contains("a `{` without its `}`"), "{open}");
}
