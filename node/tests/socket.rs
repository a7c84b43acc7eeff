//! The node's Unix socket under bad and hostile clients: malformed and
//! oversized frames, clients that vanish or stall, and the bounds every
//! connection is held to (issue 29: plan memory, the connection cap with
//! room made by the longest idle, idle and write deadlines, one report
//! slot per connection). The daemon serves in this process; every blocking
//! step is bounded, so a hang fails instead of stalling the suite.

use granary_client::{ChunkSource, LocalSource};
use granary_proto::rng::Rng;
use granary_proto::wire::{self, ErrorKind, LocalRequest, LocalResponse};
use granary_proto::{DatasetVersion, PlanParams, ShardId, Shuffle};
use granary_testkit::datagen;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;
use common::daemon::{Daemon, call, daemon_over, read_reply, send_raw};
use common::*;

// ---------------------------------------------------------------------------
// The Unix socket
// ---------------------------------------------------------------------------

fn expect_bad_request(reply: Option<LocalResponse>, names: &[&str]) {
    match reply {
        Some(LocalResponse::Failed { kind: ErrorKind::BadRequest, message }) => assert_names(&message, names),
        other => panic!("expected a BadRequest reply, got {other:?}"),
    }
}

/// The daemon closed this connection (after its error reply). A close with
/// unread request bytes in the daemon's buffer reads as a reset.
fn expect_closed(s: &mut UnixStream) {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Ok(_) => panic!("the daemon sent more after its error reply"),
        Err(e) => panic!("connection left open after a bad frame: {e}"),
    }
}

/// A well-formed client still gets served: stats, describe, and a chunk
/// whose every value matches the generator.
fn assert_serves_a_fresh_client(socket: &Path) {
    let socket = socket.to_path_buf();
    within("a well-formed client", move || {
        let src = LocalSource::connect(&socket).expect("connect");
        src.stats().expect("stats");
        let info = src.describe("ads", None).expect("describe");
        let (shard, first) = first_rows(&info)[1];
        let chunk = src.fetch(info.version, shard).expect("fetch");
        assert_eq!(datagen_mismatch(&chunk, first), None);
    });
}

#[test]
fn malformed_frames_get_a_bad_request_reply_and_the_daemon_keeps_serving() {
    let (_data, _run, daemon) = daemon_over(1, 600, 300, |_| {});

    // Garbage of plausible length.
    let mut s = daemon.connect();
    send_raw(&mut s, 16, &[0xA5; 16]);
    expect_bad_request(read_reply(&mut s), &["malformed request"]);
    expect_closed(&mut s);

    // An empty frame.
    let mut s = daemon.connect();
    send_raw(&mut s, 0, &[]);
    expect_bad_request(read_reply(&mut s), &["malformed request"]);
    expect_closed(&mut s);

    // A length prefix far beyond the limit, with no body behind it.
    let mut s = daemon.connect();
    send_raw(&mut s, u32::MAX, &[]);
    expect_bad_request(read_reply(&mut s), &["request frame", &u32::MAX.to_string()]);
    expect_closed(&mut s);

    // Just over the request limit (64 KiB: requests are a few hundred
    // bytes; only replies may be as large as a frame).
    let mut s = daemon.connect();
    send_raw(&mut s, (64 << 10) + 1, &[0; 64]);
    expect_bad_request(read_reply(&mut s), &["request frame", &((64 << 10) + 1).to_string()]);
    expect_closed(&mut s);

    // A valid request followed by garbage on the same connection: the first
    // is answered, the second refused.
    let mut s = daemon.connect();
    let stats = wire::encode(&LocalRequest::Stats);
    send_raw(&mut s, stats.len() as u32, &stats);
    assert!(matches!(read_reply(&mut s), Some(LocalResponse::Stats(_))));
    send_raw(&mut s, 8, &[0xFF; 8]);
    expect_bad_request(read_reply(&mut s), &["malformed request"]);
    expect_closed(&mut s);

    // A frame cut short, then the writer hangs up: no reply is owed.
    let mut s = daemon.connect();
    send_raw(&mut s, 100, &[1, 2, 3]);
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(read_reply(&mut s).is_none(), "a half frame got a reply");
    // A client that connects and leaves without a byte.
    drop(daemon.connect());

    // Random frames: each one is refused as a bad request or, when the bytes
    // happen to form a valid request, answered; never anything else.
    let seed = 0xBAD_F00D;
    let mut rng = Rng::new(seed);
    for i in 0..64 {
        let len = rng.below(96) as usize;
        let body: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let mut s = daemon.connect();
        send_raw(&mut s, len as u32, &body);
        match read_reply(&mut s) {
            Some(LocalResponse::Failed { kind: ErrorKind::BadRequest, .. }) | Some(LocalResponse::Stats(_)) => {}
            other => panic!("seed {seed:#x} frame {i} ({body:02x?}): unexpected reply {other:?}"),
        }
        daemon.assert_alive();
    }

    daemon.assert_alive();
    assert_serves_a_fresh_client(&daemon.socket);
    daemon.stop();
}

