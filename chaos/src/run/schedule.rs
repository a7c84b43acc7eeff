//! A seed's fault schedule for `granary-chaos run`: pure, so one seed always
//! names the same faults at the same offsets (the processes' interleaving
//! around them is the only thing a replay cannot repeat).
//!
//! Faults are drawn so that the cluster can always make progress once each
//! one ends: at most `nodes - 1` nodes are down or stopped at once, at most
//! one voter is down or cut off at a time (a majority of three stays up),
//! and network faults do not overlap (the relay heals all partitions at
//! once).

use super::store::StoreFaults;
use granary_proto::rng::{Rng, seed_of};
use serde::Serialize;
use std::fmt;
use std::time::Duration;

/// What a schedule may aim at.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// Node daemons, ids 1..=nodes.
    pub nodes: u32,
    /// Coordinator voters, ids 1..=voters.
    pub voters: u32,
    /// Faults start within this time of the first epoch's start.
    pub horizon: Duration,
    /// Process and network fault events per seed at most (at least one);
    /// one `fill_ssd` or `kill_in_ssd_write`, one `cut_host` or
    /// `isolate_voter`/`isolate_leader`, and one `stop_voter`/`stop_leader`
    /// may come on top.
    pub max_faults: u32,
}

/// Which voter a voter fault hits, resolved when it fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VoterPick {
    /// Whichever voter leads at that moment.
    Leader,
    /// A voter that does not lead at that moment (the lowest such id).
    Follower,
}

/// One fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// SIGKILL a node daemon and the trainer ranks on its host; restart
    /// both after `down`; the ranks run their unfinished epochs again.
    KillNode {
        /// Node id.
        node: u64,
        /// Time until the restart.
        #[serde(serialize_with = "millis")]
        down: Duration,
    },
    /// SIGKILL a node daemon and its ranks, flip one byte in each of up to
    /// `flips` chunk entries of its SSD tier, restart both after `down`:
    /// the node must recover the intact chunks and read the damaged ones
    /// again, never serve them.
    CorruptSsd {
        /// Node id.
        node: u64,
        /// Time until the restart.
        #[serde(serialize_with = "millis")]
        down: Duration,
        /// Chunk entries damaged at most.
        flips: u32,
    },
    /// SIGKILL a node daemon and its ranks, fill the rest of the
    /// filesystem its SSD tier lives on (a tmpfs of the tier's size and a
    /// little more), restart both after `down` on the full filesystem,
    /// which stays full until the seed ends: the node must start on the
    /// space its tier already holds and keep storing chunks.
    FillSsd {
        /// Node id.
        node: u64,
        /// Time until the restart.
        #[serde(serialize_with = "millis")]
        down: Duration,
    },
    /// SIGKILL a node daemon at the `nth` write into its SSD tier's files
    /// after the fault starts (at the write's entry, by strace's syscall
    /// fault injection; the host's ranks go down first), restart both
    /// after `down`: the node must recover what was written whole and
    /// read the rest again.
    KillInSsdWrite {
        /// Node id.
        node: u64,
        /// Time from the fault's start until the restart (or the kill, if
        /// the write comes later: the restart follows it at once).
        #[serde(serialize_with = "millis")]
        down: Duration,
        /// Which write (1: the first).
        nth: u32,
    },
    /// SIGSTOP a node daemon (alive but silent), SIGCONT after `stopped`.
    StopNode {
        /// Node id.
        node: u64,
        /// Time stopped.
        #[serde(serialize_with = "millis")]
        stopped: Duration,
    },
    /// SIGKILL a coordinator voter, restart it after `down`.
    KillVoter {
        /// Which voter.
        pick: VoterPick,
        /// Time until the restart.
        #[serde(serialize_with = "millis")]
        down: Duration,
    },
    /// Cut a voter's power: SIGKILL it, and its data folder loses what
    /// it wrote and did not sync (its log, vote and snapshot as a disk
    /// would hold them after a power cut); restart it after `down`.
    PowerCutVoter {
        /// Which voter.
        pick: VoterPick,
        /// Time until the restart.
        #[serde(serialize_with = "millis")]
        down: Duration,
    },
    /// Cut the peer links between two nodes both ways for `cut`.
    CutPair {
        /// One node.
        a: u64,
        /// The other.
        b: u64,
        /// How long.
        #[serde(serialize_with = "millis")]
        cut: Duration,
    },
    /// Cut a node's peer links to every other node for `cut` (it still
    /// reaches the coordinator: alive, but unreachable for its peers).
    IsolateNode {
        /// Node id.
        node: u64,
        /// How long.
        #[serde(serialize_with = "millis")]
        cut: Duration,
    },
    /// Cut a node off every other process, voters included, for `cut`: a
    /// host whose link went down. Its lease may lapse and its shards move;
    /// its ranks go on from what it can reach.
    CutHost {
        /// Node id.
        node: u64,
        /// How long.
        #[serde(serialize_with = "millis")]
        cut: Duration,
    },
    /// SIGSTOP a coordinator voter (alive but silent), SIGCONT after
    /// `stopped`: a stopped leader is deposed and wakes up believing it
    /// leads; a stopped follower falls behind.
    StopVoter {
        /// Which voter.
        pick: VoterPick,
        /// Time stopped.
        #[serde(serialize_with = "millis")]
        stopped: Duration,
    },
    /// Cut a voter off every other process (voters, nodes, the chaos
    /// client) for `cut`: a leader cut off is deposed, a follower falls
    /// behind and catches up.
    IsolateVoter {
        /// Which voter.
        pick: VoterPick,
        /// How long.
        #[serde(serialize_with = "millis")]
        cut: Duration,
    },
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

