//! A simulated node daemon: the node's own decision cores
//! ([`granary_node::decide`]: the fetch route, single-flight admission, the
//! stall clock and the liveness probe) driven by simulated messages and
//! timers, with the same wiring as the node's async shells (`service.rs`,
//! `fabric/read.rs`, `membership.rs`), and a trainer that asks for its
//! shards of every epoch a few at a time.
//!
//! What is modelled and what is not: a chunk is its checksum (a corrupted
//! transfer fails validation, as `ChunkView::parse` does); the RAM tier
//! holds every chunk (no eviction); a remote read is one delay; footers are
//! not fetched.

use super::check::Record;
pub use super::params::{
    CONNECT_TIMEOUT, DOWN_FOR, FETCH_DEADLINE, HANDOFF_WAIT, LEASE, REROUTE_WAIT, addr_of, checksum,
};
use super::world::{Addr, Event, IDLE_TIMEOUT, KEEP_ALIVE, Micros, Msg, Timer, World, ms};
use granary_node::decide::{
    Admission, Asked, Asker, InFlight, LeaseView, Liveness, Owner, Route, StallClock, Step, TimerFired, Verdict, admit,
    may_read_as_owner, reads_here_after_placement, start_for_peer,
};
use granary_node::fabric::{Corruption, LinkFault, PeerError, Stall};
use granary_proto::peer::{PEER_PROGRESS_INTERVAL, PEER_STALL_TIMEOUT};
use granary_proto::wire::ErrorKind;
use granary_proto::{ChunkError, NodeId, ShardId};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

fn node_of(idx: usize) -> NodeId {
    NodeId(idx as u64 + 1)
}

/// The shard id of shard index `i` (four row groups a file, as the
/// coordinator's manifest has them).
pub fn shard_id(i: u32) -> ShardId {
    ShardId { file: i / 4, row_group: i % 4 }
}

fn index_of(addr: SocketAddr) -> usize {
    match addr.ip() {
        std::net::IpAddr::V4(v4) => v4.octets()[3] as usize - 1,
        std::net::IpAddr::V6(_) => usize::MAX,
    }
}

/// Whether the process runs, is stopped, or is dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    /// Running.
    Up,
    /// SIGSTOPped: its events wait until it continues.
    Stopped,
    /// Killed: its events are lost.
    Down,
}

/// Who waits on a load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiter {
    /// The trainer's request number.
    Trainer(u64),
    /// A peer's stream.
    Peer(usize, u64),
}

/// A load of one shard in flight.
#[derive(Debug)]
struct Load {
    id: u64,
    shard: u32,
    route: Route,
    started: Micros,
    /// The owner asked now: (peer, stream, the placement epoch that named
    /// it).
    asking: Option<(usize, u64, u64)>,
    /// Owners asked.
    asks: usize,
    waiters: Vec<Waiter>,
    remote: bool,
    /// Whether it may ask the owner (a trainer's load; a peer's is never
    /// forwarded).
    forwards: bool,
    /// Whether it waits for its node's lease in doubt before reading as
    /// the shard's owner.
    doubting: bool,
    /// Whether a failure of the route came with a fault the run knows of.
    failures: Vec<String>,
}

/// An ask on a stream to an owner.
#[derive(Debug)]
struct Ask {
    load: u64,
    peer: usize,
    clock: StallClock,
    probe: Option<Liveness>,
}

/// One simulated node.
pub struct Node {
    /// Its index (node id is index + 1).
    pub idx: usize,
    /// Running, stopped or dead.
    pub run: Run,
    /// Bumped at every restart; events of a former life are dropped.
    pub life: u64,
    /// When the process was last stopped.
    pub stopped_at: Micros,
    incarnation: Option<u64>,
    /// When the last accepted heartbeat or registration was sent (None:
    /// not registered, or the lease was lost), and the placement epoch the
    /// coordinator reported with it.
    renewed_at: Option<Micros>,
    coord_epoch: u64,
    token: u64,
    placement_epoch: u64,
    owners: Vec<Option<usize>>,
    /// Per shard this node owns: the live node it was handed over from
    /// (the placement's `handed_from`).
    former: Vec<Option<usize>>,
    /// Per shard: the live node the placement moved it from, whoever owns
    /// it now (`Cluster::former_owner`).
    moved_from: Vec<Option<usize>>,
    /// Asks for a held copy: stream -> (load id, when the node asked last
    /// said it is still working on it).
    held_asks: BTreeMap<u64, (u64, Option<Micros>)>,
    /// Chunks held: shard -> guest (not owned when fetched).
    held: BTreeMap<u32, bool>,
    loads: BTreeMap<u32, Load>,
    asks: BTreeMap<u64, Ask>,
    serving: BTreeSet<(usize, u64)>,
    /// Dials out: id -> (load id, owners asked, peer, sent at).
    dials: BTreeMap<u64, (u64, usize, usize, Micros)>,
    heard: Vec<u64>,
    last_heard: Vec<Micros>,
    conn_life: Vec<u64>,
    next_load: u64,
    /// The trainer: requests per epoch, the next to issue, those in flight.
    plan: Vec<Vec<u32>>,
    epoch: usize,
    next_req: usize,
    in_flight: BTreeMap<u64, u32>,
    trainer_started: bool,
    /// The trainer computes on what it was handed until then.
    busy_until: Micros,
}

