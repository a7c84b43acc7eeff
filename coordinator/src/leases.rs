//! The leader's lease clock as a pure state machine: which live node's
//! lease has run out, and when to look again. No tokio, no wall clock:
//! every input carries `now`, so the tests drive it on a virtual clock.
//!
//! Leases are local to the leader and never replicated. The replicated
//! state holds only who is live, with which incarnation; this table holds,
//! for each of them, when the leader last heard a heartbeat. When a lease
//! passes its deadline the table hands out an [`Expired`] once, and the
//! shell proposes it through the log (`ExpireNodes`, the leases that ran
//! out at one tick together); the node stops being live only when that
//! command is applied.
//!
//! Three rules keep a healthy node from being expired:
//! - A new leadership (a new term in which this voter leads) forgets every
//!   clock and starts each live node's lease afresh with a grace of one
//!   more lease, so nodes still retrying the dead leader are not expired.
//!   An incarnation seen for the first time (registered through an earlier
//!   leader) gets the same grace.
//! - A tick that comes late by more than half a lease (this process was
//!   paused or starved) restarts every lease from that tick instead of
//!   expiring nodes whose heartbeats were queued behind the pause.
//! - A lease is expired only when strictly more than one lease has passed
//!   since its renewal, and only at a tick, every [`Leases::tick`].
//!
//! The shell's tick, at [`Leases::poll_timeout`], calls in order
//! [`Leases::handle_timeout`], [`Leases::handle_leadership`],
//! [`Leases::handle_state`] and [`Leases::poll_expired`]; heartbeats and
//! registrations call [`Leases::handle_renewed`] whenever they are accepted.

use granary_proto::NodeId;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The shortest tick, however short the lease.
pub const MIN_TICK: Duration = Duration::from_millis(50);

/// A lease that ran out: the leader proposes `ExpireNode` with these fields.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Expired {
    /// The node.
    pub node: NodeId,
    /// The incarnation whose lease ran out; a later one is not touched.
    pub incarnation: u64,
}

/// A registration refused by [`Leases::refuse_registration`]: the node is
/// live at another address.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RegistrationRefused {
    /// The address of the daemon that holds the lease.
    pub live_addr: String,
    /// Its incarnation.
    pub incarnation: u64,
    /// How long ago its lease was last renewed (zero in a grace).
    pub since_renewal: Duration,
}

/// One node's lease as the leader holds it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Clock {
    incarnation: u64,
    /// The last renewal. The lease runs out one lease after it; a grace
    /// puts it in the future.
    renewed: Instant,
    /// An [`Expired`] for this incarnation was handed out and not reported
    /// failed: it is not handed out again.
    expiring: bool,
    /// The address its registration came from, where this leader saw it.
    source: Option<SocketAddr>,
}

/// The leader's lease table. See the module docs for the rules.
#[derive(Debug)]
pub struct Leases {
    lease: Duration,
    tick: Duration,
    /// When the last tick ran (or the table was made).
    last_tick: Instant,
    /// The term this voter leads in, as of the last
    /// [`Leases::handle_leadership`]; `None` while it does not lead.
    leading_term: Option<u64>,
    /// The live nodes of the replicated state, with their incarnations, as
    /// of the last [`Leases::handle_state`].
    live: BTreeMap<NodeId, u64>,
    /// Lease clocks by node. May hold nodes no longer live; those are never
    /// expired and never reported.
    clocks: BTreeMap<NodeId, Clock>,
}

impl Leases {
    /// An empty table for leases of `lease`, ticking every tenth of it
    /// (at least [`MIN_TICK`]); the first tick is one tick after `now`.
    pub fn new(lease: Duration, now: Instant) -> Self {
        Self {
            lease,
            tick: (lease / 10).max(MIN_TICK),
            last_tick: now,
            leading_term: None,
            live: BTreeMap::new(),
            clocks: BTreeMap::new(),
        }
    }

