//! Where one load of a shard gets its chunk: the fetch route, as a pure
//! state machine.
//!
//! A node that does not own a shard asks its owner. What happens when the
//! owner fails is the fabric's central decision, and it is made here, with
//! `now` as an argument and no I/O, so that every branch is tested on a
//! virtual clock (the async shell in `service.rs` only executes [`Step`]s):
//!
//! - **The owner answers**: the chunk is a guest copy; done.
//! - **The owner is alive but gave no chunk**: it stalled (its connection
//!   answers, the stream does not) or sent a chunk that failed validation. It keeps its lease, so the placement will not move
//!   the shard; waiting would only add to the failure. Read remote storage
//!   now. (`granary-chaos sim` found the corrupt case: seed 11438 waited the
//!   whole reroute wait for a live owner's shard to move.)
//! - **The owner failed otherwise** (unreachable, gone quiet, reset, or
//!   refused: most often because its placement and this node's disagree
//!   for a moment; it is redialed and asked again like an owner that comes
//!   back, see below):
//!   it may be dead, and a dead owner's lease expiry moves its shards to one
//!   survivor, which reads them once. Reading here at once would make every
//!   survivor read them, so wait (up to the reroute wait) for the placement
//!   to move the shard, then ask the new owner. If the owner answers again
//!   first (it was cut off, or stopped, and is back: a handshake with it
//!   completes), ask it again: it keeps its lease and its shards, and the
//!   placement will never move them. (`granary-chaos sim --scenario
//!   partition` measured the cost without it: a node cut off for 6 s spent
//!   the whole reroute wait on every shard it had asked for, then read them
//!   all itself.)
//! - **This node owns the shard but a placement handed it over from a
//!   live node** (the coordinator records the node a shard was moved from,
//!   `ClusterState::handed_from`): before reading remote storage, ask that
//!   node whether it holds the chunk ([`Step::AskHeld`]). It answers from
//!   what it holds, at once, never by loading, so the ask cannot wait on
//!   anything and joins no wait cycle; a miss, a failure or no answer
//!   within the handoff wait means reading remote storage. (`granary-chaos
//!   sim --scenario stop` measured the cost without it: a node back from a
//!   stop was given shards the survivors had read while it was away, and
//!   read them again in the warm epochs.)
//! - **This node would read as the shard's owner while its lease is in
//!   doubt**: its last accepted heartbeat is a lease old or older (it was
//!   stopped, or cut off from the coordinators), or it knows its lease was
//!   lost, or the coordinator reported a newer placement than it knows. The
//!   placement it acts on may be stale: the coordinator may have moved its
//!   shards to nodes that read them meanwhile. It waits (up to the reroute
//!   wait) until a heartbeat or a new registration is accepted and the
//!   placement that came with it is known, then routes again once
//!   ([`Route::recheck_as_owner`], [`may_read_as_owner`]). (`granary-chaos
//!   sim` seed 39650: a node cut off past its lease learned, after the
//!   heal, an old placement naming it the owner and read a shard the other
//!   node had read.)
//! - Bounds: at most [`MAX_OWNERS_ASKED`] owners, all within one fetch
//!   deadline; when the placement does not move the shard in time, when it
//!   moves it to this node, or when the deadline has passed, read remote
//!   storage. Every owner that failed is named if that read fails too.

use granary_proto::NodeId;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Owners asked for one chunk, at most: the first, and the owners the
/// placement moved the shard to or the same owner again once it answers
/// after being unreachable.
pub const MAX_OWNERS_ASKED: usize = 3;

/// A shard's owner, as this node knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// The owner's id.
    pub node: NodeId,
    /// Where it serves peers.
    pub addr: SocketAddr,
    /// The placement epoch that named it (a peer's request carries it; see
    /// `crate::flight`).
    pub epoch: u64,
}