/// Issues 15 and 29, bounds: a `Follow` whose plan would make the node
/// hold more than `max_plan_bytes` is refused at once, for every shuffle
/// (a windowed shuffle with a huge window; the block shuffle with batch 1
/// and a group of u32::MAX batches, which skipped the bound before issue
/// 29), naming the numbers and the setting, without taking a planning
/// slot; a rank with sane parameters is planned meanwhile on another
/// connection, and the refused connection stays usable.
#[test]
fn a_follow_with_a_huge_plan_is_refused_at_once_for_every_shuffle_and_other_ranks_are_planned() {
    let (_data, _run, daemon) = daemon_over(2, 6_000, 300, |c| c.max_plan_bytes = 40_000);
    let (mut a, mut b) = (daemon.connect(), daemon.connect());
    let Some(LocalResponse::Described(info)) =
        call(&mut a, &LocalRequest::Describe { dataset: "ads".into(), version: None })
    else {
        panic!("describe ads failed");
    };
    let params = |batch_size, shuffle| PlanParams {
        seed: 1,
        epoch: 0,
        world_size: 1,
        rank: 0,
        batch_size,
        shuffle,
        drop_last: false,
    };
    let sane =
        LocalRequest::Follow { version: info.version, params: params(64, Shuffle::Windowed { window_shards: 2 }) };
    for (huge, numbers) in [
        (params(64, Shuffle::Windowed { window_shards: u32::MAX }), "94 batches of 64 rows, a shuffle window of 6000"),
        (params(1, Shuffle::Blocks { window_batches: u32::MAX }), "6000 batches of 1 rows, a shuffle window of 6000"),
    ] {
        let started = Instant::now();
        let huge = LocalRequest::Follow { version: info.version, params: huge };
        expect_bad_request(call(&mut a, &huge), &[numbers, "limit of 40000 bytes", "max_plan_bytes"]);
        assert!(started.elapsed() < Duration::from_secs(1), "refused at once: {:?}", started.elapsed());
        assert!(matches!(call(&mut b, &sane), Some(LocalResponse::Following)));
        // The refused connection stays usable.
        assert!(matches!(call(&mut a, &sane), Some(LocalResponse::Following)));
    }
    let blocks =
        LocalRequest::Follow { version: info.version, params: params(64, Shuffle::Blocks { window_batches: 4 }) };
    assert!(matches!(call(&mut a, &blocks), Some(LocalResponse::Following)), "a sane block plan is planned");
    daemon.assert_alive();
    daemon.stop();
}

