//! `granary bench local --plot out.svg` draws the run it measured: a line
//! per scenario, the ceiling dashed, next to the usual JSON lines.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_granary");

#[test]
fn bench_local_plots_the_epochs_it_measured() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let svg = tmp.path().join("local.svg");
    let out = Command::new(BIN)
        .args(["bench", "local", "--rows", "20000", "--row-group-rows", "2000", "--epochs", "2", "--json", "--plot"])
        .arg(&svg)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run granary");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = String::from_utf8_lossy(&out.stdout);
    assert!(lines.lines().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()), "stdout stays JSON: {lines}");
    // The global plan's scenarios ran beside the rank plan's, and every
    // path (the global plan's through the daemon and in memory among them)
    // delivered the same bytes as its reference.
    let summary: serde_json::Value = serde_json::from_str(lines.lines().last().expect("a summary line")).expect("JSON");
    assert_eq!(summary["streams_identical"], true, "{summary}");
    assert!(summary["warm_global_vs_warm"].as_f64().is_some_and(|r| r > 0.0), "{summary}");
    assert!(summary["blocks_global_vs_blocks"].as_f64().is_some_and(|r| r > 0.0), "{summary}");
    let text = std::fs::read_to_string(&svg).expect("the plot");
    assert!(text.starts_with("<svg") && text.contains("</svg>"));
    for name in ["cold", "warm", "blocks", "naive", "ceiling (copy)"] {
        assert!(text.contains(name), "{name} is not in the plot");
    }

    // --ranks N has no epochs to draw: said at once.
    let out = Command::new(BIN)
        .args(["bench", "local", "--ranks", "2", "--plot"])
        .arg(&svg)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run granary");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("without --ranks"));
}