/// What the shell does next for a load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Ask `owner` for the chunk, giving up after `within`.
    Ask {
        /// The owner to ask.
        owner: Owner,
        /// What is left of the fetch deadline.
        within: Duration,
    },
    /// Wait up to `within` for a placement in which `failed` no longer owns
    /// the shard, then report [`Route::handle_moved`] or
    /// [`Route::handle_not_moved`]; or, if the owner at `addr` answers a
    /// handshake again first (and the placement still gives it the shard),
    /// report [`Route::handle_owner_back`].
    AwaitPlacement {
        /// The owner that failed.
        failed: NodeId,
        /// Where it serves peers.
        addr: SocketAddr,
        /// How long to wait at most.
        within: Duration,
    },
    /// Ask `former`, the live node the placement handed this node's shard
    /// over from, for a copy it holds (never a load), giving up after
    /// `within`; then report [`Route::handle_held`] on a miss (a chunk ends
    /// the route).
    AskHeld {
        /// The node the shard was handed over from.
        former: Owner,
        /// What is left of the fetch deadline.
        within: Duration,
    },
    /// Read the shard from remote storage and convert it here.
    ReadRemote,
}

/// How asking an owner failed, as far as the route cares; `C` is the cause
/// (the node's `PeerError`), kept as it is: the route never turns it into
/// words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AskFailure<C> {
    /// The owner is alive but gave no chunk: its answer stopped coming while
    /// its connection answered, or its chunk failed validation.
    Alive(C),
    /// Anything else: unreachable, gone quiet, reset, timed out, or refused
    /// (most often because its placement and this node's disagree for a
    /// moment). The route waits for the placement and redials the owner: a
    /// refusing owner answers at once, so it is asked again after the
    /// redial interval, by which time the two placements usually agree (and
    /// it is often the owner after all: `granary-chaos sim --seed 19695`,
    /// where waiting the whole reroute wait made both nodes read the shard).
    Unavailable(C),
}

/// A node a load turned to that gave no chunk, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tried<C> {
    /// The node.
    pub node: NodeId,
    /// What came of it.
    pub outcome: Outcome<C>,
}

/// What came of turning to a node for a chunk ([`Tried`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome<C> {
    /// Asked; it failed with this cause.
    Failed(C),
    /// Not asked at this address: the fetch deadline had passed.
    DeadlinePassed(SocketAddr),
    /// Left while asking: a newer placement names this node the owner.
    Left,
    /// Asked for a copy it holds (the shard was handed over from it): none
    /// came, for this cause.
    NoHeldCopy(C),
}

