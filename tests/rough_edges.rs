//! Issue 17's rough edges, as a new user meets them: an error is printed
//! once, with its causes and without a backtrace unless asked (even with
//! `RUST_BACKTRACE=1`), paths keep their leading `/`; a plain absolute
//! path is a local source; a view naming columns the file lacks says what
//! the file has; `ssd_dir` without `ssd_bytes` is refused, not a silent
//! 64 GiB reservation.

use granary_client::ChunkSource;
use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::NodeProcess;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_granary");

/// `granary node --config CONFIG` run to its (failing) end: its stderr.
fn node_fails(config: &Path) -> String {
    let out = Command::new(BIN)
        .args(["node", "--config"])
        .arg(config)
        .env("RUST_BACKTRACE", "1")
        .env("GRANARY_LOG", "error")
        .output()
        .expect("run granary node");
    assert!(!out.status.success(), "the node started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A generated dataset in `dir/data` and its view in `dir/view.toml`.
fn dataset(dir: &Path, seed: u64, rows: u64, files: u32) -> (std::path::PathBuf, std::path::PathBuf) {
    let data = dir.join("data");
    let spec = GenSpec { seed, rows, files, row_group_rows: 1_000, ..GenSpec::default() };
    datagen::generate(&data, &spec, |_| {}).expect("generate");
    let view = dir.join("view.toml");
    std::fs::write(&view, datagen::VIEW_TOML).expect("view");
    (data, view)
}

fn node_toml(socket: &Path, source: &str, view: &Path, extra: &str) -> String {
    format!(
        "socket = {socket:?}\nram_bytes = {}\n{extra}\n[[dataset]]\nname = \"ads\"\nsource = \"{source}\"\nview = {view:?}\n",
        64 << 20
    )
}

#[test]
fn an_error_is_printed_once_with_its_causes_and_no_backtrace() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let missing = tmp.path().join("nope").join("node.toml");
    let err = node_fails(&missing);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines[0].starts_with("error: ") && lines[0].contains(&*missing.display().to_string()), "{err}");
    assert!(!err.contains("Caused by") && !err.contains("backtrace") && !err.contains("Error: "), "{err}");
    let mut seen = std::collections::BTreeSet::new();
    assert!(lines.iter().all(|l| seen.insert(*l)), "a line repeats:\n{err}");
    assert!(lines.len() <= 3, "{err}");
}

#[test]
fn a_plain_absolute_path_is_a_local_source_and_missing_columns_say_what_the_file_has() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, view) = dataset(tmp.path(), 4, 2_000, 1);
    let socket = tmp.path().join("node.sock");
    let config = tmp.path().join("node.toml");
    // `source = "/abs/path/"`: served like file:///abs/path/.
    std::fs::write(&config, node_toml(&socket, &format!("{}/", data.display()), &view, "")).expect("config");
    let node =
        NodeProcess::spawn(Path::new(BIN), &config, &socket, &tmp.path().join("node.log"), Duration::from_secs(60))
            .expect("a node with a plain absolute path as its source starts");
    let info = granary_client::LocalSource::connect(&socket)
        .expect("connect")
        .describe("ads", None)
        .expect("the dataset is served");
    assert_eq!(info.shards.iter().map(|s| s.rows).sum::<u64>(), 2_000);
    drop(node);

    // A zero-padded pattern over unpadded names: the error names the file
    // with its leading slash and says how the names are written.
    let padded = tmp.path().join("padded.toml");
    std::fs::write(&padded, datagen::VIEW_TOML.replace("f{0..150}", "f{000..150}")).expect("view");
    std::fs::write(&config, node_toml(&socket, &format!("file://{}/", data.display()), &padded, "")).expect("config");
    let err = node_fails(&config);
    assert!(err.contains(&format!("{}/part-00000.parquet", data.display())), "no absolute file path:\n{err}");
    assert!(err.contains("column \"f000\"") && err.contains("the file has f0: its names are not zero-padded"), "{err}");
    assert!(err.contains("f{0..150}"), "{err}");

    // A relative path is neither: the error shows the forms.
    std::fs::write(&config, node_toml(&socket, "data/", &view, "")).expect("config");
    let err = node_fails(&config);
    assert!(err.contains("nor an absolute path") && err.contains("s3://"), "{err}");
}