impl Node {
    /// Node `idx` of `nodes`, whose trainer reads `plan` (shards per epoch).
    pub fn new(idx: usize, nodes: usize, plan: Vec<Vec<u32>>) -> Self {
        Self {
            idx,
            run: Run::Up,
            life: 1,
            stopped_at: 0,
            incarnation: None,
            renewed_at: None,
            coord_epoch: 0,
            token: 0,
            placement_epoch: 0,
            owners: Vec::new(),
            former: Vec::new(),
            moved_from: Vec::new(),
            held_asks: BTreeMap::new(),
            held: BTreeMap::new(),
            loads: BTreeMap::new(),
            asks: BTreeMap::new(),
            serving: BTreeSet::new(),
            dials: BTreeMap::new(),
            heard: vec![0; nodes],
            last_heard: vec![0; nodes],
            conn_life: vec![0; nodes],
            next_load: 0,
            plan,
            epoch: 0,
            next_req: 0,
            in_flight: BTreeMap::new(),
            trainer_started: false,
            busy_until: 0,
        }
    }

    /// Whether the trainer read every epoch.
    pub fn finished(&self) -> bool {
        self.epoch >= self.plan.len()
    }

    /// Starts (or restarts) the process: timers, registration.
    pub fn boot(&mut self, w: &mut World) {
        self.token = self.life * 1_000 + self.idx as u64 + 1;
        w.timer(self.idx, self.life, 0, Timer::Heartbeat);
        w.timer(self.idx, self.life, KEEP_ALIVE, Timer::Ping);
    }

    /// SIGKILL: everything in memory is gone; the trainer's position (what
    /// it was delivered) survives, as a job's checkpoint does.
    pub fn crash(&mut self) {
        let plan = std::mem::take(&mut self.plan);
        let (epoch, life, nodes) = (self.epoch, self.life, self.heard.len());
        // Requests in flight are asked again after the restart.
        let mut fresh = Node::new(self.idx, nodes, plan);
        fresh.epoch = epoch;
        fresh.next_req = 0;
        fresh.life = life + 1;
        fresh.run = Run::Down;
        fresh.busy_until = self.busy_until;
        *self = fresh;
    }

    fn send(&self, w: &mut World, to: Addr, msg: Msg) {
        let to_life = match to {
            Addr::Node(p) => self.conn_life[p],
            Addr::Coord => 0,
        };
        w.send(Addr::Node(self.idx), self.life, to, to_life, msg);
    }

