//! Trainer ranks: [`TrainerProcess`], the JSON-lines protocol a rank speaks
//! on stdout ([`TrainerEvent`]), and starting a set of ranks and running an
//! epoch on all of them at once, every wait bounded.

use super::child::quiet_errors;
use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

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
    /// One batch of a `steps` command: which rows it held, in order
    /// (`granary_client::Batch::row_digests`).
    Rows {
        /// Rank.
        rank: u32,
        /// Epoch.
        epoch: u64,
        /// The batch's index (with the global plan, the global step).
        step: u64,
        /// One digest per row.
        rows: Vec<u64>,
    },
    /// A `steps` command finished: the rank's resume state at the next
    /// batch (what a checkpoint taken there saves), as JSON.
    Stopped {
        /// Rank.
        rank: u32,
        /// Epoch.
        epoch: u64,
        /// The next batch.
        next: u64,
        /// `granary_client::ResumeState` as JSON.
        state: String,
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
    /// Starts `exe trainer ARGS` as one of `local_world` ranks on this host
    /// (`LOCAL_WORLD_SIZE`, as torchrun sets it: the loader shares the
    /// host's cores among them); the reader thread parses its stdout.
    pub fn spawn(exe: &Path, rank: u32, local_world: usize, args: &[String]) -> Result<Self> {
        Self::spawn_to(exe, rank, local_world, args, Stdio::inherit())
    }

    /// [`TrainerProcess::spawn`] with the rank's stderr (its log) appended
    /// to `log`.
    pub fn spawn_logged(exe: &Path, rank: u32, local_world: usize, args: &[String], log: &Path) -> Result<Self> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        Self::spawn_to(exe, rank, local_world, args, Stdio::from(out))
    }

    fn spawn_to(exe: &Path, rank: u32, local_world: usize, args: &[String], stderr: Stdio) -> Result<Self> {
        let mut child = quiet_errors(&mut Command::new(exe))
            .arg("trainer")
            .args(args)
            .env("LOCAL_WORLD_SIZE", local_world.max(1).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
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

    /// Tells the rank to run batches `from..to` of `epoch` (a `steps`
    /// command: a [`TrainerEvent::Rows`] per batch, then
    /// [`TrainerEvent::Stopped`]).
    pub fn run_steps(&mut self, epoch: u64, from: u64, to: u64) -> Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| anyhow!("trainer stdin closed"))?;
        writeln!(stdin, "steps {epoch} {from} {to}")?;
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

    /// The next event if one has arrived; `Ok(None)` if none has yet.
    pub fn try_event(&self) -> Result<Option<TrainerEvent>> {
        match self.events.try_recv() {
            Ok(Ok(ev)) => Ok(Some(ev)),
            Ok(Err(line)) => bail!("rank {} printed an unreadable line: {line}", self.rank),
            Err(std::sync::mpsc::TryRecvError::Empty) => Ok(None),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => bail!("rank {} exited", self.rank),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
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

/// The arguments that place a trainer rank: its node's socket, its rank
/// and the job's world size (the job's own settings go after them).
pub fn rank_args(socket: &Path, rank: u32, world: u32) -> Vec<String> {
    vec![
        "--socket".to_string(),
        socket.display().to_string(),
        "--rank".into(),
        rank.to_string(),
        "--world".into(),
        world.to_string(),
    ]
}

/// Starts one trainer per entry of `sockets` (rank i on `sockets[i]`) with
/// the common `args`, and waits for each to be ready. Returns the ranks and
/// the batches per epoch.
pub fn spawn_ranks(exe: &Path, sockets: &[PathBuf], args: &[String]) -> Result<(Vec<TrainerProcess>, u64)> {
    let world = sockets.len();
    let mut ranks = Vec::with_capacity(world);
    for (r, socket) in sockets.iter().enumerate() {
        let mut a = rank_args(socket, r as u32, world as u32);
        a.extend_from_slice(args);
        let local = sockets.iter().filter(|s| *s == socket).count();
        ranks.push(TrainerProcess::spawn(exe, r as u32, local, &a)?);
    }
    let mut batches = 0;
    for t in &ranks {
        match t.next_event(Duration::from_secs(120))? {
            TrainerEvent::Ready { batches: b, .. } => batches = b,
            TrainerEvent::Error { message, .. } => bail!("rank {} failed: {message}", t.rank),
            other => bail!("rank {}: unexpected event {other:?}", t.rank),
        }
    }
    Ok((ranks, batches))
}

/// One epoch over a set of ranks.
#[derive(Clone, Debug, Default)]
pub struct EpochOutcome {
    /// Rows delivered over all ranks.
    pub rows: u64,
    /// Tensor bytes delivered over all ranks.
    pub bytes: u64,
    /// Wall time from the start command to the last rank's end.
    pub secs: f64,
    /// Rank -> digest of its batch checksums.
    pub digests: BTreeMap<u32, String>,
}

/// Runs `epoch` on every rank at once and waits for all of them; `progress`
/// sees (rank, batches done).
pub fn run_epoch(
    ranks: &mut [TrainerProcess],
    epoch: u64,
    timeout: Duration,
    mut progress: impl FnMut(u32, u64),
) -> Result<EpochOutcome> {
    let start = Instant::now();
    for t in ranks.iter_mut() {
        t.start_epoch(epoch)?;
    }
    let mut out = EpochOutcome::default();
    for t in ranks.iter() {
        loop {
            match t.next_event(timeout)? {
                TrainerEvent::Progress { done, .. } => progress(t.rank, done),
                TrainerEvent::Epoch { rows, bytes, digest, .. } => {
                    out.rows += rows;
                    out.bytes += bytes;
                    out.digests.insert(t.rank, digest);
                    break;
                }
                TrainerEvent::Error { message, .. } => bail!("rank {} failed: {message}", t.rank),
                other => bail!("rank {}: unexpected event {other:?}", t.rank),
            }
        }
    }
    out.secs = start.elapsed().as_secs_f64();
    Ok(out)
}
