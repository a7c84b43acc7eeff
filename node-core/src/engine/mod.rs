//! The node engine: every load in flight on one node, as one sans-IO state
//! machine that the node's async shell and the chaos simulation both drive.
//!
//! The decisions were pure cores before it ([`crate::flight`]'s single
//! flight, [`crate::route`]'s route, the post-permit rule), but
//! what composed them lived twice: in the node's async shell (its pending
//! map, the asking state in atomics, the placement wait and the permit
//! race written inline) and in the simulation, which re-wired the cores by
//! hand and had drifted from the shell (no permit queue, its own lease
//! rule, hard-coded fabric times). The engine is that composition, once:
//!
//! - [`Engine::request`]: a request that found no chunk in the tiers is
//!   joined to a load, refused, or starts one (single flight, and whether
//!   a peer's request may start a read here at all).
//! - [`Engine::poll`]: what a load does next, as a [`Command`]: wait for
//!   the version's placement, ask a peer, ask for a held copy, wait for the
//!   placement to move a failed owner's shard, take a load permit (raced
//!   against the shard moving away), wait for a lease in doubt, read, or
//!   answer a peer that another node owns the shard now.
//! - `handle_*`: what came of the command, reported back: an ask's
//!   outcome, the wait's end, the permit.
//! - [`Engine::placement_changed`]: loads that stop asking on a new
//!   placement (they read the shard here; the shell interrupts the ask).
//!
//! Time comes in as `now`; what the node knows of placement and its lease
//! comes in as a [`Placement`] view, read when a decision needs it. The
//! shell keeps only I/O: sockets, the semaphore's permits, the watch
//! channels waiters hold (a load's shell state `W`, kept beside its
//! engine state so one map holds both).
//!
//! Loads are kept in a `BTreeMap`: the simulation iterates them, and its
//! replay of a seed must not depend on a hash seed.

use crate::flight::{Admission, Asked, Asker, InFlight, admit, reads_here_after_placement, start_for_peer};
use crate::route::{AfterPermit, AskFailure, Owner, Route, Step, Tried, after_permit};
use granary_proto::NodeId;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

#[cfg(test)]
mod tests;

/// What the node knows of placement and of its own lease, read by the
/// engine when a decision needs it (the node's cluster handle, or the
/// simulated node's copy of the coordinator's placement).
pub trait Placement<K> {
    /// This node.
    fn me(&self) -> NodeId;
    /// Whether a load of `key` may be routed through other nodes at all:
    /// the node is in a cluster and a peer's chunk of it can be checked.
    /// False: the load reads here at once.
    fn routes(&self, key: K) -> bool;
    /// Whether any placement of `key`'s version is known.
    fn version_known(&self, key: K) -> bool;
    /// The owner the placement gives `key`, whichever node (this one
    /// included); None when not placed.
    fn placed_owner(&self, key: K) -> Option<NodeId>;
    /// The owner to ask: another live, unquarantined node, with the epoch
    /// that named it.
    fn owner(&self, key: K) -> Option<Owner>;
    /// For a shard this node owns that a placement handed over from
    /// another live node: that node.
    fn handed_from(&self, key: K) -> Option<Owner>;
    /// The node the placement moved `key` from, whichever (this one
    /// included, live or not).
    fn former_owner(&self, key: K) -> Option<NodeId>;
    /// The placement epoch the owners of `key`'s version were read at.
    fn owner_epoch(&self, key: K) -> u64;
    /// Whether this node may read a shard as its owner now: its lease is
    /// not in doubt ([`crate::route::may_read_as_owner`]).
    fn lease_ok(&self, now: Instant) -> bool;
}

/// The times that bound a load's route (the node takes them from its
/// fabric's configuration, `FabricConfig::timing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// All asks of one load finish within it.
    pub fetch_deadline: Duration,
    /// How long a load waits for the placement to move a failed owner's
    /// shard, or for a lease in doubt.
    pub reroute_wait: Duration,
    /// How long a load of a node that knows no placement of the version
    /// yet waits for one (at most `reroute_wait`).
    pub placement_wait: Duration,
}

/// How long a load on a cluster node waits for the placement of its
/// version when the node knows none yet (it has just joined), at most the
/// reroute wait. Without it a node back from a kill read shards its peers
/// held (find 13, soak seed 4064: 17 shards, its restarted ranks' and
/// prefetch's first requests).
pub const PLACEMENT_WAIT: Duration = Duration::from_secs(2);

