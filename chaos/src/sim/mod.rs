//! `granary-chaos sim`: a deterministic simulation of the fabric's races.
//!
//! The node's and the coordinator's decision cores (the fetch route,
//! single-flight admission, the stall clock and liveness probe, the lease
//! table, the replicated state machine with its placement) run unchanged
//! against a simulated clock and network, in one thread, driven by one
//! seed. The seed draws the run's [`Swarm`] (sizes, latencies, fault rates
//! and counts: swarm testing) and every draw after it; the same seed gives
//! the same trace, byte for byte ([`Outcome::trace_hash`]).
//!
//! Why an own step-driven harness and not turmoil or madsim: the cores are
//! sans-I/O, so driving them needs no runtime, no scheduler and no hasher
//! in the path; nothing can break determinism; a run jumps from event to
//! event (thousands of seeds a minute on one core); and its faults act on
//! exactly what the cores decide on (see docs/TESTING.md).
//!
//! ## Files
//! - [`swarm`] — the parameters a seed draws.
//! - [`world`] — clock, event queue, network, trace.
//! - [`node`] — a node daemon over the node's cores, and its trainer.
//! - [`coord`] — the coordinator over its state machine and lease table.
//! - [`check`] — the record and the invariants.
//! - [`scenario`] — one named fault on a fixed cluster, measured against
//!   the same run without it.

pub mod check;
pub mod coord;
pub mod node;
pub mod params;
pub mod scenario;
pub mod swarm;
pub mod world;

use check::{Record, Violation};
use coord::Coord;
use granary_proto::rng::{Rng, seed_of};
use node::{Node, Run};
use std::collections::BTreeMap;
pub use swarm::Swarm;
pub use world::{Addr, Fault, Micros};
use world::{Event, IDLE_TIMEOUT, World, ms};

/// Events one run may take before it counts as a livelock.
pub const MAX_STEPS: u64 = 2_000_000;
/// Simulated time a run may take past its last fault.
pub const MAX_AFTER_FAULTS: Micros = ms(300_000);

/// What one seed did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The seed.
    pub seed: u64,
    /// Its parameters.
    pub swarm: Swarm,
    /// Hash of the whole trace: the same seed must give the same hash.
    pub trace_hash: u64,
    /// Events handled.
    pub steps: u64,
    /// Simulated time at the end, in milliseconds.
    pub sim_ms: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Invariants that did not hold (the first eight of each).
    pub violations: Vec<Violation>,
    /// Violations by invariant, all of them.
    pub violation_counts: BTreeMap<&'static str, u64>,
    /// Requests delivered to trainers.
    pub requests: u64,
    /// Remote reads in all, and shards.
    pub remote_reads: u64,
    /// Shards of the dataset.
    pub shards: usize,
    /// Remote reads beyond one per shard, by cause.
    pub extra_reads: BTreeMap<&'static str, u64>,
    /// Corrupted chunks caught by validation.
    pub corrupt_caught: u64,
    /// Shards read more than twice, or twice without the watched fault
    /// exposing them (see [`run_watched`]): (shard, reads).
    pub reads_beyond: Vec<(u32, u64)>,
    /// When the last trainer finished each epoch, in milliseconds.
    pub epoch_end_ms: Vec<u64>,
    /// Remote reads per epoch (by the epoch the cluster's slowest trainer
    /// was in when the read began).
    pub reads_by_epoch: Vec<u64>,
    /// Shards read from remote storage once every node was past the cold
    /// epoch.
    pub warm_reads: Vec<u32>,
    /// With a watched node: the shards its fault exposed (held or loading
    /// there when the fault began).
    pub exposed: std::collections::BTreeSet<u32>,
    /// The trace's lines, when asked for.
    pub trace: Option<Vec<String>>,
}

/// Runs `seed`; `keep_trace` keeps the trace's lines in the outcome.
pub fn run(seed: u64, keep_trace: bool) -> Outcome {
    run_swarm(seed, Swarm::from_seed(seed), keep_trace)
}

/// Runs `seed` with the given parameters (a test may pin some).
pub fn run_swarm(seed: u64, swarm: Swarm, keep_trace: bool) -> Outcome {
    let faults = schedule(seed, &swarm);
    run_schedule(seed, swarm, faults, keep_trace)
}