impl Fault {
    /// The fault's kind, as the summary counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::KillNode { .. } => "kill_node",
            Fault::CorruptSsd { .. } => "corrupt_ssd",
            Fault::FillSsd { .. } => "fill_ssd",
            Fault::KillInSsdWrite { .. } => "kill_in_ssd_write",
            Fault::StopNode { .. } => "stop_node",
            Fault::KillVoter { pick: VoterPick::Leader, .. } => "kill_leader",
            Fault::KillVoter { pick: VoterPick::Follower, .. } => "kill_voter",
            Fault::PowerCutVoter { pick: VoterPick::Leader, .. } => "power_cut_leader",
            Fault::PowerCutVoter { pick: VoterPick::Follower, .. } => "power_cut_voter",
            Fault::CutPair { .. } => "cut_pair",
            Fault::IsolateNode { .. } => "isolate_node",
            Fault::CutHost { .. } => "cut_host",
            Fault::IsolateVoter { pick: VoterPick::Leader, .. } => "isolate_leader",
            Fault::IsolateVoter { pick: VoterPick::Follower, .. } => "isolate_voter",
            Fault::StopVoter { pick: VoterPick::Leader, .. } => "stop_leader",
            Fault::StopVoter { pick: VoterPick::Follower, .. } => "stop_voter",
        }
    }

    /// How long the fault lasts.
    pub fn duration(&self) -> Duration {
        match *self {
            Fault::KillNode { down, .. }
            | Fault::KillVoter { down, .. }
            | Fault::PowerCutVoter { down, .. }
            | Fault::CorruptSsd { down, .. }
            | Fault::FillSsd { down, .. }
            | Fault::KillInSsdWrite { down, .. } => down,
            Fault::StopNode { stopped, .. } | Fault::StopVoter { stopped, .. } => stopped,
            Fault::CutPair { cut, .. }
            | Fault::IsolateNode { cut, .. }
            | Fault::CutHost { cut, .. }
            | Fault::IsolateVoter { cut, .. } => cut,
        }
    }

    /// Whether the relay cuts links for it (partitions end all at once).
    pub fn is_cut(&self) -> bool {
        matches!(
            self,
            Fault::CutPair { .. } | Fault::IsolateNode { .. } | Fault::CutHost { .. } | Fault::IsolateVoter { .. }
        )
    }

    /// Whether it takes a voter out (killed or cut off).
    pub fn voter_out(&self) -> bool {
        matches!(
            self,
            Fault::KillVoter { .. }
                | Fault::PowerCutVoter { .. }
                | Fault::IsolateVoter { .. }
                | Fault::StopVoter { .. }
        )
    }

    /// The node it takes down, stops or cuts off, if any.
    pub fn node_down(&self) -> Option<u64> {
        match *self {
            Fault::KillNode { node, .. }
            | Fault::StopNode { node, .. }
            | Fault::CutHost { node, .. }
            | Fault::CorruptSsd { node, .. }
            | Fault::FillSsd { node, .. }
            | Fault::KillInSsdWrite { node, .. } => Some(node),
            _ => None,
        }
    }

    /// The node it kills with its host's ranks (and restarts), if any.
    pub fn host_killed(&self) -> Option<u64> {
        match *self {
            Fault::KillNode { node, .. }
            | Fault::CorruptSsd { node, .. }
            | Fault::FillSsd { node, .. }
            | Fault::KillInSsdWrite { node, .. } => Some(node),
            _ => None,
        }
    }

    /// Whether it makes a live owner unreachable for (some of) its peers:
    /// the cases where a shard may be read again by design.
    pub fn hides_an_owner(&self) -> bool {
        matches!(
            self,
            Fault::StopNode { .. } | Fault::CutPair { .. } | Fault::IsolateNode { .. } | Fault::CutHost { .. }
        )
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |d: &Duration| format!("{:.1} s", d.as_secs_f64());
        match self {
            Fault::KillNode { node, down } => write!(f, "kill node {node} (and its ranks), restart after {}", s(down)),
            Fault::StopNode { node, stopped } => write!(f, "stop node {node} for {}", s(stopped)),
            Fault::CorruptSsd { node, down, flips } => write!(
                f,
                "kill node {node} (and its ranks), damage up to {flips} chunks on its SSD, restart after {}",
                s(down)
            ),
            Fault::FillSsd { node, down } => write!(
                f,
                "kill node {node} (and its ranks), fill its SSD filesystem, restart after {} on the full filesystem",
                s(down)
            ),
            Fault::KillInSsdWrite { node, down, nth } => write!(
                f,
                "kill node {node} (and its ranks) at write {nth} into its SSD tier, restart {} after the fault began",
                s(down)
            ),
            Fault::KillVoter { pick: VoterPick::Leader, down } => {
                write!(f, "kill the leading voter, restart after {}", s(down))
            }
            Fault::KillVoter { pick: VoterPick::Follower, down } => {
                write!(f, "kill a following voter, restart after {}", s(down))
            }
            Fault::PowerCutVoter { pick: VoterPick::Leader, down } => {
                write!(f, "cut the leading voter's power (unsynced writes lost), restart after {}", s(down))
            }
            Fault::PowerCutVoter { pick: VoterPick::Follower, down } => {
                write!(f, "cut a following voter's power (unsynced writes lost), restart after {}", s(down))
            }
            Fault::CutPair { a, b, cut } => write!(f, "cut nodes {a} and {b} apart for {}", s(cut)),
            Fault::IsolateNode { node, cut } => write!(f, "cut node {node} off its peers for {}", s(cut)),
            Fault::CutHost { node, cut } => {
                write!(f, "cut node {node} off its peers and the voters for {}", s(cut))
            }
            Fault::IsolateVoter { pick: VoterPick::Leader, cut } => {
                write!(f, "cut the leading voter off every process for {}", s(cut))
            }
            Fault::IsolateVoter { pick: VoterPick::Follower, cut } => {
                write!(f, "cut a following voter off every process for {}", s(cut))
            }
            Fault::StopVoter { pick: VoterPick::Leader, stopped } => {
                write!(f, "stop the leading voter for {}", s(stopped))
            }
            Fault::StopVoter { pick: VoterPick::Follower, stopped } => {
                write!(f, "stop a following voter for {}", s(stopped))
            }
        }
    }
}