    /// A message arrived (the node is up).
    pub fn deliver(&mut self, w: &mut World, rec: &mut Record, from: Addr, from_life: u64, to_life: u64, msg: Msg) {
        if let Addr::Node(p) = from {
            self.heard[p] += 1;
            self.last_heard[p] = w.now;
            if from_life > self.conn_life[p] {
                let restarted = self.conn_life[p] != 0;
                self.conn_life[p] = from_life;
                if restarted {
                    // The peer's new life answers the old connection with a
                    // stateless reset: every stream on it fails at once.
                    let on_it: Vec<u64> = self.asks.iter().filter(|(_, a)| a.peer == p).map(|(&s, _)| s).collect();
                    for stream in on_it {
                        let addr = addr_of(p);
                        let error = quinn::ReadError::ConnectionLost(quinn::ConnectionError::Reset);
                        let fault = LinkFault::Read { what: "chunk bytes", error };
                        self.fail_ask(w, rec, stream, |shard| PeerError::Transfer { addr, shard, fault });
                    }
                }
            }
            if to_life != 0 && to_life != self.life {
                // A stream of the connection to this node's former life.
                if let Msg::Ask { stream, .. } = msg {
                    self.send(w, from, Msg::Reset { stream });
                }
                return;
            }
        }
        match msg {
            Msg::Registered { token, incarnation, epoch, sent } if token == self.token => {
                w.log(format_args!("n{} registered as incarnation {incarnation}", self.idx));
                self.incarnation = Some(incarnation);
                self.renewed(epoch, sent);
                self.settle_doubts(w, rec);
            }
            Msg::Renewed { incarnation, epoch, sent } => {
                if self.incarnation == Some(incarnation) {
                    self.renewed(epoch, sent);
                    self.settle_doubts(w, rec);
                }
            }
            Msg::Registered { .. } => {}
            Msg::Expired => {
                if self.incarnation.take().is_some() {
                    // At once, as `membership.rs`'s lease loop does.
                    w.log(format_args!("n{} lost its lease; registers again", self.idx));
                    self.renewed_at = None;
                    self.token += 1;
                    self.send(w, Addr::Coord, Msg::Register { token: self.token, sent: w.now });
                }
            }
            Msg::Placement { epoch, owners, handed_from } => self.placement(w, rec, epoch, owners, handed_from),
            Msg::Ping => {}
            Msg::Dial { id } => self.send(w, from, Msg::DialOk { id }),
            Msg::DialOk { id } => {
                // A handshake answered within the connect timeout: the
                // owner a load waits on is back (`PeerLink::reachable_again`).
                if let Some((load_id, asks, _, sent)) = self.dials.remove(&id)
                    && w.now - sent <= CONNECT_TIMEOUT
                    && let Some(shard) = self.load_by_id(load_id)
                    && let Some(load) = self.loads.get_mut(&shard)
                    && load.asks == asks
                    && let Some(failed) = load.route.awaiting()
                {
                    // As the node's shell: back, but the placement may have
                    // moved the shard meanwhile.
                    match self.owners.get(shard as usize).copied().flatten() {
                        Some(o) if node_of(o) != failed => {
                            let owner = self.owner_of(shard);
                            if let Some(load) = self.loads.get_mut(&shard) {
                                load.route.handle_moved(owner);
                            }
                        }
                        _ => {
                            w.log(format_args!(
                                "n{} hears its failed owner of s{shard} again; asks it again",
                                self.idx
                            ));
                            load.route.handle_owner_back();
                        }
                    }
                    self.drive(w, rec, shard);
                }
            }
            Msg::Ask { stream, shard, epoch } => {
                if let Addr::Node(p) = from {
                    self.asked(w, rec, p, stream, shard, epoch);
                }
            }
            Msg::AskHeld { stream, shard } => {
                // From what is held, or a load already reading remote
                // storage (it waits on nothing else); never a new load, and
                // never a load that asks a peer, so no wait cycle forms.
                let Addr::Node(p) = from else { return };
                if self.held.contains_key(&shard) {
                    self.hand(w, rec, shard, Waiter::Peer(p, stream), checksum(shard));
                } else if let Some(load) = self.loads.get_mut(&shard).filter(|l| l.remote) {
                    load.waiters.push(Waiter::Peer(p, stream));
                    self.serve_progress(w, Waiter::Peer(p, stream));
                } else {
                    self.send(w, from, Msg::NotHeld { stream });
                }
            }
            Msg::NotHeld { stream } => self.held_missing(w, rec, stream, "it does not hold it"),
            Msg::Working { stream } => {
                if let Some(ask) = self.held_asks.get_mut(&stream) {
                    ask.1 = Some(w.now);
                }
                let now = w.instant_now();
                if let Some(a) = self.asks.get_mut(&stream) {
                    a.clock.handle_progress(now);
                }
            }
            Msg::Chunk { stream, sum } => self.answered(w, rec, stream, Some(sum), false),
            Msg::Refused { stream } => self.answered(w, rec, stream, None, true),
            Msg::Reset { stream } => self.answered(w, rec, stream, None, false),
            Msg::Register { .. } | Msg::Heartbeat { .. } => {}
        }
    }

    fn placement(
        &mut self,
        w: &mut World,
        rec: &mut Record,
        epoch: u64,
        owners: Vec<Option<usize>>,
        handed_from: Vec<Option<usize>>,
    ) {
        if epoch < self.placement_epoch {
            return;
        }
        if epoch > self.placement_epoch || self.owners.is_empty() {
            w.log(format_args!("n{} placement epoch {epoch}: {owners:?}", self.idx));
        }
        self.placement_epoch = epoch;
        // As `Cluster::handed_from` keeps them: shards this node owns,
        // handed over from another node.
        self.moved_from = handed_from.clone();
        self.former = handed_from
            .iter()
            .zip(&owners)
            .map(|(from, owner)| from.filter(|&f| *owner == Some(self.idx) && f != self.idx))
            .collect();
        self.owners = owners;
        // Loads waiting for a failed owner's shard to move.
        let waiting: Vec<u32> = self.loads.keys().copied().collect();
        for shard in waiting {
            if !self.moved_from(shard) {
                continue;
            }
            let owner = self.owner_of(shard);
            if let Some(load) = self.loads.get_mut(&shard) {
                load.route.handle_moved(owner);
                self.drive(w, rec, shard);
            }
        }
        // Loads a peer waits on that ask a former owner of a shard this
        // node owns now: they read it here (see `granary_node`'s single
        // flight).
        let loads: Vec<u32> = self.loads.keys().copied().collect();
        for shard in loads {
            let owned_at = (self.owners.get(shard as usize).copied().flatten() == Some(self.idx)).then_some(epoch);
            let Some(load) = self.loads.get_mut(&shard) else { continue };
            let asking = load.asking.map(|(p, _, e)| Asked { addr: addr_of(p), epoch: e });
            let peer_waits = load.waiters.iter().any(|w| matches!(w, Waiter::Peer(..)));
            if reads_here_after_placement(asking, owned_at, peer_waits) {
                w.log(format_args!("n{} leaves its ask for s{shard}: it owns it at epoch {epoch}", self.idx));
                load.asking = None;
                load.route.handle_owned_here();
                self.drive(w, rec, shard);
            }
        }
        self.settle_doubts(w, rec);
        // The trainer starts once the placement covers every node (as a
        // deployment waits for the cluster to form), or after 5 s.
        let owners: BTreeSet<usize> = self.owners.iter().flatten().copied().collect();
        if !self.trainer_started && (owners.len() >= self.heard.len().min(self.owners.len()) || w.now > ms(5_000)) {
            self.trainer_started = true;
            w.timer(self.idx, self.life, 0, Timer::Trainer);
        }
    }