impl<C: std::fmt::Display> std::fmt::Display for Tried<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let node = self.node;
        match &self.outcome {
            Outcome::Failed(cause) => write!(f, "{node}: {cause}"),
            Outcome::DeadlinePassed(addr) => write!(f, "{node} at {addr}: not asked, the fetch deadline passed"),
            Outcome::Left => write!(f, "{node}: left, a newer placement names this node the owner"),
            Outcome::NoHeldCopy(cause) => write!(f, "{node} (handed the shard over): {cause}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// About to ask `target` (or read remote if there is none).
    Next,
    /// Asked this owner; waiting for the answer.
    Asking(Owner),
    /// Asked the node the shard was handed over from for a held copy.
    AskingHeld(Owner),
    /// Waiting for the placement to move the shard from this owner, and
    /// redialing it.
    Awaiting(Owner),
    /// Reading remote storage (final).
    Remote,
}

/// One load's route: see the module doc.
#[derive(Debug)]
pub struct Route<C> {
    target: Option<Owner>,
    /// Whether the route was routed again after a lease in doubt.
    rechecked: bool,
    /// The node to ask for a held copy before reading remote storage, while
    /// not asked yet.
    handoff: Option<Owner>,
    deadline: Instant,
    reroute_wait: Duration,
    asked: usize,
    tried: Vec<Tried<C>>,
    state: State,
}

impl<C> Route<C> {
    /// A route starting at `owner` (None: this node owns the shard or no
    /// other owner is known), bounded by `fetch_deadline` from `now`; after
    /// an owner fails, the placement is waited for at most `reroute_wait`.
    pub fn new(now: Instant, owner: Option<Owner>, fetch_deadline: Duration, reroute_wait: Duration) -> Self {
        Self {
            target: owner,
            rechecked: false,
            handoff: None,
            deadline: now + fetch_deadline,
            reroute_wait,
            asked: 0,
            tried: Vec::new(),
            state: State::Next,
        }
    }

    /// Before reading remote storage, ask `former` for a copy it holds:
    /// the live node a placement moved this node's shard from. Only for a
    /// route with no other owner to ask (this node owns the shard).
    pub fn with_handoff(mut self, former: Option<Owner>) -> Self {
        if self.target.is_none() {
            self.handoff = former;
        }
        self
    }

    /// The next step. Call again after reporting the outcome of an
    /// [`Step::Ask`] or [`Step::AwaitPlacement`]; once it says
    /// [`Step::ReadRemote`] it always does.
    pub fn poll(&mut self, now: Instant) -> Step {
        match self.state {
            State::Remote => Step::ReadRemote,
            State::Asking(owner) => {
                // The answer was not reported: asking again counts as another
                // ask, so a shell that never reports is still bounded.
                let left = self.deadline.saturating_duration_since(now);
                if self.asked >= MAX_OWNERS_ASKED || left.is_zero() {
                    return self.remote();
                }
                self.asked += 1;
                Step::Ask { owner, within: left }
            }
            // Not reported: taken as a miss.
            State::AskingHeld(_) => self.remote(),
            State::Awaiting(failed) => Step::AwaitPlacement {
                failed: failed.node,
                addr: failed.addr,
                within: self.reroute_wait.min(self.deadline.saturating_duration_since(now)),
            },
            State::Next => {
                let Some(owner) = self.target.filter(|_| self.asked < MAX_OWNERS_ASKED) else {
                    let left = self.deadline.saturating_duration_since(now);
                    if let Some(former) = self.handoff.take().filter(|_| self.target.is_none() && !left.is_zero()) {
                        self.state = State::AskingHeld(former);
                        return Step::AskHeld { former, within: left };
                    }
                    return self.remote();
                };
                let left = self.deadline.saturating_duration_since(now);
                if left.is_zero() {
                    self.tried.push(Tried { node: owner.node, outcome: Outcome::DeadlinePassed(owner.addr) });
                    return self.remote();
                }
                self.asked += 1;
                self.state = State::Asking(owner);
                Step::Ask { owner, within: left }
            }
        }
    }

    /// The owner asked last failed, for the cause `failure` carries.
    pub fn handle_failed(&mut self, failure: AskFailure<C>) {
        let State::Asking(owner) = self.state else { return };
        match failure {
            AskFailure::Alive(cause) => {
                self.tried.push(Tried { node: owner.node, outcome: Outcome::Failed(cause) });
                self.state = State::Remote;
            }
            AskFailure::Unavailable(cause) => {
                self.tried.push(Tried { node: owner.node, outcome: Outcome::Failed(cause) });
                // No owner may be asked after this one: waiting for the
                // placement could not change where the chunk comes from.
                self.state = if self.asked < MAX_OWNERS_ASKED { State::Awaiting(owner) } else { State::Remote };
            }
        }
    }

    /// The placement moved the shard: to `owner`, or (None) to this node or
    /// to no node known.
    pub fn handle_moved(&mut self, owner: Option<Owner>) {
        if let State::Awaiting(_) = self.state {
            self.target = owner;
            self.state = State::Next;
        }
    }

    /// The failed owner answers again (a handshake with it completed while
    /// the route waited for the placement, and the placement still gives it
    /// the shard): ask it again, as one more of the owners asked.
    pub fn handle_owner_back(&mut self) {
        if let State::Awaiting(owner) = self.state {
            self.target = Some(owner);
            self.state = State::Next;
        }
    }

    /// While an owner was being asked, this node learned a placement that
    /// names this node the owner, and a peer that asked for the shard on
    /// that newer placement joined the load (single flight's
    /// [`crate::flight::Admission::JoinAndConvert`]): stop asking and read
    /// it here. Only while asking; out of turn it changes nothing.
    pub fn handle_owned_here(&mut self) {
        if let State::Asking(owner) = self.state {
            self.tried.push(Tried { node: owner.node, outcome: Outcome::Left });
            self.state = State::Remote;
        }
    }

    /// The node asked for a held copy ([`Step::AskHeld`]) gave none, for
    /// the cause `reason` (it does not hold it, it failed, no answer in
    /// time). Read remote storage.
    pub fn handle_held(&mut self, reason: C) {
        if let State::AskingHeld(former) = self.state {
            self.tried.push(Tried { node: former.node, outcome: Outcome::NoHeldCopy(reason) });
            self.state = State::Remote;
        }
    }

    /// Whether the shell may wait for a lease in doubt and route again
    /// ([`Route::recheck_as_owner`]): once per route, after it said
    /// [`Step::ReadRemote`].
    pub fn may_recheck(&self) -> bool {
        self.state == State::Remote && !self.rechecked
    }

    /// The route said [`Step::ReadRemote`] for a shard this node owns
    /// while its lease was in doubt; the shell waited for the lease and the
    /// placement that came with it: route again from the owner it gives
    /// now (`owner`: another node, or None for this one) and the node the
    /// shard was handed over from (`former`). Once per route; the deadline
    /// and the owners asked so far still bound it.
    pub fn recheck_as_owner(&mut self, owner: Option<Owner>, former: Option<Owner>) {
        if !self.may_recheck() {
            return;
        }
        self.rechecked = true;
        self.target = owner;
        self.handoff = if owner.is_none() { former } else { None };
        self.state = State::Next;
    }

    /// The placement did not move the shard within the wait.
    pub fn handle_not_moved(&mut self) {
        if let State::Awaiting(_) = self.state {
            self.state = State::Remote;
        }
    }

    /// The owner whose shard the route waits to see moved, while it waits
    /// for the placement ([`Step::AwaitPlacement`]).
    pub fn awaiting(&self) -> Option<NodeId> {
        match self.state {
            State::Awaiting(failed) => Some(failed.node),
            _ => None,
        }
    }

    /// Every owner that failed and why, in the order asked.
    pub fn tried(&self) -> &[Tried<C>] {
        &self.tried
    }

    /// Takes every owner that failed and why, in the order asked, leaving
    /// none (for the error of a read that failed after them).
    pub fn take_tried(&mut self) -> Vec<Tried<C>> {
        std::mem::take(&mut self.tried)
    }

    fn remote(&mut self) -> Step {
        self.state = State::Remote;
        Step::ReadRemote
    }
}

/// What a node knows of its own lease, for [`may_read_as_owner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseView {
    /// When the last heartbeat or registration the coordinator accepted was
    /// sent (its lease runs from no earlier than that); None while not
    /// registered, or once the lease is known to be lost.
    pub renewed_at: Option<Instant>,
    /// The coordinator's lease.
    pub lease: Duration,
    /// The placement epoch the coordinator reported with it.
    pub epoch: u64,
}