/// What the shell does next for a load.
// Not `#[non_exhaustive]`: a driver must execute every command, so a new
// one should stop every driver from compiling until it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Wait up to `within` for a placement of the version, then report
    /// [`Engine::handle_version_waited`].
    AwaitVersion {
        /// How long at most.
        within: Duration,
    },
    /// Ask `owner` for the chunk within `within`, then report
    /// [`Engine::handle_asked`] (or [`Engine::handle_ask_left`] when the
    /// engine said to leave the ask).
    Ask {
        /// The owner to ask.
        owner: Owner,
        /// What is left of the fetch deadline.
        within: Duration,
    },
    /// Ask `former` for a copy it holds within `within`; a chunk ends the
    /// load, a miss is reported with [`Engine::handle_held`].
    AskHeld {
        /// The node the shard was handed over from.
        former: Owner,
        /// What is left of the fetch deadline.
        within: Duration,
    },
    /// Wait up to `within` for the placement to move the shard away from
    /// `failed`, or for `addr` to answer a handshake again; report
    /// [`Engine::handle_await`].
    AwaitMove {
        /// The owner that failed.
        failed: NodeId,
        /// Where it serves peers.
        addr: SocketAddr,
        /// How long at most.
        within: Duration,
    },
    /// Take a load permit, then report [`Engine::handle_permit`]. With
    /// `unless_moved`, stop waiting for it (and report
    /// [`Permit::Moved`]) if the placement moves the shard away from
    /// this node within that time.
    AcquirePermit {
        /// Race the permit against the shard moving away from this node.
        unless_moved: Option<Duration>,
    },
    /// This node's lease is in doubt: wait up to `within` for it to be
    /// renewed, then report [`Engine::handle_lease_settled`].
    AwaitLease {
        /// How long at most.
        within: Duration,
    },
    /// Read the shard from remote storage and convert it here, with the
    /// permit held.
    Read,
    /// A peer's load whose shard the placement gave to `owner` while it
    /// waited for its permit: answer its waiters to ask that node.
    NotOwner(NodeId),
}

/// What a request that found no chunk in the tiers became.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// It waits on the load in flight.
    Joined,
    /// It waits on the load in flight, which stopped asking a peer to read
    /// the shard here: the shell interrupts the ask.
    JoinedAndLeftAsk,
    /// Refused: the load in flight asks the very peer that asks (a wait
    /// cycle); `asking` is the peer the load asks.
    Refused {
        /// What the load in flight asks.
        asking: Option<Asked>,
    },
    /// Refused: a peer asked this node for a shard its placement gives to
    /// `owner` (see [`start_for_peer`]).
    NotOwner(NodeId),
    /// A load finished between the lookup and the decision: look again.
    LookAgain,
    /// A load started; drive it with [`Engine::poll`].
    Started,
}

/// How the wait of [`Command::AwaitMove`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AwaitOutcome {
    /// The placement moved the shard: to `owner`, or (None) to this node
    /// or no node known.
    Moved(Option<Owner>),
    /// It did not move in time.
    NotMoved,
    /// The failed owner answered a handshake again.
    OwnerBack,
}

/// What [`Engine::handle_await`] made of an owner that answers again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Back {
    /// Not an owner back (the wait ended otherwise).
    NotBack,
    /// Back, and still the owner: it is asked again.
    AskAgain,
    /// Back, but the placement moved the shard meanwhile: the new owner
    /// is asked.
    Moved,
}

/// How [`Command::AcquirePermit`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// The permit is held.
    Granted,
    /// The placement moved the shard away from this node first.
    Moved,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Routing (or about to): the next poll asks the route.
    Route,
    /// Waiting for a placement of the version.
    AwaitingVersion,
    /// Asking an owner.
    Asking,
    /// Asking for a held copy.
    AskingHeld,
    /// Waiting for a failed owner's shard to move.
    Awaiting,
    /// Waiting for a load permit.
    Permit {
        /// Racing the shard moving away.
        unless_moved: Option<Duration>,
    },
    /// Waiting for a lease in doubt.
    LeaseWait,
    /// Reading, permit held.
    Reading,
    /// Answered that another node owns the shard.
    NotOwner(NodeId),
}