#[test]
fn requests_for_unknown_things_are_refused_naming_them() {
    let (_data, _run, daemon) = daemon_over(1, 600, 300, |_| {});
    let mut s = daemon.connect();
    let mut call = |req: &LocalRequest| {
        let body = wire::encode(req);
        send_raw(&mut s, body.len() as u32, &body);
        read_reply(&mut s)
    };
    // An unknown name: the reply names it and the datasets served.
    match call(&LocalRequest::Describe { dataset: "nope".into(), version: None }) {
        Some(LocalResponse::NotServed { dataset, current: None, served, .. }) => {
            assert_eq!((dataset.as_str(), served), ("nope", vec!["ads".to_string()]))
        }
        other => panic!("describe nope: {other:?}"),
    }
    let Some(LocalResponse::Described(info)) = call(&LocalRequest::Describe { dataset: "ads".into(), version: None })
    else {
        panic!("describe ads failed");
    };
    let unknown_version = DatasetVersion([7; 16]);
    // A version the node does not serve: the reply names the current one.
    match call(&LocalRequest::Describe { dataset: "ads".into(), version: Some(unknown_version) }) {
        Some(LocalResponse::NotServed { version, current, .. }) => {
            assert_eq!((version, current), (Some(unknown_version), Some(info.version)))
        }
        other => panic!("describe ads at an unknown version: {other:?}"),
    }
    // The version it serves, asked by name and version.
    let pinned = LocalRequest::Describe { dataset: "ads".into(), version: Some(info.version) };
    assert!(matches!(call(&pinned), Some(LocalResponse::Described(i)) if i.version == info.version));
    let shard = ShardId { file: 0, row_group: 0 };
    expect_bad_request(
        call(&LocalRequest::FetchChunk { version: unknown_version, shard }),
        &[&unknown_version.to_hex()],
    );
    let missing = ShardId { file: 0, row_group: 9 };
    expect_bad_request(call(&LocalRequest::FetchChunk { version: info.version, shard: missing }), &["file#0/rg9"]);
    let missing = ShardId { file: 3, row_group: 0 };
    expect_bad_request(call(&LocalRequest::FetchChunk { version: info.version, shard: missing }), &["file#3/rg0"]);
    // These are well-formed requests: the connection stays usable.
    assert!(matches!(call(&LocalRequest::Stats), Some(LocalResponse::Stats(_))));
    daemon.assert_alive();
    assert_serves_a_fresh_client(&daemon.socket);
    daemon.stop();
}

#[test]
fn follow_with_impossible_plan_parameters_is_a_bad_request() {
    let (_data, _run, daemon) = daemon_over(1, 600, 300, |_| {});
    let mut s = daemon.connect();
    let mut call = |req: &LocalRequest| {
        let body = wire::encode(req);
        send_raw(&mut s, body.len() as u32, &body);
        read_reply(&mut s)
    };
    let Some(LocalResponse::Described(info)) = call(&LocalRequest::Describe { dataset: "ads".into(), version: None })
    else {
        panic!("describe ads failed");
    };
    let valid = granary_proto::PlanParams {
        seed: 1,
        epoch: 0,
        world_size: 2,
        rank: 1,
        batch_size: 64,
        shuffle: granary_proto::Shuffle::Windowed { window_shards: 2 },
        drop_last: false,
    };
    let bad = [
        (granary_proto::PlanParams { rank: 5, ..valid }, "rank 5 is not in a world of 2"),
        (granary_proto::PlanParams { world_size: 0, rank: 0, ..valid }, "world of 0"),
        (granary_proto::PlanParams { batch_size: 0, ..valid }, "batch size"),
        (
            granary_proto::PlanParams { shuffle: granary_proto::Shuffle::Windowed { window_shards: 0 }, ..valid },
            "window",
        ),
    ];
    // Retrying cannot make these plans possible: they are bad requests, not
    // a node that is unavailable.
    for (params, names) in bad {
        expect_bad_request(call(&LocalRequest::Follow { version: info.version, params }), &[names]);
    }
    assert!(matches!(
        call(&LocalRequest::Follow { version: info.version, params: valid }),
        Some(LocalResponse::Following)
    ));
    daemon.assert_alive();
    daemon.stop();
}

