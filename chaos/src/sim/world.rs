//! The simulated world: a virtual clock, one event queue, the network
//! between the processes with its faults, the trace, and the record the
//! invariants are checked against. Deterministic by construction: one
//! seeded generator, a queue ordered by (time, sequence number), `BTreeMap`s
//! only, no thread, no wall clock.
//!
//! The network is modelled at the level the decision cores see it: a QUIC
//! stream between two processes delivers each message once and in order,
//! late when datagrams are lost (a probe timeout per loss) and not at all
//! once a partition outlasts the connection's idle timeout. Datagram loss,
//! duplication and reordering below that are QUIC's business and are tested
//! on real processes with the relay (`relay.rs`); here they are their
//! effect on streams.

use super::swarm::Swarm;
use granary_proto::rng::{Rng, seed_of};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Simulated time in microseconds since the start of the run.
pub type Micros = u64;

/// Milliseconds as [`Micros`].
pub const fn ms(n: u64) -> Micros {
    n * 1_000
}

/// A process of the simulated cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Addr {
    /// The coordinator group, as one replicated process (its leader).
    Coord,
    /// Node daemon `i` (node id `i + 1`).
    Node(usize),
}

/// What travels between processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Node to coordinator: register (again) with this token.
    Register {
        /// The registration token (one per process life).
        token: u64,
        /// When the node sent it (its lease runs from no earlier).
        sent: Micros,
    },
    /// Node to coordinator: renew the lease of `incarnation`; `epoch` is
    /// the placement epoch the node has.
    Heartbeat {
        /// The incarnation renewed.
        incarnation: u64,
        /// The node's placement epoch.
        epoch: u64,
        /// When the node sent it.
        sent: Micros,
    },
    /// Coordinator to node: registered as `incarnation`.
    Registered {
        /// The token it answers.
        token: u64,
        /// The new incarnation.
        incarnation: u64,
        /// The placement epoch after the registration.
        epoch: u64,
        /// When the node sent the registration.
        sent: Micros,
    },
    /// Coordinator to node: the heartbeat sent at `sent` renewed the lease
    /// of `incarnation`; the placement epoch is `epoch`.
    Renewed {
        /// The incarnation renewed.
        incarnation: u64,
        /// The coordinator's placement epoch.
        epoch: u64,
        /// When the node sent the heartbeat.
        sent: Micros,
    },
    /// Coordinator to node: the heartbeat was refused (the incarnation
    /// expired): register again.
    Expired,
    /// Coordinator to node: the placement (owner of every shard).
    Placement {
        /// Its epoch.
        epoch: u64,
        /// Owner node index per shard (None: no live node).
        owners: Vec<Option<usize>>,
        /// Per shard, the live node it was handed over from
        /// (`ClusterState::handed_from`), if any.
        handed_from: Vec<Option<usize>>,
    },
    /// Node to node: a keep-alive datagram.
    Ping,
    /// Node to node: send the chunk of `shard` on stream `stream`.
    Ask {
        /// The stream.
        stream: u64,
        /// The shard.
        shard: u32,
        /// The placement epoch that named the asked node the owner.
        epoch: u64,
    },
    /// Node to node: send the chunk of `shard` on stream `stream` if you
    /// hold it (a handoff; never a load).
    AskHeld {
        /// The stream.
        stream: u64,
        /// The shard.
        shard: u32,
    },
    /// Answer to [`Msg::AskHeld`]: not held.
    NotHeld {
        /// The stream.
        stream: u64,
    },
    /// Owner to asker: still working on the stream's chunk.
    Working {
        /// The stream.
        stream: u64,
    },
    /// Owner to asker: the chunk, with its checksum.
    Chunk {
        /// The stream.
        stream: u64,
        /// The chunk's checksum as sent.
        sum: u64,
    },
    /// Owner to asker: refused (a disagreeing placement: the owner's load
    /// asks the asker).
    Refused {
        /// The stream.
        stream: u64,
    },
    /// A handshake to a peer (a dial).
    Dial {
        /// The dial's id.
        id: u64,
    },
    /// The handshake's answer.
    DialOk {
        /// The dial's id.
        id: u64,
    },
    /// A restarted process answering a stream of its former life (QUIC's
    /// stateless reset).
    Reset {
        /// The stream.
        stream: u64,
    },
}