#[test]
fn an_ssd_folder_without_a_size_is_refused_before_anything_is_reserved() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let ssd = tmp.path().join("ssd");
    let config = tmp.path().join("node.toml");
    let extra = format!("ssd_dir = {ssd:?}");
    std::fs::write(&config, node_toml(&tmp.path().join("s.sock"), "/nowhere/", &tmp.path().join("v.toml"), &extra))
        .expect("config");
    let err = node_fails(&config);
    assert!(err.contains("ssd_dir is set without ssd_bytes"), "{err}");
    assert!(!ssd.exists() || std::fs::read_dir(&ssd).expect("ssd").next().is_none(), "something was reserved");
}

#[test]
fn view_check_resolves_a_view_against_a_source_with_no_cluster() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, view) = dataset(tmp.path(), 5, 3_000, 2);
    let check = |view: &Path, json: bool| {
        let mut c = Command::new(BIN);
        c.args(["view", "check", "--source"]).arg(&data).arg("--view").arg(view).env("RUST_BACKTRACE", "0");
        if json {
            c.arg("--json");
        }
        c.output().expect("run granary view check")
    };
    let out = check(&view, true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["files"], 2);
    assert_eq!(v["first_row_groups"], 2);
    let dense = &v["tensors"][0];
    assert_eq!((dense["name"].as_str(), dense["dtype"].as_str()), (Some("dense"), Some("f32")));
    assert_eq!(dense["shape"], serde_json::json!([150]));
    assert_eq!(dense["columns"].as_array().map(Vec::len), Some(150));
    assert_eq!(v["row_bytes"], 150 * 4 + 32 * 4 + 2 * 8 + 4);
    // For people: one line per tensor.
    let out = check(&view, false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("2 Parquet files") && text.contains("f0 .. f149 (150 columns)"), "{text}");
    // A view that does not fit: the error, with what the file has.
    let bad = tmp.path().join("bad.toml");
    std::fs::write(&bad, datagen::VIEW_TOML.replace("f{0..150}", "f{1..151}")).expect("view");
    let out = check(&bad, false);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("column \"f150\"") && err.contains("run from f0 to f149"), "{err}");
}

/// Issue 30: list and byte columns resolve to jagged tensors, shown as
/// `[*]`, with their rows' lengths in the first row group.
#[test]
fn view_check_shows_jagged_tensors_and_their_lengths() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let spec =
        datagen::GenSpec { seed: 4, rows: 4_000, files: 1, row_group_rows: 2_000, jagged: true, ..Default::default() };
    datagen::generate(&data, &spec, |_| {}).expect("generate");
    let view = tmp.path().join("view.toml");
    let text = "[[tensor]]\nname = \"hist\"\ndtype = \"i64\"\ncolumns = [\"hist\"]\n\n\
                [[tensor]]\nname = \"blob\"\ndtype = \"u8\"\ncolumns = [\"blob\"]\n\n\
                [[tensor]]\nname = \"blob_id\"\ndtype = \"i64\"\ncolumns = [\"blob\"]\nhash = { buckets = 1000 }\n\n\
                [[tensor]]\nname = \"label_log\"\ndtype = \"f32\"\ncolumns = [\"label\"]\ntransform = [\"log1p\"]\n";
    std::fs::write(&view, text).expect("view");
    let run = |json: bool| {
        let mut c = Command::new(BIN);
        c.args(["view", "check", "--source"]).arg(&data).arg("--view").arg(&view);
        if json {
            c.arg("--json");
        }
        c.output().expect("run granary view check")
    };
    let out = run(true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let hist = &v["tensors"][0];
    assert_eq!((hist["jagged"].as_bool(), hist["shape"].clone()), (Some(true), serde_json::json!([])));
    let want: Vec<u64> = (0..2_000).map(|r| datagen::hist_row(4, r).len() as u64).collect();
    assert_eq!(hist["lengths"]["rows"], 2_000);
    assert_eq!(hist["lengths"]["max"].as_u64(), want.iter().max().copied());
    let blob = &v["tensors"][1]["lengths"];
    assert!(blob["max"].as_u64().is_some_and(|m| m <= datagen::MAX_BLOB as u64), "{blob}");
    assert_eq!(v["row_bytes"], 16 + 8 + 4, "8 bytes of row offset a jagged tensor, an id, a float");
    assert_eq!(v["tensors"][2]["computed"], "hash into 1000");
    assert_eq!(v["tensors"][3]["computed"], "log1p");
    assert!(v["tensors"][0].get("computed").is_none());
    let text = String::from_utf8_lossy(&run(false).stdout).to_string();
    assert!(text.contains("hist             i64    [*]"), "{text}");
    assert!(text.contains("blob: bytes a row in the first row group (2000 rows)"), "{text}");
    assert!(text.contains("blob_id          i64    []       blob (hash into 1000)"), "{text}");
}