/// A fault and when it starts, from the first epoch's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Event {
    /// Offset of the start.
    #[serde(serialize_with = "millis", rename = "at_ms")]
    pub at: Duration,
    /// The fault.
    #[serde(flatten)]
    pub fault: Fault,
}

impl Event {
    fn end(&self) -> Duration {
        self.at + self.fault.duration()
    }

    fn overlaps(&self, other: &Event) -> bool {
        self.at < other.end() && other.at < self.end()
    }
}

/// Datagram faults on every peer link for the whole run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Noise {
    /// Chance a datagram is dropped.
    pub drop: f64,
    /// Chance a datagram is sent twice.
    pub duplicate: f64,
    /// Chance a datagram is held back behind later ones.
    pub reorder: f64,
    /// Extra one-way delay of every datagram, milliseconds (the same for
    /// all: no jitter, reordering is [`Noise::reorder`]'s).
    pub delay_ms: u64,
    /// A bandwidth cap on every direction of every peer link, MiB/s (0:
    /// none): chunk transfers slow to the link's pace, and datagrams that
    /// would wait over 200 ms for it are dropped, as a router's queue
    /// drops them.
    pub bandwidth_mib: u64,
}

/// A seed's faults.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Schedule {
    /// The seed.
    pub seed: u64,
    /// Fault events, by start.
    pub events: Vec<Event>,
    /// Datagram faults on the peer links.
    pub noise: Noise,
    /// Faults of the object store, for the whole run.
    pub store: StoreFaults,
    /// A node that forges every chunk it sends to its peers, in every life
    /// (`granary-chaos node`: well-formed chunks with one value changed),
    /// while every node verifies each peer chunk (`verify_peer_chunks =
    /// 1.0`): the forger must be caught and quarantined, and no rank may
    /// see a forged value.
    pub byzantine: Option<u64>,
}

