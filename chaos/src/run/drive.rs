//! A seed's run, driven: the schedule's faults fired at their times (a
//! host's ranks going down and up with it), the ranks polled, the nodes'
//! memory sampled, until every rank is done or the seed times out; then
//! whatever is still scheduled ends.

use super::config::RunConfig;
use super::faults::{Edge, MEMORY_SAMPLE_EVERY, Pids, SsdFaults, apply, sample_memory};
use super::ranks::Ranks;
use super::schedule::{Fault, Schedule};
use super::verdict::Observed;
use crate::relay::RelayHandle;
use anyhow::Result;
use granary_testkit::harness::{ClusterCounters, LocalCluster};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// What the faults act on.
pub(super) struct Target<'a> {
    pub(super) cluster: &'a mut LocalCluster,
    pub(super) relay: &'a RelayHandle,
    pub(super) pids: Pids,
    pub(super) seed: u64,
    pub(super) ids: &'a [u64],
}

/// The schedule's faults as a queue of edges in time, and what firing
/// them left.
pub(super) struct Faults<'s> {
    schedule: &'s Schedule,
    actions: VecDeque<(Duration, usize, Edge)>,
    /// Nodes stopped now (their memory is not sampled).
    stopped: BTreeSet<u64>,
    /// Counters of node lives that ended.
    retired: ClusterCounters,
    voters_hit: BTreeMap<usize, u64>,
    by_fault: BTreeMap<String, u64>,
}

impl<'s> Faults<'s> {
    /// `schedule`'s faults, each a start and an end, in time order.
    pub(super) fn of(schedule: &'s Schedule) -> Self {
        let mut actions: Vec<(Duration, usize, Edge)> = Vec::new();
        for (i, e) in schedule.events.iter().enumerate() {
            actions.push((e.at, i, Edge::Start));
            actions.push((e.at + e.fault.duration(), i, Edge::End));
        }
        actions.sort_by_key(|a| a.0);
        let mut by_fault = BTreeMap::new();
        if schedule.byzantine.is_some() {
            by_fault.insert("byzantine_peer".into(), 1);
        }
        Faults {
            schedule,
            actions: actions.into(),
            stopped: BTreeSet::new(),
            retired: ClusterCounters::default(),
            voters_hit: BTreeMap::new(),
            by_fault,
        }
    }

    /// Fires every edge due at `t0.elapsed()`.
    fn fire_due(
        &mut self,
        t0: Instant,
        at: &mut Target,
        ranks: &mut Ranks,
        obs: &mut Observed,
        ssd: &mut SsdFaults,
    ) -> Result<()> {
        while self.actions.front().is_some_and(|a| a.0 <= t0.elapsed()) {
            let Some((_, i, edge)) = self.actions.pop_front() else { break };
            let fault = self.schedule.events[i].fault;
            if let Edge::Start = edge {
                *self.by_fault.entry(fault.kind().to_string()).or_insert(0) += 1;
            }
            if let (Fault::KillInSsdWrite { node, .. }, Edge::End) = (fault, edge)
                && ssd.armed.iter().any(|a| a.kill.node == node)
            {
                // The restart comes after the kill (the write may come
                // late in a slow build): look again shortly.
                let at = t0.elapsed() + Duration::from_millis(20);
                let pos = self.actions.iter().position(|a| a.0 > at).unwrap_or(self.actions.len());
                self.actions.insert(pos, (at, i, edge));
                continue;
            }
            if let Fault::StopNode { node, .. } = fault {
                match edge {
                    Edge::Start => self.stopped.insert(node),
                    Edge::End => self.stopped.remove(&node),
                };
            }
            if let (Some(node), Edge::Start) = (fault.host_killed(), edge) {
                // The host goes down: its ranks first.
                ranks.kill_host(node);
            }
            self.apply(at, fault, edge, i, obs, ssd)?;
            if let (Some(node), Edge::End) = (fault.host_killed(), edge) {
                ranks.restart_host(node)?;
            }
        }
        Ok(())
    }

    fn apply(
        &mut self,
        at: &mut Target,
        fault: Fault,
        edge: Edge,
        i: usize,
        obs: &mut Observed,
        ssd: &mut SsdFaults,
    ) -> Result<()> {
        let (voters_hit, retired) = (&mut self.voters_hit, &mut self.retired);
        apply(at.cluster, at.relay, at.pids, at.seed, fault, edge, i, voters_hit, retired, obs, ssd)
    }

    /// Whatever is still scheduled ends now: nodes restarted, continued,
    /// links healed, voters back.
    pub(super) fn end_all(&mut self, at: &mut Target, obs: &mut Observed, ssd: &mut SsdFaults) -> Result<()> {
        while let Some((_, i, edge)) = self.actions.pop_front() {
            if let Edge::End = edge {
                let fault = self.schedule.events[i].fault;
                self.apply(at, fault, edge, i, obs, ssd)?;
            }
        }
        Ok(())
    }
}

/// What firing a seed's faults left.
pub(super) struct Fired {
    /// Counters of node lives that ended.
    pub(super) retired: ClusterCounters,
    pub(super) voters_hit: BTreeMap<usize, u64>,
    /// Faults fired, by kind.
    pub(super) by_fault: BTreeMap<String, u64>,
}

impl Faults<'_> {
    /// What firing the faults left (the schedule no longer borrowed).
    pub(super) fn fired(self) -> Fired {
        Fired { retired: self.retired, voters_hit: self.voters_hit, by_fault: self.by_fault }
    }
}

/// Runs the seed from `t0` until every rank is done or `cfg.seed_timeout`
/// passes (then true).
pub(super) fn run(
    cfg: &RunConfig,
    t0: Instant,
    at: &mut Target,
    faults: &mut Faults,
    ranks: &mut Ranks,
    obs: &mut Observed,
    ssd: &mut SsdFaults,
) -> Result<bool> {
    let mut sampled = Instant::now();
    loop {
        faults.fire_due(t0, at, ranks, obs, ssd)?;
        ssd.poll_armed(at.cluster, &mut faults.retired, obs, false);
        ranks.poll(obs, t0)?;
        if sampled.elapsed() >= MEMORY_SAMPLE_EVERY {
            sampled = Instant::now();
            for &id in at.ids.iter().filter(|id| !faults.stopped.contains(id)) {
                sample_memory(at.cluster, id, obs);
            }
        }
        if ranks.done() {
            return Ok(false);
        }
        if t0.elapsed() > cfg.seed_timeout {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