/// One load in flight.
#[derive(Debug)]
struct Load<W, C> {
    shell: W,
    /// May ask other nodes (a trainer's or prefetch's load, not a peer's).
    forward: bool,
    /// Something other than prefetch for a later epoch waits on it.
    wanted_now: bool,
    /// The peer asked right now, and the epoch that named it.
    asking: Option<Asked>,
    /// A peer's request waits on it.
    peer_waits: bool,
    /// A request of this node's own waits on it.
    local_waits: bool,
    /// The load reads here without routing (see [`Placement::routes`]).
    direct: bool,
    /// Waited for the version's placement once already.
    version_waited: bool,
    /// The placement named this node the owner when the route said read.
    routed_as_owner: bool,
    route: Option<Route<C>>,
    phase: Phase,
}

/// Every load in flight on one node (see the module doc). `K` names a
/// shard of a version; `W` is the shell's state of a load (its waiters);
/// `C` the cause a peer gave no chunk for (the node's `PeerError`), kept
/// typed to the error a failed load reports.
#[derive(Debug)]
pub struct Engine<K, W, C> {
    timing: Timing,
    loads: BTreeMap<K, Load<W, C>>,
}

impl<K: Ord + Copy, W, C> Engine<K, W, C> {
    /// No loads, routes bounded by `timing`.
    pub fn new(timing: Timing) -> Self {
        Self { timing, loads: BTreeMap::new() }
    }

    /// Replaces the timing (a node learns its fabric's when it joins a
    /// cluster); loads already routed keep their deadlines.
    pub fn set_timing(&mut self, timing: Timing) {
        self.timing = timing;
    }

    /// A request of `asker` for `key` that found no chunk in the tiers.
    /// `finished` says whether a load finished since the tiers were looked
    /// up (asked only when it matters); `may_look_again` is false on the
    /// shell's last bounded attempt. On [`Admitted::Started`] the load's
    /// shell state is `shell()`.
    pub fn request(
        &mut self,
        key: K,
        asker: Asker,
        may_look_again: bool,
        finished: impl FnOnce() -> bool,
        view: &impl Placement<K>,
        shell: impl FnOnce() -> W,
    ) -> Admitted {
        let pending = self.loads.get(&key).map(|l| InFlight {
            asking: l.asking,
            owned_here: l.asking.is_some() && view.placed_owner(key) == Some(view.me()),
        });
        match (admit(pending, asker, finished, may_look_again), self.loads.get_mut(&key)) {
            (Admission::Refuse, _) => Admitted::Refused { asking: pending.and_then(|p| p.asking) },
            (Admission::Join { promote }, Some(load)) => {
                if asker.forwards() {
                    load.local_waits = true;
                } else {
                    load.peer_waits = true;
                }
                // A load started for a later epoch is needed now: its
                // guest copy becomes a regular one.
                load.wanted_now |= promote;
                Admitted::Joined
            }
            (Admission::JoinAndConvert, Some(load)) => {
                load.wanted_now = true;
                load.peer_waits = true;
                if load.leave_ask() { Admitted::JoinedAndLeftAsk } else { Admitted::Joined }
            }
            (Admission::LookAgain, _) => Admitted::LookAgain,
            (Admission::Start | Admission::Join { .. } | Admission::JoinAndConvert, _) => {
                // A peer's request starts a read here only where the
                // placement lets this node serve as the owner (a node that
                // knows no placement of the shard cannot judge: served).
                if let Asker::Peer { epoch, .. } = asker
                    && let Err(owner) = start_for_peer(
                        view.me(),
                        view.placed_owner(key),
                        view.former_owner(key),
                        view.owner_epoch(key),
                        epoch,
                    )
                {
                    return Admitted::NotOwner(owner);
                }
                let forward = asker.forwards();
                self.loads.insert(
                    key,
                    Load {
                        shell: shell(),
                        forward,
                        wanted_now: asker.wants_now(),
                        asking: None,
                        peer_waits: !forward,
                        local_waits: forward,
                        direct: !view.routes(key),
                        version_waited: false,
                        routed_as_owner: false,
                        route: None,
                        phase: Phase::Route,
                    },
                );
                Admitted::Started
            }
        }
    }