    /// Whether the placement moved `shard` away from the owner its load
    /// waits on, as `Cluster::reroute` decides: the shard has an owner in
    /// the placement and it is another node (a shard with no owner has not
    /// moved).
    fn moved_from(&self, shard: u32) -> bool {
        let Some(failed) = self.loads.get(&shard).and_then(|l| l.route.awaiting()) else { return false };
        self.owners.get(shard as usize).copied().flatten().is_some_and(|o| node_of(o) != failed)
    }

    /// The node this node's shard was handed over from (`Cluster::handed_from`).
    fn former_of(&self, shard: u32) -> Option<Owner> {
        let f = self.former.get(shard as usize).copied().flatten()?;
        Some(Owner { node: node_of(f), addr: addr_of(f), epoch: self.placement_epoch })
    }

    fn owner_of(&self, shard: u32) -> Option<Owner> {
        match self.owners.get(shard as usize).copied().flatten() {
            Some(o) if o != self.idx => {
                Some(Owner { node: NodeId(o as u64 + 1), addr: addr_of(o), epoch: self.placement_epoch })
            }
            _ => None,
        }
    }

    /// A timer fired (the node is up).
    pub fn timer(&mut self, w: &mut World, rec: &mut Record, timer: Timer) {
        match timer {
            Timer::Ping => {
                for p in 0..self.heard.len() {
                    if p != self.idx {
                        self.send(w, Addr::Node(p), Msg::Ping);
                    }
                }
                w.timer(self.idx, self.life, KEEP_ALIVE, Timer::Ping);
            }
            Timer::Heartbeat => {
                let msg = match self.incarnation {
                    Some(incarnation) => Msg::Heartbeat { incarnation, epoch: self.placement_epoch, sent: w.now },
                    None => Msg::Register { token: self.token, sent: w.now },
                };
                self.send(w, Addr::Coord, msg);
                w.timer(self.idx, self.life, LEASE / 3, Timer::Heartbeat);
            }
            Timer::Trainer => self.trainer(w, rec),
            Timer::Stall(stream) => self.stall_timer(w, rec, stream),
            Timer::Probe(stream) => self.probe(w, rec, stream),
            Timer::Idle(stream) => {
                let Some(peer) = self.asks.get(&stream).map(|a| a.peer) else { return };
                let deadline = self.last_heard[peer] + IDLE_TIMEOUT;
                if w.now >= deadline {
                    let addr = addr_of(peer);
                    let error = quinn::ReadError::ConnectionLost(quinn::ConnectionError::TimedOut);
                    let fault = LinkFault::Read { what: "chunk bytes", error };
                    self.fail_ask(w, rec, stream, |shard| PeerError::Transfer { addr, shard, fault });
                } else {
                    w.timer(self.idx, self.life, deadline - w.now, timer);
                }
            }
            Timer::LeaseWait(id) => {
                if let Some(shard) = self.load_by_id(id)
                    && self.loads.get(&shard).is_some_and(|l| l.doubting)
                {
                    w.log(format_args!("n{} routes s{shard} again: its lease wait ran out", self.idx));
                    self.recheck(w, rec, shard);
                }
            }
            Timer::HeldDeadline(stream) => {
                // Once the node asked says it is reading the shard, its
                // progress frames keep the ask alive (the stall clock).
                let stall = PEER_STALL_TIMEOUT.as_micros() as Micros;
                match self.held_asks.get(&stream).and_then(|a| a.1) {
                    Some(at) if w.now < at + stall => w.timer(self.idx, self.life, at + stall - w.now, timer),
                    Some(_) => self.held_missing(w, rec, stream, "it stalled"),
                    None => self.held_missing(w, rec, stream, "no answer within the handoff wait"),
                }
            }
            Timer::AskDeadline(stream) => {
                if let Some(peer) = self.asks.get(&stream).map(|a| a.peer) {
                    let deadline = FETCH_DEADLINE;
                    self.fail_ask(w, rec, stream, |shard| PeerError::Timeout { addr: addr_of(peer), shard, deadline });
                }
            }
            Timer::Await(id, asks) => {
                if let Some(shard) = self.load_by_id(id)
                    && let Some(load) = self.loads.get_mut(&shard)
                    && load.asks == asks
                    && load.route.awaiting().is_some()
                {
                    load.route.handle_not_moved();
                    load.failures.push("the placement did not move the shard in time".into());
                    self.drive(w, rec, shard);
                }
            }
            Timer::Progress(peer, stream) => {
                if self.serving.contains(&(peer, stream)) {
                    self.send(w, Addr::Node(peer), Msg::Working { stream });
                    w.timer(self.idx, self.life, PEER_PROGRESS_INTERVAL.as_micros() as Micros, timer);
                }
            }
            Timer::Redial(id, asks) => {
                if let Some(shard) = self.load_by_id(id)
                    && let Some(load) = self.loads.get(&shard)
                    && load.asks == asks
                    && let Some(failed) = load.route.awaiting()
                {
                    let peer = failed.0 as usize - 1;
                    let dial = rec.new_stream();
                    self.dials.insert(dial, (id, asks, peer, w.now));
                    self.send(w, Addr::Node(peer), Msg::Dial { id: dial });
                    // A dial that fails takes the connect timeout, then the
                    // peer is left alone for `down_for`.
                    w.timer(self.idx, self.life, CONNECT_TIMEOUT + DOWN_FOR, Timer::Redial(id, asks));
                }
            }
            Timer::RemoteDone(id) => {
                if let Some(shard) = self.load_by_id(id) {
                    w.log(format_args!("n{} read s{shard} from remote storage", self.idx));
                    self.finish(w, rec, shard, checksum(shard));
                }
            }
        }
    }