/// Runs `seed` with the given parameters and exactly the faults of
/// `faults` (time, fault), instead of those the swarm draws.
pub fn run_schedule(seed: u64, swarm: Swarm, faults: Vec<(Micros, Fault)>, keep_trace: bool) -> Outcome {
    run_watched(seed, swarm, faults, None, keep_trace)
}

/// [`run_schedule`], watching node `watch.0` through the fault window
/// `(watch.1, watch.2)`: [`Outcome::reads_beyond`] then says which shards
/// were read more than once that the fault did not expose.
pub fn run_watched(
    seed: u64,
    swarm: Swarm,
    faults: Vec<(Micros, Fault)>,
    watch: Option<(usize, Micros, Micros)>,
    keep_trace: bool,
) -> Outcome {
    let last_fault = faults.iter().map(|(at, _)| *at).max().unwrap_or(0);
    let schedule = faults;
    let mut w = World::new(seed, swarm.clone(), keep_trace);
    let mut rec = Record::default();
    rec.calm_bound = 2 * ms(swarm.remote_ms.1) * 10 + ms(2_000);
    rec.nodes = swarm.nodes;
    rec.watch = watch;
    w.log(format_args!("seed {seed}: {swarm}"));
    let plans = plans(seed, &swarm);
    rec.requests = plans.iter().flatten().map(|e| e.len() as u64).sum();
    let mut nodes: Vec<Node> = plans.into_iter().enumerate().map(|(i, p)| Node::new(i, swarm.nodes, p)).collect();
    let mut coord = Coord::new(&mut w, swarm.shards);
    for n in &mut nodes {
        n.boot(&mut w);
    }
    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut pending_faults = schedule.len();
    for (at, f) in schedule {
        w.at(at, Event::Fault(f));
    }
    let mut deferred: Vec<Vec<Event>> = vec![Vec::new(); swarm.nodes];
    let mut stopped_reason = None;
    while let Some(event) = w.pop() {
        if w.steps > MAX_STEPS {
            stopped_reason = Some(format!("step limit of {MAX_STEPS} events reached"));
            break;
        }
        if w.now > last_fault + MAX_AFTER_FAULTS {
            stopped_reason = Some(format!("not done {} s after the last fault", MAX_AFTER_FAULTS / 1_000_000));
            break;
        }
        match event {
            Event::Fault(f) => {
                pending_faults -= 1;
                if let Some(kind) = f.kind() {
                    *faults.entry(kind).or_default() += 1;
                }
                rec.disturbed(w.now);
                apply_fault(&mut w, &mut rec, &mut nodes, &mut coord, &mut deferred, f);
            }
            Event::CoordTick => coord.tick(&mut w, &mut rec),
            Event::Deliver { from: Addr::Node(from), to: Addr::Coord, msg, .. } => {
                coord.deliver(&mut w, &mut rec, from, msg.clone());
                if w.odds(w.swarm.duplicate_per_mille) {
                    // The client's retry after a lost answer.
                    w.log(format_args!("n{from}'s request reaches the coordinator again"));
                    coord.deliver(&mut w, &mut rec, from, msg);
                }
            }
            Event::Deliver { to: Addr::Coord, .. } => {}
            ref e @ (Event::Deliver { to: Addr::Node(i), .. } | Event::Timer { node: i, .. }) => {
                match nodes[i].accepts(e) {
                    None => deferred[i].push(event),
                    Some(false) => {}
                    Some(true) => match event {
                        Event::Deliver { from, to_life, from_life, msg, .. } => {
                            nodes[i].deliver(&mut w, &mut rec, from, from_life, to_life, msg)
                        }
                        Event::Timer { timer, .. } => nodes[i].timer(&mut w, &mut rec, timer),
                        _ => {}
                    },
                }
            }
        }
        for (node, peer, shard) in std::mem::take(&mut rec.joins) {
            // `peer` waits on `node`; follow whom each load waits on: the
            // peer it asks, if that peer's load holds the request. A stream
            // to a peer's former life (it restarted), or one not delivered
            // yet, is no wait on a load (seed 2088 took a stopped node's
            // stream to a restarted one for a cycle edge; its wait ends
            // with the connection's idle timeout, and the join that
            // delivers a stream is checked when it happens).
            let mut chain = vec![peer, node];
            let mut cur = node;
            while let Some(next) =
                nodes[cur].asking_for(shard).filter(|&(p, stream)| nodes[p].serves(shard, cur, stream)).map(|(p, _)| p)
            {
                if next == peer {
                    rec.wait_cycle(w.now, shard, &chain);
                    break;
                }
                if chain.contains(&next) || chain.len() > nodes.len() {
                    break;
                }
                chain.push(next);
                cur = next;
            }
        }
        if pending_faults == 0 && nodes.iter().all(Node::finished) {
            break;
        }
    }
    let finished = nodes.iter().all(Node::finished);
    if let Some(reason) = stopped_reason {
        rec.violations.push(Violation { invariant: "liveness", at: w.now, detail: reason });
        *rec.violation_counts.entry("liveness").or_default() += 1;
    }
    rec.finish(w.now, &coord.final_owners(), &coord.live(), finished);
    w.log(format_args!("end: {} violations", rec.violations.len()));
    Outcome {
        seed,
        trace_hash: w.trace_hash(),
        steps: w.steps,
        sim_ms: w.now / 1_000,
        faults,
        requests: rec.requests,
        remote_reads: rec.reads.values().sum(),
        shards: swarm.shards,
        extra_reads: rec.extra.clone(),
        corrupt_caught: rec.corrupt_caught,
        reads_beyond: rec
            .reads
            .iter()
            .filter(|&(s, &n)| n > 2 || (n == 2 && !rec.exposed.contains(s)))
            .map(|(&s, &n)| (s, n))
            .collect(),
        epoch_end_ms: rec.epoch_ends(swarm.epochs as usize),
        reads_by_epoch: rec.reads_by_epoch.clone(),
        warm_reads: std::mem::take(&mut rec.warm_reads),
        exposed: std::mem::take(&mut rec.exposed),
        violations: std::mem::take(&mut rec.violations),
        violation_counts: std::mem::take(&mut rec.violation_counts),
        trace: w.take_trace(),
        swarm,
    }
}