    /// What the load of `key` does next (None: no such load). Polling
    /// again without reporting returns the same command, except that an
    /// unreported ask counts as another ask (the route bounds it).
    pub fn poll(&mut self, key: K, now: Instant, view: &impl Placement<K>) -> Option<Command> {
        let timing = self.timing;
        let load = self.loads.get_mut(&key)?;
        Some(match load.phase {
            Phase::Reading => Command::Read,
            Phase::NotOwner(owner) => Command::NotOwner(owner),
            Phase::Permit { unless_moved } => Command::AcquirePermit { unless_moved },
            Phase::LeaseWait => Command::AwaitLease { within: timing.reroute_wait },
            Phase::AwaitingVersion => Command::AwaitVersion { within: timing.placement_wait },
            Phase::Route | Phase::Asking | Phase::AskingHeld | Phase::Awaiting => load.route(key, now, timing, view),
        })
    }

    /// The wait of [`Command::AwaitVersion`] ended (a placement of the
    /// version arrived, or the wait ran out: the load is routed on what is
    /// known either way).
    pub fn handle_version_waited(&mut self, key: K) {
        if let Some(load) = self.loads.get_mut(&key)
            && load.phase == Phase::AwaitingVersion
        {
            load.phase = Phase::Route;
        }
    }

    /// The ask of [`Command::Ask`] ended: `Ok` when a chunk came (the load
    /// is then finished by the shell), or how it failed.
    pub fn handle_asked(&mut self, key: K, outcome: Result<(), AskFailure<C>>) {
        let Some(load) = self.loads.get_mut(&key) else { return };
        load.asking = None;
        if let (Err(failure), Some(route)) = (outcome, load.route.as_mut()) {
            route.handle_failed(failure);
        }
        if load.phase == Phase::Asking {
            load.phase = Phase::Route;
        }
    }

    /// The shell left an ask because the engine said so
    /// ([`Admitted::JoinedAndLeftAsk`], [`Engine::placement_changed`]).
    pub fn handle_ask_left(&mut self, key: K) {
        if let Some(load) = self.loads.get_mut(&key) {
            load.asking = None;
            if load.phase == Phase::Asking {
                load.phase = Phase::Route;
            }
        }
    }

    /// The ask of [`Command::AskHeld`] gave no copy, for the cause `reason`.
    pub fn handle_held(&mut self, key: K, reason: C) {
        if let Some(load) = self.loads.get_mut(&key) {
            if let Some(route) = load.route.as_mut() {
                route.handle_held(reason);
            }
            if load.phase == Phase::AskingHeld {
                load.phase = Phase::Route;
            }
        }
    }

    /// The wait of [`Command::AwaitMove`] ended. An owner that answers
    /// again is asked again only if the placement still gives it the shard
    /// (its lease may have run out while it was away): else the owner the
    /// placement gives now is asked.
    pub fn handle_await(&mut self, key: K, outcome: AwaitOutcome, view: &impl Placement<K>) -> Back {
        let Some(load) = self.loads.get_mut(&key) else { return Back::NotBack };
        let Some(route) = load.route.as_mut() else { return Back::NotBack };
        let Some(failed) = route.awaiting() else { return Back::NotBack };
        let back = match outcome {
            AwaitOutcome::Moved(owner) => {
                route.handle_moved(owner);
                Back::NotBack
            }
            AwaitOutcome::NotMoved => {
                route.handle_not_moved();
                Back::NotBack
            }
            AwaitOutcome::OwnerBack => match view.placed_owner(key) {
                Some(owner) if owner != failed => {
                    route.handle_moved(view.owner(key));
                    Back::Moved
                }
                _ => {
                    route.handle_owner_back();
                    Back::AskAgain
                }
            },
        };
        load.phase = Phase::Route;
        back
    }

    /// The permit of [`Command::AcquirePermit`]: held, or the shard moved
    /// away first. Decides, once per route, whether the load reads, routes
    /// again (the shard moved to another node while it queued, or it
    /// would read as the owner while its lease is in doubt), or answers a
    /// peer that another node owns the shard now. The next
    /// [`Engine::poll`] says which: [`Command::Read`] keeps the permit;
    /// anything else gives it back.
    pub fn handle_permit(&mut self, key: K, permit: Permit, now: Instant, view: &impl Placement<K>) -> AfterPermit {
        let Some(load) = self.loads.get_mut(&key) else { return AfterPermit::Read };
        if !matches!(load.phase, Phase::Permit { .. }) {
            return AfterPermit::Read;
        }
        let may_recheck = load.route.as_ref().is_some_and(Route::may_recheck);
        let after = match permit {
            Permit::Moved => AfterPermit::RouteAgain { wait_for_lease: false },
            Permit::Granted if load.direct => AfterPermit::Read,
            Permit::Granted => after_permit(
                view.me(),
                load.forward,
                load.routed_as_owner,
                view.placed_owner(key),
                view.lease_ok(now),
                may_recheck,
                load.local_waits,
            ),
        };
        match after {
            AfterPermit::Read => load.phase = Phase::Reading,
            AfterPermit::NotOwner(owner) => load.phase = Phase::NotOwner(owner),
            AfterPermit::RouteAgain { wait_for_lease: true } => load.phase = Phase::LeaseWait,
            AfterPermit::RouteAgain { wait_for_lease: false } => load.recheck(key, view),
        }
        after
    }