#[test]
fn a_node_serves_its_good_datasets_and_says_why_a_bad_one_is_not_served() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, view) = dataset(tmp.path(), 6, 2_000, 1);
    let bad = tmp.path().join("bad.toml");
    std::fs::write(&bad, datagen::VIEW_TOML.replace("\"label\"", "\"clicked\"")).expect("view");
    let socket = tmp.path().join("node.sock");
    let config = tmp.path().join("node.toml");
    let metrics = granary_testkit::harness::reserve_tcp_port().expect("port");
    let mut toml = node_toml(&socket, &format!("{}/", data.display()), &view, &format!("metrics = \"{metrics}\""));
    toml += &format!("\n[[dataset]]\nname = \"broken\"\nsource = \"{}/\"\nview = {bad:?}\n", data.display());
    std::fs::write(&config, toml).expect("config");
    let log = tmp.path().join("node.log");
    let _node = NodeProcess::spawn(Path::new(BIN), &config, &socket, &log, Duration::from_secs(60))
        .expect("one bad dataset does not stop the node");
    let source = granary_client::LocalSource::connect(&socket).expect("connect");
    assert!(source.describe("ads", None).is_ok(), "the good dataset is served");
    let e = source.describe("broken", None).expect_err("the bad one is not").to_string();
    assert!(e.contains("\"broken\" is configured on this node but could not be opened"), "{e}");
    assert!(e.contains("column \"clicked\"") && e.contains("no such column"), "{e}");
    let logged = std::fs::read_to_string(&log).expect("log");
    assert!(logged.contains("dataset not served") && logged.contains("broken"), "{logged}");
    // And its metrics: served and failed datasets.
    let mut s = std::net::TcpStream::connect(metrics).expect("metrics endpoint");
    std::io::Write::write_all(&mut s, b"GET /metrics HTTP/1.0\r\n\r\n").expect("ask");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut s, &mut text).expect("answer");
    assert!(text.contains("granary_node_dataset_failed{dataset=\"broken\"} 1"), "{text}");
    assert!(text.contains("granary_node_dataset_served{dataset=\"ads\""), "{text}");
}

