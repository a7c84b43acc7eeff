//! A simulated node daemon: the node's own engine
//! ([`granary_node::decide::Engine`]: single flight, each load's route,
//! the placement wait, the permit queue and the post-permit rule, the
//! lease wait) driven by simulated messages and timers, with the stall
//! clock and the liveness probe of its peer asks, and a trainer that asks
//! for its shards of every epoch a few at a time. The engine is the one
//! the node runs; this file and its children only execute its commands,
//! as the node's `service` does over sockets, with the fabric's default
//! settings (`params.rs`).
//!
//! Children, one concern each: `load` (the trainer, requests, and the
//! engine's commands executed: permits, timers, remote reads, handing
//! chunks out) and `ask` (a peer's answers and failures, the stall clock
//! and the probe).
//!
//! What is modelled and what is not: a chunk is its checksum (a corrupted
//! transfer fails validation, as `ChunkView::parse` does); the RAM tier
//! holds every chunk (no eviction); a remote read is one delay; footers are
//! not fetched; peers are never quarantined (chunks are not verified).

mod ask;
mod load;

use super::check::Record;
use super::params::{LEASE, connect_timeout, down_for, load_permits, micros};
pub use super::params::{addr_of, checksum};
use super::world::{Addr, Event, KEEP_ALIVE, Micros, Msg, Timer, World, ms};
use granary_node::decide::{
    AwaitOutcome, Back, Engine, LeaseView, Owner, Placement, StallClock, Waiting, may_read_as_owner, moved_away,
};
use granary_node::fabric::{LinkFault, PeerError};
use granary_proto::peer::PEER_PROGRESS_INTERVAL;
use granary_proto::{NodeId, ShardId};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

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

/// The simulation's part of a load in flight (the engine keeps the rest).
#[derive(Debug)]
struct SimLoad {
    id: u64,
    started: Micros,
    /// The peer asked now, and the stream.
    ask: Option<(usize, u64)>,
    /// Owners asked.
    asks: usize,
    waiters: Vec<Waiter>,
    /// What the route met, for the checks' attribution of a remote read.
    failures: Vec<String>,
    /// Holds one of the node's load permits.
    permit: bool,
    /// Queued for a permit; until then, the shard moving away from this
    /// node ends the wait.
    queued: Option<Micros>,
    /// The remote read started.
    reading: bool,
    /// Timers armed for the engine's waits.
    lease_timer: bool,
    version_timer: bool,
}

/// What a simulated node knows of placement: the coordinator's last
/// placement it received.
#[derive(Debug, Default)]
struct Known {
    idx: usize,
    epoch: u64,
    owners: Vec<Option<usize>>,
    /// Per shard: the live node the placement moved it from, whoever owns
    /// it now.
    moved_from: Vec<Option<usize>>,
}

impl Known {
    fn placed(&self, shard: u32) -> Option<NodeId> {
        self.owners.get(shard as usize).copied().flatten().map(node_of)
    }

    fn at(&self, idx: usize) -> Owner {
        Owner { node: node_of(idx), addr: addr_of(idx), epoch: self.epoch }
    }
}

/// [`Known`] and the lease, as the engine reads them.
struct View<'a> {
    known: &'a Known,
    lease_ok: bool,
}

impl Placement<u32> for View<'_> {
    fn me(&self) -> NodeId {
        node_of(self.known.idx)
    }
    fn routes(&self, _: u32) -> bool {
        true
    }
    fn version_known(&self, _: u32) -> bool {
        !self.known.owners.is_empty()
    }
    fn placed_owner(&self, shard: u32) -> Option<NodeId> {
        self.known.placed(shard)
    }
    fn owner(&self, shard: u32) -> Option<Owner> {
        let o = self.known.owners.get(shard as usize).copied().flatten()?;
        (o != self.known.idx).then(|| self.known.at(o))
    }
    fn handed_from(&self, shard: u32) -> Option<Owner> {
        // As `Cluster::handed_from` keeps them: shards this node owns,
        // handed over from another node.
        let f = self.known.moved_from.get(shard as usize).copied().flatten()?;
        (self.known.placed(shard) == Some(self.me()) && f != self.known.idx).then(|| self.known.at(f))
    }
    fn former_owner(&self, shard: u32) -> Option<NodeId> {
        self.known.moved_from.get(shard as usize).copied().flatten().map(node_of)
    }
    fn owner_epoch(&self, _: u32) -> u64 {
        self.known.epoch
    }
    fn lease_ok(&self, _: Instant) -> bool {
        self.lease_ok
    }
}

/// An ask on a stream to an owner.
#[derive(Debug)]
struct Ask {
    load: u64,
    peer: usize,
    clock: StallClock,
    probe: Option<granary_node::decide::Liveness>,
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
    known: Known,
    engine: Engine<u32, SimLoad, PeerError>,
    /// Load permits free, and the loads queued for one, in order.
    permits: usize,
    queue: VecDeque<u32>,
    /// Asks for a held copy: stream -> (load id, the node asked, when it
    /// last said it is still working on it).
    held_asks: BTreeMap<u64, (u64, usize, Option<Micros>)>,
    /// Chunks held: shard -> guest (not owned when fetched).
    held: BTreeMap<u32, bool>,
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
            known: Known { idx, ..Known::default() },
            engine: Engine::new(super::params::fabric().timing()),
            permits: load_permits(),
            queue: VecDeque::new(),
            held_asks: BTreeMap::new(),
            held: BTreeMap::new(),
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