    /// The wait of [`Command::AwaitLease`] ended (the lease was renewed, or
    /// the wait ran out): the load routes again from the placement known
    /// now.
    pub fn handle_lease_settled(&mut self, key: K, view: &impl Placement<K>) {
        if let Some(load) = self.loads.get_mut(&key)
            && load.phase == Phase::LeaseWait
        {
            load.recheck(key, view);
        }
    }

    /// A new placement arrived: loads a peer waits on that ask a former
    /// owner of a shard the placement now gives this node stop asking and
    /// read it here ([`reads_here_after_placement`]). Returns their keys:
    /// the shell interrupts their asks.
    pub fn placement_changed(&mut self, view: &impl Placement<K>) -> Vec<K> {
        let me = view.me();
        let mut left = Vec::new();
        for (&key, load) in &mut self.loads {
            let owned_at = (view.placed_owner(key) == Some(me)).then(|| view.owner_epoch(key));
            if reads_here_after_placement(load.asking, owned_at, load.peer_waits) && load.leave_ask() {
                left.push(key);
            }
        }
        left
    }

    /// The loads waiting for something a placement or a lease renewal
    /// may end, by what they wait for (the simulation ends these waits
    /// from its events; the node's shell from futures on its cluster).
    pub fn waiting(&self) -> impl Iterator<Item = (K, Waiting)> + '_ {
        self.loads.iter().filter_map(|(&key, load)| Some((key, load.waiting()?)))
    }

    /// What the load of `key` waits for, if it waits on a placement, a
    /// permit or a lease ([`Engine::waiting`]).
    pub fn waiting_for(&self, key: K) -> Option<Waiting> {
        self.loads.get(&key).and_then(Load::waiting)
    }

    /// The shell state of the load of `key`.
    pub fn shell(&self, key: K) -> Option<&W> {
        self.loads.get(&key).map(|l| &l.shell)
    }

    /// The shell state of the load of `key`, to change.
    pub fn shell_mut(&mut self, key: K) -> Option<&mut W> {
        self.loads.get_mut(&key).map(|l| &mut l.shell)
    }

    /// The shell state of the load of `key` if it holds its permit and
    /// reads (a handoff may wait on such a load: it asks nobody).
    pub fn reading(&self, key: K) -> Option<&W> {
        self.loads.get(&key).filter(|l| l.phase == Phase::Reading).map(|l| &l.shell)
    }

    /// Whether something other than prefetch for a later epoch waits on
    /// the load of `key` (false: its guest copy is kept at low priority).
    pub fn wanted_now(&self, key: K) -> bool {
        self.loads.get(&key).is_some_and(|l| l.wanted_now)
    }

    /// Every node the load of `key` turned to that gave no chunk, and why.
    pub fn tried(&self, key: K) -> &[Tried<C>] {
        self.loads.get(&key).and_then(|l| l.route.as_ref()).map_or(&[], |r| r.tried())
    }

    /// Takes them (for the error of a read that failed after them).
    pub fn take_tried(&mut self, key: K) -> Vec<Tried<C>> {
        self.loads.get_mut(&key).and_then(|l| l.route.as_mut()).map(Route::take_tried).unwrap_or_default()
    }

    /// The peer the load of `key` asks now.
    pub fn asking(&self, key: K) -> Option<Asked> {
        self.loads.get(&key).and_then(|l| l.asking)
    }

    /// Ends the load of `key` (it published its chunk or error), giving
    /// back its shell state.
    pub fn finish(&mut self, key: K) -> Option<W> {
        self.loads.remove(&key).map(|l| l.shell)
    }

    /// Loads in flight.
    pub fn len(&self) -> usize {
        self.loads.len()
    }

    /// Whether no load is in flight.
    pub fn is_empty(&self) -> bool {
        self.loads.is_empty()
    }

    /// The keys of every load in flight, in order.
    pub fn keys(&self) -> impl Iterator<Item = K> + '_ {
        self.loads.keys().copied()
    }
}