/// `--log-format json`: every line the node writes is one JSON object, and
/// a load's lines carry the dataset, version and shard of the span they
/// are in (the spans GRANARY_LOG lets through, RUST_LOG's syntax).
#[test]
fn json_logs_carry_each_loads_dataset_version_and_shard() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, view) = dataset(tmp.path(), 4, 2_000, 1);
    let socket = tmp.path().join("node.sock");
    let config = tmp.path().join("node.toml");
    std::fs::write(&config, node_toml(&socket, &format!("{}/", data.display()), &view, "")).expect("config");
    let log = tmp.path().join("node.log");
    let mut node = std::process::Command::new(BIN)
        .args(["--log-format", "json", "node", "--config"])
        .arg(&config)
        .env("GRANARY_LOG", "info,granary_node::service=debug")
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start the node");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let source = loop {
        if let Ok(s) = granary_client::LocalSource::connect(&socket) {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "the node did not serve");
        std::thread::sleep(Duration::from_millis(20));
    };
    let info = source.describe("ads", None).expect("describe");
    for s in &info.shards {
        source.fetch(info.version, s.shard).expect("fetch");
    }
    let _ = node.kill();
    let _ = node.wait();
    let text = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let converted: Vec<&serde_json::Value> =
        lines.iter().filter(|l| l["fields"]["message"] == "shard converted").collect();
    assert_eq!(converted.len(), info.shards.len(), "{text}");
    for line in converted {
        let load = line["spans"].as_array().and_then(|s| s.iter().find(|s| s["name"] == "load")).expect("a load span");
        assert_eq!(load["dataset"], "ads", "{line}");
        assert_eq!(load["version"], info.version.to_string(), "{line}");
        assert!(load["shard"].as_str().is_some_and(|s| !s.is_empty()), "{line}");
    }
}

/// Every tensor byte of one batch, hashed.
fn digest(b: &granary_client::Batch) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for i in 0..b.layouts().len() {
        h.update(b.tensor_bytes(i));
    }
    h.digest()
}

/// A trainer whose node is killed and started again mid-epoch goes on: its
/// connection reconnects, announces its plan again and repeats the fetch,
/// and the epoch's batches are those of an epoch without the restart. A
/// node that does not come back within the reconnect time is an error
/// naming its socket.
#[test]
fn a_trainer_reads_on_through_a_node_restart() {
    use granary_client::{ClientError, Loader, LoaderConfig};
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, view) = dataset(tmp.path(), 8, 6_000, 2);
    let socket = tmp.path().join("node.sock");
    let config = tmp.path().join("node.toml");
    std::fs::write(&config, node_toml(&socket, &format!("{}/", data.display()), &view, "")).expect("config");
    let spawn = |log: &str| {
        NodeProcess::spawn(Path::new(BIN), &config, &socket, &tmp.path().join(log), Duration::from_secs(60))
            .expect("node")
    };
    let node = spawn("node-1.log");
    // No chunks kept mapped by the trainer: every batch asks the node.
    let cfg = LoaderConfig { seed: 5, mapping_cache_bytes: 0, prefetch_batches: 1, ..LoaderConfig::new("ads", 250) };
    let reference: Vec<u64> = Loader::connect(&socket, cfg.clone())
        .expect("loader")
        .epoch(0)
        .expect("epoch")
        .map(|b| digest(&b.expect("batch")))
        .collect();
    assert_eq!(reference.len(), 24);

    let loader = Loader::connect(&socket, cfg.clone()).expect("loader");
    let mut epoch = loader.epoch(0).expect("epoch");
    let mut got: Vec<u64> = epoch.by_ref().take(5).map(|b| digest(&b.expect("batch"))).collect();
    node.stop();
    let node = std::thread::scope(|scope| {
        let restarted = scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(800));
            spawn("node-2.log")
        });
        got.extend(epoch.map(|b| digest(&b.expect("the epoch goes on after the node restarts"))));
        restarted.join().expect("restart")
    });
    assert_eq!(got, reference, "the same batches as without the restart");
    // Issue 48: the stall is counted where a trainer can see it.
    let stalls = loader.stalls();
    assert!(stalls.reconnects >= 1 && stalls.waited > Duration::ZERO, "{stalls:?}");
    let logged = std::fs::read_to_string(tmp.path().join("node-2.log")).expect("log");
    assert!(logged.contains("serving dataset"), "the node did restart:\n{logged}");

    // Gone for good: the error names the socket and says how long it waited.
    let short = LoaderConfig { reconnect: Duration::from_millis(600), ..cfg };
    let loader = Loader::connect(&socket, short).expect("loader");
    let mut epoch = loader.epoch(0).expect("epoch");
    epoch.next().expect("a batch").expect("batch");
    node.stop();
    let err = epoch.find_map(Result::err).expect("the epoch fails once the node is gone");
    assert!(matches!(err, ClientError::NodeGone { .. }), "{err}");
    assert!(err.to_string().contains(&socket.display().to_string()) && err.is_retryable(), "{err}");
}