fn apply_fault(
    w: &mut World,
    rec: &mut Record,
    nodes: &mut [Node],
    coord: &mut Coord,
    deferred: &mut [Vec<Event>],
    f: Fault,
) {
    w.log(format_args!("fault: {f:?}"));
    // A watched node's copies and loads become unreachable to the others
    // (and a crash loses them: the simulated node keeps chunks in memory).
    if let Fault::Stop(i) | Fault::Crash(i) | Fault::Cut { from: Addr::Node(i), first: true, .. } = f
        && rec.watch.is_some_and(|(n, ..)| n == i)
    {
        let here: Vec<u32> = nodes[i].shards_here().collect();
        rec.exposed.extend(here);
    }
    match f {
        Fault::Cut { from, to, .. } => {
            w.set_cut(from, to, true);
        }
        Fault::Heal { from, to } => {
            let Some(began) = w.set_cut(from, to, false) else { return };
            let now = w.now;
            for (_, from_life, to_life, msg) in w.take_parked(from, to) {
                // The receiver heard nothing from the sender since the cut
                // began: its end of the connection closed at the idle
                // timeout, and what the sender kept retransmitting is
                // answered with a reset, not delivered. (Seed 8 of the
                // partition scenario: a request sent late in a 6 s cut
                // arrived after the heal, although the asker had given up
                // on it, and the cut-off node read the shard for nobody.)
                if now - began < IDLE_TIMEOUT {
                    w.send(from, from_life, to, to_life, msg);
                }
            }
        }
        Fault::Crash(i) => {
            deferred[i].clear();
            nodes[i].crash();
            rec.crashed(i);
        }
        Fault::Restart(i) => {
            if nodes[i].run == Run::Down {
                nodes[i].run = Run::Up;
                nodes[i].boot(w);
            }
        }
        Fault::Stop(i) => {
            if nodes[i].run == Run::Up {
                nodes[i].run = Run::Stopped;
                nodes[i].stopped_at = w.now;
            }
        }
        Fault::Continue(i) => {
            if nodes[i].run == Run::Stopped {
                nodes[i].run = Run::Up;
                let now = w.now;
                let stopped_for = now.saturating_sub(nodes[i].stopped_at);
                for e in deferred[i].drain(..) {
                    // Connections idle past their timeout closed on both
                    // ends while the process was stopped: what arrived on
                    // them is dropped with them. Timers still fire.
                    if stopped_for > IDLE_TIMEOUT && matches!(e, Event::Deliver { from: Addr::Node(_), .. }) {
                        continue;
                    }
                    w.at(now, e);
                }
            }
        }
        Fault::LeaderLost => coord.lost(),
        Fault::Elected => coord.elected(w),
    }
}