    /// The lease length.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The tick interval.
    pub fn tick(&self) -> Duration {
        self.tick
    }

    /// When the next tick is due: one tick after the last one began.
    pub fn poll_timeout(&self) -> Instant {
        self.last_tick + self.tick
    }

    /// A tick at `now`. If it comes more than half a lease later than due,
    /// every lease restarts at `now`: the silence was this process's, not
    /// the nodes'.
    pub fn handle_timeout(&mut self, now: Instant) {
        let stalled = now.saturating_duration_since(self.last_tick) > self.tick + self.lease / 2;
        self.last_tick = now;
        if stalled {
            for clock in self.clocks.values_mut() {
                clock.renewed = clock.renewed.max(now);
            }
        }
    }

    /// The term in which this voter leads, or `None` if it does not. Losing
    /// the lead forgets every clock; a new term also starts every known live
    /// node's lease afresh, with a grace of one lease, at `now`.
    pub fn handle_leadership(&mut self, term: Option<u64>, now: Instant) {
        match term {
            None => {
                if self.leading_term.take().is_some() {
                    self.clocks.clear();
                }
            }
            Some(t) if self.leading_term != Some(t) => {
                self.leading_term = Some(t);
                self.clocks.clear();
                self.grant_grace(now);
            }
            Some(_) => {}
        }
    }

    /// The live nodes of the replicated state, with their incarnations.
    /// While leading, a live incarnation without a clock gets one with a
    /// grace of one lease from `now`.
    pub fn handle_state(&mut self, live: impl IntoIterator<Item = (NodeId, u64)>, now: Instant) {
        self.live = live.into_iter().collect();
        if self.leading_term.is_some() {
            self.grant_grace(now);
        }
    }

    /// A heartbeat of `incarnation` was accepted, or its registration
    /// committed, at `now`: its lease restarts, even from inside a grace.
    /// It does not recall an expiry already handed out.
    pub fn handle_renewed(&mut self, node: NodeId, incarnation: u64, now: Instant) {
        let source = self.clocks.get(&node).filter(|c| c.incarnation == incarnation).and_then(|c| c.source);
        self.clocks.insert(node, Clock { incarnation, renewed: now, expiring: false, source });
    }

    /// A registration of `incarnation` from `source` committed at `now`:
    /// [`Leases::handle_renewed`], remembering where it came from.
    pub fn handle_registered(&mut self, node: NodeId, incarnation: u64, source: SocketAddr, now: Instant) {
        self.clocks.insert(node, Clock { incarnation, renewed: now, expiring: false, source: Some(source) });
    }

    /// Whether a registration of `node` from `source` is the daemon that
    /// holds live `incarnation` registering again (a retry whose answer was
    /// lost, or a restart within its lease on the same socket): this leader
    /// saw that incarnation register from `source`, and its lease has not
    /// run out at `now`. Such a registration commits nothing: the
    /// incarnation stands and its lease is renewed.
    pub fn same_daemon(&self, node: NodeId, incarnation: u64, source: SocketAddr, now: Instant) -> bool {
        self.clocks.get(&node).is_some_and(|c| {
            c.incarnation == incarnation && c.source == Some(source) && !c.expiring && c.renewed + self.lease > now
        })
    }

    /// Decides a registration of `node` from `addr` while the replicated
    /// state has `live` (its live incarnation and address, if it is live):
    /// refused while a daemon at another address holds the node's lease
    /// (renewed within one lease of `now`, or in its grace), so a second
    /// daemon given the same certificate cannot take the id over and flap
    /// the placement. The same advertised address from the same source
    /// address (where this leader saw the live one register) is the same
    /// daemon starting again (two processes cannot bind one address); a
    /// copied node.toml advertises the same address from another host, and
    /// is refused. A lease that ran out is free to take. A live incarnation without a clock (a leader before
    /// its first tick, or one registered through an earlier leader) is in
    /// its grace: held. Registrations go to the leader only.
    pub fn refuse_registration(
        &self,
        node: NodeId,
        live: Option<(u64, &str)>,
        addr: &str,
        source: SocketAddr,
        now: Instant,
    ) -> Option<RegistrationRefused> {
        let (incarnation, live_addr) = live?;
        let clock = self.clocks.get(&node).filter(|c| c.incarnation == incarnation);
        if live_addr == addr && clock.and_then(|c| c.source).is_none_or(|s| s == source) {
            return None;
        }
        let since = clock.map_or(Duration::ZERO, |c| now.saturating_duration_since(c.renewed));
        (since <= self.lease).then(|| RegistrationRefused {
            live_addr: live_addr.to_owned(),
            incarnation,
            since_renewal: since,
        })
    }