/// Whether a node may read a shard its placement (of `known_epoch`) gives
/// it, as its owner: its lease is not in doubt (`lease`: None when the
/// node follows no lease, as in tests) and that placement is at least as
/// new as the one the coordinator last reported.
pub fn may_read_as_owner(now: Instant, lease: Option<LeaseView>, known_epoch: u64) -> bool {
    let Some(l) = lease else { return true };
    l.renewed_at.is_some_and(|t| now.saturating_duration_since(t) < l.lease) && known_epoch >= l.epoch
}

/// What a load that was routed to read remote storage does once it holds
/// its load permit (the queue can outlast a placement; see
/// [`after_permit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterPermit {
    /// Read.
    Read,
    /// Give the permit back and route again ([`Route::recheck_as_owner`]),
    /// after waiting for the lease and the placement that comes with it
    /// when `wait_for_lease`.
    RouteAgain {
        /// Wait for a renewal first.
        wait_for_lease: bool,
    },
    /// A peer's request whose shard the placement gave to `owner` while
    /// the load waited: answer that the peer should ask it.
    NotOwner(NodeId),
}

/// The decision of [`AfterPermit`] for a load that holds its permit.
/// `forward`: the load may ask other nodes (a trainer's or prefetch's, not
/// a peer's); `routed_as_owner`: the placement named this node (`me`) the
/// owner when the load was routed to read; `placed_now`: the owner it
/// names now; `lease_ok`: [`may_read_as_owner`]; `may_recheck`:
/// [`Route::may_recheck`]; `local_waits`: a request of this node's own
/// joined the load.
#[allow(clippy::too_many_arguments)]
pub fn after_permit(
    me: NodeId,
    forward: bool,
    routed_as_owner: bool,
    placed_now: Option<NodeId>,
    lease_ok: bool,
    may_recheck: bool,
    local_waits: bool,
) -> AfterPermit {
    let moved = routed_as_owner && placed_now.is_some_and(|o| o != me);
    match placed_now {
        // A peer's load whose shard moved on, with none of this node's own
        // requests on it (they would get the refusal too): the peer asks
        // the new owner rather than this node read it a second time.
        Some(owner) if moved && !forward && !local_waits => AfterPermit::NotOwner(owner),
        _ if !may_recheck => AfterPermit::Read,
        _ if moved && forward => AfterPermit::RouteAgain { wait_for_lease: false },
        Some(owner) if owner == me && !lease_ok => AfterPermit::RouteAgain { wait_for_lease: true },
        _ => AfterPermit::Read,
    }
}