/// Set in the child process that runs [`run_starved_daemon`]: the daemon's
/// socket path and data folder.
const STARVED_SOCKET: &str = "GRANARY_BAD_INPUT_STARVED_SOCKET";
const STARVED_DATA: &str = "GRANARY_BAD_INPUT_STARVED_DATA";

/// Kills the child by its handle if the test ends early.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn daemon_keeps_serving_after_a_connection_flood_exhausts_its_descriptors() {
    if let (Some(socket), Some(data)) = (std::env::var_os(STARVED_SOCKET), std::env::var_os(STARVED_DATA)) {
        return run_starved_daemon(PathBuf::from(socket), PathBuf::from(data));
    }
    // The daemon runs in a child process (this test, re-run with the
    // variables set) whose descriptor limit is lowered: the flood must not
    // starve this process, nor the other tests.
    let data = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    generate(data.path(), 1, 600, 300, "snappy");
    let socket = run.path().join("node.sock");
    let log = run.path().join("child.log");
    let out = std::fs::File::create(&log).unwrap();
    let name = "daemon_keeps_serving_after_a_connection_flood_exhausts_its_descriptors";
    let mut child = ChildGuard(
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(STARVED_SOCKET, &socket)
            .env(STARVED_DATA, data.path())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap(),
    );
    let child_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let wait_for = |what: &str, child: &mut ChildGuard, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + WAIT;
        while !done() {
            if let Some(status) = child.0.try_wait().unwrap() {
                panic!("child exited ({status}) before {what}:\n{}", child_log());
            }
            assert!(Instant::now() < deadline, "{what} timed out:\n{}", child_log());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let ready = run.path().join("ready");
    wait_for("the starved daemon is ready", &mut child, &|| ready.exists());
    let limit: usize = std::fs::read_to_string(&ready).unwrap().trim().parse().unwrap();

    // Far more connections than the daemon has descriptors for: once every
    // descriptor is in use, its accept fails (EMFILE) on the ones still
    // waiting in the listen queue.
    let flood: Vec<UnixStream> = (0..48).map(|_| UnixStream::connect(&socket).expect("flood connect")).collect();
    let fds = PathBuf::from(format!("/proc/{}/fd", child.0.id()));
    wait_for("the daemon runs out of descriptors", &mut child, &|| {
        std::fs::read_dir(&fds).map(|d| d.count()).unwrap_or(0) >= limit
    });
    drop(flood);
    assert_serves_a_fresh_client(&socket);

    std::fs::write(run.path().join("stop"), b"").unwrap();
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the child did not stop:\n{}", child_log());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "the starved daemon failed ({status}):\n{}", child_log());
    assert!(child_log().contains("1 passed"), "the child ran no test:\n{}", child_log());
}