/// What a load waits for ([`Engine::waiting`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// A placement of its version.
    Version,
    /// The placement moving the shard away from this failed owner.
    Move(NodeId),
    /// A load permit.
    Permit,
    /// A load permit, or the shard moving away from this node.
    PermitUnlessMoved,
    /// Its lease in doubt to be renewed.
    Lease,
}

/// Whether a placement that gives the shard to `placed` moved it away
/// from `from`: it has an owner, and another one (a shard with no owner
/// has not moved). The node's wait for a move and the simulation's use it.
pub fn moved_away(placed: Option<NodeId>, from: NodeId) -> bool {
    placed.is_some_and(|owner| owner != from)
}

impl<W, C> Load<W, C> {
    fn waiting(&self) -> Option<Waiting> {
        Some(match self.phase {
            Phase::AwaitingVersion => Waiting::Version,
            Phase::Awaiting => Waiting::Move(self.route.as_ref()?.awaiting()?),
            Phase::Permit { unless_moved: Some(_) } => Waiting::PermitUnlessMoved,
            Phase::Permit { unless_moved: None } => Waiting::Permit,
            Phase::LeaseWait => Waiting::Lease,
            _ => return None,
        })
    }

    /// Stops asking a peer (a newer placement names this node the owner):
    /// the route reads here. Whether an ask was left.
    fn leave_ask(&mut self) -> bool {
        if self.asking.take().is_none() {
            return false;
        }
        if let Some(route) = self.route.as_mut() {
            route.handle_owned_here();
        }
        true
    }

    /// The route's next step, as a command (creating the route first).
    fn route<K: Copy>(&mut self, key: K, now: Instant, timing: Timing, view: &impl Placement<K>) -> Command {
        if self.route.is_none() && !self.direct && self.forward && !self.version_waited && !view.version_known(key) {
            self.version_waited = true;
            self.phase = Phase::AwaitingVersion;
            return Command::AwaitVersion { within: timing.placement_wait };
        }
        let (direct, forward) = (self.direct, self.forward);
        let route = self.route.get_or_insert_with(|| {
            let new = |owner| Route::new(now, owner, timing.fetch_deadline, timing.reroute_wait);
            if direct {
                return new(None);
            }
            // A peer's request is never forwarded to the owner; but a
            // handoff is asked for whoever waits (its answer never waits
            // on a load that asks a peer, so no cycle forms through it).
            new(if forward { view.owner(key) } else { None }).with_handoff(view.handed_from(key))
        });
        match route.poll(now) {
            Step::Ask { owner, within } => {
                self.asking = Some(Asked { addr: owner.addr, epoch: owner.epoch });
                self.phase = Phase::Asking;
                Command::Ask { owner, within }
            }
            Step::AskHeld { former, within } => {
                self.phase = Phase::AskingHeld;
                Command::AskHeld { former, within }
            }
            Step::AwaitPlacement { failed, addr, within } => {
                self.phase = Phase::Awaiting;
                Command::AwaitMove { failed, addr, within }
            }
            Step::ReadRemote => {
                // A load permit first: a load queued behind others, or
                // across a stop, checks what it knows when it may read. A
                // load that reads as the shard's owner (and may ask others)
                // stops waiting if the placement gives the shard to another
                // node meanwhile.
                self.routed_as_owner = !self.direct && view.placed_owner(key) == Some(view.me());
                let race = self.forward && self.routed_as_owner && route.may_recheck();
                let unless_moved = race.then_some(timing.fetch_deadline);
                self.phase = Phase::Permit { unless_moved };
                Command::AcquirePermit { unless_moved }
            }
        }
    }

    /// Routes again after the permit (once per route), from the owner the
    /// placement gives now and the node it was handed over from.
    fn recheck<K: Copy>(&mut self, key: K, view: &impl Placement<K>) {
        let owner = if self.forward { view.owner(key) } else { None };
        if let Some(route) = self.route.as_mut() {
            route.recheck_as_owner(owner, view.handed_from(key));
        }
        self.phase = Phase::Route;
    }
}
