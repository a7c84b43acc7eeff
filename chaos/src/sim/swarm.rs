//! [`Swarm`]: every parameter of one simulated run, drawn from its seed
//! (swarm testing, as TigerBeetle's VOPR does it): how many nodes and
//! shards, how slow the links and remote storage are, and which faults of
//! which kinds the schedule holds. One seed, one swarm, printed with any
//! failure, so a run is understood before it is replayed.

use granary_proto::rng::{Rng, seed_of};
use std::fmt;

/// The parameters of one run. Times in milliseconds of simulated time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swarm {
    /// Node daemons (one per host).
    pub nodes: usize,
    /// Shards (row groups) of the one dataset.
    pub shards: usize,
    /// Epochs each host's trainer reads.
    pub epochs: u32,
    /// Chunk requests a trainer keeps in flight.
    pub window: usize,
    /// Share of the dataset each node's trainer reads per epoch, in
    /// thousandths (at least its own range: 1/nodes and one shard; 1000:
    /// every node reads everything, as an evaluation pass does), so nodes
    /// often want the same shard at once.
    pub share_per_mille: u64,
    /// The trainer's compute time per chunk it is handed.
    pub step_ms: u64,
    /// One-way latency between two processes, drawn per message in this
    /// range.
    pub latency_ms: (u64, u64),
    /// Per-mille odds that a message's datagram is lost and retransmitted
    /// (each loss adds a probe timeout of delay; QUIC streams never lose or
    /// reorder bytes, so loss shows as delay).
    pub loss_per_mille: u64,
    /// Per-mille odds that a request to the coordinator is delivered twice
    /// (a client retry after a lost answer).
    pub duplicate_per_mille: u64,
    /// How far behind the leader a node's placement watch may lag (a watch
    /// stream reopened after a failover, a slow link): each placement
    /// reaches a node up to this much later.
    pub watch_lag_ms: u64,
    /// Time to read and convert one shard from remote storage.
    pub remote_ms: (u64, u64),
    /// Per-mille odds that one remote read is slow (ten times the time).
    pub slow_remote_per_mille: u64,
    /// Per-mille odds that a chunk crosses the fabric corrupted (caught by
    /// the chunk's checksum).
    pub corrupt_per_mille: u64,
    /// Faults are placed between 2 s and this time.
    pub fault_window_ms: u64,
    /// Partitions: a node cut from all others and the coordinator, or one
    /// link cut, both ways or one way.
    pub partitions: u32,
    /// Node processes killed, each restarted after a while.
    pub crashes: u32,
    /// Node processes stopped (SIGSTOP) and continued.
    pub stalls: u32,
    /// Coordinator leader failovers (an election window, then a new term).
    pub failovers: u32,
    /// How long one partition, stop or election lasts, drawn in this range.
    pub fault_ms: (u64, u64),
}

impl Swarm {
    /// The swarm of `seed`.
    pub fn from_seed(seed: u64) -> Self {
        let mut r = Rng::new(seed_of(&[seed, 0x0053_5741_524d]));
        let mut between = |lo: u64, hi: u64| lo + r.below(hi - lo + 1);
        let nodes = between(2, 5) as usize;
        let shards = between(4, 24) as usize;
        let window = between(1, 4) as usize;
        let step_ms = between(20, 400);
        let share_per_mille = match between(0, 3) {
            0 => 1000,
            1 => between(0, 1000),
            _ => 0,
        };
        let lat_lo = between(0, 2);
        let latency_ms = (lat_lo, lat_lo + between(0, 20));
        // Half the runs are calm on some axis, so each fault is also seen
        // alone (swarm testing: not every fault in every run).
        let loss_per_mille = if between(0, 1) == 0 { 0 } else { between(0, 300) };
        let duplicate_per_mille = if between(0, 1) == 0 { 0 } else { between(0, 300) };
        let watch_lag_ms = if between(0, 1) == 0 { 0 } else { between(0, 3_000) };
        let remote_lo = between(20, 200);
        let remote_ms = (remote_lo, remote_lo + between(0, 400));
        let slow_remote_per_mille = if between(0, 1) == 0 { 0 } else { between(0, 100) };
        let corrupt_per_mille = if between(0, 3) == 0 { between(0, 50) } else { 0 };
        let fault_window_ms = between(4_000, 30_000);
        let partitions = between(0, 3) as u32;
        let crashes = between(0, 2) as u32;
        let stalls = between(0, 2) as u32;
        let failovers = between(0, 2) as u32;
        let fault_lo = between(300, 3_000);
        let fault_ms = (fault_lo, fault_lo + between(0, 12_000));
        // Enough epochs that the trainers still read when the last fault
        // ends: a fault in an idle cluster tests nothing.
        let per_node = (shards / nodes + 1).max(shards * share_per_mille as usize / 1000);
        let per_epoch_ms = per_node as u64 * step_ms;
        let epochs = ((fault_window_ms + fault_ms.1) / per_epoch_ms + 2).clamp(2, 200) as u32;
        Self {
            nodes,
            shards,
            epochs,
            window,
            share_per_mille,
            step_ms,
            latency_ms,
            loss_per_mille,
            duplicate_per_mille,
            watch_lag_ms,
            remote_ms,
            slow_remote_per_mille,
            corrupt_per_mille,
            fault_window_ms,
            partitions,
            crashes,
            stalls,
            failovers,
            fault_ms,
        }
    }
}

impl fmt::Display for Swarm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} nodes, {} shards, {} epochs, window {}, share {}‰, step {} ms; latency {}-{} ms, loss {}‰, duplicates {}‰, watch lag {} ms; \
             remote {}-{} ms, slow {}‰, corrupt {}‰; faults within {} ms lasting {}-{} ms: \
             {} partitions, {} crashes, {} stops, {} failovers",
            self.nodes,
            self.shards,
            self.epochs,
            self.window,
            self.share_per_mille,
            self.step_ms,
            self.latency_ms.0,
            self.latency_ms.1,
            self.loss_per_mille,
            self.duplicate_per_mille,
            self.watch_lag_ms,
            self.remote_ms.0,
            self.remote_ms.1,
            self.slow_remote_per_mille,
            self.corrupt_per_mille,
            self.fault_window_ms,
            self.fault_ms.0,
            self.fault_ms.1,
            self.partitions,
            self.crashes,
            self.stalls,
            self.failovers
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_swarm_and_seeds_give_many() {
        assert_eq!(Swarm::from_seed(7), Swarm::from_seed(7));
        let distinct: std::collections::BTreeSet<String> = (0..64).map(|s| Swarm::from_seed(s).to_string()).collect();
        assert!(distinct.len() > 60, "{}", distinct.len());
        for s in 0..256 {
            let w = Swarm::from_seed(s);
            assert!((2..=5).contains(&w.nodes) && (4..=24).contains(&w.shards));
            assert!(w.latency_ms.0 <= w.latency_ms.1 && w.remote_ms.0 <= w.remote_ms.1);
        }
    }
}
