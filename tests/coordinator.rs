//! The coordinator as real processes: `granary coordinator` voters on
//! loopback with temp folders, driven through the `granary` CLI, stopped by
//! handle.
//!
//! Voters get reserved ports rather than port 0: a voter's address is part
//! of the replicated membership, so a restarted voter must come back where
//! its peers expect it. Ports are reserved by binding and releasing a UDP
//! socket just before use.

use granary_testkit::harness::{CoordinatorProcess, VoterSpec, reserve_udp_port};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_granary");
const ELECTION_MS: u64 = 300;

struct Cluster {
    tmp: tempfile::TempDir,
    certs: PathBuf,
    admin: PathBuf,
    specs: Vec<VoterSpec>,
    voters: Vec<Option<CoordinatorProcess>>,
    lease_ms: u64,
    nodes: Vec<Child>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.nodes {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn run(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).env("GRANARY_LOG", "warn").output().expect("run granary")
}

impl Cluster {
    fn new(voters: u64, lease_ms: u64) -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("certs");
        let voter_count = voters.to_string();
        let out =
            run(&["certs", "init", "--out", root.to_str().expect("utf8"), "--voters", &voter_count, "--nodes", "1"]);
        assert!(out.status.success(), "certs init: {}", String::from_utf8_lossy(&out.stderr));
        // Each host gets its own folder of `hosts/`; the admin identity is the operator's.
        let (certs, admin) = (root.join("hosts"), root.join("admin"));
        let specs: Vec<VoterSpec> = (1..=voters)
            .map(|id| VoterSpec {
                id,
                addr: reserve_udp_port().expect("port"),
                data_dir: tmp.path().join(format!("voter-{id}")),
                name: None,
            })
            .collect();
        let voters = specs.iter().map(|_| None).collect();
        Self { tmp, certs, admin, specs, voters, lease_ms, nodes: Vec::new() }
    }

    fn addrs(&self) -> String {
        self.specs.iter().map(|v| v.addr.to_string()).collect::<Vec<_>>().join(",")
    }

    fn start(&mut self, id: u64) {
        let i = (id - 1) as usize;
        let extra: Vec<String> = [
            "--election-timeout-ms",
            &ELECTION_MS.to_string(),
            "--heartbeat-ms",
            "50",
            "--lease-ms",
            &self.lease_ms.to_string(),
            "--snapshot-entries",
            "5",
            "--keep-log-entries",
            "0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let log = self.tmp.path().join(format!("voter-{id}.log"));
        let p = CoordinatorProcess::spawn(
            Path::new(BIN),
            &self.specs[i],
            &self.specs,
            &self.certs,
            &extra,
            &log,
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("voter {id}: {e:#}"));
        self.voters[i] = Some(p);
    }

    fn kill(&mut self, id: u64) {
        self.voters[(id - 1) as usize].take().expect("running").kill();
    }

    fn cli(&self, args: &[&str], cert: &str) -> Result<Value, String> {
        let addrs = self.addrs();
        // Each identity's own folder: the folder alone says who it is.
        let dir = if cert == "admin" { self.admin.clone() } else { self.certs.join(cert) };
        let out = Command::new(BIN)
            .args(args)
            .args(["--coordinators", &addrs, "--certs", dir.to_str().expect("utf8")])
            .args(["--json", "--timeout-ms", "8000"])
            .env("GRANARY_LOG", "error")
            .output()
            .expect("run cli");
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.trim()).map_err(|e| format!("{e}: {text}"))
    }

    fn status(&self) -> Value {
        self.cli(&["status"], "admin").unwrap_or_else(|e| panic!("status: {e}"))
    }

    /// Waits until a status answer names a leader other than `not`.
    fn wait_leader(&self, not: Option<u64>) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(s) = self.cli(&["status"], "admin")
                && let Some(l) = s["leader"].as_u64()
                && Some(l) != not
            {
                return l;
            }
            assert!(Instant::now() < deadline, "no leader other than {not:?} within 20 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn add_dataset(&self, name: &str, data: &Path, view: &Path) -> Result<Value, String> {
        let source = format!("file://{}/", data.display());
        self.cli(&["dataset", "add", name, "--source", &source, "--view", view.to_str().expect("utf8")], "admin")
    }
}