/// A scheduled event.
#[derive(Debug, Clone)]
pub enum Event {
    /// A message arrives.
    Deliver {
        /// Sender.
        from: Addr,
        /// Receiver.
        to: Addr,
        /// The receiver's life the sender's connection was made to (a
        /// message for a former life is refused with a reset).
        to_life: u64,
        /// The sender's life.
        from_life: u64,
        /// The message.
        msg: Msg,
    },
    /// A node's timer, for one life of the node.
    Timer {
        /// The node.
        node: usize,
        /// The life it was set in.
        life: u64,
        /// What for.
        timer: Timer,
    },
    /// The coordinator's lease tick.
    CoordTick,
    /// A fault begins or ends.
    Fault(Fault),
}

/// A node's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// Send keep-alives to every peer.
    Ping,
    /// Heartbeat (or register).
    Heartbeat,
    /// The stall clock of an ask.
    Stall(u64),
    /// A sample of the liveness probe of an ask.
    Probe(u64),
    /// The idle deadline of the connection an ask runs on.
    Idle(u64),
    /// The deadline of an ask.
    AskDeadline(u64),
    /// The handoff wait of an ask for a held copy (by stream).
    HeldDeadline(u64),
    /// The wait of a load (by load id) for its node's lease in doubt.
    LeaseWait(u64),
    /// The wait for the placement of a load (by load id, and owners asked
    /// when the wait began) ran out.
    Await(u64, usize),
    /// Send a progress frame on a stream served to a peer.
    Progress(usize, u64),
    /// Dial a failed owner again, for a load (by load id, and owners asked)
    /// waiting for the placement.
    Redial(u64, usize),
    /// A remote read of a load (by load id) finished.
    RemoteDone(u64),
    /// The wait of a load (by load id) for a placement of its version ran
    /// out.
    VersionWait(u64),
    /// The trainer issues its next requests.
    Trainer,
}

/// A fault of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Cut the link `from` -> `to`.
    Cut {
        /// Sender side.
        from: Addr,
        /// Receiver side.
        to: Addr,
        /// The first link of its partition (counted once in the summary).
        first: bool,
    },
    /// Heal the link `from` -> `to`.
    Heal {
        /// Sender side.
        from: Addr,
        /// Receiver side.
        to: Addr,
    },
    /// SIGKILL a node.
    Crash(usize),
    /// Start a killed node again.
    Restart(usize),
    /// SIGSTOP a node.
    Stop(usize),
    /// SIGCONT a node.
    Continue(usize),
    /// The coordinator leader dies: no leader until `Elected`.
    LeaderLost,
    /// A new leader, in a new term.
    Elected,
}

impl Fault {
    /// The fault in words ("node 2 cut from the coordinator").
    pub fn describe(&self) -> String {
        let name = |a: &Addr| match a {
            Addr::Coord => "the coordinator".to_string(),
            Addr::Node(i) => format!("n{i}"),
        };
        match self {
            Fault::Cut { from, to, .. } => format!("cut {} -> {}", name(from), name(to)),
            Fault::Heal { from, to } => format!("heal {} -> {}", name(from), name(to)),
            Fault::Crash(i) => format!("kill n{i}"),
            Fault::Restart(i) => format!("restart n{i}"),
            Fault::Stop(i) => format!("stop n{i}"),
            Fault::Continue(i) => format!("continue n{i}"),
            Fault::LeaderLost => "the coordinator's leader dies".to_string(),
            Fault::Elected => "a new leader is elected".to_string(),
        }
    }
}

