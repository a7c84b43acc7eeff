//! A node daemon serving its Unix socket in the test's process, on its
//! own runtime (`socket.rs`).

use super::{WAIT, config, generate, parse_view};
use granary_node::Node;
use granary_node::config::NodeConfig;
use granary_proto::wire::{self, LocalRequest, LocalResponse};
use granary_testkit::datagen;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A daemon serving in this process, on its own runtime.
pub(crate) struct Daemon {
    pub(crate) runtime: tokio::runtime::Runtime,
    pub(crate) socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Daemon {
    pub(crate) fn start(cfg: NodeConfig, socket: PathBuf) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let node = runtime
            .block_on(async { tokio::time::timeout(WAIT, Node::start(&cfg)).await })
            .expect("node start timed out")
            .expect("node start");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let path = socket.clone();
        let task = runtime.spawn(async move {
            granary_node::daemon::serve(node, &path, granary_node::access::LocalAccess::new(None, None), async {
                let _ = stopped.await;
            })
            .await
        });
        let deadline = Instant::now() + WAIT;
        while UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "daemon did not listen on {}", socket.display());
            assert!(!task.is_finished(), "daemon stopped while starting");
            std::thread::sleep(Duration::from_millis(10));
        }
        Self { runtime, socket, stop: Some(stop), task }
    }

    pub(crate) fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.socket).expect("connect to daemon");
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.set_write_timeout(Some(WAIT)).unwrap();
        s
    }

    pub(crate) fn assert_alive(&self) {
        assert!(!self.task.is_finished(), "the daemon stopped serving");
    }

    pub(crate) fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let res = self.runtime.block_on(async { tokio::time::timeout(WAIT, &mut self.task).await });
        res.expect("daemon did not stop").expect("daemon task panicked").expect("daemon ended with an error");
    }
}

/// Sends `prefix` then `body` (raw, possibly inconsistent).
pub(crate) fn send_raw(s: &mut UnixStream, prefix: u32, body: &[u8]) {
    let mut frame = prefix.to_le_bytes().to_vec();
    frame.extend_from_slice(body);
    s.write_all(&frame).expect("send frame");
}

/// Reads one reply frame; `None` when the daemon closed the connection.
pub(crate) fn read_reply(s: &mut UnixStream) -> Option<LocalResponse> {
    let mut len = [0u8; 4];
    match s.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
        Err(e) => panic!("reading a reply: {e}"),
    }
    let len = u32::from_le_bytes(len) as usize;
    assert!(len <= wire::MAX_FRAME_LEN, "reply frame of {len} bytes");
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).expect("read reply body");
    Some(wire::decode::<LocalResponse>(&body).expect("reply validates"))
}

/// A daemon over `files` generated files (`rows` in all, row groups of
/// `row_group_rows`), with `limits` applied to its config; the folders
/// live as long as the guards.
pub(crate) fn daemon_over(
    files: u32,
    rows: u64,
    row_group_rows: u64,
    limits: impl FnOnce(&mut NodeConfig),
) -> (tempfile::TempDir, tempfile::TempDir, Daemon) {
    let data = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    generate(data.path(), files, rows, row_group_rows, "snappy");
    let mut cfg = config(data.path(), parse_view(datagen::VIEW_TOML));
    limits(&mut cfg);
    let daemon = Daemon::start(cfg, run.path().join("node.sock"));
    (data, run, daemon)
}

pub(crate) fn call(s: &mut UnixStream, req: &LocalRequest) -> Option<LocalResponse> {
    let body = wire::encode(req);
    send_raw(s, body.len() as u32, &body);
    read_reply(s)
}