/// The child's side: a daemon left with a handful of spare descriptors,
/// serving until the parent writes `stop` next to the socket.
fn run_starved_daemon(socket: PathBuf, data: PathBuf) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let daemon = Daemon::start(config(&data, parse_view(datagen::VIEW_TOML)), socket.clone());
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    let old = getrlimit(Resource::Nofile);
    let limit = open + 8;
    setrlimit(Resource::Nofile, Rlimit { current: Some(limit), maximum: old.maximum }).unwrap();
    std::fs::write(socket.with_file_name("ready"), limit.to_string()).unwrap();
    let stop = socket.with_file_name("stop");
    let deadline = Instant::now() + WAIT;
    while !stop.exists() {
        assert!(Instant::now() < deadline, "never told to stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    setrlimit(Resource::Nofile, old).unwrap();
    daemon.assert_alive();
    daemon.stop();
}

/// Issue 15, bounds: a shard whose load alone would take more memory than
/// `load_memory_bytes` allows (compressed column chunks plus twice its
/// converted size) is refused before it is read, naming the file, row
/// group and both sizes; the node reads nothing for it and keeps serving.
/// Before, it was decoded regardless (and a large enough row group could
/// get the node OOM-killed).
#[test]
fn a_shard_whose_load_would_take_more_memory_than_the_budget_is_refused_before_it_is_read() {
    // 2x a 1,000-row chunk of the generator's view is far over 64 KiB.
    let (_data, _run, daemon) = daemon_over(1, 2_000, 1_000, |c| c.load_memory_bytes = Some(64 << 10));
    let mut s = daemon.connect();
    let mut call = |req: &LocalRequest| {
        let body = wire::encode(req);
        send_raw(&mut s, body.len() as u32, &body);
        read_reply(&mut s)
    };
    let Some(LocalResponse::Described(info)) = call(&LocalRequest::Describe { dataset: "ads".into(), version: None })
    else {
        panic!("describe ads failed");
    };
    let before = match call(&LocalRequest::Stats) {
        Some(LocalResponse::Stats(st)) => st.remote_bytes,
        other => panic!("stats: {other:?}"),
    };
    let shard = ShardId { file: 0, row_group: 1 };
    match call(&LocalRequest::FetchChunk { version: info.version, shard }) {
        Some(LocalResponse::Failed { kind, message }) => {
            assert_eq!(kind, ErrorKind::BadInput, "{message}");
            assert_names(&message, &["row group 1", "65536 bytes", "load_memory_bytes"]);
        }
        other => panic!("expected the load to be refused, got {other:?}"),
    }
    match call(&LocalRequest::Stats) {
        Some(LocalResponse::Stats(st)) => assert_eq!(st.remote_bytes, before, "nothing was read for it"),
        other => panic!("stats: {other:?}"),
    }
    daemon.assert_alive();
    daemon.stop();
}

/// Issue 29, bounds: a connection that sends many distinct reports (a
/// new loader id each, as a flood of fake ranks would) holds one report
/// slot: the doctor sees one rank, not every report ever sent. Before,
/// every distinct (loader, dataset, rank, world) was kept for a minute.
#[test]
fn a_connection_sending_many_distinct_reports_holds_one_report_slot() {
    use granary_proto::doctor::{RankReport, RankTimes};
    let (_data, _run, daemon) = daemon_over(1, 600, 300, |_| {});
    let socket = daemon.socket.clone();
    let reports = 1_000_000u64;
    within("a million pipelined reports", move || {
        let mut a = UnixStream::connect(&socket).expect("connect");
        let mut w = a.try_clone().expect("clone");
        let writer = std::thread::spawn(move || {
            for i in 0..reports {
                let req = LocalRequest::Report(RankReport {
                    dataset: format!("ads-{}", i % 1000),
                    rank: (i % 4096) as u32,
                    world: 4096,
                    loader: i,
                    times: RankTimes { batches: i, ..RankTimes::default() },
                });
                let body = wire::encode(&req);
                send_raw(&mut w, body.len() as u32, &body);
            }
        });
        for _ in 0..reports {
            assert!(matches!(read_reply(&mut a), Some(LocalResponse::Reported)));
        }
        writer.join().expect("writer");
        let Some(LocalResponse::Doctor(snapshot)) = call(&mut a, &LocalRequest::Doctor) else {
            panic!("no doctor snapshot");
        };
        assert_eq!(snapshot.ranks.len(), 1, "one slot per connection");
        assert_eq!(snapshot.ranks[0].loader, reports - 1, "the slot holds the latest report");
        assert_eq!(snapshot.ranks[0].times.batches, reports - 1);
    });
    daemon.assert_alive();
    daemon.stop();
}

/// Issue 29, bounds: with the node at `max_connections`, each held by a
/// process that sends nothing more, one more trainer still describes and
/// gets a chunk: the connection idle the longest is closed to make room.
#[test]
fn at_the_connection_cap_idle_connections_make_room_and_a_trainer_still_gets_a_chunk() {
    let (_data, _run, daemon) = daemon_over(2, 600, 300, |c| c.max_connections = 8);
    let mut idle: Vec<UnixStream> = (0..8).map(|_| daemon.connect()).collect();
    // Each answered once, in order: the first is idle the longest.
    for s in &mut idle {
        assert!(matches!(call(s, &LocalRequest::Stats), Some(LocalResponse::Stats(_))));
    }
    assert_serves_a_fresh_client(&daemon.socket);
    // One of them made room: the first, idle the longest, unless the
    // machine is so loaded that its task had not yet marked itself idle
    // (which one goes is the pure core's, tested exactly in conns.rs).
    let deadline = Instant::now() + Duration::from_secs(20);
    let closed = loop {
        let closed: Vec<usize> = (0..idle.len())
            .filter(|&i| {
                idle[i].set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                let mut b = [0u8; 1];
                match idle[i].read(&mut b) {
                    Ok(0) => true,
                    Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
                    Ok(_) => panic!("an idle connection got bytes it did not ask for"),
                }
            })
            .collect();
        if !closed.is_empty() || Instant::now() > deadline {
            break closed;
        }
    };
    assert_eq!(closed.len(), 1, "one idle connection made room: {closed:?}");
    // The others were not touched.
    let kept = (0..idle.len()).find(|i| !closed.contains(i)).expect("seven kept");
    idle[kept].set_read_timeout(Some(WAIT)).unwrap();
    assert!(matches!(call(&mut idle[kept], &LocalRequest::Stats), Some(LocalResponse::Stats(_))));
    daemon.assert_alive();
    daemon.stop();
}

/// Issue 29, bounds: a connection that sends no request for
/// `idle_timeout_ms` is closed; a busy one is not.
#[test]
fn an_idle_connection_is_closed_at_the_idle_deadline() {
    let (_data, _run, daemon) = daemon_over(1, 600, 300, |c| c.idle_timeout_ms = 400);
    let (mut quiet, mut busy) = (daemon.connect(), daemon.connect());
    assert!(matches!(call(&mut quiet, &LocalRequest::Stats), Some(LocalResponse::Stats(_))));
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(150));
        assert!(matches!(call(&mut busy, &LocalRequest::Stats), Some(LocalResponse::Stats(_))), "a busy one stays");
    }
    expect_closed(&mut quiet);
    daemon.assert_alive();
    daemon.stop();
}