/// A small generated dataset and its view file.
fn dataset(dir: &Path) -> (PathBuf, PathBuf) {
    let data = dir.join("data");
    let out = run(&[
        "dataset",
        "gen",
        "--out",
        data.to_str().expect("utf8"),
        "--rows",
        "4000",
        "--files",
        "2",
        "--row-group-rows",
        "500",
    ]);
    assert!(out.status.success(), "dataset gen: {}", String::from_utf8_lossy(&out.stderr));
    let view = dir.join("view.toml");
    std::fs::write(&view, granary_testkit::datagen::VIEW_TOML).expect("view");
    (data, view)
}

fn dataset_names(c: &Cluster) -> Vec<(String, String)> {
    let list = c.cli(&["dataset", "ls"], "admin").expect("dataset ls");
    list.as_array()
        .expect("array")
        .iter()
        .map(|d| (d["name"].as_str().expect("name").to_string(), d["version"].as_str().expect("version").to_string()))
        .collect()
}

/// Voters named by host names (as Kubernetes services name them), not IP
/// addresses: each resolves the others' names when it dials, so the group
/// elects a leader, and again after the leader is killed.
#[test]
fn voters_named_by_host_names_elect_and_fail_over() {
    let mut c = Cluster::new(3, 3000);
    for v in &mut c.specs {
        v.name = Some(format!("localhost:{}", v.addr.port()));
    }
    for id in 1..=3 {
        c.start(id);
    }
    let first = c.wait_leader(None);
    let status = c.status();
    let named: Vec<&str> =
        status["voters"].as_array().expect("voters").iter().filter_map(|v| v["addr"].as_str()).collect();
    assert!(named.iter().all(|a| a.starts_with("localhost:")), "the membership keeps the names: {status}");
    c.kill(first);
    let second = c.wait_leader(Some(first));
    assert_ne!(first, second);
}