impl Fault {
    /// The fault's kind, for the summary (`None` for the end of a fault).
    pub fn kind(&self) -> Option<&'static str> {
        match self {
            Fault::Cut { first: true, .. } => Some("partition"),
            Fault::Cut { first: false, .. } => None,
            Fault::Crash(_) => Some("crash"),
            Fault::Stop(_) => Some("stop"),
            Fault::LeaderLost => Some("failover"),
            Fault::Heal { .. } | Fault::Restart(_) | Fault::Continue(_) | Fault::Elected => None,
        }
    }
}

/// QUIC's idle timeout: a connection that hears nothing this long closes
/// (`granary_net::transport::IDLE_TIMEOUT`).
pub const IDLE_TIMEOUT: Micros = ms(5_000);
/// QUIC's keep-alive interval (`granary_net::transport::KEEP_ALIVE_INTERVAL`).
pub const KEEP_ALIVE: Micros = ms(1_000);

/// Everything but the processes: clock, queue, network, trace, record.
pub struct World {
    /// Now.
    pub now: Micros,
    base: Instant,
    queue: BinaryHeap<Reverse<(Micros, u64)>>,
    events: BTreeMap<u64, Event>,
    seq: u64,
    /// The generator of every network and remote-storage draw.
    pub rng: Rng,
    /// The run's parameters.
    pub swarm: Swarm,
    /// Cut links, each with when the cut began and how many partitions
    /// cut it.
    cut: BTreeMap<(Addr, Addr), (Micros, u32)>,
    /// Each stream's last scheduled arrival per direction, so a stream's
    /// messages arrive in order.
    ordered: BTreeMap<(Addr, Addr), Micros>,
    /// Messages sent on a cut link: (sent at, from, from life, to, to life,
    /// message).
    parked: Vec<(Micros, Addr, u64, Addr, u64, Msg)>,
    /// Lines of the trace (kept only when asked), and their hash.
    trace: Option<Vec<String>>,
    hash: xxhash_rust::xxh3::Xxh3,
    line: String,
    /// Events handled.
    pub steps: u64,
}

impl World {
    /// A world for `seed` and `swarm`; `keep_trace` keeps the trace's lines.
    pub fn new(seed: u64, swarm: Swarm, keep_trace: bool) -> Self {
        Self {
            now: 0,
            base: Instant::now(),
            queue: BinaryHeap::new(),
            events: BTreeMap::new(),
            seq: 0,
            rng: Rng::new(seed_of(&[seed, 0x004e_4554_574f_524b])),
            swarm,
            cut: BTreeMap::new(),
            ordered: BTreeMap::new(),
            parked: Vec::new(),
            trace: keep_trace.then(Vec::new),
            hash: xxhash_rust::xxh3::Xxh3::new(),
            line: String::new(),
            steps: 0,
        }
    }

    /// `at` as the `Instant` the decision cores take.
    pub fn instant(&self, at: Micros) -> Instant {
        self.base + Duration::from_micros(at)
    }

    /// An `Instant` of the cores back in simulated time.
    pub fn micros(&self, at: Instant) -> Micros {
        at.saturating_duration_since(self.base).as_micros() as Micros
    }

    /// Now, as an `Instant`.
    pub fn instant_now(&self) -> Instant {
        self.instant(self.now)
    }