/// Issue 29, bounds: a client that sends requests and never reads the
/// replies is dropped at the write deadline (its requests stop being read,
/// its writes then fail); the daemon serves everyone else.
#[test]
fn a_client_that_never_reads_its_replies_is_dropped_at_the_write_deadline() {
    let (_data, _run, daemon) = daemon_over(2, 600, 300, |c| c.write_timeout_ms = 300);
    let socket = daemon.socket.clone();
    let took = within("the write deadline", move || {
        let s = UnixStream::connect(&socket).expect("connect");
        s.set_write_timeout(Some(Duration::from_millis(50))).unwrap();
        let req = wire::encode(&LocalRequest::Describe { dataset: "ads".into(), version: None });
        let mut frame = (req.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&req);
        let started = Instant::now();
        let mut w = &s;
        loop {
            match w.write(&frame) {
                Ok(_) => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset) => {
                    return started.elapsed();
                }
                Err(e) => panic!("unexpected write error: {e}"),
            }
            assert!(started.elapsed() < Duration::from_secs(20), "still connected after 20 s");
        }
    });
    assert!(took >= Duration::from_millis(300), "dropped before the deadline: {took:?}");
    daemon.assert_alive();
    assert_serves_a_fresh_client(&daemon.socket);
    daemon.stop();
}

