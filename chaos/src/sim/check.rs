//! What a simulated run recorded, and the invariants judged on it. Each
//! invariant is one method, named after it in a [`Violation`]:
//!
//! - `integrity`: every chunk a trainer is handed has its shard's checksum
//!   (corrupted transfers are caught by validation, never handed on);
//! - `exactly-once`: every request of every trainer is delivered once,
//!   never twice, and by the end of the run;
//! - `route-bounds`: one load asks at most `MAX_OWNERS_ASKED` owners, and
//!   none after its fetch deadline;
//! - `lease-safety`: the coordinator never expires a node within one lease
//!   of a heartbeat of it that reached the leader;
//! - `calm-reads`: away from every fault (two leases and a fetch deadline
//!   after the last one), no node reads from remote storage a shard that
//!   the placement gives to another node which holds it, when the reader's
//!   route met no failure: the fabric's whole point, one read per cluster;
//! - `pair-reads`: two nodes that refused each other a shard (their
//!   placements disagree) do not both read it from remote storage after
//!   the refusal, within a fetch deadline: the refused one waits for the
//!   placement and takes the chunk from the other;
//! - `calm-latency`: a request issued and answered away from every fault
//!   takes at most two remote reads (at their slowest) and two seconds: no
//!   load waits on a cycle of nodes or on a deadline when nothing failed;
//! - `wait-cycle`: no load joins a chain of loads that comes back to the
//!   node that asked (A asks B for a shard, B's load asks C, C's asks A):
//!   such a cycle waits until the fetch deadline;
//! - `placement`: at the end, every shard has one owner, a live node.
//!
//! Remote reads beyond one per shard are counted by cause and reported
//! whether or not they break an invariant.

use super::params::{LEASE, checksum, fetch_deadline, micros};
use super::world::Micros;
use granary_node::decide::MAX_OWNERS_ASKED;
use std::collections::{BTreeMap, BTreeSet};

/// An invariant that did not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The invariant's name.
    pub invariant: &'static str,
    /// When, in simulated microseconds.
    pub at: Micros,
    /// What happened.
    pub detail: String,
}

/// Time after a fault during which extra remote reads are expected.
fn calm_after() -> Micros {
    2 * LEASE + micros(fetch_deadline())
}

/// The run's record.
#[derive(Debug, Default)]
pub struct Record {
    /// Violations found so far (the first eight of each invariant).
    pub violations: Vec<Violation>,
    /// Violations by invariant, all of them.
    pub violation_counts: BTreeMap<&'static str, u64>,
    delivered: BTreeMap<u64, u32>,
    /// Requests of all trainers.
    pub requests: u64,
    streams: u64,
    holders: BTreeMap<u32, BTreeSet<usize>>,
    /// Remote reads per shard.
    pub reads: BTreeMap<u32, u64>,
    /// Extra remote reads by cause.
    pub extra: BTreeMap<&'static str, u64>,
    renewed: BTreeMap<usize, Micros>,
    /// Until when reads are not judged (a fault is recent).
    disturbed_until: Micros,
    /// Corrupted chunks caught by validation.
    pub corrupt_caught: u64,
    /// When each trainer finished each epoch.
    pub epochs: BTreeMap<(usize, usize), Micros>,
    /// Node expiries.
    pub expiries: u64,
    /// The placement the leader last published.
    owners: Vec<Option<usize>>,
    /// Requests in flight: when issued, and whether all was calm then.
    issued: BTreeMap<u64, (Micros, bool)>,
    /// The longest a calm request may take.
    pub calm_bound: Micros,
    /// When two nodes (lower index first) last refused each other a shard.
    refused_at: BTreeMap<(usize, usize, u32), Micros>,
    /// When each node last began a remote read of a shard.
    read_at: BTreeMap<(usize, u32), Micros>,
    /// Peer requests joined to a load since the last cycle check: (node,
    /// peer, shard).
    pub joins: Vec<(usize, usize, u32)>,
    /// Remote reads by the epoch of the slowest trainer when they began.
    pub reads_by_epoch: Vec<u64>,
    /// Shards read from remote storage once every node was past the cold
    /// epoch, in the order read.
    pub warm_reads: Vec<u32>,
    /// Nodes.
    pub nodes: usize,
    /// A scenario's watched node and fault window (start, end): the shards
    /// it held or loaded when the fault began, or asked for until a lease
    /// after it ended, are the ones the fault may cost a second read of.
    pub watch: Option<(usize, Micros, Micros)>,
    /// Those shards.
    pub exposed: BTreeSet<u32>,
}

