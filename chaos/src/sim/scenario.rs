//! One named fault on a fixed cluster, measured against the same run
//! without it: the costs issue 14 sets targets for. Three nodes, forty
//! shards, remote reads of about a second each (a throttled link), three
//! epochs; node 2 is stopped, cut off from every other process, or killed
//! and restarted, for `secs` seconds in the middle of the cold epoch.
//!
//! Target: the cold epoch takes at most `secs` + one lease longer than
//! without the fault; warm epochs read nothing from remote storage.

use super::params::LEASE;
use super::swarm::Swarm;
use super::world::{Addr, Fault, Micros, ms};
use super::{Outcome, run_schedule, run_watched};

/// The fault of a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// SIGSTOP, then SIGCONT.
    Stop,
    /// Every link of the node cut both ways (the other nodes and the
    /// coordinator), then healed.
    Partition,
    /// SIGKILL, restarted after the fault's length (its memory is gone).
    Crash,
}

/// A scenario's result.
#[derive(Debug, Clone)]
pub struct Cost {
    /// The fault.
    pub kind: Kind,
    /// The run without the fault.
    pub calm: Outcome,
    /// The run with it.
    pub faulted: Outcome,
    /// The fault's length in milliseconds.
    pub fault_ms: u64,
}

impl Cost {
    /// Extra time of the cold epoch, in milliseconds.
    pub fn extra_cold_ms(&self) -> i64 {
        self.faulted.epoch_end_ms[0] as i64 - self.calm.epoch_end_ms[0] as i64
    }

    /// The time the target allows: the fault and one lease.
    pub fn allowed_ms(&self) -> i64 {
        (self.fault_ms + LEASE / 1000) as i64
    }

    /// Remote reads beyond the fault-free run's.
    pub fn extra_reads(&self) -> i64 {
        self.faulted.remote_reads as i64 - self.calm.remote_reads as i64
    }

    /// Shards read again that the fault did not expose: a shard may be
    /// read a second time only if the stopped or cut-off node held it or
    /// was loading it when the fault began (the survivors cannot reach that
    /// copy), or asked for it during the fault (it cannot reach anyone).
    /// Any other second read, or a third, is a cost the target forbids.
    pub fn unexposed_rereads(&self) -> &[(u32, u64)] {
        &self.faulted.reads_beyond
    }

    /// Remote reads in warm epochs (after the first) of the faulted run.
    pub fn warm_reads(&self) -> u64 {
        self.faulted.reads_by_epoch.iter().skip(1).sum()
    }

    /// Remote reads in warm epochs that the target forbids: every one after
    /// a stop or a partition; after a crash, those of shards the node did
    /// not hold or load when it was killed (it lost what it held: the
    /// simulated node keeps chunks in memory only, and reads them again
    /// once, in whichever epoch it next needs them).
    pub fn forbidden_warm_reads(&self) -> u64 {
        match self.kind {
            Kind::Crash => self.faulted.warm_reads.iter().filter(|s| !self.faulted.exposed.contains(s)).count() as u64,
            Kind::Stop | Kind::Partition => self.warm_reads(),
        }
    }
}

/// The scenario's cluster.
pub fn swarm() -> Swarm {
    Swarm {
        nodes: 3,
        shards: 40,
        epochs: 3,
        window: 4,
        share_per_mille: 0,
        step_ms: 10,
        latency_ms: (0, 1),
        loss_per_mille: 0,
        duplicate_per_mille: 0,
        watch_lag_ms: 0,
        remote_ms: (900, 1_100),
        slow_remote_per_mille: 0,
        corrupt_per_mille: 0,
        fault_window_ms: 0,
        partitions: 0,
        crashes: 0,
        stalls: 0,
        failovers: 0,
        fault_ms: (0, 0),
    }
}

/// Runs `kind` for `secs` seconds on node 2, starting `start_ms` into the
/// run (the cold epoch), and the same run without it; `keep_trace` keeps
/// the faulted run's trace.
pub fn run(kind: Kind, secs: u64, start_ms: u64, seed: u64, keep_trace: bool) -> Cost {
    let (at, until): (Micros, Micros) = (ms(start_ms), ms(start_ms + secs * 1000));
    let node = Addr::Node(2);
    let faults = match kind {
        Kind::Stop => vec![(at, Fault::Stop(2)), (until, Fault::Continue(2))],
        Kind::Crash => vec![(at, Fault::Crash(2)), (until, Fault::Restart(2))],
        Kind::Partition => {
            let others = [Addr::Node(0), Addr::Node(1), Addr::Coord];
            let mut f = Vec::new();
            for (i, o) in others.into_iter().enumerate() {
                for (k, (from, to)) in [(node, o), (o, node)].into_iter().enumerate() {
                    f.push((at, Fault::Cut { from, to, first: i == 0 && k == 0 }));
                    f.push((until, Fault::Heal { from, to }));
                }
            }
            f.sort_by_key(|(t, _)| *t);
            f
        }
    };
    Cost {
        kind,
        calm: run_schedule(seed, swarm(), Vec::new(), false),
        faulted: run_watched(seed, swarm(), faults, Some((2, at, until)), keep_trace),
        fault_ms: secs * 1000,
    }
}
