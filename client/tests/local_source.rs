//! `LocalSource` against a scripted node on a Unix socket: replies that a
//! real node would never send are refused with a clear error, before any
//! memory file is mapped, and a connection left out of step by an error is
//! not used again.

use granary_client::{ChunkSource, ClientError, LocalSource};
use granary_proto::wire::{self, DatasetInfo, LocalRequest, LocalResponse};
use granary_proto::{DType, DatasetVersion, ShardId, ShardRows, TensorLayout};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use std::io::{IoSlice, Read};
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

/// Serves one connection at a new socket, answering each request with
/// `answer`; returns the socket's path (in `dir`).
fn scripted_node(dir: &std::path::Path, answer: Answer) -> std::path::PathBuf {
    let path = dir.join("node.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else { return };
        loop {
            let mut prefix = [0u8; 4];
            if stream.read_exact(&mut prefix).is_err() {
                return;
            }
            let mut body = vec![0u8; u32::from_le_bytes(prefix) as usize];
            if stream.read_exact(&mut body).is_err() {
                return;
            }
            let req: LocalRequest = wire::decode(&body).expect("request");
            let (bytes, fd) = answer(&req);
            send(&stream, &bytes, fd);
        }
    });
    path
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