/// What a node answers a peer that asks for a file's footer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FooterAnswer {
    /// The footer is in memory: send it.
    Held,
    /// This node believes `owner` reads that footer (the owner of the file's
    /// first row group): say so at once. Two nodes whose placements
    /// disagree would otherwise each wait on the other's read until the
    /// footer deadline.
    NotOwner(NodeId),
    /// Read it from remote storage here (it owns the file, or is alone).
    ReadHere,
}

/// The footer rule for a peer's request: `held` when the footer is in
/// memory, `first_owner` the other node this node believes owns the file's
/// first row group (None: this node, or no cluster).
pub fn answer_footer(held: bool, first_owner: Option<NodeId>) -> FooterAnswer {
    match (held, first_owner) {
        (true, _) => FooterAnswer::Held,
        (false, Some(owner)) => FooterAnswer::NotOwner(owner),
        (false, None) => FooterAnswer::ReadHere,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEADLINE: Duration = Duration::from_secs(30);

    /// Routes whose causes are words, as the tests write them.
    type Route = super::Route<String>;

    fn strings(tried: Vec<Tried<String>>) -> Vec<String> {
        tried.iter().map(ToString::to_string).collect()
    }
    const REROUTE: Duration = Duration::from_secs(10);

    #[test]
    fn a_load_told_the_shard_is_its_own_now_stops_asking_and_reads_it_here() {
        let t0 = Instant::now();
        let mut r = Route::new(t0, Some(owner(2)), DEADLINE, REROUTE);
        // Out of turn (not asking yet): nothing changes.
        r.handle_owned_here();
        assert!(matches!(r.poll(t0), Step::Ask { .. }));
        r.handle_owned_here();
        assert_eq!(r.poll(t0), Step::ReadRemote);
        assert_eq!(r.tried().len(), 1, "{:?}", r.tried());
    }

    fn owner(n: u64) -> Owner {
        Owner { node: NodeId(n), addr: SocketAddr::from(([127, 0, 0, 1], 7000 + n as u16)), epoch: 1 }
    }

    fn ask(o: Owner, within: Duration) -> Step {
        Step::Ask { owner: o, within }
    }

    #[test]
    fn a_shard_handed_over_is_asked_of_its_former_node_once_before_reading_remote() {
        let t0 = Instant::now();
        let mut r = Route::new(t0, None, DEADLINE, REROUTE).with_handoff(Some(owner(2)));
        assert_eq!(r.poll(t0), Step::AskHeld { former: owner(2), within: DEADLINE });
        // Reported out of turn, the other outcomes change nothing.
        r.handle_failed(AskFailure::Unavailable("reset".into()));
        r.handle_owned_here();
        r.handle_held("it does not hold it".into());
        assert_eq!(r.poll(t0), Step::ReadRemote);
        assert_eq!(strings(r.take_tried()), ["node-2 (handed the shard over): it does not hold it"]);
        // Never unreported twice: a shell that does not report reads.
        let mut r = Route::new(t0, None, DEADLINE, REROUTE).with_handoff(Some(owner(2)));
        assert!(matches!(r.poll(t0), Step::AskHeld { .. }));
        assert_eq!(r.poll(t0), Step::ReadRemote);
        // A shard another node owns asks that owner, never a former node.
        let mut r = Route::new(t0, Some(owner(3)), DEADLINE, REROUTE).with_handoff(Some(owner(2)));
        assert_eq!(r.poll(t0), ask(owner(3), DEADLINE));
        r.handle_failed(AskFailure::Unavailable("gone".into()));
        r.poll(t0);
        r.handle_moved(None);
        assert_eq!(r.poll(t0), Step::ReadRemote);
        // Past the deadline, nobody is asked.
        let mut r = Route::new(t0, None, DEADLINE, REROUTE).with_handoff(Some(owner(2)));
        assert_eq!(r.poll(t0 + DEADLINE), Step::ReadRemote);
    }

    #[test]
    fn a_lease_in_doubt_holds_a_read_as_owner_and_routes_again_once() {
        let t0 = Instant::now();
        let lease = Duration::from_secs(3);
        let view = |renewed: Option<Instant>, epoch| Some(LeaseView { renewed_at: renewed, lease, epoch });
        assert!(may_read_as_owner(t0, None, 0), "no lease followed");
        assert!(may_read_as_owner(t0 + Duration::from_secs(2), view(Some(t0), 4), 4));
        assert!(!may_read_as_owner(t0 + lease, view(Some(t0), 4), 4), "a lease old");
        assert!(!may_read_as_owner(t0, view(None, 4), 4), "lost or not registered");
        assert!(!may_read_as_owner(t0, view(Some(t0), 5), 4), "the coordinator reported a newer placement");
        // The route: read as owner, held; routed again to the owner the
        // placement gives now, once.
        let mut r = Route::new(t0, None, DEADLINE, REROUTE);
        assert!(!r.may_recheck(), "only once it says ReadRemote");
        assert_eq!(r.poll(t0), Step::ReadRemote);
        assert!(r.may_recheck());
        r.recheck_as_owner(Some(owner(3)), Some(owner(2)));
        assert_eq!(r.poll(t0), ask(owner(3), DEADLINE), "another node owns it now; no handoff then");
        r.handle_failed(AskFailure::Alive("stalled".into()));
        assert_eq!(r.poll(t0), Step::ReadRemote);
        assert!(!r.may_recheck(), "once per route");
        r.recheck_as_owner(None, None);
        assert_eq!(r.poll(t0), Step::ReadRemote);
        // Still this node's, handed over from node 2: asked for its copy.
        let mut r = Route::new(t0, None, DEADLINE, REROUTE);
        r.poll(t0);
        r.recheck_as_owner(None, Some(owner(2)));
        assert_eq!(r.poll(t0), Step::AskHeld { former: owner(2), within: DEADLINE });
    }

    #[test]
    fn a_load_that_got_its_permit_reads_unless_its_shard_moved_or_its_lease_is_in_doubt() {
        let (me, other) = (NodeId(1), NodeId(2));
        let d = |forward, routed, placed, lease_ok, recheck, local| {
            after_permit(me, forward, routed, placed, lease_ok, recheck, local)
        };
        // Nothing changed: read.
        assert_eq!(d(true, true, Some(me), true, true, false), AfterPermit::Read);
        // The shard moved while queued: a forwarding load asks the owner;
        // a peer's load refuses, unless this node's own request joined it.
        assert_eq!(d(true, true, Some(other), true, true, false), AfterPermit::RouteAgain { wait_for_lease: false });
        assert_eq!(d(false, true, Some(other), true, true, false), AfterPermit::NotOwner(other));
        assert_eq!(d(false, true, Some(other), true, true, true), AfterPermit::Read);
        // Routed after an owner failed (not as the owner): read as decided.
        assert_eq!(d(true, false, Some(other), true, true, false), AfterPermit::Read);
        // Still this node's but the lease is in doubt: wait, then route.
        assert_eq!(d(true, true, Some(me), false, true, false), AfterPermit::RouteAgain { wait_for_lease: true });
        assert_eq!(d(false, true, Some(me), false, true, false), AfterPermit::RouteAgain { wait_for_lease: true });
        // Once per route: read the second time.
        assert_eq!(d(true, true, Some(me), false, false, false), AfterPermit::Read);
        assert_eq!(d(true, true, Some(other), true, false, false), AfterPermit::Read);
        // No placement known: read.
        assert_eq!(d(true, true, None, false, true, false), AfterPermit::Read);
    }

    #[test]
    fn no_other_owner_reads_remote_at_once() {
        let t0 = Instant::now();
        let mut r = Route::new(t0, None, DEADLINE, REROUTE);
        assert_eq!(r.poll(t0), Step::ReadRemote);
        assert_eq!(r.poll(t0 + DEADLINE), Step::ReadRemote, "final");
        assert!(r.tried().is_empty());
    }

    #[test]
    fn a_stalled_owner_is_not_waited_for() {
        let t0 = Instant::now();
        let mut r = Route::new(t0, Some(owner(2)), DEADLINE, REROUTE);
        assert_eq!(r.poll(t0), ask(owner(2), DEADLINE));
        r.handle_failed(AskFailure::Alive("stalled for 5s".into()));
        // Alive owners keep their lease: the placement will not move the
        // shard, so the route reads at once instead of waiting for it.
        assert_eq!(r.poll(t0 + Duration::from_secs(5)), Step::ReadRemote);
        assert_eq!(strings(r.take_tried()), ["node-2: stalled for 5s"]);
    }

    #[test]
    fn a_dead_owner_waits_for_the_placement_then_asks_the_new_owner() {
        let t0 = Instant::now();
        let mut r = Route::new(t0, Some(owner(2)), DEADLINE, REROUTE);
        assert_eq!(r.poll(t0), ask(owner(2), DEADLINE));
        let t1 = t0 + Duration::from_secs(3);
        r.handle_failed(AskFailure::Unavailable("connection refused".into()));
        assert_eq!(r.poll(t1), Step::AwaitPlacement { failed: NodeId(2), addr: owner(2).addr, within: REROUTE });
        r.handle_moved(Some(owner(3)));
        let t2 = t1 + Duration::from_secs(7);
        assert_eq!(r.poll(t2), ask(owner(3), DEADLINE - Duration::from_secs(10)));
        assert_eq!(r.tried().len(), 1);
    }

    #[test]
    fn an_owner_that_answers_again_while_awaited_is_asked_again() {
        let t0 = Instant::now();
        let mut r = Route::new(t0, Some(owner(2)), DEADLINE, REROUTE);
        assert_eq!(r.poll(t0), ask(owner(2), DEADLINE));
        r.handle_failed(AskFailure::Unavailable("the peer went quiet".into()));
        let t1 = t0 + Duration::from_secs(5);
        assert!(matches!(r.poll(t1), Step::AwaitPlacement { .. }));
        // Its link heals: the owner is asked again, not waited for.
        r.handle_owner_back();
        let t2 = t1 + Duration::from_secs(2);
        assert_eq!(r.poll(t2), ask(owner(2), DEADLINE - Duration::from_secs(7)));
        // Still bounded: after the third ask, an owner that fails again is
        // not waited for.
        r.handle_failed(AskFailure::Unavailable("quiet again".into()));
        r.poll(t2);
        r.handle_owner_back();
        assert!(matches!(r.poll(t2), Step::Ask { .. }));
        r.handle_failed(AskFailure::Unavailable("and again".into()));
        assert_eq!(r.poll(t2), Step::ReadRemote);
        // Reported out of turn, it changes nothing.
        r.handle_owner_back();
        assert_eq!(r.poll(t2), Step::ReadRemote);
    }

    #[test]
    fn the_wait_for_the_placement_is_bounded_by_the_deadline() {
        let t0 = Instant::now();
        let mut r = Route::new(t0, Some(owner(2)), Duration::from_secs(4), REROUTE);
        r.poll(t0);
        r.handle_failed(AskFailure::Unavailable("reset".into()));
        assert_eq!(
            r.poll(t0 + Duration::from_secs(1)),
            Step::AwaitPlacement { failed: NodeId(2), addr: owner(2).addr, within: Duration::from_secs(3) }
        );
        r.handle_not_moved();
        assert_eq!(r.poll(t0 + Duration::from_secs(4)), Step::ReadRemote);
    }

    #[test]
    fn a_placement_that_does_not_move_in_time_means_reading_remote() {
        let t0 = Instant::now();
        let mut r = Route::new(t0, Some(owner(2)), DEADLINE, REROUTE);
        r.poll(t0);
        r.handle_failed(AskFailure::Unavailable("timed out".into()));
        assert!(matches!(r.poll(t0), Step::AwaitPlacement { .. }));
        r.handle_not_moved();
        assert_eq!(r.poll(t0 + REROUTE), Step::ReadRemote);
    }

    #[test]
    fn a_shard_moved_to_this_node_is_read_here() {
        let t0 = Instant::now();
        let mut r = Route::new(t0, Some(owner(2)), DEADLINE, REROUTE);
        r.poll(t0);
        r.handle_failed(AskFailure::Unavailable("gone".into()));
        r.poll(t0);
        r.handle_moved(None);
        assert_eq!(r.poll(t0 + Duration::from_secs(1)), Step::ReadRemote);
    }

    #[test]
    fn at_most_three_owners_are_asked_and_the_last_failure_is_not_waited_on() {
        let t0 = Instant::now();
        let mut r = Route::new(t0, Some(owner(2)), DEADLINE, REROUTE);
        let mut now = t0;
        for next in 3..=4 {
            assert!(matches!(r.poll(now), Step::Ask { .. }));
            r.handle_failed(AskFailure::Unavailable("reset".into()));
            assert!(matches!(r.poll(now), Step::AwaitPlacement { .. }));
            now += Duration::from_secs(1);
            r.handle_moved(Some(owner(next)));
        }
        assert_eq!(r.poll(now), ask(owner(4), DEADLINE - Duration::from_secs(2)));
        r.handle_failed(AskFailure::Unavailable("reset".into()));
        assert_eq!(r.poll(now), Step::ReadRemote, "no fourth owner, so no wait for one");
        assert_eq!(r.tried().len(), 3);
    }

    #[test]
    fn an_owner_is_not_asked_once_the_deadline_has_passed() {
        let t0 = Instant::now();
        let mut r = Route::new(t0, Some(owner(2)), Duration::from_secs(2), REROUTE);
        r.poll(t0);
        r.handle_failed(AskFailure::Unavailable("reset".into()));
        r.poll(t0);
        r.handle_moved(Some(owner(3)));
        assert_eq!(r.poll(t0 + Duration::from_secs(2)), Step::ReadRemote);
        assert_eq!(
            r.tried()[1].to_string(),
            format!("node-3 at {}: not asked, the fetch deadline passed", owner(3).addr)
        );
    }

    #[test]
    fn outcomes_reported_out_of_turn_are_ignored() {
        let t0 = Instant::now();
        let mut r = Route::new(t0, Some(owner(2)), DEADLINE, REROUTE);
        r.handle_moved(Some(owner(5)));
        r.handle_not_moved();
        assert_eq!(r.poll(t0), ask(owner(2), DEADLINE));
        r.handle_moved(Some(owner(5)));
        assert_eq!(r.poll(t0), ask(owner(2), DEADLINE), "still asking owner 2");
    }

    #[test]
    fn a_shell_that_never_reports_an_outcome_is_still_bounded() {
        let t0 = Instant::now();
        let mut r = Route::new(t0, Some(owner(2)), DEADLINE, REROUTE);
        let steps: Vec<Step> = (0..5).map(|_| r.poll(t0)).collect();
        assert_eq!(steps[..3], [ask(owner(2), DEADLINE), ask(owner(2), DEADLINE), ask(owner(2), DEADLINE)]);
        assert_eq!(steps[3..], [Step::ReadRemote, Step::ReadRemote]);
    }

    #[test]
    fn footer_requests_never_wait_on_a_node_that_is_believed_to_read_it() {
        assert_eq!(answer_footer(true, Some(NodeId(2))), FooterAnswer::Held);
        // The footer cycle: A believes B reads file f's footer, B believes
        // A does. Each answers the other at once instead of joining its own
        // fetch of the footer from the other.
        assert_eq!(answer_footer(false, Some(NodeId(2))), FooterAnswer::NotOwner(NodeId(2)));
        assert_eq!(answer_footer(false, None), FooterAnswer::ReadHere);
    }
}