    fn load_by_id(&self, id: u64) -> Option<u32> {
        self.loads.values().find(|l| l.id == id).map(|l| l.shard)
    }

    /// The trainer issues requests up to its window, epoch by epoch.
    fn trainer(&mut self, w: &mut World, rec: &mut Record) {
        if w.now < self.busy_until {
            let after = self.busy_until - w.now;
            w.timer(self.idx, self.life, after, Timer::Trainer);
            return;
        }
        while !self.finished() && self.in_flight.len() < w.swarm.window && w.now >= self.busy_until {
            let epoch = &self.plan[self.epoch];
            if self.next_req >= epoch.len() {
                if self.in_flight.is_empty() {
                    w.log(format_args!("n{} trainer finished epoch {}", self.idx, self.epoch));
                    rec.epoch_done(self.idx, self.epoch, w.now);
                    self.epoch += 1;
                    self.next_req = 0;
                    continue;
                }
                break;
            }
            let shard = epoch[self.next_req];
            let req = rec.request_id(self.idx, self.epoch, self.next_req);
            self.next_req += 1;
            if rec.was_delivered(req) {
                continue;
            }
            self.in_flight.insert(req, shard);
            rec.issued_for(self.idx, shard, req, w.now);
            self.request(w, rec, shard, Waiter::Trainer(req), 0);
        }
    }

    /// A request for `shard` from the trainer or a peer (which placement
    /// epoch `epoch` told this node owns it).
    fn request(&mut self, w: &mut World, rec: &mut Record, shard: u32, waiter: Waiter, epoch: u64) {
        if self.held.contains_key(&shard) {
            self.hand(w, rec, shard, waiter, checksum(shard));
            return;
        }
        let asker = match waiter {
            Waiter::Trainer(_) => Asker::Trainer,
            Waiter::Peer(p, _) => Asker::Peer { addr: addr_of(p), epoch },
        };
        let owned_here = self.owners.get(shard as usize).copied().flatten() == Some(self.idx);
        let pending = self
            .loads
            .get(&shard)
            .map(|l| InFlight { asking: l.asking.map(|(p, _, epoch)| Asked { addr: addr_of(p), epoch }), owned_here });
        match admit(pending, asker, || false, true) {
            admission @ (Admission::Join { .. } | Admission::JoinAndConvert) => {
                if let Some(l) = self.loads.get_mut(&shard) {
                    l.waiters.push(waiter);
                }
                if let Waiter::Peer(p, _) = waiter {
                    rec.joined(self.idx, p, shard);
                }
                self.serve_progress(w, waiter);
                if admission == Admission::JoinAndConvert
                    && let Some(l) = self.loads.get_mut(&shard)
                {
                    w.log(format_args!(
                        "n{} leaves its ask for s{shard} (epoch {}): n{} asks it on epoch {epoch} (this node knows epoch {})",
                        self.idx,
                        l.asking.map_or(0, |a| a.2),
                        match waiter {
                            Waiter::Peer(p, _) => p,
                            Waiter::Trainer(_) => self.idx,
                        },
                        self.placement_epoch
                    ));
                    l.asking = None;
                    l.route.handle_owned_here();
                    self.drive(w, rec, shard);
                }
            }
            Admission::Refuse => {
                if let Waiter::Peer(p, stream) = waiter {
                    rec.refused(self.idx, p, shard, w.now);
                    let (q, e) =
                        pending.and_then(|l| l.asking).map_or((usize::MAX, 0), |a| (index_of(a.addr), a.epoch));
                    w.log(format_args!(
                        "n{} refuses s{shard} to n{p} (epoch {epoch}): its load asks n{q} (epoch {e})",
                        self.idx
                    ));
                    self.send(w, Addr::Node(p), Msg::Refused { stream });
                }
            }
            Admission::LookAgain | Admission::Start => {
                // A peer's request starts a read here only where this node's
                // placement lets it serve as the owner (the node's rule).
                if let Waiter::Peer(p, stream) = waiter
                    && let Err(owner) = start_for_peer(
                        self.idx,
                        self.owners.get(shard as usize).copied().flatten(),
                        self.moved_from.get(shard as usize).copied().flatten(),
                        self.placement_epoch,
                        epoch,
                    )
                {
                    rec.refused(self.idx, p, shard, w.now);
                    w.log(format_args!(
                        "n{} refuses s{shard} to n{p} (epoch {epoch}): its placement (epoch {}) names n{owner}",
                        self.idx, self.placement_epoch
                    ));
                    self.send(w, Addr::Node(p), Msg::Refused { stream });
                    return;
                }
                let owner = if asker.forwards() { self.owner_of(shard) } else { None };
                // A held copy is asked for whoever waits: the answer never
                // waits on anything, so no cycle can form through it.
                let former = if owner.is_none() { self.former_of(shard) } else { None };
                w.log(format_args!(
                    "n{} loads s{shard} for {waiter:?}, first from {:?}{}",
                    self.idx,
                    owner.map(|o| index_of(o.addr)),
                    former.map(|f| format!(", handed over from n{}", index_of(f.addr))).unwrap_or_default()
                ));
                self.next_load += 1;
                let route = Route::new(w.instant_now(), owner, FETCH_DEADLINE, REROUTE_WAIT).with_handoff(former);
                let load = Load {
                    id: self.next_load,
                    shard,
                    route,
                    started: w.now,
                    asking: None,
                    asks: 0,
                    waiters: vec![waiter],
                    remote: false,
                    forwards: asker.forwards(),
                    doubting: false,
                    failures: Vec::new(),
                };
                self.loads.insert(shard, load);
                self.serve_progress(w, waiter);
                self.drive(w, rec, shard);
            }
        }
    }

