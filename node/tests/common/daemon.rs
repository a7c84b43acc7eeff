//! A node daemon serving its Unix socket in the test's process, on its
//! own runtime (`socket.rs`).

use super::WAIT;
use granary_node::Node;
use granary_node::config::NodeConfig;
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