/// Each node's trainer's shards, per epoch: the epoch's seeded shard order
/// split in contiguous ranges, each overlapping the next by one shard (as
/// ranks' row ranges share a shard at their boundary), lengthened to the
/// swarm's share of the dataset.
fn plans(seed: u64, swarm: &Swarm) -> Vec<Vec<Vec<u32>>> {
    let n = swarm.nodes;
    let s = swarm.shards;
    let mut out = vec![Vec::new(); n];
    for epoch in 0..swarm.epochs {
        let mut order: Vec<u32> = (0..s as u32).collect();
        Rng::new(seed_of(&[seed, 0x504c_414e, epoch as u64])).shuffle(&mut order);
        let share = (s * swarm.share_per_mille as usize / 1000).min(s);
        for (i, plan) in out.iter_mut().enumerate() {
            // Reading everything, every node starts at the same place (an
            // evaluation pass): they want the same shards at once.
            let lo = if share == s { 0 } else { i * s / n };
            let own = ((i + 1) * s / n + 1).min(s) - lo;
            // From its own range on, wrapping around the epoch's order.
            plan.push((0..own.max(share)).map(|k| order[(lo + k) % s]).collect());
        }
    }
    out
}

/// The fault schedule of `seed`: (time, fault) pairs.
fn schedule(seed: u64, swarm: &Swarm) -> Vec<(Micros, Fault)> {
    flatten(&episodes(seed, swarm))
}

/// Episodes as one schedule, by time (a stable sort: events at the same
/// instant keep the order they were drawn in).
fn flatten(episodes: &[Episode]) -> Vec<(Micros, Fault)> {
    let mut out: Vec<(Micros, Fault)> = episodes.iter().flatten().copied().collect();
    out.sort_by_key(|(at, _)| *at);
    out
}

/// One fault of a schedule with its end: a partition's cuts and heals, a
/// crash and its restart, a stop and its continue, a failover and its
/// election. The unit [`shrink`] removes.
pub type Episode = Vec<(Micros, Fault)>;