    /// Proposing `expired` failed: hand it out again at a later tick if its
    /// lease has still run out then. A renewal since has already cleared it.
    pub fn handle_expiry_failed(&mut self, expired: Expired) {
        if let Some(c) = self.clocks.get_mut(&expired.node)
            && c.incarnation == expired.incarnation
        {
            c.expiring = false;
        }
    }

    /// While leading: the live nodes whose lease ran out by `now` (more than
    /// one lease since their renewal), each handed out once, in node order.
    pub fn poll_expired(&mut self, now: Instant) -> Vec<Expired> {
        if self.leading_term.is_none() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (&node, &incarnation) in &self.live {
            let Some(c) = self.clocks.get_mut(&node) else { continue };
            if c.incarnation == incarnation && !c.expiring && now.saturating_duration_since(c.renewed) > self.lease {
                c.expiring = true;
                out.push(Expired { node, incarnation });
            }
        }
        out
    }

    /// What is left of `incarnation`'s lease at `now` (zero once run out),
    /// or `None` if this table holds no clock for it.
    pub fn lease_left(&self, node: NodeId, incarnation: u64, now: Instant) -> Option<Duration> {
        let c = self.clocks.get(&node).filter(|c| c.incarnation == incarnation)?;
        Some((c.renewed + self.lease).saturating_duration_since(now))
    }

