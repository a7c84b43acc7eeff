//! Coordinator voters: [`CoordinatorProcess`], started from a
//! [`VoterSpec`] on a fixed loopback port ([`reserve_udp_port`]) so that a
//! restarted voter returns to the address the membership records.

use super::child::{log_tail, quiet_errors};
use anyhow::{Context, Result, bail};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc::channel;
use std::time::Duration;

/// Reserves a loopback UDP port by binding and releasing it. Coordinators
/// need fixed ports (a voter's address is part of the replicated
/// membership, so a restarted voter must return to it).
///
/// Ports come from below the kernel's ephemeral range (32768-60999 by
/// default), so that a socket bound to port 0 never takes one while the
/// process that owns it is down: a soak's restarted node found its peer
/// port taken ("Address already in use"). Each process walks the range
/// from its own offset, so parallel test processes rarely meet.
pub fn reserve_udp_port() -> Result<std::net::SocketAddr> {
    reserve_port(|port| std::net::UdpSocket::bind(("127.0.0.1", port)).and_then(|s| s.local_addr()))
        .context("binding a UDP port")
}

/// A free loopback TCP port, from the same range as [`reserve_udp_port`]
/// (metrics endpoints).
pub fn reserve_tcp_port() -> Result<std::net::SocketAddr> {
    reserve_port(|port| std::net::TcpListener::bind(("127.0.0.1", port)).and_then(|s| s.local_addr()))
        .context("binding a TCP port")
}

/// The first port of this process's walk that `bind` can take (then
/// released), or the kernel's choice (port 0) when every one is taken.
fn reserve_port(bind: impl Fn(u16) -> std::io::Result<std::net::SocketAddr>) -> std::io::Result<std::net::SocketAddr> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id().wrapping_mul(2_654_435_761) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (offset + n.wrapping_mul(7_919)) % SPAN) as u16;
        if let Ok(addr) = bind(port) {
            return Ok(addr);
        }
    }
    bind(0)
}

/// How to start one coordinator voter.
#[derive(Clone, Debug)]
pub struct VoterSpec {
    /// Voter id.
    pub id: u64,
    /// Its address.
    pub addr: std::net::SocketAddr,
    /// Its data folder.
    pub data_dir: PathBuf,
    /// The `HOST:PORT` name its peers dial (resolved at every dial)
    /// instead of `addr`; None: `addr`.
    pub name: Option<String>,
}

impl VoterSpec {
    /// How the group's `--peers` names it.
    pub fn reached_at(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.addr.to_string())
    }
}

/// A coordinator voter child process.
pub struct CoordinatorProcess {
    child: Child,
    id: u64,
    log: PathBuf,
}

impl CoordinatorProcess {
    /// Starts `exe coordinator --json` for `me` in the group `voters`, with
    /// `certs` and any `extra` arguments, and waits (up to `timeout`) for its
    /// ready line.
    pub fn spawn(
        exe: &Path,
        me: &VoterSpec,
        voters: &[VoterSpec],
        certs: &Path,
        extra: &[String],
        log: &Path,
        timeout: Duration,
    ) -> Result<Self> {
        Self::spawn_in(None, exe, me, voters, certs, extra, log, timeout)
    }

    /// [`CoordinatorProcess::spawn`] inside network namespace `netns`
    /// (`ip netns exec`, which execs the voter: the child is the voter).
    #[allow(clippy::too_many_arguments)]
    pub fn spawn_in(
        netns: Option<&str>,
        exe: &Path,
        me: &VoterSpec,
        voters: &[VoterSpec],
        certs: &Path,
        extra: &[String],
        log: &Path,
        timeout: Duration,
    ) -> Result<Self> {
        let peers = voters.iter().map(|v| format!("{}={}", v.id, v.reached_at())).collect::<Vec<_>>().join(",");
        // Appended, so a restarted voter's log follows its previous life's.
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        // Its own certificate, bound to its voter id, where one was issued:
        // its own folder (`certs init`'s `hosts/coordinator-ID/`), or a file
        // of an all-in-one folder (`init_cluster`); else the shared one.
        let bound = format!("coordinator-{}", me.id);
        let (certs, cert_name) = if certs.join(&bound).is_dir() {
            (certs.join(&bound), bound)
        } else if certs.join(format!("{bound}.pem")).exists() {
            (certs.to_path_buf(), bound)
        } else {
            (certs.to_path_buf(), "coordinator".to_string())
        };
        let mut child = quiet_errors(&mut super::child::command_in(netns, exe))
            .args(["coordinator", "--json", "--id", &me.id.to_string(), "--listen", &me.addr.to_string()])
            .args(["--cert-name", &cert_name])
            .args(["--peers", &peers])
            .arg("--data-dir")
            .arg(&me.data_dir)
            .arg("--certs")
            .arg(&certs)
            .args(extra)
            .env("GRANARY_LOG", std::env::var("GRANARY_LOG").unwrap_or_else(|_| "info,openraft=warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {} coordinator", exe.display()))?;
        let stdout = child.stdout.take().context("coordinator stdout")?;
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let mut p = Self { child, id: me.id, log: log.to_path_buf() };
        let line = match rx.recv_timeout(timeout) {
            Ok(l) if !l.is_empty() => l,
            _ => bail!("voter {} did not report ready within {timeout:?}:\n{}", me.id, p.log_tail()),
        };
        let ready: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("voter {} ready line {line:?}", me.id))?;
        if ready["addr"] != me.addr.to_string() {
            let _ = p.child.kill();
            bail!("voter {} serves on {} instead of {}", me.id, ready["addr"], me.addr);
        }
        Ok(p)
    }

    /// Voter id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// Stops the voter cleanly (SIGTERM) and waits for it, bounded.
    pub fn terminate(mut self, timeout: Duration) -> Result<()> {
        // SAFETY: kill(2) on our own child, which has not been reaped (we
        // hold its handle), so the pid is still ours.
        let rc = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        if rc != 0 {
            bail!("SIGTERM to voter {}: {}", self.id, std::io::Error::last_os_error());
        }
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                if status.success() {
                    return Ok(());
                }
                bail!("voter {} exited with {status} after SIGTERM:\n{}", self.id, self.log_tail());
            }
            if std::time::Instant::now() > deadline {
                bail!("voter {} did not stop within {timeout:?} of SIGTERM:\n{}", self.id, self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL through the handle, then reap.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for CoordinatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