/// The fault episodes of `seed`, in the order they were drawn.
fn episodes(seed: u64, swarm: &Swarm) -> Vec<Episode> {
    let mut r = Rng::new(seed_of(&[seed, 0x0046_4155_4c54]));
    let mut between = |lo: u64, hi: u64| lo + r.below(hi.saturating_sub(lo) + 1);
    let n = swarm.nodes;
    let mut window = || {
        let at = ms(between(2_000, swarm.fault_window_ms));
        let lasts = ms(between(swarm.fault_ms.0, swarm.fault_ms.1));
        (at, lasts)
    };
    let mut episodes: Vec<Episode> = Vec::new();
    let mut draws = Vec::new();
    for _ in 0..swarm.partitions {
        draws.push(("partition", window()));
    }
    for _ in 0..swarm.crashes {
        draws.push(("crash", window()));
    }
    for _ in 0..swarm.stalls {
        draws.push(("stop", window()));
    }
    for _ in 0..swarm.failovers {
        draws.push(("failover", window()));
    }
    let mut r = Rng::new(seed_of(&[seed, 0x0057_484f]));
    let mut pick = |k: u64| r.below(k);
    // A node's process faults (crash, stop) and the coordinator's failovers
    // do not overlap: each starts after the one before ends (a restart
    // inside a stop would undo the stop).
    let mut free_at: BTreeMap<Option<usize>, Micros> = BTreeMap::new();
    for (kind, (at, lasts)) in draws {
        let node = pick(n as u64) as usize;
        let key = match kind {
            "crash" | "stop" => Some(Some(node)),
            "failover" => Some(None),
            _ => None,
        };
        let at = match key {
            Some(k) => {
                let free = free_at.entry(k).or_insert(0);
                let at = at.max(*free);
                *free = at + lasts + ms(500);
                at
            }
            None => at,
        };
        let mut out: Episode = Vec::new();
        match kind {
            "partition" => {
                let links: Vec<(Addr, Addr)> = match pick(3) {
                    // One node cut from everyone, both ways.
                    0 => (0..n)
                        .filter(|&m| m != node)
                        .map(Addr::Node)
                        .chain([Addr::Coord])
                        .flat_map(|o| [(Addr::Node(node), o), (o, Addr::Node(node))])
                        .collect(),
                    // One link, both ways.
                    1 => {
                        let other = (node + 1 + pick(n as u64 - 1) as usize) % n;
                        vec![(Addr::Node(node), Addr::Node(other)), (Addr::Node(other), Addr::Node(node))]
                    }
                    // One link, one way.
                    _ => {
                        let other = (node + 1 + pick(n as u64 - 1) as usize) % n;
                        vec![(Addr::Node(node), Addr::Node(other))]
                    }
                };
                for (k, (from, to)) in links.into_iter().enumerate() {
                    out.push((at, Fault::Cut { from, to, first: k == 0 }));
                    out.push((at + lasts, Fault::Heal { from, to }));
                }
            }
            "crash" => {
                out.push((at, Fault::Crash(node)));
                out.push((at + lasts, Fault::Restart(node)));
            }
            "stop" => {
                out.push((at, Fault::Stop(node)));
                out.push((at + lasts, Fault::Continue(node)));
            }
            _ => {
                out.push((at, Fault::LeaderLost));
                out.push((at + lasts.min(ms(5_000)), Fault::Elected));
            }
        }
        episodes.push(out);
    }
    // Cuts of one link nest (`World::set_cut`); process faults and
    // failovers do not overlap (above).
    episodes
}

/// A failing seed's schedule cut down to the fault episodes it needs,
/// and its swarm's rates calmed where the failure does not need them.
#[derive(Debug, Clone)]
pub struct Shrunk {
    /// The invariant the seed breaks, and still breaks with `kept` alone.
    pub invariant: &'static str,
    /// The episodes that suffice, in the order drawn.
    pub kept: Vec<Episode>,
    /// The seed's episodes in all.
    pub of: usize,
    /// The rates set calm with the failure still there, each with the
    /// value it had (in the order tried).
    pub calmed: Vec<(Calm, String)>,
    /// The swarm the seed still fails with: its own, with `calmed` applied
    /// and its fault counts those of `kept`.
    pub swarm: Swarm,
    /// Runs the search took.
    pub runs: u32,
}

/// One of the swarm's rates that shrinking tries to set calm: no loss, no
/// duplicates, no watch lag, no slow or corrupt remote reads, latencies
/// and remote reads that take one time instead of a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Calm {
    /// `loss_per_mille` to 0.
    Loss,
    /// `duplicate_per_mille` to 0.
    Duplicates,
    /// `watch_lag_ms` to 0.
    WatchLag,
    /// `slow_remote_per_mille` to 0.
    SlowRemote,
    /// `corrupt_per_mille` to 0.
    Corrupt,
    /// `latency_ms` to its lower bound, always.
    LatencySpread,
    /// `remote_ms` to its lower bound, always.
    RemoteSpread,
}

impl Calm {
    /// Every rate, in the order shrinking tries them.
    pub const ALL: [Calm; 7] = [
        Calm::Loss,
        Calm::Duplicates,
        Calm::WatchLag,
        Calm::SlowRemote,
        Calm::Corrupt,
        Calm::LatencySpread,
        Calm::RemoteSpread,
    ];

