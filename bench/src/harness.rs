//! Real processes for demos and benchmarks: the node daemon and trainer
//! ranks, started from the `granary` binary, stopped by handle, every wait
//! bounded.

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// The last 20 lines of a child's log file (empty if unreadable).
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

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
        let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(exe)
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

/// Memory of a process, from /proc/PID/status, in bytes.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ProcMemory {
    /// Anonymous resident memory.
    pub rss_anon: u64,
    /// File-backed resident memory.
    pub rss_file: u64,
    /// Resident shared memory (memory files the process touched).
    pub rss_shmem: u64,
}

/// Reads /proc/PID/status.
pub fn proc_memory(pid: u32) -> Result<ProcMemory> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    Ok(ProcMemory { rss_anon: field("RssAnon:"), rss_file: field("RssFile:"), rss_shmem: field("RssShmem:") })
}

/// One line a trainer rank prints on stdout.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TrainerEvent {
    /// Connected and planned; waiting for `epoch N` lines on stdin.
    Ready {
        /// Rank.
        rank: u32,
        /// Batches per epoch.
        batches: u64,
    },
    /// Progress within an epoch.
    Progress {
        /// Rank.
        rank: u32,
        /// Epoch.
        epoch: u64,
        /// Batches done.
        done: u64,
    },
    /// An epoch finished.
    Epoch {
        /// Rank.
        rank: u32,
        /// Epoch.
        epoch: u64,
        /// Rows delivered.
        rows: u64,
        /// Tensor bytes delivered.
        bytes: u64,
        /// Seconds from the `epoch` command to the last batch.
        secs: f64,
        /// Hash of the sequence of batch checksums, hex.
        digest: String,
    },
    /// The rank failed.
    Error {
        /// Rank.
        rank: u32,
        /// What failed.
        message: String,
    },
}

/// A trainer rank child process.
pub struct TrainerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    events: Receiver<Result<TrainerEvent, String>>,
    /// The rank.
    pub rank: u32,
}

impl TrainerProcess {
    /// Starts `exe trainer ARGS`; the reader thread parses its stdout.
    pub fn spawn(exe: &Path, rank: u32, args: &[String]) -> Result<Self> {
        let mut child = Command::new(exe)
            .arg("trainer")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting trainer rank {rank}"))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("trainer stdout missing"))?;
        let stdin = child.stdin.take();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let ev = serde_json::from_str::<TrainerEvent>(&line).map_err(|e| format!("{e}: {line}"));
                if tx.send(ev).is_err() {
                    break;
                }
            }
        });
        Ok(Self { child, stdin, events: rx, rank })
    }

    /// Tells the rank to run `epoch`.
    pub fn start_epoch(&mut self, epoch: u64) -> Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| anyhow!("trainer stdin closed"))?;
        writeln!(stdin, "epoch {epoch}")?;
        stdin.flush()?;
        Ok(())
    }

    /// The next event, waiting at most `timeout`.
    pub fn next_event(&self, timeout: Duration) -> Result<TrainerEvent> {
        match self.events.recv_timeout(timeout) {
            Ok(Ok(ev)) => Ok(ev),
            Ok(Err(line)) => bail!("rank {} printed an unreadable line: {line}", self.rank),
            Err(RecvTimeoutError::Timeout) => bail!("rank {} said nothing for {timeout:?}", self.rank),
            Err(RecvTimeoutError::Disconnected) => bail!("rank {} exited", self.rank),
        }
    }

    /// Closes stdin (the rank exits) and waits for it, bounded.
    pub fn finish(mut self, timeout: Duration) -> Result<()> {
        drop(self.stdin.take());
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return if status.success() { Ok(()) } else { Err(anyhow!("rank {} exited with {status}", self.rank)) };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        bail!("rank {} did not exit within {timeout:?}", self.rank)
    }
}

impl Drop for TrainerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reserves a loopback UDP port by binding and releasing it. Coordinators
/// need fixed ports (a voter's address is part of the replicated
/// membership, so a restarted voter must return to it).
pub fn reserve_udp_port() -> Result<std::net::SocketAddr> {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").context("binding a UDP port")?;
    Ok(s.local_addr()?)
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
        let peers = voters.iter().map(|v| format!("{}={}", v.id, v.addr)).collect::<Vec<_>>().join(",");
        // Appended, so a restarted voter's log follows its previous life's.
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let mut child = Command::new(exe)
            .args(["coordinator", "--json", "--id", &me.id.to_string(), "--listen", &me.addr.to_string()])
            .args(["--peers", &peers])
            .arg("--data-dir")
            .arg(&me.data_dir)
            .arg("--certs")
            .arg(certs)
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

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
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