    /// Whether this node may read as an owner now (its lease is not in
    /// doubt, as membership keeps it).
    fn lease_ok(&self, w: &World) -> bool {
        let lease = LeaseView {
            renewed_at: self.renewed_at.map(|t| w.instant(t)),
            lease: Duration::from_micros(LEASE),
            epoch: self.coord_epoch,
        };
        may_read_as_owner(w.instant_now(), Some(lease), self.known.epoch)
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
                    && w.now - sent <= connect_timeout()
                    && let Some(shard) = self.load_by_id(load_id)
                    && self.engine.shell(shard).is_some_and(|l| l.asks == asks)
                    && matches!(self.engine.waiting_for(shard), Some(Waiting::Move(_)))
                {
                    let view = View { known: &self.known, lease_ok: self.lease_ok(w) };
                    if self.engine.handle_await(shard, AwaitOutcome::OwnerBack, &view) == Back::AskAgain {
                        w.log(format_args!("n{} hears its failed owner of s{shard} again; asks it again", self.idx));
                    }
                    self.drive(w, rec, shard);
                }
            }
            Msg::Ask { stream, shard, epoch } => {
                if let Addr::Node(p) = from {
                    self.request(w, rec, shard, Waiter::Peer(p, stream), epoch);
                }
            }
            Msg::AskHeld { stream, shard } => {
                // From what is held, or a load already reading remote
                // storage (it waits on nothing else); never a new load, and
                // never a load that asks a peer, so no wait cycle forms.
                let Addr::Node(p) = from else { return };
                if self.held.contains_key(&shard) {
                    self.hand(w, rec, shard, Waiter::Peer(p, stream), checksum(shard));
                } else if self.engine.reading(shard).is_some()
                    && let Some(load) = self.engine.shell_mut(shard)
                {
                    load.waiters.push(Waiter::Peer(p, stream));
                    self.serve_progress(w, Waiter::Peer(p, stream));
                } else {
                    self.send(w, from, Msg::NotHeld { stream });
                }
            }
            Msg::NotHeld { stream } => {
                self.held_missing(w, rec, stream, |addr, shard| PeerError::NotHeld { addr, shard })
            }
            Msg::Working { stream } => {
                if let Some(ask) = self.held_asks.get_mut(&stream) {
                    ask.2 = Some(w.now);
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
        if epoch < self.known.epoch {
            return;
        }
        if epoch > self.known.epoch || self.known.owners.is_empty() {
            w.log(format_args!("n{} placement epoch {epoch}: {owners:?}", self.idx));
        }
        self.known.epoch = epoch;
        self.known.moved_from = handed_from;
        self.known.owners = owners;
        let me = node_of(self.idx);
        // The waits a placement ends, as the node's futures on its cluster
        // end them: a version now placed, a failed owner's shard moved, a
        // queued read as owner whose shard moved away.
        let waiting: Vec<(u32, Waiting)> = self.engine.waiting().collect();
        for (shard, waiting) in waiting {
            let placed = self.known.placed(shard);
            let racing =
                waiting == Waiting::PermitUnlessMoved && moved_away(placed, me) && self.unqueue_racing(w, shard);
            let view = View { known: &self.known, lease_ok: self.lease_ok(w) };
            match waiting {
                Waiting::Version => self.engine.handle_version_waited(shard),
                Waiting::Move(failed) if moved_away(placed, failed) => {
                    let owner = view.owner(shard);
                    self.engine.handle_await(shard, AwaitOutcome::Moved(owner), &view);
                }
                Waiting::PermitUnlessMoved if racing => {
                    let now = w.instant_now();
                    self.engine.handle_permit(shard, granary_node::decide::Permit::Moved, now, &view);
                }
                _ => continue,
            }
            self.drive(w, rec, shard);
        }
        // Loads a peer waits on that ask a former owner of a shard this
        // node owns now: they read it here (see `granary_node`'s single
        // flight).
        let view = View { known: &self.known, lease_ok: self.lease_ok(w) };
        for shard in self.engine.placement_changed(&view) {
            w.log(format_args!("n{} leaves its ask for s{shard}: it owns it at epoch {epoch}", self.idx));
            self.left_ask(w, rec, shard);
        }
        self.settle_doubts(w, rec);
        // The trainer starts once the placement covers every node (as a
        // deployment waits for the cluster to form), or after 5 s.
        let owners: BTreeSet<usize> = self.known.owners.iter().flatten().copied().collect();
        if !self.trainer_started && (owners.len() >= self.heard.len().min(self.known.owners.len()) || w.now > ms(5_000))
        {
            self.trainer_started = true;
            w.timer(self.idx, self.life, 0, Timer::Trainer);
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
                    Some(incarnation) => Msg::Heartbeat { incarnation, epoch: self.known.epoch, sent: w.now },
                    None => Msg::Register { token: self.token, sent: w.now },
                };
                self.send(w, Addr::Coord, msg);
                w.timer(self.idx, self.life, LEASE / 3, Timer::Heartbeat);
            }
            Timer::Trainer => self.trainer(w, rec),
            Timer::Stall(stream) => self.stall_timer(w, rec, stream),
            Timer::Probe(stream) => self.probe(w, rec, stream),
            Timer::Idle(stream) => self.idle(w, rec, stream, timer),
            Timer::LeaseWait(id) => {
                if let Some(shard) = self.load_by_id(id)
                    && self.engine.waiting_for(shard) == Some(Waiting::Lease)
                {
                    w.log(format_args!("n{} routes s{shard} again: its lease wait ran out", self.idx));
                    let view = View { known: &self.known, lease_ok: self.lease_ok(w) };
                    self.engine.handle_lease_settled(shard, &view);
                    self.drive(w, rec, shard);
                }
            }
            Timer::VersionWait(id) => {
                if let Some(shard) = self.load_by_id(id)
                    && self.engine.waiting_for(shard) == Some(Waiting::Version)
                {
                    self.engine.handle_version_waited(shard);
                    self.drive(w, rec, shard);
                }
            }
            Timer::HeldDeadline(stream) => self.held_deadline(w, rec, stream, timer),
            Timer::AskDeadline(stream) => self.ask_deadline(w, rec, stream),
            Timer::Await(id, asks) => {
                if let Some(shard) = self.load_by_id(id)
                    && let Some(load) = self.engine.shell_mut(shard)
                    && load.asks == asks
                    && matches!(self.engine.waiting_for(shard), Some(Waiting::Move(_)))
                {
                    let view = View { known: &self.known, lease_ok: self.lease_ok(w) };
                    self.engine.handle_await(shard, AwaitOutcome::NotMoved, &view);
                    if let Some(load) = self.engine.shell_mut(shard) {
                        load.failures.push("the placement did not move the shard in time".into());
                    }
                    self.drive(w, rec, shard);
                }
            }
            Timer::Progress(peer, stream) => {
                if self.serving.contains(&(peer, stream)) {
                    self.send(w, Addr::Node(peer), Msg::Working { stream });
                    w.timer(self.idx, self.life, micros(PEER_PROGRESS_INTERVAL), timer);
                }
            }
            Timer::Redial(id, asks) => {
                if let Some(shard) = self.load_by_id(id)
                    && self.engine.shell(shard).is_some_and(|l| l.asks == asks)
                    && let Some(Waiting::Move(failed)) = self.engine.waiting_for(shard)
                {
                    let peer = failed.0 as usize - 1;
                    let dial = rec.new_stream();
                    self.dials.insert(dial, (id, asks, peer, w.now));
                    self.send(w, Addr::Node(peer), Msg::Dial { id: dial });
                    // A dial that fails takes the connect timeout, then the
                    // peer is left alone for `down_for`.
                    w.timer(self.idx, self.life, connect_timeout() + down_for(), Timer::Redial(id, asks));
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
        self.engine.keys().find(|&k| self.engine.shell(k).is_some_and(|l| l.id == id))
    }

    fn renewed(&mut self, epoch: u64, sent: Micros) {
        self.renewed_at = self.renewed_at.max(Some(sent));
        self.coord_epoch = self.coord_epoch.max(epoch);
    }

    /// Loads waiting for a lease in doubt route again once the lease is
    /// renewed and the placement that came with it is known.
    fn settle_doubts(&mut self, w: &mut World, rec: &mut Record) {
        if !self.lease_ok(w) {
            return;
        }
        let doubting: Vec<u32> =
            self.engine.waiting().filter(|(_, waits)| *waits == Waiting::Lease).map(|(k, _)| k).collect();
        for shard in doubting {
            w.log(format_args!("n{} routes s{shard} again: its lease is renewed", self.idx));
            let view = View { known: &self.known, lease_ok: true };
            self.engine.handle_lease_settled(shard, &view);
            self.drive(w, rec, shard);
        }
    }

    /// Shards held or being loaded here.
    pub fn shards_here(&self) -> impl Iterator<Item = u32> + '_ {
        self.held.keys().copied().chain(self.engine.keys())
    }

    /// The peer this node's load of `shard` asks now, and on which stream.
    pub fn asking_for(&self, shard: u32) -> Option<(usize, u64)> {
        self.engine.shell(shard).and_then(|l| l.ask)
    }

    /// Whether this node's load of `shard` holds `peer`'s request on
    /// `stream` (it joined it, so `peer` waits on this load).
    pub fn serves(&self, shard: u32, peer: usize, stream: u64) -> bool {
        self.engine.shell(shard).is_some_and(|l| l.waiters.contains(&Waiter::Peer(peer, stream)))
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