impl Record {
    fn violate(&mut self, invariant: &'static str, at: Micros, detail: String) {
        // The first few of each invariant are enough to read; the rest are
        // counted (an early flood of one kind hides no other kind).
        *self.violation_counts.entry(invariant).or_default() += 1;
        if self.violations.iter().filter(|v| v.invariant == invariant).count() < 8 {
            self.violations.push(Violation { invariant, at, detail });
        }
    }

    /// The id of request `index` of `node`'s trainer in `epoch`.
    pub fn request_id(&self, node: usize, epoch: usize, index: usize) -> u64 {
        ((node as u64) << 40) | ((epoch as u64) << 20) | index as u64
    }

    /// Whether a request was delivered already (a restarted trainer skips
    /// it, as a resumed job does).
    pub fn was_delivered(&self, req: u64) -> bool {
        self.delivered.contains_key(&req)
    }

    /// A new stream id.
    pub fn new_stream(&mut self) -> u64 {
        self.streams += 1;
        self.streams
    }

    /// A fault began or ended at `now`.
    pub fn disturbed(&mut self, now: Micros) {
        self.disturbed_until = self.disturbed_until.max(now + calm_after());
    }

    /// `node` crashed: its chunks are gone.
    pub fn crashed(&mut self, node: usize) {
        for h in self.holders.values_mut() {
            h.remove(&node);
        }
    }

    /// `node` now holds `shard`.
    pub fn held(&mut self, node: usize, shard: u32) {
        self.holders.entry(shard).or_default().insert(node);
    }

    /// The trainer of `node` asks for `shard` (request `req`) at `now`.
    pub fn issued_for(&mut self, node: usize, shard: u32, req: u64, now: Micros) {
        if let Some((n, start, end)) = self.watch
            && n == node
            && (start..end + LEASE).contains(&now)
        {
            self.exposed.insert(shard);
        }
        self.issued.insert(req, (now, now >= self.disturbed_until));
    }

    /// The trainer of `node` was handed `shard` with `sum` for `req`.
    pub fn delivered(&mut self, node: usize, req: u64, shard: u32, sum: u64, now: Micros) {
        if let Some((at, calm)) = self.issued.remove(&req)
            && calm
            && now >= self.disturbed_until
            && now - at > self.calm_bound
        {
            self.violate(
                "calm-latency",
                now,
                format!("n{node} took {} ms for s{shard} with no fault near", (now - at) / 1000),
            );
        }
        if sum != checksum(shard) {
            self.violate("integrity", now, format!("n{node} handed s{shard} with a wrong checksum to its trainer"));
        }
        if self.delivered.insert(req, shard).is_some() {
            self.violate("exactly-once", now, format!("n{node} handed request {req:#x} (s{shard}) twice"));
        }
    }

    /// `node`'s load of `shard` (started at `started`) asks its `asks`-th
    /// owner at `now`.
    pub fn asked(&mut self, node: usize, shard: u32, asks: usize, now: Micros, started: Micros) {
        if asks > MAX_OWNERS_ASKED {
            self.violate("route-bounds", now, format!("n{node} asked owner number {asks} for s{shard}"));
        }
        if now > started + micros(fetch_deadline()) {
            self.violate("route-bounds", now, format!("n{node} asked for s{shard} past the fetch deadline"));
        }
    }

