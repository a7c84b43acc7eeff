//! `granary doctor` names the stage that bounds a running job: each
//! verdict provoked on a real node daemon with a trainer reading from it
//! (a slow trainer, slow assembly, a slow remote link, slow conversion).

use granary_client::{Loader, LoaderConfig};
use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::NodeProcess;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_granary");

/// 40,000 rows in 2 files of 2,000-row row groups (20 shards of ~1.5 MB).
fn dataset(dir: &Path, compression: &str) -> (PathBuf, PathBuf) {
    let data = dir.join("data");
    let spec = GenSpec {
        seed: 9,
        rows: 40_000,
        files: 2,
        row_group_rows: 2_000,
        compression: compression.into(),
        ..GenSpec::default()
    };
    datagen::generate(&data, &spec, |_| {}).expect("generate");
    let view = dir.join("view.toml");
    std::fs::write(&view, datagen::VIEW_TOML).expect("view");
    (data, view)
}

struct Job {
    stop: Arc<AtomicBool>,
    trainer: Option<std::thread::JoinHandle<()>>,
    _node: NodeProcess,
    socket: PathBuf,
}

impl Drop for Job {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.trainer.take() {
            let _ = t.join();
        }
    }
}

/// A node with `settings` (node.toml lines) and one trainer reading epoch
/// after epoch, sleeping `step` per batch; `warm` epochs first.
fn job(dir: &Path, compression: &str, settings: &str, cfg: LoaderConfig, step: Duration, warm: u64) -> Job {
    let (data, view) = dataset(dir, compression);
    let socket = dir.join("node.sock");
    let config = dir.join("node.toml");
    std::fs::write(
        &config,
        format!(
            "socket = {socket:?}\n{settings}\n[[dataset]]\nname = \"ads\"\nsource = \"{}/\"\nview = {view:?}\n",
            data.display()
        ),
    )
    .expect("config");
    let node = NodeProcess::spawn(Path::new(BIN), &config, &socket, &dir.join("node.log"), Duration::from_secs(60))
        .expect("node");
    let loader = Loader::connect(&socket, cfg).expect("loader");
    for e in 0..warm {
        for b in loader.epoch(e).expect("epoch") {
            b.expect("batch");
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let running = stop.clone();
    let trainer = std::thread::spawn(move || {
        for e in warm.. {
            for b in loader.epoch(e).expect("epoch") {
                b.expect("batch");
                if running.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(step);
            }
        }
    });
    // Let the first reports reach the node.
    std::thread::sleep(Duration::from_millis(1500));
    Job { stop, trainer: Some(trainer), _node: node, socket }
}

/// `granary doctor --json` over 3 s: the stage, and the whole answer.
fn doctor(job: &Job) -> (String, serde_json::Value) {
    let out = std::process::Command::new(BIN)
        .args(["doctor", "--seconds", "3", "--json", "--socket"])
        .arg(&job.socket)
        .output()
        .expect("run granary doctor");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    (d["stage"].as_str().unwrap_or_default().to_string(), d)
}

fn cfg(batch: u32, threads: usize, mapping_cache_bytes: u64) -> LoaderConfig {
    LoaderConfig { assembly_threads: threads, mapping_cache_bytes, ..LoaderConfig::new("ads", batch) }
}

#[test]
fn a_trainer_slower_than_its_batches_is_the_verdict() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let j = job(tmp.path(), "snappy", "ram_bytes = 268435456", cfg(1024, 2, 1 << 30), Duration::from_millis(20), 1);
    let (stage, d) = doctor(&j);
    assert_eq!(stage, "trainer", "{d:#}");
    assert!(d["verdict"].as_str().is_some_and(|v| v.contains("rank 0")), "{d:#}");
    assert!(d["ranks"][0]["training"].as_f64().is_some_and(|t| t > 0.75), "{d:#}");
}

#[test]
fn a_loader_busy_assembling_is_the_verdict() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let j = job(tmp.path(), "snappy", "ram_bytes = 268435456", cfg(1024, 1, 1 << 30), Duration::ZERO, 1);
    let (stage, d) = doctor(&j);
    assert_eq!(stage, "assembly", "{d:#}");
    assert!(d["advice"].as_str().is_some_and(|a| a.contains("assembly_threads (now 1)")), "{d:#}");
}

#[test]
fn a_slow_remote_link_is_the_verdict() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // 4 MB/s to a 30 MB dataset, a RAM tier of 8 MiB and no chunks kept
    // mapped by the trainer: every epoch reads the link.
    let settings =
        "ram_bytes = 8388608\nprefetch_bytes = 0\n[throttle]\nlatency_ms = 20\nbandwidth_bytes_per_s = 4000000\n";
    let j = job(tmp.path(), "snappy", settings, cfg(1024, 2, 0), Duration::ZERO, 0);
    let (stage, d) = doctor(&j);
    assert_eq!(stage, "remote_read", "{d:#}");
    let rate = d["node"]["remote_bytes_per_s"].as_f64().unwrap_or(0.0);
    assert!(rate > 1e6 && rate < 6e6, "read at about the link's 4 MB/s: {d:#}");
}

#[test]
fn slow_conversion_is_the_verdict_naming_the_threads() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // One converter thread for four loads, zstd pages, a small RAM tier.
    let settings = "ram_bytes = 8388608\nprefetch_bytes = 0\nconvert_threads = 1\nmax_concurrent_loads = 4\n";
    let j = job(tmp.path(), "zstd", settings, cfg(1024, 2, 0), Duration::ZERO, 0);
    let (stage, d) = doctor(&j);
    assert_eq!(stage, "conversion", "{d:#}");
    assert!(d["advice"].as_str().is_some_and(|a| a.contains("convert_threads = 1")), "{d:#}");
}