/// Issue 30: `granary demo --jagged` serves list and byte columns as
/// jagged tensors to every rank, and its replay (other prefetch, loader and
/// converter settings, a cold cache) delivers the same batches, offsets
/// and values, byte for byte. `--nodes 2` does the same through a cluster,
/// where each shard is read from remote storage once.
#[test]
fn the_jagged_demo_replays_byte_identically() {
    for nodes in ["1", "2"] {
        let out = Command::new(BIN)
            .args(["demo", "--jagged", "--json", "--rows", "12000", "--files", "2", "--row-group-rows", "2000"])
            .args(["--epochs", "2", "--ranks", "2", "--batch-size", "256", "--latency-ms", "1", "--nodes", nodes])
            .env("GRANARY_LOG", "warn")
            .output()
            .expect("run granary demo");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "demo --nodes {nodes} failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<serde_json::Value> =
            stdout.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
        let summary = lines.iter().find(|v| v["event"] == "summary").expect("a summary line");
        assert_eq!(summary["deterministic"], true, "{summary}");
        let epochs: Vec<&serde_json::Value> = lines.iter().filter(|v| v["event"] == "epoch").collect();
        assert_eq!(epochs.len(), 2);
        for e in &epochs {
            assert_eq!(e["rows"], 12_000, "every row once per epoch: {e}");
        }
        // Each shard read once (the files' bytes, less the bytes no row
        // group or footer covers).
        let last = epochs[1];
        let read = last["remote_bytes"].as_f64().expect("remote") / last["source_bytes"].as_f64().expect("source");
        assert!((0.98..=1.01).contains(&read), "each shard read once: {last}");
    }
}

/// Issue 32: `granary demo --elastic` runs a job of the global plan on 4
/// ranks, resumes it on 2 from a saved state, then on 3, through a real
/// node daemon (then a cluster of two) and trainer processes: every row of
/// the epoch comes exactly once, and every global step holds the 1-rank
/// run's rows in its order.
#[test]
fn the_elastic_demo_keeps_one_global_order_across_world_sizes() {
    // One node daemon, then a coordinator and two node daemons (the ranks
    // of each phase spread over them).
    for nodes in ["1", "2"] {
        let out = Command::new(BIN)
            .args(["demo", "--elastic", "--json", "--rows", "30000", "--files", "3", "--row-group-rows", "1500"])
            .args(["--global-batch", "600", "--partitions", "3", "--latency-ms", "1", "--nodes", nodes])
            .env("GRANARY_LOG", "warn")
            .output()
            .expect("run granary demo --elastic");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "demo --elastic --nodes {nodes} failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary: serde_json::Value = stdout
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
            .find(|v| v["scenario"] == "summary")
            .expect("a summary line");
        assert_eq!(summary["exactly_once"], 1, "{summary}");
        assert_eq!(summary["same_global_order"], 1, "{summary}");
        assert_eq!(summary["rows_delivered"], 30_000, "{summary}");
        assert_eq!(summary["steps"], 50, "{summary}");
    }
    // A global batch the demo's world sizes cannot split is refused by name.
    let out = Command::new(BIN)
        .args(["demo", "--elastic", "--rows", "3000", "--global-batch", "1000"])
        .output()
        .expect("run granary demo --elastic");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--global-batch 1000 must be divisible"));
}

