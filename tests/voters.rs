//! Voters in view (issue 48): an admin command is not held up by dead
//! voters listed first; `granary status` shows each voter as the leader
//! sees it and how many more may fail; openraft's lines about a dead
//! voter do not bury the leader's log.

use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::{LocalCluster, LocalClusterSpec};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_granary");

/// A cluster of `voters` voters and no node, its dataset registered.
fn voters(tmp: &Path, voters: u32) -> LocalCluster {
    let data = tmp.join("data");
    datagen::generate(&data, &GenSpec { rows: 1_000, files: 1, row_group_rows: 500, ..GenSpec::default() }, |_| {})
        .expect("generate");
    let spec = LocalClusterSpec { nodes: 0, voters, ..LocalClusterSpec::default() };
    LocalCluster::prepare(Path::new(BIN), &tmp.join("cluster"), &data, spec).expect("cluster")
}

/// `granary status` run as the admin against `coordinators`.
fn status(c: &LocalCluster, coordinators: &str, json: bool) -> std::process::Output {
    let mut cmd = Command::new(BIN);
    cmd.args(["status", "--cert-name", "admin", "--timeout-ms", "1900", "--coordinators", coordinators, "--certs"]);
    cmd.arg(c.certs()).env("GRANARY_LOG", "error");
    if json {
        cmd.arg("--json");
    }
    cmd.output().expect("run status")
}

/// Voters that never answer (two black holes: sockets that take every
/// packet and answer none), listed before the live one, cost an admin
/// command nothing: the voters are dialed at once, so `status` answers
/// within a deadline shorter than one connect timeout (2 s), which trying
/// them in turn spent on the first. When no voter answers, the error says
/// what each one did.
#[test]
fn dead_voters_listed_first_cost_an_admin_command_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let c = voters(tmp.path(), 1);
    let holes: Vec<std::net::UdpSocket> =
        (0..2).map(|_| std::net::UdpSocket::bind("127.0.0.1:0").expect("black hole")).collect();
    let hole_addrs: Vec<String> = holes.iter().map(|h| h.local_addr().expect("addr").to_string()).collect();
    let listed = format!("{},{},{}", hole_addrs[0], hole_addrs[1], c.coordinators().join(","));
    for _ in 0..3 {
        let out = status(&c, &listed, true);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["leader"].as_u64(), Some(1), "{v}");
    }
    let out = status(&c, &hole_addrs.join(","), true);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for hole in &hole_addrs {
        assert!(err.contains(&format!("{hole}: ")), "each voter and what it did: {err}");
    }
    drop(holes);
}

/// `granary status` from the leader shows each voter's reachability and
/// lag and the quorum margin: with three voters up, one more may fail;
/// with a follower killed, it shows that voter unreachable and that none
/// more may fail (text and JSON). The leader's log is not buried under
/// openraft's errors about the dead voter (about five a second): each of
/// their call sites passes once every 30 s (src/quiet.rs).
#[test]
fn status_shows_the_voters_as_the_leader_sees_them_and_the_quorum_margin() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut c = voters(tmp.path(), 3);
    let until = |c: &LocalCluster, what: &str, done: &dyn Fn(&granary_net::api::ClusterStatus) -> bool| {
        let start = Instant::now();
        loop {
            match c.status() {
                Ok(s) if done(&s) => return s,
                other => assert!(start.elapsed() < Duration::from_secs(60), "{what}: {other:?}\n{}", c.log_tails()),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let reachable = |s: &granary_net::api::ClusterStatus, id: u64| s.voters.iter().find(|v| v.id == id)?.reachable;
    let all_up = until(&c, "every voter reachable", &|s| s.quorum_margin == Some(1));
    assert!((1..=3).all(|id| reachable(&all_up, id) == Some(true)), "{all_up:?}");
    let leader = all_up.leader.expect("a leader");
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    c.kill_voter(follower);
    let one_down = until(&c, "the follower seen unreachable", &|s| reachable(s, follower) == Some(false));
    assert_eq!(one_down.quorum_margin, Some(0), "{one_down:?}");
    let out = status(&c, &c.coordinators().join(","), false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("voter-{follower} ")) && text.contains(": UNREACHABLE, last answered "), "{text}");
    assert!(text.contains("quorum: held, but one more unreachable voter loses it"), "{text}");
    std::thread::sleep(Duration::from_secs(3));
    let log = std::fs::read_to_string(c.voter_log(leader)).expect("leader's log");
    let noisy: Vec<&str> =
        log.lines().filter(|l| l.contains("openraft::replication") || l.contains("openraft::network")).collect();
    assert!(noisy.len() <= 4, "{} openraft lines about the dead voter:\n{}", noisy.len(), noisy.join("\n"));
}
