//! Metrics: a coordinator voter and two nodes serve Prometheus metrics
//! while a trainer reads, and Debian's real `prometheus` server scrapes
//! them; its query API then shows the counters that moved.

use granary_client::{ChunkSource, LocalSource};
use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::{LocalCluster, LocalClusterSpec, reserve_tcp_port};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_granary");

/// The body of `GET path` at `addr` (HTTP/1.0: no chunked answer).
fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let (head, body) = out.split_once("\r\n\r\n").ok_or_else(|| anyhow::anyhow!("no HTTP answer: {out}"))?;
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((status, body.to_string()))
}

/// The value of the sample `name` (whole line prefix, labels included).
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.split_whitespace().next()?.parse().ok())
}

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Percent-encodes a PromQL query for a URL.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The first value of `query` at the Prometheus server at `addr`, if any.
fn query(addr: SocketAddr, q: &str) -> anyhow::Result<Option<f64>> {
    let (status, body) = get(addr, &format!("/api/v1/query?query={}", encode(q)))?;
    anyhow::ensure!(status == 200, "query {q}: HTTP {status}: {body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    Ok(v["data"]["result"][0]["value"][1].as_str().and_then(|s| s.parse().ok()))
}

#[test]
fn a_real_prometheus_scrapes_a_node_and_a_coordinator() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("data");
    let spec = GenSpec { seed: 3, rows: 6_000, files: 2, row_group_rows: 1_000, ..GenSpec::default() };
    datagen::generate(&data, &spec, |_| {})?;
    let cluster_spec = LocalClusterSpec { nodes: 2, prefetch_bytes: 0, metrics: true, ..LocalClusterSpec::default() };
    let c = LocalCluster::start(Path::new(BIN), &tmp.path().join("cluster"), &data, cluster_spec)?;
    let src = LocalSource::connect(c.socket(1))?;
    let info = src.describe("ads", None)?;
    for s in &info.shards {
        src.fetch(info.version, s.shard)?;
    }
    let node = c.node_metrics(1).expect("metrics asked for");
    let voter = c.voter_metrics(1).expect("metrics asked for");

    // The endpoints themselves.
    let (status, text) = get(node, "/metrics")?;
    assert_eq!(status, 200, "{text}");
    let fetched = info.shards.len() as f64;
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
    let asked = sample(&text, "granary_node_chunk_request_seconds_count{dataset=\"ads\"}");
    assert_eq!(asked, Some(fetched), "one timed request per fetch:\n{text}");
    let hits_and_loads = ["ram_hits", "misses", "joined", "guest_hits"]
        .iter()
        .filter_map(|n| sample(&text, &format!("granary_node_{n}_total")))
        .sum::<f64>();
    assert!(hits_and_loads >= fetched, "every request counted as a hit or a load:\n{text}");
    assert!(
        text.contains(&format!("granary_node_dataset_served{{dataset=\"ads\",version=\"{}\"}} 1", info.version)),
        "{text}"
    );
    assert!(sample(&text, "granary_node_prefetch_in_flight").is_some(), "{text}");
    // Issue 48: what an SRE expects of any process, and the node's memory
    // shares.
    assert!(sample(&text, "process_resident_memory_bytes").is_some_and(|b| b > 1e6), "{text}");
    assert!(sample(&text, "process_open_fds").is_some_and(|n| n > 0.0), "{text}");
    assert!(sample(&text, "process_cpu_seconds_total").is_some(), "{text}");
    assert!(text.contains("granary_build_info{role=\"node\",version=\""), "{text}");
    assert!(sample(&text, "granary_node_tiers_capacity_bytes").is_some_and(|b| b > 0.0), "{text}");
    assert!(sample(&text, "granary_node_load_budget_bytes").is_some_and(|b| b > 0.0), "{text}");
    assert!(sample(&text, "granary_node_loaders").is_some(), "{text}");
    let (status, text) = get(voter, "/metrics")?;
    assert_eq!(status, 200, "{text}");
    assert_eq!(sample(&text, "granary_coordinator_is_leader"), Some(1.0), "{text}");
    assert!(text.contains("granary_build_info{role=\"coordinator\",version=\""), "{text}");
    assert!(sample(&text, "process_resident_memory_bytes").is_some_and(|b| b > 1e6), "{text}");
    assert!(sample(&text, "granary_coordinator_term").is_some_and(|t| t >= 1.0), "{text}");
    assert_eq!(sample(&text, "granary_coordinator_node_live{node=\"1\"}"), Some(1.0), "{text}");
    assert!(sample(&text, "granary_coordinator_node_lease_left_seconds{node=\"2\"}").is_some(), "{text}");
    let registered = sample(&text, "granary_coordinator_api_requests_total{kind=\"register-node\",result=\"ok\"}");
    assert!(registered.is_some_and(|n| n >= 2.0), "{text}");
    assert_eq!(get(node, "/nothing")?.0, 404);

    // A real Prometheus server scrapes both.
    let Some(prometheus) =
        ["/usr/bin/prometheus", "/usr/local/bin/prometheus"].into_iter().find(|p| Path::new(p).exists())
    else {
        granary_testkit::skip::skipped(
            "the prometheus server is not installed (Debian package prometheus): its scrape is not checked",
        );
        return Ok(());
    };
    let web = reserve_tcp_port()?;
    let config = tmp.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: node\n    static_configs:\n      - targets: ['{node}']\n  - job_name: coordinator\n    static_configs:\n      - targets: ['{voter}']\n"
        ),
    )?;
    let log = std::fs::File::create(tmp.path().join("prometheus.log"))?;
    let _server = Prometheus(
        Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", tmp.path().join("tsdb").display()))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let wanted = [
        ("granary_node_conversions_total", 1.0),
        ("sum(granary_node_chunk_request_seconds_count{dataset=\"ads\"})", fetched),
        ("granary_coordinator_is_leader", 1.0),
        ("sum(granary_coordinator_api_requests_total{kind=\"heartbeat\"})", 1.0),
        ("min(up)", 1.0),
    ];
    for (q, at_least) in wanted {
        loop {
            let got = query(web, q).ok().flatten();
            if got.is_some_and(|v| v >= at_least) {
                break;
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(tmp.path().join("prometheus.log")).unwrap_or_default();
                let tail: String = log.lines().rev().take(20).collect::<Vec<_>>().join("\n");
                anyhow::bail!(
                    "prometheus: {q} = {got:?}, wanted at least {at_least} within 60 s; its log ends:\n{tail}"
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    Ok(())
}

/// Polls `GET path` at `addr` until its status is `want`; the last body.
fn until_status(addr: SocketAddr, path: &str, want: u16, what: &str, c: &LocalCluster) -> String {
    let start = Instant::now();
    loop {
        match get(addr, path) {
            Ok((status, body)) if status == want => return body,
            other => assert!(
                start.elapsed() < Duration::from_secs(60),
                "{what}: {path} at {addr} answered {other:?}\n{}",
                c.log_tails()
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 48: a node's `/readyz` says why it is not ready while its
/// coordinators are down, and passes once it has joined; `/healthz`
/// answers all along. Meanwhile a trainer is told the node has not joined
/// (retryable), and a loader started first gets its batches once it has. A voter is ready once it knows a leader. When two
/// of three voters die, the third's `/readyz` says it knows no leader (or,
/// leading, that no quorum answers it) and the node's that its lease ran
/// out.
#[test]
fn readiness_follows_the_cluster_not_the_process() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("data");
    let spec = GenSpec { seed: 4, rows: 2_000, files: 1, row_group_rows: 500, ..GenSpec::default() };
    datagen::generate(&data, &spec, |_| {})?;
    let cluster_spec =
        LocalClusterSpec { nodes: 1, voters: 3, prefetch_bytes: 0, metrics: true, ..LocalClusterSpec::default() };
    // The dataset is registered, then every voter stops: the node starts
    // while its coordinators are down.
    let mut c = LocalCluster::prepare(Path::new(BIN), &tmp.path().join("cluster"), &data, cluster_spec)?;
    for id in c.voter_ids() {
        c.kill_voter(id);
    }
    c.start_node(1)?;
    let node = c.node_metrics(1).expect("metrics asked for");
    let (alive, text) = get(node, "/healthz")?;
    assert_eq!((alive, text.as_str()), (200, "alive\n"));
    let (status, why) = get(node, "/readyz")?;
    assert_eq!(status, 503, "no voter runs: {why}");
    assert_eq!(why, "not ready: not registered with the coordinators yet\n");
    // A trainer started before the node joined: its loader waits, then
    // reads every row once the node has joined.
    let socket = c.socket(1).to_path_buf();
    let trainer = std::thread::spawn(move || -> Result<u64, granary_client::ClientError> {
        let cfg = granary_client::LoaderConfig { seed: 1, ..granary_client::LoaderConfig::new("ads", 250) };
        let loader = granary_client::Loader::connect(&socket, cfg)?;
        let mut rows = 0;
        for batch in loader.epoch(0)? {
            rows += batch?.rows() as u64;
        }
        Ok(rows)
    });
    // Asked directly, the node says it has not joined, and that is
    // retryable (it said "not served here", not retryable, before).
    let err = LocalSource::connect(c.socket(1))?.describe("ads", None).expect_err("not joined");
    assert!(err.is_retryable(), "{err}");
    assert!(
        err.to_string().contains("this node is not in the cluster yet (not registered with the coordinators yet)"),
        "{err}"
    );

    for id in c.voter_ids() {
        c.start_voter(id)?;
    }
    let ready = until_status(node, "/readyz", 200, "the node joins", &c);
    assert!(ready.starts_with("ready: in the cluster, placement epoch "), "{ready}");
    let rows = trainer.join().expect("trainer thread").unwrap_or_else(|e| panic!("{e}\n{}", c.log_tails()));
    assert_eq!(rows, 2_000, "every row, once the node joined");
    // Its standing in the metrics and in `granary stats`.
    let (_, text) = get(node, "/metrics")?;
    assert_eq!(sample(&text, "granary_node_registered"), Some(1.0), "{text}");
    assert!(sample(&text, "granary_node_lease_left_seconds").is_some_and(|s| s > 0.0), "{text}");
    let stats = Command::new(BIN).args(["stats", "--socket"]).arg(c.socket(1)).output()?;
    let stats = String::from_utf8_lossy(&stats.stdout);
    assert!(stats.contains("cluster         registered, lease "), "{stats}");
    let voter = c.voter_metrics(1).expect("metrics asked for");
    let ready = until_status(voter, "/readyz", 200, "voter 1 knows a leader", &c);
    assert!(ready.starts_with("ready: voter 1, ") && ready.ends_with("of 3 voters\n"), "{ready}");

    c.kill_voter(2);
    c.kill_voter(3);
    let why = until_status(voter, "/readyz", 503, "the last voter loses its quorum", &c);
    // Voter 1 led (it knows no quorum) or followed (it knows no leader).
    assert!(why.contains("knows no leader") || why.contains("no quorum of the 3 voters"), "{why}");
    let why = until_status(node, "/readyz", 503, "the node's lease runs out", &c);
    assert!(why.starts_with("not ready: the lease ran out "), "{why}");
    assert_eq!(get(node, "/healthz")?.0, 200, "alive all along");
    Ok(())
}