/// Issue 48: a command whose reader goes away (`granary status | head
/// -1`) ends quietly, never with a panic. The reading end is closed before
/// the command prints, so every run meets the closed pipe.
#[test]
fn printing_into_a_closed_pipe_never_panics() {
    use granary_testkit::harness::{LocalCluster, LocalClusterSpec};
    use std::os::unix::process::ExitStatusExt;
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, _) = dataset(tmp.path(), 48, 2_000, 1);
    let spec = LocalClusterSpec { nodes: 1, prefetch_bytes: 0, ..LocalClusterSpec::default() };
    let c = LocalCluster::start(Path::new(BIN), &tmp.path().join("cluster"), &data, spec).expect("cluster");
    let admin = |args: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        a.extend(["--cert-name", "admin", "--coordinators"].map(String::from));
        a.push(c.coordinators().join(","));
        a.push("--certs".into());
        a.push(c.certs().display().to_string());
        a
    };
    let socket = c.socket(1).display().to_string();
    let commands = [
        admin(&["status"]),
        admin(&["status", "--json"]),
        admin(&["dataset", "ls"]),
        vec!["stats".into(), "--socket".into(), socket.clone()],
        vec!["stats".into(), "--json".into(), "--socket".into(), socket],
    ];
    for args in &commands {
        for _ in 0..5 {
            let mut child = Command::new(BIN)
                .args(args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn");
            drop(child.stdout.take());
            let out = child.wait_with_output().expect("wait");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!stderr.contains("panicked"), "granary {}: {stderr}", args.join(" "));
            let quiet = out.status.signal() == Some(libc::SIGPIPE) || out.status.code() == Some(141);
            assert!(quiet, "granary {}: {:?}\n{stderr}", args.join(" "), out.status);
        }
    }
}

/// Issue 48: a second daemon started with a live node's identity (its
/// certificate and node id, from another address) is refused by the
/// coordinators; once the refusals outlast any former self's lease it
/// exits non-zero saying why, so an orchestrator sees it. The first node
/// serves on.
#[test]
fn a_second_daemon_with_a_live_nodes_identity_exits_non_zero() {
    use granary_testkit::harness::{LocalCluster, LocalClusterSpec, reserve_udp_port};
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, _) = dataset(tmp.path(), 49, 2_000, 1);
    let spec = LocalClusterSpec { nodes: 1, prefetch_bytes: 0, ..LocalClusterSpec::default() };
    let c = LocalCluster::start(Path::new(BIN), &tmp.path().join("cluster"), &data, spec).expect("cluster");
    let first = std::fs::read_to_string(c.node_dir(1).join("node.toml")).expect("node 1's config");
    let other = reserve_udp_port().expect("port").to_string();
    let copy = tmp.path().join("copy");
    std::fs::create_dir_all(&copy).expect("dir");
    let second = first
        .replace(&c.socket(1).display().to_string(), &copy.join("node.sock").display().to_string())
        .replace(&c.peer_addr(1).to_string(), &other);
    assert!(second.contains(&other) && !second.contains(&c.peer_addr(1).to_string()), "{second}");
    let config = copy.join("node.toml");
    std::fs::write(&config, second).expect("config");
    let start = std::time::Instant::now();
    let mut child = Command::new(BIN)
        .args(["node", "--config"])
        .arg(&config)
        .env("GRANARY_LOG", "warn")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("the second daemon kept running\n{}", c.log_tails());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().expect("stderr"), &mut stderr).expect("stderr");
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("error: this node cannot be in the cluster"), "{stderr}");
    assert!(stderr.contains("is live at"), "the refusal names where it is live: {stderr}");
    // The first node serves on.
    let info = granary_client::LocalSource::connect(c.socket(1)).and_then(|s| s.describe("ads", None));
    assert!(info.is_ok(), "{info:?}");
}