#[test]
fn three_voters_survive_leader_kill_follower_kill_and_full_restart() {
    let mut c = Cluster::new(3, 3000);
    let (data, view) = dataset(c.tmp.path());
    for id in 1..=3 {
        c.start(id);
    }
    let leader = c.wait_leader(None);
    let added = c.add_dataset("ads", &data, &view).expect("add ads");
    assert_eq!(added["added"]["shards"], 8);
    assert_eq!(added["new"], true);

    // Leader killed: a new leader is elected and a write commits.
    let t = Instant::now();
    c.kill(leader);
    let new_leader = c.wait_leader(Some(leader));
    c.add_dataset("ads2", &data, &view).expect("a write after the leader was killed");
    let failover = t.elapsed();
    eprintln!(
        "leader {leader} killed; voter {new_leader} leads and committed a write after {failover:?} (election timeout {ELECTION_MS} ms; CLI processes included)"
    );
    c.start(leader);

    // A follower killed: writes still commit with two of three. Enough of
    // them that the others snapshot and purge their logs (every 5 entries,
    // keeping none), so the follower can only catch up from a snapshot sent
    // over QUIC.
    let leader = c.wait_leader(None);
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    c.kill(follower);
    c.add_dataset("ads3", &data, &view).expect("a write with one follower down");
    for _ in 0..6 {
        // Re-adding the same version commits an entry and changes nothing.
        assert_eq!(c.add_dataset("ads3", &data, &view).expect("re-add")["new"], false);
    }
    c.start(follower);
    let log = c.tmp.path().join(format!("voter-{follower}.log"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("installed a snapshot") {
        assert!(Instant::now() < deadline, "voter {follower} did not install a snapshot within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = dataset_names(&c);
    assert_eq!(before.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["ads", "ads2", "ads3"]);

    // Every voter killed at once, then restarted: nothing acknowledged is lost.
    for id in 1..=3 {
        c.kill(id);
    }
    for id in 1..=3 {
        c.start(id);
    }
    c.wait_leader(None);
    assert_eq!(dataset_names(&c), before, "datasets after a full restart");
    // The log was compacted into snapshots along the way (every 5 entries)
    // and the voters recovered from them.
    for v in &c.specs {
        assert!(v.data_dir.join("snapshot.json").exists(), "voter {} has a snapshot", v.id);
    }
}

fn node_toml(c: &Cluster, id: u64, data: Option<&Path>) -> PathBuf {
    let dir = c.tmp.path().join(format!("node-{id}"));
    std::fs::create_dir_all(&dir).expect("node dir");
    let coordinators: Vec<String> = c.specs.iter().map(|v| format!("{:?}", v.addr.to_string())).collect();
    // Each node its own certificate, bound to its id.
    let name = format!("node-{id}");
    let folder = c.certs.join(&name);
    if !folder.exists() {
        let dir = folder.to_str().expect("utf8");
        let out = run(&["certs", "issue", "--dir", dir, "--role", "node", "--node-id", &id.to_string()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let mut toml = format!(
        "socket = {:?}\nram_bytes = {}\nprefetch_bytes = 0\n\n[cluster]\ncoordinators = [{}]\ncerts = {:?}\nnode_id = {id}\nadvertise = \"{}\"\n",
        dir.join("node.sock"),
        64u64 << 20,
        coordinators.join(", "),
        folder,
        reserve_udp_port().expect("port"),
    );
    if let Some(data) = data {
        toml =
            format!("ssd_dir = {:?}\nssd_bytes = {}\nssd_block_bytes = {}\n", dir.join("ssd"), 64u64 << 20, 8u64 << 20)
                + &toml;
        toml += &format!(
            "\n[[dataset]]\nname = \"ads\"\nsource = \"file://{}/\"\n\n[dataset.view]\n{}",
            data.display(),
            granary_testkit::datagen::VIEW_TOML.replace("[[tensor]]", "[[dataset.view.tensor]]")
        );
    }
    let path = dir.join("node.toml");
    std::fs::write(&path, toml).expect("node.toml");
    path
}

/// One voter with the generated dataset registered as "ads", and three live
/// node daemons (serving "ads" themselves when `serve`). Returns the node
/// handles' indexes in `nodes`.
fn one_voter_three_nodes(serve: bool) -> (Cluster, Vec<usize>) {
    let mut c = Cluster::new(1, 3000);
    let (data, view) = dataset(c.tmp.path());
    c.start(1);
    c.wait_leader(None);
    c.add_dataset("ads", &data, &view).expect("add");
    let handles = (1..=3).map(|id| start_node_with(&mut c, id, serve.then_some(data.as_path()))).collect();
    wait_status(&c, "three live nodes", |s| live_nodes(s) == [1, 2, 3]);
    (c, handles)
}

/// Waits until each node's log says it knows the placement of three live
/// nodes and one dataset version.
fn wait_placement_known(c: &Cluster, ids: &[u64]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for id in ids {
        let log = c.tmp.path().join(format!("node-{id}.log"));
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.lines().any(|l| l.contains("placement known") && l.contains("peers=3") && l.contains("versions=1"))
            {
                break;
            }
            assert!(Instant::now() < deadline, "node {id} did not learn the placement:\n{text}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn start_node(c: &mut Cluster, id: u64) -> usize {
    start_node_with(c, id, None)
}

fn start_node_with(c: &mut Cluster, id: u64, data: Option<&Path>) -> usize {
    let cfg = node_toml(c, id, data);
    let log = std::fs::File::create(c.tmp.path().join(format!("node-{id}.log"))).expect("log");
    let child = Command::new(BIN)
        .args(["node", "--config", cfg.to_str().expect("utf8")])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn node");
    c.nodes.push(child);
    c.nodes.len() - 1
}

fn live_nodes(status: &Value) -> Vec<u64> {
    status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["live"] == true)
        .map(|n| n["node"].as_u64().expect("id"))
        .collect()
}

fn wait_status(c: &Cluster, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = c.status();
        if pred(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{what} within 30 s; last status {s}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn owners(c: &Cluster) -> (u64, Vec<(u64, u64, u64)>) {
    let p = c.cli(&["dataset", "placement", "ads"], "admin").expect("placement");
    let owners = p["owners"]
        .as_array()
        .expect("owners")
        .iter()
        .map(|o| (o[0].as_u64().expect("file"), o[1].as_u64().expect("rg"), o[2].as_u64().expect("node")))
        .collect();
    (p["placement_epoch"].as_u64().expect("epoch"), owners)
}

#[test]
fn an_expired_lease_moves_only_that_nodes_shards() {
    let (mut c, handles) = one_voter_three_nodes(false);
    let (epoch_before, before) = owners(&c);
    assert_eq!(before.len(), 8);

    // SIGKILL node 2: its heartbeats stop and the leader expires its lease.
    let mut n2 = c.nodes.remove(handles[1]);
    n2.kill().expect("SIGKILL");
    n2.wait().expect("reap");
    let s = wait_status(&c, "node 2 expired", |s| live_nodes(s) == [1, 3]);
    let (epoch_after, after) = owners(&c);
    assert!(epoch_after > epoch_before, "placement epoch advanced: {epoch_before} -> {epoch_after}");
    for ((f, rg, b), (_, _, a)) in before.iter().zip(&after) {
        if *b == 2 {
            assert_ne!(*a, 2, "file {f} rg {rg} still on the expired node");
        } else {
            assert_eq!(a, b, "file {f} rg {rg} moved although its owner survived");
        }
    }
    let shards: u64 = s["nodes"].as_array().expect("nodes").iter().map(|n| n["shards"].as_u64().expect("n")).sum();
    assert_eq!(shards, 8);

    // The node returns with a new incarnation.
    let inc_before = s["nodes"][1]["incarnation"].as_u64().expect("incarnation");
    start_node(&mut c, 2);
    let s = wait_status(&c, "node 2 back", |s| live_nodes(s) == [1, 2, 3]);
    assert!(s["nodes"][1]["incarnation"].as_u64().expect("incarnation") > inc_before);
}

#[test]
fn unauthenticated_and_wrong_role_peers_are_refused() {
    let mut c = Cluster::new(1, 3000);
    let (data, view) = dataset(c.tmp.path());
    c.start(1);
    c.wait_leader(None);

    // A trainer may read but not add a dataset; neither may a node.
    c.cli(&["status"], "trainer").expect("a trainer may read status");
    for role in ["trainer", "node-1"] {
        let source = format!("file://{}/", data.display());
        let err = c
            .cli(&["dataset", "add", "ads", "--source", &source, "--view", view.to_str().expect("utf8")], role)
            .expect_err("only admin may add");
        assert!(err.contains("Forbidden") && err.contains("add-dataset"), "{role}: {err}");
    }

    // A certificate of another cluster is refused at the handshake.
    let other = c.tmp.path().join("other-certs");
    assert!(run(&["certs", "init", "--out", other.to_str().expect("utf8")]).status.success());
    let out = Command::new(BIN)
        .args([
            "status",
            "--coordinators",
            &c.addrs(),
            "--certs",
            other.join("admin").to_str().expect("utf8"),
            "--timeout-ms",
            "2000",
        ])
        .env("GRANARY_LOG", "error")
        .output()
        .expect("run");
    assert!(!out.status.success(), "a foreign certificate was accepted");

    // Bad dataset input: a missing source, a view that does not fit.
    let err = c.add_dataset("missing", &c.tmp.path().join("nope"), &view).expect_err("missing source");
    assert!(err.contains("BadRequest"), "{err}");
    let bad_view = c.tmp.path().join("bad-view.toml");
    std::fs::write(&bad_view, "[[tensor]]\nname = \"x\"\ncolumns = [\"no_such_column\"]\ndtype = \"f32\"\n")
        .expect("write");
    let err = c.add_dataset("badview", &data, &bad_view).expect_err("view that does not fit");
    assert!(err.contains("no_such_column"), "{err}");
    // A source holding a file whose footer is garbage: refused, naming it.
    let corrupt = c.tmp.path().join("corrupt");
    std::fs::create_dir_all(&corrupt).expect("mkdir");
    for entry in std::fs::read_dir(&data).expect("data") {
        let p = entry.expect("entry").path();
        std::fs::copy(&p, corrupt.join(p.file_name().expect("name"))).expect("copy");
    }
    std::fs::write(corrupt.join("zz-broken.parquet"), vec![7u8; 4096]).expect("write");
    let err = c.add_dataset("corrupt", &corrupt, &view).expect_err("corrupt footer");
    assert!(err.contains("zz-broken.parquet"), "the error names the file: {err}");
    assert!(dataset_names(&c).is_empty(), "a refused add left a dataset behind");
    c.add_dataset("ads", &data, &view).expect("the coordinator still serves");
}

#[test]
fn a_leader_kill_expires_no_healthy_node() {
    let mut c = Cluster::new(3, 3000);
    for id in 1..=3 {
        c.start(id);
    }
    let leader = c.wait_leader(None);
    for id in 1..=2 {
        start_node(&mut c, id);
    }
    let before = wait_status(&c, "two live nodes", |s| live_nodes(s) == [1, 2]);
    let incarnations = |s: &Value| -> Vec<u64> {
        s["nodes"].as_array().expect("nodes").iter().map(|n| n["incarnation"].as_u64().expect("inc")).collect()
    };
    let epoch = before["placement_epoch"].as_u64().expect("epoch");
    c.kill(leader);
    c.wait_leader(Some(leader));
    // Two leases after the new leader took over, both nodes still hold the
    // incarnations they had: nobody was expired, nobody re-registered.
    std::thread::sleep(Duration::from_secs(6));
    let after = c.status();
    assert_eq!(live_nodes(&after), [1, 2], "{after}");
    assert_eq!(incarnations(&after), incarnations(&before), "{after}");
    assert_eq!(after["placement_epoch"].as_u64(), Some(epoch), "placement changed: {after}");
}

/// Issue 29: two daemons given node 2's folder. The second, at another
/// address, is refused (its log says why) while the first holds the lease:
/// the incarnation and the placement epoch stop moving. When the first
/// stops, the second takes the id over once the lease has run out.
#[test]
fn a_second_daemon_with_the_same_node_certificate_is_refused() {
    // A long lease: on a loaded CI machine node 2's heartbeats must not
    // lapse while the twin knocks.
    let mut c = Cluster::new(1, 6000);
    c.start(1);
    c.wait_leader(None);
    let first = start_node(&mut c, 2);
    let before = wait_status(&c, "node 2 live", |s| live_nodes(s) == [2]);
    let node2 = |s: &Value| -> (u64, String) {
        let n = &s["nodes"][0];
        (n["incarnation"].as_u64().expect("incarnation"), n["addr"].as_str().unwrap_or_default().to_string())
    };
    let epoch = before["placement_epoch"].as_u64().expect("epoch");
    // The same folder and id; its own socket and peer address.
    let dir = c.tmp.path().join("node-2-twin");
    std::fs::create_dir_all(&dir).expect("dir");
    let toml = std::fs::read_to_string(c.tmp.path().join("node-2/node.toml")).expect("node-2's config");
    let (_, addr) = node2(&before);
    let toml = toml
        .replace(&format!("{:?}", c.tmp.path().join("node-2/node.sock")), &format!("{:?}", dir.join("node.sock")))
        .replace(&addr, &reserve_udp_port().expect("port").to_string());
    std::fs::write(dir.join("node.toml"), &toml).expect("twin config");
    let log_path = dir.join("node.log");
    let twin = Command::new(BIN)
        .args(["node", "--config"])
        .arg(dir.join("node.toml"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).expect("log"))
        .spawn()
        .expect("spawn twin");
    c.nodes.push(twin);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.contains("is live at") && log.contains("may not register") {
            break;
        }
        if Instant::now() >= deadline {
            let voter = std::fs::read_to_string(c.tmp.path().join("voter-1.log")).unwrap_or_default();
            let first = std::fs::read_to_string(c.tmp.path().join("node-2.log")).unwrap_or_default();
            panic!("the twin was not refused:\n{log}\nthe voter:\n{voter}\nthe first daemon:\n{first}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Seconds of the twin retrying (every 0.5 s): nothing moved.
    std::thread::sleep(Duration::from_secs(4));
    let after = c.status();
    assert_eq!(live_nodes(&after), [2], "{after}");
    assert_eq!(node2(&after), node2(&before), "node 2's incarnation and address: {after}");
    assert_eq!(after["placement_epoch"].as_u64(), Some(epoch), "the placement flapped: {after}");
    // The first daemon stops: once its lease runs out the twin registers.
    let _ = c.nodes[first].kill();
    let _ = c.nodes[first].wait();
    let took = wait_status(&c, "the twin registered", |s| live_nodes(s) == [2] && node2(s).1 != addr);
    assert!(node2(&took).0 > node2(&before).0, "a new incarnation: {took}");
}

/// Issue 29: placement weights are an admin's (`granary nodes weight`),
/// not what a node reports: two nodes take equal shares until the admin
/// weighs one three times the other; a node's own certificate may not set
/// weights.
#[test]
fn an_admin_sets_node_weights_and_a_node_cannot() {
    let mut c = Cluster::new(1, 3000);
    let (data, view) = dataset(c.tmp.path());
    c.start(1);
    c.wait_leader(None);
    c.add_dataset("ads", &data, &view).expect("add");
    for id in 1..=2 {
        start_node(&mut c, id);
    }
    wait_status(&c, "two live nodes", |s| live_nodes(s) == [1, 2]);
    let shards = |s: &Value, id: u64| -> u64 {
        s["nodes"].as_array().expect("nodes").iter().find(|n| n["node"] == id).expect("node")["shards"]
            .as_u64()
            .expect("shards")
    };
    let err = c.cli(&["nodes", "weight", "--node", "1", "--weight", "300"], "node-1").expect_err("a node may not");
    assert!(err.contains("Forbidden") && err.contains("set-node-weight"), "{err}");
    let set = c.cli(&["nodes", "weight", "--node", "1", "--weight", "300"], "admin").expect("admin sets it");
    assert_eq!(set["weight"], 300);
    let after = wait_status(&c, "node 1 weighs 300", |s| {
        s["nodes"].as_array().is_some_and(|n| n.iter().any(|n| n["node"] == 1 && n["weight"] == 300))
    });
    let (one, two) = (shards(&after, 1), shards(&after, 2));
    assert!(one >= 2 * two, "node 1 takes about three quarters: {one} vs {two}");
}

#[test]
fn an_unusable_data_folder_is_a_clear_error() {
    let c = Cluster::new(1, 3000);
    let file = c.tmp.path().join("not-a-folder");
    std::fs::write(&file, b"x").expect("write");
    let spec = &c.specs[0];
    let out = Command::new(BIN)
        .args(["coordinator", "--id", "1", "--listen", &spec.addr.to_string()])
        .args(["--data-dir", file.to_str().expect("utf8")])
        .arg("--certs")
        .arg(c.certs.join("coordinator-1"))
        .env("GRANARY_LOG", "error")
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not-a-folder"), "the error names the folder: {err}");
}

/// Shards requested on every node at once: each is read from remote storage
/// and converted once, by its owner; the other nodes fetch it over QUIC and
/// hand their trainers the same bytes.
#[test]
fn a_shard_requested_on_every_node_is_converted_once_by_its_owner() {
    use granary_client::{ChunkSource, LocalSource};
    let (c, _) = one_voter_three_nodes(true);
    let (_, owners) = owners(&c);
    wait_placement_known(&c, &[1, 2, 3]);
    let sockets: Vec<PathBuf> = (1..=3).map(|id| c.tmp.path().join(format!("node-{id}/node.sock"))).collect();
    let fetched: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
        let handles: Vec<_> = sockets
            .iter()
            .map(|sock| {
                s.spawn(move || {
                    let src = LocalSource::connect(sock).expect("connect");
                    let info = src.describe("ads", None).expect("describe");
                    info.shards
                        .iter()
                        .map(|r| src.fetch(info.version, r.shard).expect("fetch").bytes().to_vec())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    assert_eq!(fetched[0].len(), 8);
    assert!(fetched.iter().all(|f| *f == fetched[0]), "every node hands out the same bytes");
    for (i, sock) in sockets.iter().enumerate() {
        let id = i as u64 + 1;
        let src = LocalSource::connect(sock).expect("connect");
        let owned = owners.iter().filter(|o| o.2 == id).count() as u64;
        let stats = src.stats().expect("stats");
        let logs = || {
            (1..=3)
                .map(|n| {
                    let text = std::fs::read_to_string(c.tmp.path().join(format!("node-{n}.log"))).unwrap_or_default();
                    let lines: Vec<&str> = text.lines().collect();
                    format!("node {n}:\n{}", lines[lines.len().saturating_sub(15)..].join("\n"))
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(stats.conversions, owned, "node {id} converted only its own shards: {stats:?}\n{}", logs());
        assert_eq!(stats.peer_fetched, 8 - owned, "node {id} fetched the others' shards from their owners");
        assert_eq!(stats.peer_failures, 0);
        // A second pass is served from the guest copies: no new fetch.
        let info = src.describe("ads", None).expect("describe");
        for r in &info.shards {
            src.fetch(info.version, r.shard).expect("fetch");
        }
        let again = src.stats().expect("stats");
        assert_eq!((again.conversions, again.peer_fetched), (owned, 8 - owned), "node {id}: {again:?}");
        assert!(again.guest_hits >= 8 - owned && again.guest_bytes > 0, "node {id}: {again:?}");
    }
}

/// The owner of some shards is SIGKILLed: the survivors' trainers still get
/// every chunk, byte-identical, with no error; the dead node's shards move
/// with its lease, and each is converted once, by its new owner.
#[test]
fn a_dead_owner_costs_latency_not_errors() {
    use granary_client::{ChunkSource, LocalSource};
    let (mut c, handles) = one_voter_three_nodes(true);
    let (_, owners) = owners(&c);
    assert!(owners.iter().any(|o| o.2 == 2), "node 2 owns something");
    wait_placement_known(&c, &[1, 3]);
    let mut n2 = c.nodes.remove(handles[1]);
    n2.kill().expect("SIGKILL");
    n2.wait().expect("reap");
    let fetch_all = |id: u64| -> Vec<Vec<u8>> {
        let src = LocalSource::connect(c.tmp.path().join(format!("node-{id}/node.sock"))).expect("connect");
        let info = src.describe("ads", None).expect("describe");
        info.shards.iter().map(|r| src.fetch(info.version, r.shard).expect("no error").bytes().to_vec()).collect()
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| fetch_all(1));
        let b = s.spawn(|| fetch_all(3));
        (a.join().expect("node 1"), b.join().expect("node 3"))
    });
    assert_eq!(a.len(), 8);
    assert_eq!(a, b, "both survivors hand out the same bytes");
    let stats: Vec<_> = [1, 3]
        .iter()
        .map(|id| {
            LocalSource::connect(c.tmp.path().join(format!("node-{id}/node.sock")))
                .expect("connect")
                .stats()
                .expect("stats")
        })
        .collect();
    assert_eq!(stats.iter().map(|s| s.conversions).sum::<u64>(), 8, "each shard converted once: {stats:?}");
    assert!(stats.iter().any(|s| s.peer_failures > 0), "the dead owner was tried first");
}

/// A node stopped and started again serves the chunks it owns from its SSD
/// tier: no remote read, no conversion, no peer fetch.
#[test]
fn a_restarted_node_serves_its_ssd_tier_without_converting_again() {
    use granary_client::{ChunkSource, LocalSource};
    let (mut c, handles) = one_voter_three_nodes(true);
    wait_placement_known(&c, &[1, 2, 3]);
    let mine =
        |c: &Cluster| -> Vec<(u64, u64)> { owners(c).1.iter().filter(|o| o.2 == 1).map(|o| (o.0, o.1)).collect() };
    let socket = c.tmp.path().join("node-1/node.sock");
    let fetch = |shards: &[(u64, u64)]| {
        let src = LocalSource::connect(&socket).expect("connect");
        let info = src.describe("ads", None).expect("describe");
        for &(file, row_group) in shards {
            let shard = granary_proto::ShardId { file: file as u32, row_group: row_group as u32 };
            src.fetch(info.version, shard).expect("fetch");
        }
        src.stats().expect("stats")
    };
    let before = mine(&c);
    assert!(!before.is_empty(), "node 1 owns shards");
    assert_eq!(fetch(&before).conversions, before.len() as u64);
    // A clean stop (SIGTERM through the handle): loads in flight reach the tier.
    let mut n1 = c.nodes.remove(handles[0]);
    // SAFETY: kill(2) on our own child's pid; the child has not been reaped.
    let rc = unsafe { libc::kill(n1.id() as i32, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while n1.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "node 1 did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    let data = c.tmp.path().join("data");
    start_node_with(&mut c, 1, Some(&data));
    wait_placement_known(&c, &[1]);
    let kept: Vec<(u64, u64)> = mine(&c).into_iter().filter(|s| before.contains(s)).collect();
    assert!(!kept.is_empty(), "node 1 still owns some of its shards");
    let stats = fetch(&kept);
    assert_eq!(stats.conversions, 0, "{stats:?}");
    assert_eq!(stats.peer_fetched, 0, "{stats:?}");
    assert_eq!(stats.ssd_hits, kept.len() as u64, "{stats:?}");
}