    /// The rate's name, as `Swarm`'s display says it.
    pub fn name(self) -> &'static str {
        match self {
            Calm::Loss => "loss",
            Calm::Duplicates => "duplicates",
            Calm::WatchLag => "watch lag",
            Calm::SlowRemote => "slow remote reads",
            Calm::Corrupt => "corrupt chunks",
            Calm::LatencySpread => "latency spread",
            Calm::RemoteSpread => "remote read spread",
        }
    }

    /// `swarm` with this rate calm, and the value it had; `None` if it is
    /// calm already.
    pub fn apply(self, swarm: &Swarm) -> Option<(Swarm, String)> {
        let mut s = swarm.clone();
        let was = match self {
            Calm::Loss => calm(&mut s.loss_per_mille, 0).map(|v| format!("{v}‰")),
            Calm::Duplicates => calm(&mut s.duplicate_per_mille, 0).map(|v| format!("{v}‰")),
            Calm::WatchLag => calm(&mut s.watch_lag_ms, 0).map(|v| format!("{v} ms")),
            Calm::SlowRemote => calm(&mut s.slow_remote_per_mille, 0).map(|v| format!("{v}‰")),
            Calm::Corrupt => calm(&mut s.corrupt_per_mille, 0).map(|v| format!("{v}‰")),
            Calm::LatencySpread => {
                let lo = s.latency_ms.0;
                calm(&mut s.latency_ms.1, lo).map(|v| format!("{lo}-{v} ms"))
            }
            Calm::RemoteSpread => {
                let lo = s.remote_ms.0;
                calm(&mut s.remote_ms.1, lo).map(|v| format!("{lo}-{v} ms"))
            }
        };
        was.map(|w| (s, w))
    }
}

/// Sets `*v` to `to`, giving the old value if it changed.
fn calm(v: &mut u64, to: u64) -> Option<u64> {
    (*v != to).then(|| std::mem::replace(v, to))
}

/// Shrinks `seed`'s schedule: `None` if the seed breaks no invariant,
/// else the fewest fault episodes (one at a time removed, greedily, while
/// the first invariant it broke still breaks) with which it still fails,
/// then its swarm's rates calmed one at a time the same way. Every run is
/// the seed's own simulation with fewer faults or calmer rates: as
/// deterministic as the seed, so the search replays too.
pub fn shrink(seed: u64) -> Option<Shrunk> {
    let swarm = Swarm::from_seed(seed);
    let all = episodes(seed, &swarm);
    let first = run_schedule(seed, swarm.clone(), flatten(&all), false);
    let invariant = first.violations.first()?.invariant;
    let of = all.len();
    let mut runs = 1;
    let breaks = |swarm: &Swarm, trial: &[Episode]| {
        run_schedule(seed, swarm.clone(), flatten(trial), false).violation_counts.contains_key(invariant)
    };
    let kept = shrink_episodes(all, |trial| {
        runs += 1;
        breaks(&swarm, trial)
    });
    let (mut swarm, calmed) = calm_rates(swarm, |trial| {
        runs += 1;
        breaks(trial, &kept)
    });
    // The counts of faults say what is left (they draw no schedule here).
    let count = |kind: &str| kept.iter().filter(|e| e.first().and_then(|(_, f)| f.kind()) == Some(kind)).count() as u32;
    (swarm.partitions, swarm.crashes, swarm.stalls, swarm.failovers) =
        (count("partition"), count("crash"), count("stop"), count("failover"));
    Some(Shrunk { invariant, kept, of, calmed, swarm, runs })
}

/// Runs a shrunk seed again: its kept episodes on its calmed swarm (the
/// run that `shrink`'s last successful trial made), with its trace if asked.
pub fn run_shrunk(seed: u64, s: &Shrunk, keep_trace: bool) -> Outcome {
    run_schedule(seed, s.swarm.clone(), flatten(&s.kept), keep_trace)
}