    fn serve_progress(&mut self, w: &mut World, waiter: Waiter) {
        if let Waiter::Peer(p, stream) = waiter
            && self.serving.insert((p, stream))
        {
            w.timer(self.idx, self.life, PEER_PROGRESS_INTERVAL.as_micros() as Micros, Timer::Progress(p, stream));
        }
    }

    /// Executes the route's next step for the load of `shard`.
    fn drive(&mut self, w: &mut World, rec: &mut Record, shard: u32) {
        let now = w.instant_now();
        let lease = self.lease_view(w);
        let Some(load) = self.loads.get_mut(&shard) else { return };
        match load.route.poll(now) {
            Step::Ask { owner, within } => {
                let peer = index_of(owner.addr);
                load.asks += 1;
                rec.asked(self.idx, shard, load.asks, w.now, load.started);
                let stream = rec.new_stream();
                load.asking = Some((peer, stream, owner.epoch));
                let clock = StallClock::new(now, PEER_STALL_TIMEOUT);
                let stall_at = w.micros(clock.deadline()) - w.now;
                self.asks.insert(stream, Ask { load: load.id, peer, clock, probe: None });
                w.log(format_args!("n{} asks n{peer} for s{shard} (stream {stream})", self.idx));
                self.send(w, Addr::Node(peer), Msg::Ask { stream, shard, epoch: owner.epoch });
                w.timer(self.idx, self.life, stall_at, Timer::Stall(stream));
                // The connection closes once it has heard nothing for the
                // idle timeout, and the stream with it.
                let idle_at = (self.last_heard[peer] + IDLE_TIMEOUT).max(w.now) - w.now;
                w.timer(self.idx, self.life, idle_at, Timer::Idle(stream));
                w.timer(self.idx, self.life, within.as_micros() as Micros, Timer::AskDeadline(stream));
            }
            Step::AskHeld { former, within } => {
                let peer = index_of(former.addr);
                let stream = rec.new_stream();
                self.held_asks.insert(stream, (load.id, None));
                w.log(format_args!("n{} asks n{peer} for a held copy of s{shard} (stream {stream})", self.idx));
                self.send(w, Addr::Node(peer), Msg::AskHeld { stream, shard });
                let wait = HANDOFF_WAIT.min(within.as_micros() as Micros);
                w.timer(self.idx, self.life, wait, Timer::HeldDeadline(stream));
            }
            Step::AwaitPlacement { failed, within, .. } => {
                w.log(format_args!("n{} waits up to {within:?} for s{shard} to move from {failed}", self.idx));
                let (id, asks) = (load.id, load.asks);
                // The placement may have moved already.
                if self.moved_from(shard) {
                    let owner = self.owner_of(shard);
                    if let Some(load) = self.loads.get_mut(&shard) {
                        load.route.handle_moved(owner);
                    }
                    return self.drive(w, rec, shard);
                }
                w.timer(self.idx, self.life, within.as_micros() as Micros, Timer::Await(id, asks));
                w.timer(self.idx, self.life, DOWN_FOR, Timer::Redial(id, asks));
            }
            Step::ReadRemote => {
                if load.remote || load.doubting {
                    return;
                }
                let mine = self.owners.get(shard as usize).copied().flatten() == Some(self.idx);
                if mine && load.route.may_recheck() && !may_read_as_owner(now, lease, self.placement_epoch) {
                    // As the node's shell: a read as owner waits for a
                    // lease in doubt, then routes again once.
                    load.doubting = true;
                    let id = load.id;
                    w.log(format_args!("n{} holds its read of s{shard} as owner: its lease is in doubt", self.idx));
                    w.timer(self.idx, self.life, REROUTE_WAIT.as_micros() as Micros, Timer::LeaseWait(id));
                    return;
                }
                load.remote = true;
                let id = load.id;
                let failures = load.failures.clone();
                rec.remote_read(self.idx, shard, w.now, failures);
                let (lo, hi) = w.swarm.remote_ms;
                let mut took = w.between(ms(lo), ms(hi));
                if w.odds(w.swarm.slow_remote_per_mille) {
                    took *= 10;
                }
                w.log(format_args!("n{} reads s{shard} from remote storage ({} ms)", self.idx, took / 1000));
                w.timer(self.idx, self.life, took, Timer::RemoteDone(id));
            }
        }
    }