/// Draws the schedule of `seed`.
pub fn draw(seed: u64, t: Target) -> Schedule {
    let mut r = Rng::new(seed_of(&[seed, 0x4348_414f_5352_554e]));
    let horizon_ms = t.horizon.as_millis().max(1) as u64;
    let ms = |r: &mut Rng, lo: u64, hi: u64| Duration::from_millis(lo + r.below(hi - lo + 1));
    let wanted = 1 + r.below(u64::from(t.max_faults.max(1)));
    let mut events: Vec<Event> = Vec::new();
    // A bounded number of draws: a fault that cannot fit is dropped.
    for _ in 0..wanted * 4 {
        if events.len() as u64 == wanted {
            break;
        }
        let at = ms(&mut r, 200, horizon_ms);
        let node = 1 + r.below(u64::from(t.nodes.max(1)));
        let other = 1 + (node + r.below(u64::from(t.nodes.max(2) - 1))) % u64::from(t.nodes.max(2));
        let fault = match r.below(11) {
            10 => Fault::CorruptSsd { node, down: ms(&mut r, 300, 2500), flips: 1 + r.below(3) as u32 },
            0..=1 => Fault::KillNode { node, down: ms(&mut r, 300, 2500) },
            2..=3 => Fault::StopNode { node, stopped: ms(&mut r, 500, 4000) },
            4 if t.voters >= 3 => Fault::KillVoter { pick: VoterPick::Leader, down: ms(&mut r, 300, 2500) },
            5 if t.voters >= 3 => Fault::KillVoter { pick: VoterPick::Follower, down: ms(&mut r, 300, 2500) },
            6..=7 if t.nodes >= 2 => {
                Fault::CutPair { a: node.min(other), b: node.max(other), cut: ms(&mut r, 500, 4000) }
            }
            _ if t.nodes >= 2 => Fault::IsolateNode { node, cut: ms(&mut r, 500, 4000) },
            _ => Fault::StopNode { node, stopped: ms(&mut r, 500, 4000) },
        };
        let e = Event { at, fault };
        if fits(&events, &e, t) {
            events.push(e);
        }
    }
    // SSD faults of the filesystem and of a write in progress, from a
    // stream of their own (the schedules drawn before they existed stay
    // as they were): in about one seed of four, when one fits.
    let mut d = Rng::new(seed_of(&[seed, 0x5353_445f_4641_554c]));
    if d.below(4) == 0 {
        let at = ms(&mut d, 200, horizon_ms);
        let node = 1 + d.below(u64::from(t.nodes.max(1)));
        let fault = if d.below(2) == 0 {
            Fault::FillSsd { node, down: ms(&mut d, 300, 2500) }
        } else {
            // Long enough for the write to come (most often within a
            // second in the cold epoch), then a restart.
            Fault::KillInSsdWrite { node, down: ms(&mut d, 1500, 3500), nth: 1 + d.below(3) as u32 }
        };
        let e = Event { at, fault };
        if fits(&events, &e, t) {
            events.push(e);
        }
    }
    // Faults of the links to the voters, from a stream of their own: in
    // about one seed of two, a host cut off (voters included) or a voter
    // cut off, when one fits (about a third do: the other cuts are many).
    let mut c = Rng::new(seed_of(&[seed, 0x434f_4f52_4c49_4e4b]));
    if c.below(2) == 0 {
        let at = ms(&mut c, 200, horizon_ms);
        let node = 1 + c.below(u64::from(t.nodes.max(1)));
        let cut = ms(&mut c, 500, 4000);
        let fault = match c.below(4) {
            0 if t.voters >= 3 => Fault::IsolateVoter { pick: VoterPick::Leader, cut },
            1 if t.voters >= 3 => Fault::IsolateVoter { pick: VoterPick::Follower, cut },
            _ => Fault::CutHost { node, cut },
        };
        let e = Event { at, fault };
        if fits(&events, &e, t) {
            events.push(e);
        }
    }
    // A voter stopped (SIGSTOP), from a stream of its own too: in about
    // one seed of four, when it fits.
    let mut v = Rng::new(seed_of(&[seed, 0x5354_4f50_564f_5445]));
    if v.below(4) == 0 && t.voters >= 3 {
        let at = ms(&mut v, 200, horizon_ms);
        let pick = if v.below(2) == 0 { VoterPick::Leader } else { VoterPick::Follower };
        let e = Event { at, fault: Fault::StopVoter { pick, stopped: ms(&mut v, 500, 4000) } };
        if fits(&events, &e, t) {
            events.push(e);
        }
    }
    // A voter's power cut, from a stream of its own too: in about one
    // seed of three, when it fits.
    let mut p = Rng::new(seed_of(&[seed, 0x504f_5745_5243_5554]));
    if p.below(3) == 0 && t.voters >= 3 {
        let at = ms(&mut p, 200, horizon_ms);
        let pick = if p.below(2) == 0 { VoterPick::Leader } else { VoterPick::Follower };
        let e = Event { at, fault: Fault::PowerCutVoter { pick, down: ms(&mut p, 300, 2500) } };
        if fits(&events, &e, t) {
            events.push(e);
        }
    }
    events.sort_by_key(|e| e.at);
    let noise = if r.below(2) == 0 {
        Noise::default()
    } else {
        // Rates of a bad datacenter link, not of a broken one: at 2.7%
        // loss with up to 4 ms of jitter per datagram (every datagram
        // overtaking others), QUIC's congestion control made a 2 s job
        // take 24 s on loopback.
        Noise {
            drop: r.below(11) as f64 / 1000.0,
            duplicate: r.below(11) as f64 / 1000.0,
            reorder: r.below(11) as f64 / 1000.0,
            delay_ms: r.below(3),
            bandwidth_mib: 0,
        }
    };
    // A cap on the peer links, from a stream of its own (earlier seeds'
    // schedules stay as they were): in about one seed of four, 8-32 MiB/s,
    // so a chunk of this job's takes tens of milliseconds to cross.
    let mut b = Rng::new(seed_of(&[seed, 0x4241_4e44_5749_4454]));
    let noise = if b.below(4) == 0 { Noise { bandwidth_mib: 8 + b.below(25), ..noise } } else { noise };
    let store = if r.below(2) == 0 {
        StoreFaults::default()
    } else {
        // A run makes few GETs (one per shard, and footers): rates high
        // enough that each kind fires a few times in a seed.
        StoreFaults {
            error: r.below(151) as f64 / 1000.0,
            slow: r.below(151) as f64 / 1000.0,
            slow_ms: 50 + r.below(351),
            short: r.below(101) as f64 / 1000.0,
            ..StoreFaults::default()
        }
    };
    // Bodies that stall halfway, from a stream of their own (earlier
    // seeds' schedules stay as they were): in about one seed of three,
    // 5-20% of GETs pause 0.3-1.5 s after half their bytes.
    let mut m = Rng::new(seed_of(&[seed, 0x5354_414c_4c42_4f44]));
    let store = if m.below(3) == 0 {
        StoreFaults { stall: (50 + m.below(151)) as f64 / 1000.0, stall_ms: 300 + m.below(1201), ..store }
    } else {
        store
    };
    // A byzantine node, from a stream of its own (earlier seeds' faults
    // stay as they were): in about one seed of four, with two nodes or more.
    let mut z = Rng::new(seed_of(&[seed, 0x4259_5a41_4e54_494e]));
    let byzantine = (z.below(4) == 0 && t.nodes >= 2).then(|| 1 + z.below(u64::from(t.nodes)));
    Schedule { seed, events, noise, store, byzantine }
}