    /// `node` reads `shard` from remote storage at `now`; `failures` are
    /// what its route met first.
    pub fn remote_read(&mut self, node: usize, shard: u32, now: Micros, failures: Vec<String>) {
        let window = micros(fetch_deadline());
        let recent = |t: Option<&Micros>| t.is_some_and(|&t| now.saturating_sub(t) <= window);
        for other in 0..self.nodes {
            let refused = |a: usize, b: usize| self.refused_at.get(&(a.min(b), a.max(b), shard));
            // The other's read counts only if it came after the refusal: a
            // read before it (seed 74680: in the other's former life,
            // before a crash) is not one the refusal caused.
            let read_after = |r: &Micros| self.read_at.get(&(other, shard)).is_some_and(|t| t >= r);
            if other != node && recent(refused(node, other)) && refused(node, other).is_some_and(read_after) {
                self.violate(
                    "pair-reads",
                    now,
                    format!("n{node} and n{other} refused each other s{shard}, and both read it from remote storage"),
                );
            }
        }
        self.read_at.insert((node, shard), now);
        let epoch = (0..).find(|&e| (0..self.nodes).any(|n| !self.epochs.contains_key(&(n, e)))).unwrap_or(0);
        if self.reads_by_epoch.len() <= epoch {
            self.reads_by_epoch.resize(epoch + 1, 0);
        }
        self.reads_by_epoch[epoch] += 1;
        if epoch > 0 {
            self.warm_reads.push(shard);
        }
        let n = self.reads.entry(shard).or_default();
        *n += 1;
        if *n == 1 {
            return;
        }
        let holds = |m: usize| self.holders.get(&shard).is_some_and(|h| h.contains(&m));
        let owner = self.owners.get(shard as usize).copied().flatten();
        let cause = if owner == Some(node) {
            "the owner reads it (a new owner, or its copy was lost)"
        } else if !failures.is_empty() {
            "the route met a failure"
        } else if !owner.is_some_and(holds) {
            "the owner holds no copy yet"
        } else if now < self.disturbed_until {
            "placement in flux after a fault"
        } else {
            let owner = owner.unwrap_or(usize::MAX);
            self.violate(
                "calm-reads",
                now,
                format!(
                    "n{node} read s{shard} from remote storage while its owner n{owner} held it, with no fault near"
                ),
            );
            "calm (a violation)"
        };
        *self.extra.entry(cause).or_default() += 1;
    }

    /// `node` refused `peer` its load of `shard` (their placements
    /// disagree: its load asks `peer`).
    pub fn refused(&mut self, node: usize, peer: usize, shard: u32, now: Micros) {
        self.refused_at.insert((node.min(peer), node.max(peer), shard), now);
    }

    /// `node` joined `peer`'s request for `shard` to its load.
    pub fn joined(&mut self, node: usize, peer: usize, shard: u32) {
        self.joins.push((node, peer, shard));
    }

    /// A wait cycle was found: `chain` of nodes, each asking the next.
    pub fn wait_cycle(&mut self, now: Micros, shard: u32, chain: &[usize]) {
        self.violate("wait-cycle", now, format!("loads of s{shard} wait on each other: {chain:?}"));
    }

    /// The leader published a placement.
    pub fn set_owners(&mut self, owners: Vec<Option<usize>>) {
        self.owners = owners;
    }

    /// The leader accepted a heartbeat or registration of `node`.
    pub fn renewed(&mut self, node: usize, now: Micros) {
        self.renewed.insert(node, now);
    }

    /// The leader expired `node` at `now`.
    pub fn expired(&mut self, node: usize, now: Micros) {
        self.expiries += 1;
        if let Some(&last) = self.renewed.get(&node)
            && now.saturating_sub(last) <= LEASE
        {
            self.violate(
                "lease-safety",
                now,
                format!("n{node} expired {} ms after a renewal reached the leader", (now - last) / 1000),
            );
        }
    }

    /// `node`'s trainer finished `epoch` at `now`.
    pub fn epoch_done(&mut self, node: usize, epoch: usize, now: Micros) {
        self.epochs.insert((node, epoch), now);
    }

    /// When the last trainer finished each of `epochs` epochs (ms; 0 if
    /// not finished).
    pub fn epoch_ends(&self, epochs: usize) -> Vec<u64> {
        (0..epochs)
            .map(|e| (0..self.nodes).filter_map(|n| self.epochs.get(&(n, e))).max().map_or(0, |t| t / 1000))
            .collect()
    }

    /// A corrupted chunk was refused by validation.
    pub fn corrupt_caught(&mut self) {
        self.corrupt_caught += 1;
    }

    /// The checks at the end of a run: every request delivered; the final
    /// placement gives every shard one live owner.
    pub fn finish(&mut self, now: Micros, owners: &[Option<usize>], live: &[usize], finished: bool) {
        let missing = self.requests.saturating_sub(self.delivered.len() as u64);
        if missing > 0 {
            self.violate(
                "exactly-once",
                now,
                format!("{missing} of {} requests were never delivered by {} ms", self.requests, now / 1000),
            );
        } else if !finished {
            self.violate("liveness", now, "every request was delivered but a trainer did not finish".into());
        }
        if !live.is_empty() {
            for (s, o) in owners.iter().enumerate() {
                if !o.is_some_and(|o| live.contains(&o)) {
                    self.violate("placement", now, format!("s{s} has owner {o:?}, not one of the live {live:?}"));
                }
            }
        }
    }
}
