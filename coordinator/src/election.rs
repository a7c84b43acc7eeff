//! The election watchdog as a pure state machine: when a follower that has
//! stopped hearing from its leader should start an election itself. No
//! tokio, no wall clock: every input carries `now`.
//!
//! openraft 0.9 has a follower that stops hearing from its leader wait the
//! leader lease (`election_timeout_max`) plus a random election timeout
//! before it campaigns; other followers refuse votes until their own lease
//! has run out. Campaigning at lease expiry plus a stagger by voter rank
//! (one heartbeat interval per rank, so two survivors do not split the
//! vote) roughly halves failover. Timing never affects Raft's safety, only
//! when an election starts; if this one fails, openraft's own timers retry.
//!
//! The shell polls every quarter heartbeat (at least [`MIN_POLL`]): at
//! [`Watchdog::poll_timeout`] it calls [`Watchdog::handle_timeout`], feeds
//! the last AppendEntries accepted ([`Watchdog::handle_contact`]) and the
//! Raft metrics ([`Watchdog::handle_membership`]), and starts an election
//! when [`Watchdog::poll_campaign`] says so.

use crate::types::VoterId;
use std::time::{Duration, Instant};

/// The shortest poll interval, however short the heartbeat.
pub const MIN_POLL: Duration = Duration::from_millis(5);

/// The watchdog's decision to start an election now.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Campaign {
    /// How long this voter has heard nothing from a leader.
    pub silent: Duration,
}

/// One voter's election watchdog. See the module docs.
#[derive(Debug)]
pub struct Watchdog {
    id: VoterId,
    /// The leader lease a follower waits out (`election_timeout_max`).
    lease: Duration,
    /// The stagger per voter rank (the heartbeat interval).
    step: Duration,
    poll: Duration,
    last_poll: Instant,
    /// The leader as the metrics last showed it (possibly one that died).
    leader: Option<VoterId>,
    /// The voters, sorted and without repeats.
    voters: Vec<VoterId>,
    /// The last contact with a leader: an AppendEntries accepted, or a poll
    /// at which this voter led.
    last_contact: Option<Instant>,
    /// When this watchdog last started an election.
    last_campaign: Option<Instant>,
    /// Elections started since the last contact with a leader: each one
    /// unanswered doubles the rest before the next (at most
    /// [`MAX_BACKOFF`] leases), so voters whose vote rounds outlast a lease
    /// (a loaded host) stop aborting each other's rounds, and openraft's
    /// randomized timers get room to elect.
    unanswered: u32,
}

/// The longest rest between two campaigns, in leases.
pub const MAX_BACKOFF: u32 = 8;

impl Watchdog {
    /// A watchdog for voter `id` that campaigns `lease` plus one `step` per
    /// rank after the last contact; the first poll is one poll after `now`.
    pub fn new(id: VoterId, lease: Duration, step: Duration, now: Instant) -> Self {
        Self {
            id,
            lease,
            step,
            poll: (step / 4).max(MIN_POLL),
            last_poll: now,
            leader: None,
            voters: Vec::new(),
            last_contact: None,
            last_campaign: None,
            unanswered: 0,
        }
    }

    /// The poll interval.
    pub fn poll_interval(&self) -> Duration {
        self.poll
    }

    /// When the next poll is due: one poll after the last one began.
    pub fn poll_timeout(&self) -> Instant {
        self.last_poll + self.poll
    }