    /// Schedules `event` at `at` (not before now).
    pub fn at(&mut self, at: Micros, event: Event) {
        let at = at.max(self.now);
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq)));
        self.events.insert(self.seq, event);
    }

    /// Sets `timer` of `node` (in `life`) to fire after `after`.
    pub fn timer(&mut self, node: usize, life: u64, after: Micros, timer: Timer) {
        self.at(self.now + after, Event::Timer { node, life, timer });
    }

    /// The next event, moving the clock to it.
    pub fn pop(&mut self) -> Option<Event> {
        let Reverse((at, seq)) = self.queue.pop()?;
        self.now = at;
        self.steps += 1;
        self.events.remove(&seq)
    }

    /// A uniform draw in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.rng.below(hi.saturating_sub(lo) + 1)
    }

    /// True with `per_mille` odds.
    pub fn odds(&mut self, per_mille: u64) -> bool {
        per_mille > 0 && self.rng.below(1000) < per_mille
    }

    /// Whether `from` -> `to` is cut now.
    pub fn is_cut(&self, from: Addr, to: Addr) -> bool {
        self.cut.contains_key(&(from, to))
    }

    /// Cuts or heals a link; a message already on its way when a cut
    /// began still arrives (it left before). Cuts of one link nest: it
    /// heals when every partition that cut it has healed. Returns whether
    /// the link is whole again, and since when it was cut.
    pub fn set_cut(&mut self, from: Addr, to: Addr, cut: bool) -> Option<Micros> {
        let now = self.now;
        let entry = self.cut.entry((from, to)).or_insert((now, 0));
        if cut {
            entry.1 += 1;
            None
        } else {
            entry.1 = entry.1.saturating_sub(1);
            if entry.1 == 0 { self.cut.remove(&(from, to)).map(|(began, _)| began) } else { None }
        }
    }

    /// Sends `msg` from `from` (in `from_life`) to `to` (its connection
    /// made to `to_life`). Messages on a cut link wait for the heal, as
    /// QUIC's retransmissions do; those that waited longer than the idle
    /// timeout are lost with their connection (see [`World::take_parked`]).
    pub fn send(&mut self, from: Addr, from_life: u64, to: Addr, to_life: u64, msg: Msg) {
        if self.is_cut(from, to) {
            // Parked: the heal fault re-sends what is parked, if the
            // connection lived through the cut.
            self.parked.push((self.now, from, from_life, to, to_life, msg));
            return;
        }
        let (lo, hi) = self.swarm.latency_ms;
        let mut delay = self.between(ms(lo), ms(hi).max(ms(lo)) + 500);
        // Each lost datagram costs a probe timeout: about three round trips,
        // at least 10 ms (quinn's granularity is finer; this is coarse on
        // purpose, to stretch races).
        let pto = (6 * ms(hi)).max(ms(10));
        let mut losses = 0;
        while losses < 8 && self.odds(self.swarm.loss_per_mille) {
            delay += pto << losses;
            losses += 1;
        }
        if matches!(msg, Msg::Placement { .. }) {
            delay += self.between(0, ms(self.swarm.watch_lag_ms));
        }
        let mut arrive = self.now + delay;
        // One ordered stream per direction between two processes.
        let last = self.ordered.entry((from, to)).or_insert(0);
        arrive = arrive.max(*last);
        *last = arrive;
        self.at(arrive, Event::Deliver { from, to, to_life, from_life, msg });
    }

    /// Messages parked on cut links, taken for re-sending by a heal.
    pub fn take_parked(&mut self, from: Addr, to: Addr) -> Vec<(Micros, u64, u64, Msg)> {
        let (take, keep): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.parked).into_iter().partition(|p| p.1 == from && p.3 == to);
        self.parked = keep;
        take.into_iter().map(|(at, _, fl, _, tl, m)| (at, fl, tl, m)).collect()
    }

    /// Appends one line to the trace (its hash always, its text if kept).
    pub fn log(&mut self, args: std::fmt::Arguments<'_>) {
        self.line.clear();
        let _ = write!(self.line, "{:>10} ", self.now);
        let _ = self.line.write_fmt(args);
        self.hash.update(self.line.as_bytes());
        self.hash.update(b"\n");
        if let Some(t) = &mut self.trace {
            t.push(self.line.clone());
        }
    }

    /// The trace's hash so far.
    pub fn trace_hash(&self) -> u64 {
        self.hash.digest()
    }

    /// The trace's lines, if kept.
    pub fn take_trace(&mut self) -> Option<Vec<String>> {
        self.trace.take()
    }
}