/// Whether `e` can join `events` under the module's rules.
fn fits(events: &[Event], e: &Event, t: Target) -> bool {
    let during: Vec<&Event> = events.iter().filter(|o| o.overlaps(e)).collect();
    let node_fits = |node: u64| {
        let down: Vec<u64> = during.iter().filter_map(|o| o.fault.node_down()).collect();
        !down.contains(&node) && (down.len() as u32) < t.nodes.saturating_sub(1)
    };
    let voter_fits = || !during.iter().any(|o| o.fault.voter_out());
    let cut_fits = || !during.iter().any(|o| o.fault.is_cut());
    match e.fault {
        Fault::KillNode { node, .. }
        | Fault::StopNode { node, .. }
        | Fault::CorruptSsd { node, .. }
        | Fault::FillSsd { node, .. }
        | Fault::KillInSsdWrite { node, .. } => node_fits(node),
        Fault::KillVoter { .. } | Fault::PowerCutVoter { .. } | Fault::StopVoter { .. } => voter_fits(),
        Fault::CutPair { .. } | Fault::IsolateNode { .. } => cut_fits(),
        Fault::CutHost { node, .. } => cut_fits() && node_fits(node),
        Fault::IsolateVoter { .. } => cut_fits() && voter_fits(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Target = Target { nodes: 3, voters: 3, horizon: Duration::from_secs(4), max_faults: 3 };

    #[test]
    fn a_seed_draws_the_same_schedule_every_time_and_seeds_differ() {
        assert_eq!(draw(7, T), draw(7, T));
        let distinct: std::collections::BTreeSet<String> =
            (0..50).map(|s| serde_json::to_string(&draw(s, T)).expect("json")).collect();
        assert!(distinct.len() > 45, "{}", distinct.len());
    }

    #[test]
    fn about_one_seed_of_four_has_a_byzantine_node_and_one_node_never_does() {
        let drawn: Vec<u64> = (0..2_000).filter_map(|s| draw(s, T).byzantine).collect();
        assert!((400..600).contains(&drawn.len()), "{} of 2,000", drawn.len());
        assert!(drawn.iter().all(|n| (1..=3).contains(n)));
        let one = Target { nodes: 1, ..T };
        assert!((0..200).all(|s| draw(s, one).byzantine.is_none()), "a lone node has no peer to lie to");
    }

    #[test]
    fn schedules_keep_a_node_up_a_voter_majority_and_one_network_fault_at_a_time() {
        let mut kinds = std::collections::BTreeMap::new();
        for seed in 0..2000 {
            let s = draw(seed, T);
            let ssd =
                s.events.iter().filter(|e| matches!(e.fault, Fault::FillSsd { .. } | Fault::KillInSsdWrite { .. }));
            assert!(ssd.count() <= 1, "seed {seed}: one SSD fault on top at most");
            assert!(!s.events.is_empty() && s.events.len() <= 3 + 4, "seed {seed}");
            assert!(s.events.windows(2).all(|w| w[0].at <= w[1].at), "seed {seed}: sorted");
            for e in &s.events {
                *kinds.entry(e.fault.kind()).or_insert(0) += 1;
                assert!(e.at >= Duration::from_millis(200) && e.at <= T.horizon, "seed {seed}");
                if let Fault::CutPair { a, b, .. } = e.fault {
                    assert!(a < b && b <= 3, "seed {seed}: {a}-{b}");
                }
                // What is faulty at the instant `e` starts.
                let active: Vec<&Event> = s.events.iter().filter(|o| o.at <= e.at && e.at < o.end()).collect();
                let down: Vec<u64> = active.iter().filter_map(|o| o.fault.node_down()).collect();
                let distinct: std::collections::BTreeSet<u64> = down.iter().copied().collect();
                assert!(distinct.len() == down.len() && down.len() < 3, "seed {seed}: nodes down {down:?}");
                let voters = active.iter().filter(|o| o.fault.voter_out()).count();
                assert!(voters <= 1, "seed {seed}: {voters} voters down");
                let cuts = active.iter().filter(|o| o.fault.is_cut());
                assert!(cuts.count() <= 1, "seed {seed}: overlapping cuts");
            }
        }
        // Every kind is drawn, none rarely.
        for k in ["kill_node", "stop_node", "kill_leader", "kill_voter", "cut_pair", "isolate_node", "corrupt_ssd"] {
            assert!(kinds.get(k).copied().unwrap_or(0) > 200, "{k}: {kinds:?}");
        }
        // The SSD faults of their own stream: about one seed in eight each,
        // less those that do not fit.
        for k in ["fill_ssd", "kill_in_ssd_write"] {
            assert!(kinds.get(k).copied().unwrap_or(0) > 100, "{k}: {kinds:?}");
        }
        // The faults of the voters' links, their own stream too: about
        // one seed in thirteen cuts a host off, one in twenty each a voter.
        assert!(kinds.get("cut_host").copied().unwrap_or(0) > 100, "{kinds:?}");
        for k in ["isolate_leader", "isolate_voter"] {
            assert!(kinds.get(k).copied().unwrap_or(0) > 60, "{k}: {kinds:?}");
        }
        // Voters stopped, a stream of their own: one seed in eight each,
        // less those that do not fit.
        for k in ["stop_leader", "stop_voter"] {
            assert!(kinds.get(k).copied().unwrap_or(0) > 100, "{k}: {kinds:?}");
        }
        // Voters' power cuts, a stream of their own: one seed in six
        // each, less those that do not fit.
        for k in ["power_cut_leader", "power_cut_voter"] {
            assert!(kinds.get(k).copied().unwrap_or(0) > 150, "{k}: {kinds:?}");
        }
    }

    #[test]
    fn ci_seeds_cut_the_power_of_a_leading_and_a_following_voter() {
        let cuts: Vec<(u64, &str)> = (2..=10)
            .flat_map(|seed| draw(seed, T).events.into_iter().map(move |e| (seed, e.fault.kind())))
            .filter(|(_, k)| k.starts_with("power_cut"))
            .collect();
        eprintln!("power cuts in seeds 2-10: {cuts:?}");
        assert!(cuts.iter().any(|(_, k)| *k == "power_cut_leader"), "{cuts:?}");
        assert!(cuts.iter().any(|(_, k)| *k == "power_cut_voter"), "{cuts:?}");
    }

    #[test]
    fn about_one_seed_in_three_stalls_store_bodies_and_ci_seeds_include_one() {
        let stalled: Vec<u64> = (0..3000).filter(|&s| draw(s, T).store.stall > 0.0).collect();
        assert!((850..1150).contains(&stalled.len()), "{}", stalled.len());
        for &s in &stalled {
            let f = draw(s, T).store;
            assert!((0.05..=0.2).contains(&f.stall) && (300..=1500).contains(&f.stall_ms), "seed {s}: {f:?}");
        }
        let ci: Vec<u64> = stalled.iter().copied().filter(|s| (2..=10).contains(s)).collect();
        assert!(!ci.is_empty(), "CI's seeds 2-10 stall no body; the first stalled seeds: {:?}", &stalled[..8]);
        eprintln!("CI seeds with stalled bodies: {ci:?}");
    }

    #[test]
    fn about_one_seed_in_four_caps_the_peer_links_and_ci_seeds_include_one() {
        let capped: Vec<u64> = (0..2000).filter(|&s| draw(s, T).noise.bandwidth_mib > 0).collect();
        assert!((400..600).contains(&capped.len()), "{}", capped.len());
        assert!(capped.iter().all(|&s| (8..=32).contains(&draw(s, T).noise.bandwidth_mib)));
        let ci: Vec<u64> = capped.iter().copied().filter(|s| (2..=10).contains(s)).collect();
        assert!(!ci.is_empty(), "CI's seeds 2-10 draw no link cap; the first capped seeds: {:?}", &capped[..8]);
        eprintln!("CI seeds with a link cap: {ci:?}");
    }

    #[test]
    fn ci_seeds_cut_a_host_and_a_voter_off_and_stop_voters() {
        let kinds = |s: u64| draw(s, T).events.iter().map(|e| e.fault.kind()).collect::<Vec<_>>();
        let ci: Vec<&str> = (2..=10).flat_map(kinds).collect();
        assert!(ci.contains(&"cut_host"), "CI's seeds 2-10 cut no host off: {ci:?}");
        assert!(ci.iter().any(|k| k.starts_with("isolate_") && *k != "isolate_node"), "no voter cut off: {ci:?}");
        assert!(ci.contains(&"stop_leader") && ci.contains(&"stop_voter"), "no voter stopped: {ci:?}");
    }

    #[test]
    fn one_voter_draws_no_voter_faults_and_two_nodes_cut_only_each_other() {
        let t = Target { nodes: 2, voters: 1, ..T };
        let mut cuts = 0;
        for seed in 0..500 {
            for e in draw(seed, t).events {
                assert!(!e.fault.voter_out(), "{e:?}");
                if let Fault::CutPair { a, b, .. } = e.fault {
                    assert_eq!((a, b), (1, 2));
                    cuts += 1;
                }
            }
        }
        assert!(cuts > 50, "{cuts}");
    }
}