    /// A poll at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.last_poll = now;
    }

    /// This voter accepted an AppendEntries from a leader at `at`.
    pub fn handle_contact(&mut self, at: Instant) {
        self.last_contact = self.last_contact.max(Some(at));
    }

    /// The leader and voters as Raft reports them at `now`. Leading counts
    /// as contact with a leader: if this voter is deposed while alive, its
    /// silence counts from its last poll as leader, not from before it led.
    pub fn handle_membership(
        &mut self,
        leader: Option<VoterId>,
        voters: impl IntoIterator<Item = VoterId>,
        now: Instant,
    ) {
        self.leader = leader;
        self.voters = voters.into_iter().collect();
        self.voters.sort_unstable();
        self.voters.dedup();
        if leader == Some(self.id) {
            self.handle_contact(now);
        }
    }

    /// Whether to start an election at `now`: this voter is a follower of a
    /// group of two or more, has heard from a leader before, and has heard
    /// nothing for more than the lease plus one step per rank among the
    /// voters other than the last known leader; and it has not campaigned
    /// within the last lease, or, after campaigns no leader answered, the
    /// last 2, 4, then 8 leases.
    pub fn poll_campaign(&mut self, now: Instant) -> Option<Campaign> {
        if self.leader == Some(self.id) || self.voters.len() < 2 || !self.voters.contains(&self.id) {
            return None;
        }
        let last_contact = self.last_contact?;
        if self.last_campaign.is_some_and(|t| last_contact > t) {
            self.unanswered = 0;
        }
        let silent = now.saturating_duration_since(last_contact);
        let rank = self.voters.iter().filter(|v| Some(**v) != self.leader).position(|v| *v == self.id).unwrap_or(0);
        let due = self.lease + self.step * (rank as u32 + 1);
        let rest = self.lease * (1u32 << self.unanswered.saturating_sub(1).min(MAX_BACKOFF.trailing_zeros()));
        let rested = self.last_campaign.is_none_or(|t| now.saturating_duration_since(t) > rest);
        if silent > due && rested {
            self.last_campaign = Some(now);
            self.unanswered = self.unanswered.saturating_add(1);
            return Some(Campaign { silent });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_millis(625);
    const STEP: Duration = Duration::from_millis(100);
    const MS: Duration = Duration::from_millis(1);

    fn voters(ids: &[u64]) -> Vec<VoterId> {
        ids.iter().map(|&i| VoterId(i)).collect()
    }

    /// Voter `id` of {1, 2, 3} following voter 1, last heard from it at `t0`.
    fn follower(id: u64, t0: Instant) -> Watchdog {
        let mut w = Watchdog::new(VoterId(id), LEASE, STEP, t0);
        w.handle_contact(t0);
        w.handle_membership(Some(VoterId(1)), voters(&[1, 2, 3]), t0);
        w
    }

    /// Polls on schedule from the watchdog's last poll until `until`, with
    /// the membership fixed; returns when each campaign started, as offsets
    /// from `t0`. Bounded, so a schedule that stops advancing fails.
    fn run(w: &mut Watchdog, t0: Instant, until: Duration) -> Vec<Duration> {
        let mut out = Vec::new();
        for _ in 0..100_000 {
            let now = w.poll_timeout();
            assert!(now > w.last_poll, "the poll schedule must advance");
            if now > t0 + until {
                return out;
            }
            w.handle_timeout(now);
            if w.poll_campaign(now).is_some() {
                out.push(now - t0);
            }
        }
        panic!("more than 100000 polls");
    }

    #[test]
    fn polls_every_quarter_heartbeat_but_at_least_every_5_ms() {
        let t0 = Instant::now();
        let w = Watchdog::new(VoterId(1), LEASE, STEP, t0);
        assert_eq!(w.poll_interval(), Duration::from_millis(25));
        assert_eq!(w.poll_timeout(), t0 + Duration::from_millis(25));
        assert_eq!(Watchdog::new(VoterId(1), LEASE, Duration::from_millis(10), t0).poll_interval(), MIN_POLL);
    }

    #[test]
    fn fires_after_the_lease_plus_one_step_and_not_before() {
        let t0 = Instant::now();
        let mut w = follower(2, t0);
        // Rank 0 among {2, 3}: due after 625 + 100 ms of silence.
        assert_eq!(w.poll_campaign(t0 + LEASE + STEP), None, "exactly the due time is not past it");
        assert_eq!(w.poll_campaign(t0 + LEASE + STEP + MS), Some(Campaign { silent: LEASE + STEP + MS }));
    }

    #[test]
    fn on_a_poll_schedule_it_fires_at_the_first_poll_past_due() {
        let t0 = Instant::now();
        let mut w = follower(2, t0);
        // Polls every 25 ms; due at 725 ms (strict), so 750 ms; then again
        // only once more than a lease has passed since: 1400 ms.
        assert_eq!(
            run(&mut w, t0, Duration::from_millis(1500)),
            [Duration::from_millis(750), Duration::from_millis(1400)]
        );
    }

    #[test]
    fn voters_are_staggered_by_rank_among_those_other_than_the_leader() {
        let t0 = Instant::now();
        let mut third = follower(3, t0);
        // Rank 1 among {2, 3}: one more step.
        assert_eq!(third.poll_campaign(t0 + LEASE + 2 * STEP), None);
        assert!(third.poll_campaign(t0 + LEASE + 2 * STEP + MS).is_some());
        // With no leader known, voter 1 counts too: voter 2 has rank 1.
        let mut second = Watchdog::new(VoterId(2), LEASE, STEP, t0);
        second.handle_contact(t0);
        second.handle_membership(None, voters(&[3, 1, 2, 2]), t0);
        assert_eq!(second.poll_campaign(t0 + LEASE + 2 * STEP), None);
        assert!(second.poll_campaign(t0 + LEASE + 2 * STEP + MS).is_some());
    }

    #[test]
    fn contact_resets_the_silence() {
        let t0 = Instant::now();
        let mut w = follower(2, t0);
        let t1 = t0 + LEASE;
        w.handle_contact(t1);
        // An older contact read late does not move it back.
        w.handle_contact(t0);
        assert_eq!(w.poll_campaign(t1 + LEASE + STEP), None);
        assert!(w.poll_campaign(t1 + LEASE + STEP + MS).is_some());
    }

    #[test]
    fn after_a_campaign_it_waits_more_than_a_lease_before_the_next() {
        let t0 = Instant::now();
        let mut w = follower(2, t0);
        let t1 = t0 + LEASE + STEP + MS;
        assert!(w.poll_campaign(t1).is_some());
        assert_eq!(w.poll_campaign(t1 + MS), None);
        assert_eq!(w.poll_campaign(t1 + LEASE), None);
        assert!(w.poll_campaign(t1 + LEASE + MS).is_some(), "still silent: it tries again");
    }

    #[test]
    fn unanswered_campaigns_rest_twice_as_long_each_time_up_to_eight_leases_until_contact() {
        let t0 = Instant::now();
        let mut w = follower(2, t0);
        let first = t0 + LEASE + STEP + MS;
        let mut at = vec![first];
        assert!(w.poll_campaign(first).is_some());
        // Rests of 1, 2, 4, 8, then 8 leases.
        for rest in [1u32, 2, 4, 8, 8] {
            let prev = *at.last().unwrap();
            assert_eq!(w.poll_campaign(prev + LEASE * rest), None, "rest {rest}");
            assert!(w.poll_campaign(prev + LEASE * rest + MS).is_some(), "rest {rest}");
            at.push(prev + LEASE * rest + MS);
        }
        // A leader is heard: the next silence starts from a lease's rest.
        let heard = *at.last().unwrap() + MS;
        w.handle_contact(heard);
        let next = heard + LEASE + STEP + MS;
        assert!(w.poll_campaign(next).is_some());
        assert!(w.poll_campaign(next + LEASE + MS).is_some(), "one lease again after contact");
    }

    #[test]
    fn the_leader_never_campaigns_and_its_silence_starts_when_deposed() {
        let t0 = Instant::now();
        let mut w = Watchdog::new(VoterId(1), LEASE, STEP, t0);
        w.handle_membership(Some(VoterId(1)), voters(&[1, 2, 3]), t0);
        let t1 = t0 + Duration::from_secs(10);
        w.handle_membership(Some(VoterId(1)), voters(&[1, 2, 3]), t1);
        assert_eq!(w.poll_campaign(t1), None);
        // Deposed at t1 (voter 2 leads), then nothing more is heard. Voter 1
        // has rank 0 among the voters other than the leader, {1, 3}.
        w.handle_membership(Some(VoterId(2)), voters(&[1, 2, 3]), t1);
        assert_eq!(w.poll_campaign(t1 + LEASE + STEP), None, "silence counts from the last poll as leader");
        assert!(w.poll_campaign(t1 + LEASE + STEP + MS).is_some());
    }

    #[test]
    fn never_fires_alone_outside_the_group_or_before_any_contact() {
        let t0 = Instant::now();
        let late = t0 + Duration::from_secs(60);
        let mut alone = Watchdog::new(VoterId(1), LEASE, STEP, t0);
        alone.handle_contact(t0);
        alone.handle_membership(None, voters(&[1]), t0);
        assert_eq!(alone.poll_campaign(late), None, "a group of one");
        let mut outsider = Watchdog::new(VoterId(9), LEASE, STEP, t0);
        outsider.handle_contact(t0);
        outsider.handle_membership(Some(VoterId(1)), voters(&[1, 2, 3]), t0);
        assert_eq!(outsider.poll_campaign(late), None, "not a voter");
        let mut fresh = Watchdog::new(VoterId(2), LEASE, STEP, t0);
        fresh.handle_membership(None, voters(&[1, 2, 3]), t0);
        assert_eq!(fresh.poll_campaign(late), None, "never heard a leader: openraft's own timers elect");
    }
}
