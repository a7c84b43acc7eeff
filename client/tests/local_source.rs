//! `LocalSource` against a scripted node on a Unix socket: replies that a
//! real node would never send are refused with a clear error, before any
//! memory file is mapped, and a connection left out of step by an error is
//! not used again.

use granary_client::{ChunkSource, ClientError, LocalSource};
use granary_proto::version;
use granary_proto::wire::{self, DatasetInfo, LocalRequest, LocalResponse};
use granary_proto::{DType, DatasetVersion, ShardId, ShardRows, TensorLayout};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use std::io::{IoSlice, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};

/// What the scripted node answers to one request: a frame (raw bytes) and
/// an optional descriptor sent with it.
type Answer = Box<dyn Fn(&LocalRequest) -> (Vec<u8>, Option<OwnedFd>) + Send>;

fn frame(resp: &LocalResponse) -> Vec<u8> {
    let body = wire::encode(resp);
    [(body.len() as u32).to_le_bytes().to_vec(), body.to_vec()].concat()
}

/// How a scripted node meets a connection's first bytes.
#[derive(Clone, Copy)]
enum Greeting {
    /// As this build's node: a hello is answered with what `speaks` and
    /// the trainer share (or a refusal).
    Speaks(version::Speaks),
    /// As a node of local protocol 1, which knows no hello: the first four
    /// bytes are a frame length; an oversized one is refused with a frame
    /// and the connection closed.
    Legacy,
}

/// This build's node.
const CURRENT: Greeting = Greeting::Speaks(version::LOCAL);

/// Serves one connection at a new socket, answering each request with
/// `answer`; returns the socket's path (in `dir`).
fn scripted_node(dir: &std::path::Path, answer: Answer) -> std::path::PathBuf {
    scripted_node_greeting(dir, CURRENT, answer)
}

/// [`scripted_node`] meeting connections as `greeting` says, for as many
/// connections as come (one at a time).
fn scripted_node_greeting(dir: &std::path::Path, greeting: Greeting, answer: Answer) -> std::path::PathBuf {
    let path = dir.join("node.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    std::thread::spawn(move || {
        while let Ok((mut stream, _)) = listener.accept() {
            serve(&mut stream, greeting, &answer);
        }
    });
    path
}

fn serve(stream: &mut UnixStream, greeting: Greeting, answer: &Answer) {
    let mut first = true;
    loop {
        let mut prefix = [0u8; 4];
        if stream.read_exact(&mut prefix).is_err() {
            return;
        }
        if std::mem::take(&mut first) {
            match greeting {
                Greeting::Speaks(node) if version::is_hello(prefix) => {
                    let mut rest = [0u8; 4];
                    stream.read_exact(&mut rest).expect("hello");
                    let chosen = node.negotiate(version::decode_hello(rest)).ok();
                    stream.write_all(&version::encode_hello_reply(chosen, node)).expect("reply");
                    if chosen.is_none() {
                        return;
                    }
                    continue;
                }
                Greeting::Legacy if u32::from_le_bytes(prefix) as usize > wire::MAX_FRAME_LEN => {
                    let why = format!(
                        "request frame of {} bytes exceeds {}",
                        u32::from_le_bytes(prefix),
                        wire::MAX_FRAME_LEN
                    );
                    let refused = LocalResponse::Failed { kind: wire::ErrorKind::BadRequest, message: why };
                    send(stream, &frame(&refused), None);
                    return;
                }
                _ => {}
            }
        }
        let mut body = vec![0u8; u32::from_le_bytes(prefix) as usize];
        if stream.read_exact(&mut body).is_err() {
            return;
        }
        let req: LocalRequest = wire::decode(&body).expect("request");
        let (bytes, fd) = answer(&req);
        send(stream, &bytes, fd);
    }
}

fn send(stream: &UnixStream, bytes: &[u8], fd: Option<OwnedFd>) {
    let mut sent = 0;
    while sent < bytes.len() {
        let iov = [IoSlice::new(&bytes[sent..])];
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut cmsg = SendAncillaryBuffer::new(&mut space);
        let fds;
        if let (0, Some(fd)) = (sent, fd.as_ref()) {
            fds = [fd.as_fd()];
            cmsg.push(SendAncillaryMessage::ScmRights(&fds));
        }
        match rustix::net::sendmsg(stream, &iov, &mut cmsg, SendFlags::NOSIGNAL) {
            Ok(n) => sent += n,
            Err(_) => return,
        }
    }
}

fn info(name: &str) -> DatasetInfo {
    DatasetInfo {
        name: name.into(),
        version: DatasetVersion([5; 16]),
        plan_key: granary_proto::PlanKey(5),
        tensors: vec![TensorLayout { name: "x".into(), dtype: DType::F32, shape: vec![4], jagged: false }],
        shards: vec![ShardRows { shard: ShardId { file: 0, row_group: 0 }, rows: 100 }],
        files: vec!["a.parquet".into()],
        source_bytes: 1,
        mapping_budget_bytes: u64::MAX,
    }
}