    /// What this node knows of its lease, as membership keeps it.
    fn lease_view(&self, w: &World) -> Option<LeaseView> {
        Some(LeaseView {
            renewed_at: self.renewed_at.map(|t| w.instant(t)),
            lease: Duration::from_micros(LEASE),
            epoch: self.coord_epoch,
        })
    }

    fn renewed(&mut self, epoch: u64, sent: Micros) {
        self.renewed_at = self.renewed_at.max(Some(sent));
        self.coord_epoch = self.coord_epoch.max(epoch);
    }

    /// Loads holding a read as owner for a lease in doubt route again once
    /// the lease is renewed and the placement that came with it is known.
    fn settle_doubts(&mut self, w: &mut World, rec: &mut Record) {
        if !may_read_as_owner(w.instant_now(), self.lease_view(w), self.placement_epoch) {
            return;
        }
        let doubting: Vec<u32> = self.loads.values().filter(|l| l.doubting).map(|l| l.shard).collect();
        for shard in doubting {
            w.log(format_args!("n{} routes s{shard} again: its lease is renewed", self.idx));
            self.recheck(w, rec, shard);
        }
    }

    /// Routes a load that held its read as owner again, from the placement
    /// known now.
    fn recheck(&mut self, w: &mut World, rec: &mut Record, shard: u32) {
        let owner = self.owner_of(shard);
        let former = self.former_of(shard);
        let Some(load) = self.loads.get_mut(&shard) else { return };
        load.doubting = false;
        let owner = if load.forwards { owner } else { None };
        load.route.recheck_as_owner(owner, former);
        self.drive(w, rec, shard);
    }

    /// A peer asks for `shard` on `stream`.
    fn asked(&mut self, w: &mut World, rec: &mut Record, peer: usize, stream: u64, shard: u32, epoch: u64) {
        self.request(w, rec, shard, Waiter::Peer(peer, stream), epoch);
    }

    /// An owner answered `stream`: a chunk with checksum `sum`, or a
    /// refusal (`refused`) or reset (`None`).
    fn answered(&mut self, w: &mut World, rec: &mut Record, stream: u64, sum: Option<u64>, refused: bool) {
        if let Some(&(load, _)) = self.held_asks.get(&stream) {
            let Some(shard) = self.load_by_id(load) else {
                self.held_asks.remove(&stream);
                return;
            };
            match sum {
                Some(sum) if sum == checksum(shard) => {
                    self.held_asks.remove(&stream);
                    w.log(format_args!("n{} got its s{shard} from the node it was handed over from", self.idx));
                    self.finish(w, rec, shard, sum);
                }
                Some(_) => {
                    rec.corrupt_caught();
                    self.held_missing(w, rec, stream, "its copy failed validation");
                }
                None => self.held_missing(w, rec, stream, "the stream was reset"),
            }
            return;
        }
        let Some((load, peer)) = self.asks.get(&stream).map(|a| (a.load, a.peer)) else { return };
        let Some(shard) = self.load_by_id(load) else {
            self.asks.remove(&stream);
            return;
        };
        match sum {
            Some(sum) if sum == checksum(shard) => {
                self.asks.remove(&stream);
                w.log(format_args!("n{} got s{shard} from n{peer}", self.idx));
                self.finish(w, rec, shard, sum);
            }
            Some(actual) => {
                rec.corrupt_caught();
                let addr = addr_of(peer);
                let corruption = Corruption::Invalid(ChunkError::PayloadChecksum { expected: checksum(shard), actual });
                self.fail_ask(w, rec, stream, |shard| PeerError::Corrupt { addr, shard, corruption });
            }
            None if refused => {
                let (addr, kind) = (addr_of(peer), ErrorKind::Unavailable);
                let message = "a load of the peer asks this node for the shard".to_string();
                self.fail_ask(w, rec, stream, |shard| PeerError::Refused { addr, shard, kind, message });
            }
            None => {
                let addr = addr_of(peer);
                let error = quinn::ReadError::ConnectionLost(quinn::ConnectionError::Reset);
                let fault = LinkFault::Read { what: "response header", error };
                self.fail_ask(w, rec, stream, |shard| PeerError::Transfer { addr, shard, fault });
            }
        }
    }

    /// The ask for a held copy on `stream` gave none (`reason`): the load
    /// reads remote storage.
    fn held_missing(&mut self, w: &mut World, rec: &mut Record, stream: u64, reason: &str) {
        let Some((load, _)) = self.held_asks.remove(&stream) else { return };
        let Some(shard) = self.load_by_id(load) else { return };
        w.log(format_args!("n{} gets no held copy of s{shard}: {reason}", self.idx));
        if let Some(l) = self.loads.get_mut(&shard) {
            l.route.handle_held(reason);
        }
        self.drive(w, rec, shard);
    }