/// Greedy calming: sets each of the swarm's rates calm, in [`Calm::ALL`]'s
/// order, where `fails` still holds with it calm. Pure given `fails`.
fn calm_rates(mut swarm: Swarm, mut fails: impl FnMut(&Swarm) -> bool) -> (Swarm, Vec<(Calm, String)>) {
    let mut calmed = Vec::new();
    for c in Calm::ALL {
        if let Some((trial, was)) = c.apply(&swarm)
            && fails(&trial)
        {
            swarm = trial;
            calmed.push((c, was));
        }
    }
    (swarm, calmed)
}

/// Greedy one-at-a-time removal: drops each episode whose removal keeps
/// `fails` true, until no single removal does. Pure given `fails`.
fn shrink_episodes(mut episodes: Vec<Episode>, mut fails: impl FnMut(&[Episode]) -> bool) -> Vec<Episode> {
    loop {
        let mut removed = false;
        let mut i = 0;
        while i < episodes.len() {
            let mut trial = episodes.clone();
            trial.remove(i);
            if fails(&trial) {
                episodes = trial;
                removed = true;
            } else {
                i += 1;
            }
        }
        if !removed {
            return episodes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn episode(node: usize) -> Episode {
        vec![(ms(node as u64), Fault::Stop(node)), (ms(node as u64 + 1), Fault::Continue(node))]
    }

    #[test]
    fn shrinking_keeps_exactly_the_episodes_the_failure_needs() {
        // Fails while episodes 1 and 3 are both in the schedule.
        let all: Vec<Episode> = (0..6).map(episode).collect();
        let needs = |trial: &[Episode]| [1, 3].iter().all(|&n| trial.contains(&episode(n)));
        let mut runs = 0;
        let kept = shrink_episodes(all, |t| {
            runs += 1;
            needs(t)
        });
        assert_eq!(kept, vec![episode(1), episode(3)]);
        assert!(runs <= 6 + 2, "one pass and a check: {runs} runs");
    }

    #[test]
    fn calming_keeps_exactly_the_rates_the_failure_needs() {
        // Seed 3's swarm with every rate stirred; it "fails" while loss and
        // the remote read spread are both kept.
        let mut stirred = Swarm::from_seed(3);
        stirred.loss_per_mille = 120;
        stirred.duplicate_per_mille = 40;
        stirred.watch_lag_ms = 900;
        stirred.slow_remote_per_mille = 30;
        stirred.corrupt_per_mille = 10;
        stirred.latency_ms = (1, 15);
        stirred.remote_ms = (50, 300);
        let mut runs = 0;
        let (calm, calmed) = calm_rates(stirred.clone(), |s| {
            runs += 1;
            s.loss_per_mille > 0 && s.remote_ms.1 > s.remote_ms.0
        });
        assert_eq!(runs, Calm::ALL.len(), "one run per rate");
        let names: Vec<Calm> = calmed.iter().map(|(c, _)| *c).collect();
        assert_eq!(names, vec![Calm::Duplicates, Calm::WatchLag, Calm::SlowRemote, Calm::Corrupt, Calm::LatencySpread]);
        assert_eq!(calmed[0].1, "40‰");
        assert_eq!(calmed[4].1, "1-15 ms");
        assert_eq!((calm.loss_per_mille, calm.remote_ms), (120, (50, 300)), "what the failure needs is kept");
        assert_eq!((calm.duplicate_per_mille, calm.watch_lag_ms, calm.latency_ms), (0, 0, (1, 1)));
        assert_eq!((calm.nodes, calm.shards, calm.epochs), (stirred.nodes, stirred.shards, stirred.epochs));
        // A rate calm already is not tried again.
        let (_, again) = calm_rates(calm, |_| true);
        assert_eq!(again.iter().map(|(c, _)| *c).collect::<Vec<_>>(), vec![Calm::Loss, Calm::RemoteSpread]);
    }

    #[test]
    fn a_seed_that_breaks_nothing_has_nothing_to_shrink() {
        assert!(shrink(1).is_none());
    }

    #[test]
    fn a_schedule_is_its_episodes_by_time() {
        let swarm = Swarm::from_seed(42);
        let eps = episodes(42, &swarm);
        let flat = schedule(42, &swarm);
        assert_eq!(flat.len(), eps.iter().map(Vec::len).sum::<usize>());
        assert!(flat.windows(2).all(|w| w[0].0 <= w[1].0));
    }
}
