//! A seed's trainer ranks: started and made ready before the clock starts,
//! polled for their epochs while the faults run, killed with their host
//! and started again with it, and finished at the end.

use super::config::RunConfig;
use super::faults::cluster_socket;
use super::verdict::Observed;
use anyhow::{Result, anyhow, bail};
use granary_testkit::harness::{TrainerEvent, TrainerProcess};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One rank's state in a seed's run.
struct Rank {
    proc: Option<TrainerProcess>,
    /// Waiting for its Ready line after a (re)start.
    starting: bool,
    /// The first epoch it has not finished.
    next_epoch: u64,
    finished: bool,
    /// Failed while its node ran: it is not started again.
    lost: bool,
}

/// Every rank of a seed's job.
pub(super) struct Ranks<'a> {
    cfg: &'a RunConfig,
    dir: PathBuf,
    ranks: Vec<Rank>,
    /// Ranks started again with their host.
    pub(super) restarts: u64,
    /// When the last rank finished each epoch, seconds from the start.
    pub(super) epoch_ends: Vec<f64>,
}

impl<'a> Ranks<'a> {
    /// Starts every rank of `cfg`'s world against the nodes in `dir`, waits
    /// for each to be ready, and starts epoch 0 on all of them (the
    /// schedule counts from the first epoch).
    pub(super) fn start(cfg: &'a RunConfig, dir: &Path) -> Result<Self> {
        let mut ranks = Ranks { cfg, dir: dir.to_path_buf(), ranks: Vec::new(), restarts: 0, epoch_ends: Vec::new() };
        for rank in 0..cfg.world() {
            let proc = Some(ranks.spawn(rank)?);
            ranks.ranks.push(Rank { proc, starting: true, next_epoch: 0, finished: false, lost: false });
        }
        for (r, rank) in ranks.ranks.iter_mut().enumerate() {
            let p = rank.proc.as_mut().ok_or_else(|| anyhow!("rank {r} missing"))?;
            match p.next_event(Duration::from_secs(120))? {
                TrainerEvent::Ready { .. } => {}
                other => bail!("rank {r}: expected ready, got {other:?}"),
            }
            rank.starting = false;
            p.start_epoch(0)?;
        }
        Ok(ranks)
    }

    /// The node a rank runs beside.
    fn node_of(&self, rank: u32) -> u64 {
        u64::from(rank / self.cfg.ranks_per_node) + 1
    }

    fn spawn(&self, rank: u32) -> Result<TrainerProcess> {
        let cfg = self.cfg;
        let a = cfg.rank_args(&cluster_socket(&self.dir, self.node_of(rank)), rank);
        let log = self.dir.join(format!("rank-{rank}.log"));
        TrainerProcess::spawn_logged(&cfg.exe, rank, cfg.ranks_per_node as usize, &a, &log)
    }

    /// Host `node` goes down: its ranks go with it (killed on drop).
    pub(super) fn kill_host(&mut self, node: u64) {
        for r in 0..self.ranks.len() {
            if self.node_of(r as u32) == node {
                self.ranks[r].proc = None;
            }
        }
    }

    /// Host `node` is back: its unfinished ranks start again, from the
    /// start of the epoch they had not finished.
    pub(super) fn restart_host(&mut self, node: u64) -> Result<()> {
        for r in 0..self.ranks.len() {
            let rank = &self.ranks[r];
            if self.node_of(r as u32) == node && !rank.finished && !rank.lost {
                let proc = self.spawn(r as u32)?;
                let rank = &mut self.ranks[r];
                rank.proc = Some(proc);
                rank.starting = true;
                self.restarts += 1;
            }
        }
        Ok(())
    }

    /// Takes every rank's events: a rank ready after a restart starts its
    /// epoch, a finished epoch's digest is kept and the next epoch started,
    /// an error loses the rank.
    pub(super) fn poll(&mut self, obs: &mut Observed, t0: Instant) -> Result<()> {
        let epochs = self.cfg.epochs;
        for (r, rank) in self.ranks.iter_mut().enumerate() {
            let r = r as u32;
            let Some(p) = rank.proc.as_mut() else { continue };
            loop {
                let ev = match p.try_event() {
                    Ok(Some(ev)) => ev,
                    Ok(None) => break,
                    Err(e) => TrainerEvent::Error { rank: r, message: format!("{e:#}") },
                };
                match ev {
                    TrainerEvent::Ready { .. } if rank.starting => {
                        rank.starting = false;
                        p.start_epoch(rank.next_epoch)?;
                    }
                    TrainerEvent::Progress { .. } => {}
                    TrainerEvent::Epoch { epoch, digest, .. } => {
                        obs.digests.insert((r, epoch), digest);
                        let e = epoch as usize;
                        if self.epoch_ends.len() <= e {
                            self.epoch_ends.resize(e + 1, 0.0);
                        }
                        self.epoch_ends[e] = f64::max(self.epoch_ends[e], t0.elapsed().as_secs_f64());
                        rank.next_epoch = epoch + 1;
                        if rank.next_epoch < epochs {
                            p.start_epoch(rank.next_epoch)?;
                        } else {
                            rank.finished = true;
                        }
                    }
                    TrainerEvent::Error { message, .. } => {
                        obs.rank_errors.push((r, rank.next_epoch, message));
                        rank.proc = None;
                        rank.lost = true;
                        break;
                    }
                    other => {
                        obs.rank_errors.push((r, rank.next_epoch, format!("unexpected event {other:?}")));
                        rank.proc = None;
                        rank.lost = true;
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether every rank finished its epochs or was lost.
    pub(super) fn done(&self) -> bool {
        self.ranks.iter().all(|r| r.finished || r.lost)
    }

    /// The ranks that had not finished, and in which epoch.
    pub(super) fn stuck(&self) -> String {
        let stuck: Vec<String> = self
            .ranks
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.finished)
            .map(|(i, r)| format!("rank {i} in epoch {}", r.next_epoch))
            .collect();
        stuck.join(", ")
    }

    /// The end: finished ranks exit cleanly (or say why not), the others
    /// are killed.
    pub(super) fn finish(&mut self, obs: &mut Observed) {
        for (r, rank) in self.ranks.iter_mut().enumerate() {
            if let Some(p) = rank.proc.take()
                && rank.finished
                && let Err(e) = p.finish(Duration::from_secs(30))
            {
                obs.unclean.push(format!("rank {r}: {e:#}"));
            }
        }
    }
}