    fn grant_grace(&mut self, now: Instant) {
        for (&node, &incarnation) in &self.live {
            match self.clocks.get(&node) {
                Some(c) if c.incarnation == incarnation => {}
                _ => {
                    let renewed = now + self.lease;
                    self.clocks.insert(node, Clock { incarnation, renewed, expiring: false, source: None });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_daemon_registering_again_from_its_socket_is_the_same_daemon() {
        let t0 = Instant::now();
        let lease = Duration::from_secs(3);
        let mut l = Leases::new(lease, t0);
        let (a, b): (SocketAddr, SocketAddr) = ("10.0.0.1:7100".parse().unwrap(), "10.0.0.2:7100".parse().unwrap());
        assert!(!l.same_daemon(NodeId(1), 4, a, t0), "no clock: not known");
        l.handle_registered(NodeId(1), 4, a, t0);
        assert!(l.same_daemon(NodeId(1), 4, a, t0 + lease / 2));
        assert!(!l.same_daemon(NodeId(1), 4, b, t0), "another socket");
        assert!(!l.same_daemon(NodeId(1), 5, a, t0), "another incarnation");
        assert!(!l.same_daemon(NodeId(1), 4, a, t0 + lease), "its lease ran out");
        l.handle_renewed(NodeId(1), 4, t0 + lease);
        assert!(l.same_daemon(NodeId(1), 4, a, t0 + lease + lease / 2), "a renewal keeps the source");
    }

    const LEASE: Duration = Duration::from_secs(3);
    const MS: Duration = Duration::from_millis(1);

    fn expired(node: u64, incarnation: u64) -> Expired {
        Expired { node: NodeId(node), incarnation }
    }

    /// The shell on a virtual clock: ticks at `poll_timeout`, and commits
    /// every expiry it is handed (the node leaves the live set) unless
    /// `commit` is off, in which case the proposal fails.
    struct Sim {
        leases: Leases,
        now: Instant,
        term: Option<u64>,
        live: BTreeMap<NodeId, u64>,
        commit: bool,
        log: Vec<(Duration, Expired)>,
        start: Instant,
    }

    impl Sim {
        fn new(live: &[(u64, u64)]) -> Self {
            let start = Instant::now();
            let mut sim = Sim {
                leases: Leases::new(LEASE, start),
                now: start,
                term: Some(1),
                live: live.iter().map(|&(n, i)| (NodeId(n), i)).collect(),
                commit: true,
                log: Vec::new(),
                start,
            };
            // This voter leads from the start; the registrations commit on it.
            sim.leases.handle_leadership(sim.term, start);
            for &(n, i) in live {
                sim.leases.handle_renewed(NodeId(n), i, start);
            }
            sim
        }

        fn at(&self, offset: Duration) -> Instant {
            self.start + offset
        }

        /// One tick at `now`, as the shell runs it.
        fn tick_at(&mut self, now: Instant) {
            self.now = now;
            self.leases.handle_timeout(now);
            self.leases.handle_leadership(self.term, now);
            self.leases.handle_state(self.live.clone(), now);
            for e in self.leases.poll_expired(now) {
                self.log.push((now - self.start, e));
                if self.commit {
                    self.live.remove(&e.node);
                } else {
                    self.leases.handle_expiry_failed(e);
                }
            }
        }

        /// Ticks on schedule until `until` (offset from the start); bounded,
        /// so a schedule that stops advancing fails instead of hanging.
        fn run_until(&mut self, until: Duration, mut between: impl FnMut(&mut Self)) {
            for _ in 0..100_000 {
                let next = self.leases.poll_timeout();
                assert!(next > self.now, "the tick schedule must advance");
                if next > self.at(until) {
                    return;
                }
                self.tick_at(next);
                between(self);
            }
            panic!("more than 100000 ticks");
        }

        fn renew(&mut self, node: u64) {
            let inc = self.live[&NodeId(node)];
            self.leases.handle_renewed(NodeId(node), inc, self.now);
        }
    }

    #[test]
    fn the_tick_is_a_tenth_of_the_lease_but_at_least_50_ms() {
        let t0 = Instant::now();
        let l = Leases::new(LEASE, t0);
        assert_eq!(l.tick(), Duration::from_millis(300));
        assert_eq!(l.poll_timeout(), t0 + Duration::from_millis(300));
        let short = Leases::new(Duration::from_millis(200), t0);
        assert_eq!(short.tick(), MIN_TICK);
        let mut l = l;
        l.handle_timeout(t0 + Duration::from_millis(310));
        assert_eq!(l.poll_timeout(), t0 + Duration::from_millis(610), "the next tick counts from the last one");
    }

    #[test]
    fn a_lease_renewed_in_time_is_kept() {
        let mut sim = Sim::new(&[(1, 7)]);
        // Heartbeats every second, a third of the lease, for a minute.
        let mut last = Duration::ZERO;
        sim.run_until(Duration::from_secs(60), |s| {
            if s.now - s.start >= last + Duration::from_secs(1) {
                last = s.now - s.start;
                s.renew(1);
            }
        });
        assert!(sim.log.is_empty(), "{:?}", sim.log);
        assert_eq!(sim.live.len(), 1);
    }

    #[test]
    fn a_lease_that_runs_out_is_expired_exactly_once_at_the_first_tick_past_it() {
        let mut sim = Sim::new(&[(1, 7), (2, 8)]);
        sim.run_until(Duration::from_secs(20), |s| s.renew(1));
        // Ticks every 300 ms: 3.0 s is exactly one lease (kept, the bound is
        // strict), 3.3 s is the first tick past it. Node 1 heartbeats.
        assert_eq!(sim.log, [(Duration::from_millis(3300), expired(2, 8))]);
        assert_eq!(sim.live.keys().copied().collect::<Vec<_>>(), [NodeId(1)]);
    }

    #[test]
    fn an_expiry_handed_out_is_not_handed_out_again_while_its_proposal_is_in_flight() {
        let t0 = Instant::now();
        let mut l = Leases::new(LEASE, t0);
        l.handle_leadership(Some(1), t0);
        l.handle_renewed(NodeId(2), 8, t0);
        l.handle_state([(NodeId(2), 8)], t0);
        let late = t0 + LEASE + MS;
        assert_eq!(l.poll_expired(t0 + LEASE), [], "exactly one lease is still within it");
        assert_eq!(l.poll_expired(late), [expired(2, 8)]);
        // The state still shows the node live until the command applies.
        l.handle_state([(NodeId(2), 8)], late);
        assert_eq!(l.poll_expired(late + Duration::from_secs(10)), []);
        assert_eq!(l.lease_left(NodeId(2), 8, late), Some(Duration::ZERO));
    }

    #[test]
    fn a_failed_expiry_is_handed_out_again_at_the_next_poll() {
        let mut sim = Sim::new(&[(2, 8)]);
        sim.commit = false;
        sim.run_until(Duration::from_millis(4000), |_| {});
        let times: Vec<u128> = sim.log.iter().map(|(t, _)| t.as_millis()).collect();
        assert_eq!(times, [3300, 3600, 3900], "retried once per tick while it keeps failing");
        assert!(sim.log.iter().all(|(_, e)| *e == expired(2, 8)));
    }

    #[test]
    fn a_renewal_racing_with_an_expiry_does_not_recall_it_but_cancels_the_retry() {
        let t0 = Instant::now();
        let mut l = Leases::new(LEASE, t0);
        l.handle_leadership(Some(1), t0);
        l.handle_renewed(NodeId(2), 8, t0);
        l.handle_state([(NodeId(2), 8)], t0);
        let t1 = t0 + LEASE + MS;
        let e = l.poll_expired(t1);
        assert_eq!(e, [expired(2, 8)]);
        // The heartbeat lands while ExpireNode is being proposed...
        l.handle_renewed(NodeId(2), 8, t1);
        // ...and the proposal fails: the renewal stands, nothing is retried.
        l.handle_expiry_failed(e[0]);
        assert_eq!(l.poll_expired(t1 + LEASE), []);
        assert_eq!(l.poll_expired(t1 + LEASE + MS), [expired(2, 8)], "the renewed lease runs out in turn");
    }

    #[test]
    fn a_new_leader_grants_every_live_node_one_more_lease() {
        let t0 = Instant::now();
        let mut l = Leases::new(LEASE, t0);
        // Node 1 last heartbeated long ago, on the previous leader.
        l.handle_state([(NodeId(1), 7)], t0);
        let t1 = t0 + Duration::from_secs(100);
        l.handle_leadership(Some(4), t1);
        assert_eq!(l.lease_left(NodeId(1), 7, t1), Some(2 * LEASE));
        assert_eq!(l.poll_expired(t1 + 2 * LEASE), [], "two leases from the new leadership is still within");
        assert_eq!(l.poll_expired(t1 + 2 * LEASE + MS), [expired(1, 7)]);
    }

    #[test]
    fn a_new_term_forgets_the_old_clocks_and_grants_a_grace_again() {
        let mut sim = Sim::new(&[(1, 7)]);
        // Leads in term 1 until 2 s, then in term 2 from 2.1 s on (a new
        // election it won again). Node 1 never heartbeats.
        sim.run_until(Duration::from_millis(2000), |_| {});
        sim.term = Some(2);
        sim.run_until(Duration::from_secs(20), |_| {});
        // Term 2 starts at the 2.1 s tick: the grace runs out after 8.1 s.
        assert_eq!(sim.log, [(Duration::from_millis(8400), expired(1, 7))]);
    }

    #[test]
    fn a_deposed_leader_expires_nothing_and_reports_no_leases() {
        let mut sim = Sim::new(&[(1, 7)]);
        sim.run_until(Duration::from_millis(2000), |_| {});
        sim.term = None;
        sim.run_until(Duration::from_secs(20), |_| {});
        assert!(sim.log.is_empty(), "{:?}", sim.log);
        assert_eq!(sim.leases.lease_left(NodeId(1), 7, sim.now), None);
        // Leading again (any term) starts from a grace.
        sim.term = Some(3);
        let back = sim.now - sim.start + sim.leases.tick();
        sim.run_until(Duration::from_secs(40), |_| {});
        assert_eq!(sim.log, [(back + 2 * LEASE + Duration::from_millis(300), expired(1, 7))]);
    }

    #[test]
    fn an_incarnation_registered_through_an_earlier_leader_gets_a_grace() {
        let t0 = Instant::now();
        let mut l = Leases::new(LEASE, t0);
        l.handle_leadership(Some(1), t0);
        l.handle_renewed(NodeId(1), 7, t0);
        l.handle_state([(NodeId(1), 7)], t0);
        // The node re-registered (incarnation 9) without this table hearing
        // of it; the state shows the new incarnation at 10 s.
        let t1 = t0 + Duration::from_secs(10);
        l.handle_state([(NodeId(1), 9)], t1);
        assert_eq!(l.lease_left(NodeId(1), 7, t1), None, "the old incarnation's clock is gone");
        assert_eq!(l.lease_left(NodeId(1), 9, t1), Some(2 * LEASE));
        assert_eq!(l.poll_expired(t1 + 2 * LEASE), []);
        assert_eq!(l.poll_expired(t1 + 2 * LEASE + MS), [expired(1, 9)]);
    }

    #[test]
    fn a_stalled_tick_restarts_every_lease_instead_of_expiring() {
        let t0 = Instant::now();
        let mut l = Leases::new(LEASE, t0);
        l.handle_leadership(Some(1), t0);
        l.handle_renewed(NodeId(1), 7, t0);
        l.handle_state([(NodeId(1), 7)], t0);
        // The process sleeps 10 s: the tick due at 0.3 s runs at 10 s.
        let t1 = t0 + Duration::from_secs(10);
        l.handle_timeout(t1);
        assert_eq!(l.poll_expired(t1), [], "no node is expired for the leader's own pause");
        assert_eq!(l.lease_left(NodeId(1), 7, t1), Some(LEASE));
        assert_eq!(l.poll_expired(t1 + LEASE + MS), [expired(1, 7)], "the restarted lease still runs out");
    }

    #[test]
    fn a_tick_late_by_at_most_half_a_lease_is_not_a_stall() {
        let t0 = Instant::now();
        let table = |late: Duration| {
            let mut l = Leases::new(LEASE, t0);
            l.handle_leadership(Some(1), t0);
            l.handle_renewed(NodeId(1), 7, t0);
            l.handle_state([(NodeId(1), 7)], t0);
            l.handle_timeout(t0 + Duration::from_millis(1500));
            let t1 = t0 + Duration::from_millis(1500) + l.tick() + late;
            l.handle_timeout(t1);
            l.poll_expired(t1)
        };
        // 1.5 s late (exactly half a lease) is on time: the lease ran out.
        assert_eq!(table(LEASE / 2), [expired(1, 7)]);
        // A millisecond more is a stall: the lease restarts instead.
        assert_eq!(table(LEASE / 2 + MS), []);
    }

    #[test]
    fn a_follower_grants_nothing_and_expires_nothing() {
        let t0 = Instant::now();
        let mut l = Leases::new(LEASE, t0);
        l.handle_leadership(None, t0);
        l.handle_state([(NodeId(1), 7)], t0);
        assert_eq!(l.lease_left(NodeId(1), 7, t0), None);
        l.handle_renewed(NodeId(1), 7, t0);
        assert_eq!(l.poll_expired(t0 + 10 * LEASE), []);
    }

    #[test]
    fn only_live_incarnations_are_expired() {
        let t0 = Instant::now();
        let mut l = Leases::new(LEASE, t0);
        l.handle_leadership(Some(1), t0);
        l.handle_renewed(NodeId(1), 7, t0);
        l.handle_renewed(NodeId(2), 8, t0);
        // Node 2's expiry was applied: only node 1 is live.
        l.handle_state([(NodeId(1), 7)], t0);
        assert_eq!(l.poll_expired(t0 + 2 * LEASE), [expired(1, 7)]);
    }

    /// Issue 29: a second daemon with node 2's certificate, at another
    /// address, is refused while node 2's lease is held (or in its grace,
    /// before the leader has timed it: found under load, a registration
    /// 250 ms after the first, before the new leader's first tick, was let
    /// through), and nothing is refused to the daemon that holds it (a
    /// restart at its own address) or once the lease has run out.
    #[test]
    fn a_second_daemon_is_refused_while_the_live_one_holds_the_lease() {
        let start = Instant::now();
        let mut leases = Leases::new(LEASE, start);
        leases.handle_leadership(Some(1), start);
        leases.handle_state([(NodeId(2), 7)], start);
        let live = Some((7, "10.0.0.2:7100"));
        let at = |ms: u64| start + Duration::from_millis(ms);
        let src = |host: u8| SocketAddr::from(([10, 0, 0, host], 7100));
        leases.handle_registered(NodeId(2), 7, src(2), start);
        let refused = leases.refuse_registration(NodeId(2), live, "10.0.0.9:7100", src(9), at(2_000)).expect("refused");
        assert_eq!(
            refused,
            RegistrationRefused {
                live_addr: "10.0.0.2:7100".into(),
                incarnation: 7,
                since_renewal: Duration::from_millis(2_000)
            }
        );
        assert_eq!(
            leases.refuse_registration(NodeId(2), live, "10.0.0.2:7100", src(2), at(2_000)),
            None,
            "same address"
        );
        assert_eq!(leases.refuse_registration(NodeId(2), None, "10.0.0.9:7100", src(9), at(2_000)), None, "not live");
        let untimed = leases.refuse_registration(NodeId(3), Some((8, "a:1")), "b:1", src(9), at(2_000));
        assert_eq!(untimed.map(|r| r.since_renewal), Some(Duration::ZERO), "no clock yet: its grace");
        assert!(
            leases.refuse_registration(NodeId(2), live, "10.0.0.9:7100", src(9), at(3_000)).is_some(),
            "a whole lease"
        );
        assert_eq!(leases.refuse_registration(NodeId(2), live, "10.0.0.9:7100", src(9), at(3_001)), None, "ran out");
        // A copied node.toml: the same advertised address from another host.
        assert!(leases.refuse_registration(NodeId(2), live, "10.0.0.2:7100", src(3), at(2_000)).is_some(), "copy");
        // Heartbeats keep it held.
        leases.handle_renewed(NodeId(2), 7, at(2_900));
        assert!(leases.refuse_registration(NodeId(2), live, "10.0.0.9:7100", src(9), at(5_000)).is_some());
        // A new leadership's grace holds it too, then it runs out.
        leases.handle_leadership(Some(2), at(10_000));
        assert!(leases.refuse_registration(NodeId(2), live, "10.0.0.9:7100", src(9), at(15_900)).is_some(), "grace");
        assert_eq!(
            leases.refuse_registration(NodeId(2), live, "10.0.0.9:7100", src(9), at(16_001)),
            None,
            "grace over"
        );
        // A leader that registered the node before its first tick holds the
        // clock of that registration.
        let mut fresh = Leases::new(LEASE, start);
        fresh.handle_renewed(NodeId(2), 1, at(100));
        assert!(fresh.refuse_registration(NodeId(2), Some((1, "a:1")), "b:1", src(9), at(350)).is_some());
    }
}
