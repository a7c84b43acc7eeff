//! [`NodeProcess`]: a node daemon child, ready once its socket accepts
//! connections, stopped by SIGTERM (clean) or SIGKILL.

use super::child::{log_tail, quiet_errors};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A node daemon child process.
pub struct NodeProcess {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
}

impl NodeProcess {
    /// Starts `exe node --config config` and waits (up to `timeout`) until its
    /// socket accepts connections.
    pub fn spawn(exe: &Path, config: &Path, socket: &Path, log: &Path, timeout: Duration) -> Result<Self> {
        Self::spawn_in(None, exe, config, socket, log, timeout)
    }

    /// [`NodeProcess::spawn`] inside network namespace `netns` (`ip netns
    /// exec`, which execs the node: the child is the daemon). Its socket is
    /// a file, reachable from every namespace.
    pub fn spawn_in(
        netns: Option<&str>,
        exe: &Path,
        config: &Path,
        socket: &Path,
        log: &Path,
        timeout: Duration,
    ) -> Result<Self> {
        let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        // The harness waits on the node's "placement known" line
        // (`LocalCluster::wait_placement`): keep it whatever level the
        // caller's GRANARY_LOG asks for.
        let filter = std::env::var("GRANARY_LOG").unwrap_or_else(|_| "info".into());
        let child = quiet_errors(&mut super::child::command_in(netns, exe))
            .env("GRANARY_LOG", format!("{filter},granary_node::fabric::follow=info"))
            .arg("node")
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {} node", exe.display()))?;
        let mut node = Self { child, socket: socket.to_path_buf(), log: log.to_path_buf() };
        let deadline = Instant::now() + timeout;
        loop {
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return Ok(node);
            }
            if let Some(status) = node.child.try_wait()? {
                bail!("node exited with {status} before serving:\n{}", node.log_tail());
            }
            if Instant::now() > deadline {
                bail!("node did not serve {} within {timeout:?}:\n{}", socket.display(), node.log_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The last lines of the daemon's log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// Asks the daemon to stop (SIGTERM: it finishes writing its SSD tier)
    /// and waits up to `timeout` for it to exit.
    pub fn terminate(mut self, timeout: Duration) -> Result<()> {
        // SAFETY: kill(2) on our own child, which has not been reaped (we
        // hold its handle), so the pid is still ours.
        let rc = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        if rc != 0 {
            bail!("SIGTERM to node {}: {}", self.child.id(), std::io::Error::last_os_error());
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                if status.success() {
                    return Ok(());
                }
                bail!("node exited with {status} after SIGTERM:\n{}", self.log_tail());
            }
            if Instant::now() > deadline {
                bail!("node did not stop within {timeout:?} of SIGTERM:\n{}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the daemon (SIGKILL through its handle) and reaps it.
    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