/// Issue 29, bounds: connections that send a request header and never the
/// rest still count as idle, so at the cap they make room for a trainer
/// instead of holding the node for the request deadline.
#[test]
fn connections_that_send_only_headers_do_not_hold_the_cap() {
    let (_data, _run, daemon) = daemon_over(2, 600, 300, |c| c.max_connections = 4);
    let mut partial: Vec<UnixStream> = (0..4).map(|_| daemon.connect()).collect();
    for s in &mut partial {
        s.write_all(&100u32.to_le_bytes()).expect("a header alone");
    }
    // Let the daemon read every header.
    std::thread::sleep(Duration::from_millis(300));
    assert_serves_a_fresh_client(&daemon.socket);
    daemon.assert_alive();
    daemon.stop();
}

/// The local protocol's hello (issue 42): a trainer that says which
/// versions it speaks is answered with the one both speak and served on;
/// one too far ahead is refused with the node's range, and the connection
/// closes. A trainer without a hello (local protocol 1, every build before
/// it) is served as before: every other test here speaks so.
#[test]
fn a_hello_agrees_on_a_version_or_is_refused_with_the_node_s_range() {
    use granary_proto::version::{self, HelloReply, Speaks};
    let (_data, _run, d) = daemon_over(1, 600, 300, |_| {});
    let mut s = d.connect();
    s.write_all(&version::encode_hello(version::LOCAL)).unwrap();
    let mut reply = [0u8; version::HELLO_REPLY_LEN];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(
        version::decode_hello_reply(reply, version::LOCAL),
        HelloReply::Speak { version: version::LOCAL.current, node: version::LOCAL }
    );
    assert!(matches!(call(&mut s, &LocalRequest::Stats), Some(LocalResponse::Stats(_))));

    let ahead = Speaks { oldest: version::LOCAL.current + 2, current: version::LOCAL.current + 3 };
    let mut s = d.connect();
    s.write_all(&version::encode_hello(ahead)).unwrap();
    s.read_exact(&mut reply).unwrap();
    assert_eq!(version::decode_hello_reply(reply, ahead), HelloReply::Refused { node: version::LOCAL });
    expect_closed(&mut s);
    d.assert_alive();
    assert_serves_a_fresh_client(&d.socket);
    d.stop();
}

/// Rolling upgrades (issue 42): a trainer of the build before (local
/// protocol 2, which reads chunks of format 2 only) gets a format-2 copy
/// of each chunk, the same length and payload as the format-3 chunk a
/// trainer of this build gets.
#[test]
fn a_trainer_of_the_build_before_gets_chunks_in_the_format_it_reads() {
    use granary_proto::chunk::{CONVERTER_VERSION, Verify};
    use granary_proto::version::Speaks;
    let (_data, _run, d) = daemon_over(1, 600, 300, |_| {});
    let new = LocalSource::connect(&d.socket).expect("connect");
    let old =
        LocalSource::connect_speaking(&d.socket, Speaks { oldest: 1, current: 2 }).expect("connect as protocol 2");
    let info = new.describe("ads", None).expect("describe");
    old.describe("ads", Some(info.version)).expect("describe");
    let described = |bytes: &[u8]| {
        let v = granary_proto::ChunkView::parse(bytes, Verify::Full).expect("a valid chunk");
        ((v.format(), v.converter()), bytes[bytes.len() - v.header().payload_len as usize..].to_vec())
    };
    for s in &info.shards {
        let (a, b) =
            (new.fetch(info.version, s.shard).expect("fetch"), old.fetch(info.version, s.shard).expect("fetch"));
        let ((new_format, new_payload), (old_format, old_payload)) = (described(a.bytes()), described(b.bytes()));
        assert_eq!((new_format, old_format), ((3, Some(CONVERTER_VERSION)), (2, None)));
        assert_eq!((a.bytes().len(), new_payload), (b.bytes().len(), old_payload));
    }
    d.stop();
}