#[test]
fn a_description_of_another_dataset_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = scripted_node(dir.path(), Box::new(|_| (frame(&LocalResponse::Described(info("other"))), None)));
    let src = LocalSource::connect(&path).expect("connect");
    let e = src.describe("ads", None).expect_err("wrong dataset").to_string();
    assert!(e.contains("\"ads\"") && e.contains("\"other\""), "{e}");
}

#[test]
fn a_chunk_of_another_length_than_the_layout_gives_is_refused_before_mapping() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = scripted_node(
        dir.path(),
        Box::new(|req| match req {
            LocalRequest::Describe { .. } => (frame(&LocalResponse::Described(info("ads"))), None),
            _ => {
                // A sparse memory file of 1 TiB: mapping it with
                // MAP_POPULATE would commit memory for every page.
                let fd = rustix::fs::memfd_create("huge", rustix::fs::MemfdFlags::CLOEXEC).expect("memfd");
                rustix::fs::ftruncate(&fd, 1 << 40).expect("truncate");
                (frame(&LocalResponse::Chunk { len: 1 << 40 }), Some(fd))
            }
        }),
    );
    let src = LocalSource::connect(&path).expect("connect");
    let info = src.describe("ads", None).expect("describe");
    let e = src.fetch(info.version, info.shards[0].shard).expect_err("wrong length").to_string();
    assert!(e.contains(&(1u64 << 40).to_string()) && e.contains("layout"), "{e}");
}

#[test]
fn after_an_oversized_reply_the_connection_is_not_used_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A length prefix over the frame limit, followed by part of a body.
    let path =
        scripted_node(dir.path(), Box::new(|_| ([u32::MAX.to_le_bytes().to_vec(), vec![0u8; 64]].concat(), None)));
    let src = LocalSource::connect(&path).expect("connect");
    let first = src.describe("ads", None).expect_err("oversized");
    assert!(matches!(first, ClientError::Protocol(_)), "{first}");
    let second = src.describe("ads", None).expect_err("out of step").to_string();
    assert!(second.contains("out of step"), "{second}");
}

/// A node of local protocol 1 (every build before the hello) refuses the
/// hello as an oversized frame; the client connects again without one and
/// is served.
#[test]
fn a_node_of_the_protocol_before_the_hello_is_still_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = scripted_node_greeting(
        dir.path(),
        Greeting::Legacy,
        Box::new(|_| (frame(&LocalResponse::Described(info("ads"))), None)),
    );
    let src = LocalSource::connect(&path).expect("connect");
    assert_eq!(src.describe("ads", None).expect("described").name, "ads");
}

/// A node two versions ahead refuses the hello; the error names both
/// ranges and says to upgrade the trainer. A node two versions behind: the
/// node is to be upgraded. Never "malformed frame".
#[test]
fn a_node_too_far_from_the_client_is_named_with_both_versions() {
    let ahead = version::Speaks { oldest: version::LOCAL.current + 1, current: version::LOCAL.current + 2 };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = scripted_node_greeting(dir.path(), Greeting::Speaks(ahead), Box::new(|_| unreachable!("refused")));
    let e = LocalSource::connect(&path).err().expect("refused");
    assert!(matches!(e, ClientError::Version { node, .. } if node == ahead), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("local protocol {ahead}")) && msg.contains(&format!("this client {}", version::LOCAL)),
        "{msg}"
    );
    assert!(msg.contains("upgrade granary in the trainer") && !msg.contains("malformed"), "{msg}");
    assert!(!e.is_retryable());

    let behind = version::Speaks { oldest: 0, current: 0 };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = scripted_node_greeting(dir.path(), Greeting::Speaks(behind), Box::new(|_| unreachable!("refused")));
    let msg = LocalSource::connect(&path).err().expect("refused").to_string();
    assert!(msg.contains("upgrade the node"), "{msg}");
}

/// Counters by name came with local protocol 3: a node that agreed to 2
/// is never asked (its build cannot read the request); the error says to
/// upgrade the node. A node of 3 answers them.
#[test]
fn counters_are_asked_only_of_a_node_of_protocol_3() {
    let dir = tempfile::tempdir().expect("tempdir");
    let two = version::Speaks { oldest: 1, current: 2 };
    let path = scripted_node_greeting(dir.path(), Greeting::Speaks(two), Box::new(|r| panic!("asked {r:?}")));
    let e = LocalSource::connect(&path).expect("connect").counters().expect_err("protocol 2");
    assert!(e.to_string().contains("upgrade the node"), "{e}");

    let dir = tempfile::tempdir().expect("tempdir");
    let counters = vec![wire::Counter { name: "chunks_reused".into(), value: 7 }];
    let path = scripted_node(
        dir.path(),
        Box::new(move |r| match r {
            LocalRequest::Counters => (frame(&LocalResponse::Counters(counters.clone())), None),
            other => panic!("asked {other:?}"),
        }),
    );
    let got = LocalSource::connect(&path).expect("connect").counters().expect("counters");
    assert_eq!(got, [("chunks_reused".to_string(), 7)]);
}