    /// The ask on `stream` failed with the peer error `error` makes for its
    /// shard; the route takes it as the node's link does
    /// ([`PeerError::as_ask_failure`]).
    fn fail_ask(&mut self, w: &mut World, rec: &mut Record, stream: u64, error: impl FnOnce(ShardId) -> PeerError) {
        let Some(ask) = self.asks.remove(&stream) else { return };
        let Some(shard) = self.load_by_id(ask.load) else { return };
        let failure = error(shard_id(shard)).as_ask_failure();
        let Some(load) = self.loads.get_mut(&shard) else { return };
        if load.asking.map(|(_, s, _)| s) != Some(stream) {
            return;
        }
        w.log(format_args!("n{} ask of n{} for s{shard} failed: {failure:?}", self.idx, ask.peer));
        load.asking = None;
        load.failures.push(format!("n{}: {failure:?}", ask.peer));
        load.route.handle_failed(failure);
        self.drive(w, rec, shard);
    }

    fn stall_timer(&mut self, w: &mut World, rec: &mut Record, stream: u64) {
        let now = w.instant_now();
        let Some(ask) = self.asks.get_mut(&stream) else { return };
        if ask.probe.is_some() {
            return;
        }
        match ask.clock.handle_timer(now) {
            TimerFired::Rearm(at) => {
                let after = w.micros(at) - w.now;
                w.timer(self.idx, self.life, after, Timer::Stall(stream));
            }
            TimerFired::Stalled => {
                ask.probe = Some(Liveness::new(now, self.heard[ask.peer], Duration::from_micros(KEEP_ALIVE)));
                self.probe(w, rec, stream);
            }
        }
    }

    fn probe(&mut self, w: &mut World, rec: &mut Record, stream: u64) {
        let now = w.instant_now();
        let Some(ask) = self.asks.get(&stream) else { return };
        let Some(probe) = ask.probe else { return };
        let closed = w.now.saturating_sub(self.last_heard[ask.peer]) > IDLE_TIMEOUT;
        let (addr, idle) = (addr_of(ask.peer), PEER_STALL_TIMEOUT);
        let stall = Stall { idle, what: "chunk bytes", got: 0, len: 1 };
        match probe.sample(now, self.heard[ask.peer], closed) {
            Verdict::Answers => self.fail_ask(w, rec, stream, |shard| PeerError::Stalled { addr, shard, stall }),
            Verdict::Silent => {
                let fault = LinkFault::Gone(stall);
                self.fail_ask(w, rec, stream, |shard| PeerError::Transfer { addr, shard, fault })
            }
            Verdict::SampleIn(after) => w.timer(self.idx, self.life, after.as_micros() as Micros, Timer::Probe(stream)),
        }
    }

    /// The load of `shard` produced its chunk.
    fn finish(&mut self, w: &mut World, rec: &mut Record, shard: u32, sum: u64) {
        let Some(load) = self.loads.remove(&shard) else { return };
        let owned = self.owners.get(shard as usize).copied().flatten() == Some(self.idx);
        self.held.insert(shard, !owned);
        rec.held(self.idx, shard);
        for waiter in load.waiters {
            self.hand(w, rec, shard, waiter, sum);
        }
    }

    fn hand(&mut self, w: &mut World, rec: &mut Record, shard: u32, waiter: Waiter, sum: u64) {
        match waiter {
            Waiter::Trainer(req) => {
                // Every hand counts, before the trainer's own bookkeeping:
                // a request handed twice is a violation, not a no-op.
                rec.delivered(self.idx, req, shard, sum, w.now);
                if self.in_flight.remove(&req).is_some() {
                    let step = ms(w.swarm.step_ms);
                    self.busy_until = self.busy_until.max(w.now) + step;
                    let after = self.busy_until - w.now;
                    w.timer(self.idx, self.life, after, Timer::Trainer);
                }
            }
            Waiter::Peer(p, stream) => {
                self.serving.remove(&(p, stream));
                let sum = if w.odds(w.swarm.corrupt_per_mille) { sum ^ 1 } else { sum };
                self.send(w, Addr::Node(p), Msg::Chunk { stream, sum });
            }
        }
    }

    /// Shards held or being loaded here.
    pub fn shards_here(&self) -> impl Iterator<Item = u32> + '_ {
        self.held.keys().chain(self.loads.keys()).copied()
    }

    /// The peer this node's load of `shard` asks now, and on which stream.
    pub fn asking_for(&self, shard: u32) -> Option<(usize, u64)> {
        self.loads.get(&shard).and_then(|l| l.asking).map(|(p, stream, _)| (p, stream))
    }

    /// Whether this node's load of `shard` holds `peer`'s request on
    /// `stream` (it joined it, so `peer` waits on this load).
    pub fn serves(&self, shard: u32, peer: usize, stream: u64) -> bool {
        self.loads.get(&shard).is_some_and(|l| l.waiters.contains(&Waiter::Peer(peer, stream)))
    }

    /// Whether an event for this node should wait (stopped), be dropped
    /// (dead, or of a former life), or be handled.
    pub fn accepts(&self, event: &Event) -> Option<bool> {
        match self.run {
            Run::Down => Some(false),
            Run::Stopped => None,
            Run::Up => Some(match event {
                Event::Timer { life, .. } => *life == self.life,
                _ => true,
            }),
        }
    }
}
