//! The simulated coordinator: the real replicated state machine
//! (`granary_coordinator::state::ClusterState::apply`) and the real lease
//! table (`granary_coordinator::leases::Leases`), wired as the server's
//! lease loop and API handlers wire them (`server/timers.rs`,
//! `server/api.rs`). The Raft log itself is one process here: a failover
//! is a window without a leader, then a new term, which is what the lease
//! table sees of an election.

use super::check::Record;
use super::params::LEASE;
use super::world::{Addr, Event, Msg, World};
use granary_coordinator::leases::Leases;
use granary_coordinator::state::ClusterState;
use granary_coordinator::types::{Command, CommandResult};
use granary_proto::{FileEntry, Manifest, NodeId, RowGroupEntry, View};
use std::time::Duration;

/// The one dataset's name.
pub const DATASET: &str = "sim";

/// The coordinator group, as its leader.
pub struct Coord {
    state: ClusterState,
    leases: Leases,
    term: u64,
    /// Whether a leader serves (false between `LeaderLost` and `Elected`).
    pub up: bool,
}

impl Coord {
    /// A coordinator holding one dataset of `shards` shards.
    pub fn new(w: &mut World, shards: usize) -> Self {
        let mut state = ClusterState::default();
        let manifest = Manifest {
            source: "sim:///".into(),
            files: (0..shards.div_ceil(4))
                .map(|f| FileEntry {
                    path: format!("part-{f}.parquet"),
                    size_bytes: 1 << 20,
                    version_tag: "v".into(),
                    row_groups: vec![
                        RowGroupEntry { rows: 1_000, compressed_bytes: 1 << 18, values_bytes: None };
                        (shards - 4 * f).min(4)
                    ],
                    footer_sha256: None,
                })
                .collect(),
            tensors: vec![],
        };
        state.apply(&Command::AddDataset { name: DATASET.into(), view: View { tensors: vec![] }, manifest });
        let leases = Leases::new(Duration::from_micros(LEASE), w.instant_now());
        let mut coord = Self { state, leases, term: 1, up: true };
        coord.schedule_tick(w);
        coord
    }

    fn schedule_tick(&mut self, w: &mut World) {
        let at = w.micros(self.leases.poll_timeout());
        w.at(at, Event::CoordTick);
    }

    fn owners(&self) -> Vec<Option<usize>> {
        self.state.owners(DATASET).iter().map(|n| Some(n.0 as usize - 1)).collect()
    }

    fn handed_from(&self) -> Vec<Option<usize>> {
        self.state.handed_from(DATASET).iter().map(|n| n.map(|n| n.0 as usize - 1)).collect()
    }

    fn broadcast(&self, w: &mut World, rec: &mut Record) {
        let epoch = self.state.placement_epoch;
        let owners = self.owners();
        rec.set_owners(owners.clone());
        rec.disturbed(w.now);
        for (&node, r) in &self.state.nodes {
            if r.live {
                w.send(
                    Addr::Coord,
                    0,
                    Addr::Node(node.0 as usize - 1),
                    0,
                    Msg::Placement { epoch, owners: owners.clone(), handed_from: self.handed_from() },
                );
            }
        }
    }

    /// The lease tick, as `server::timers::lease_loop` runs it.
    pub fn tick(&mut self, w: &mut World, rec: &mut Record) {
        let now = w.instant_now();
        let live: Vec<(NodeId, u64)> =
            self.state.nodes.iter().filter(|(_, r)| r.live).map(|(&n, r)| (n, r.incarnation)).collect();
        self.leases.handle_timeout(now);
        self.leases.handle_leadership(self.up.then_some(self.term), now);
        self.leases.handle_state(live, now);
        for e in self.leases.poll_expired(now) {
            let node = e.node.0 as usize - 1;
            rec.expired(node, w.now);
            if let CommandResult::NodeExpired { placement_epoch: Some(epoch) } =
                self.state.apply(&Command::ExpireNode { node: e.node, incarnation: e.incarnation })
            {
                w.log(format_args!("coordinator expires n{node} (incarnation {}): epoch {epoch}", e.incarnation));
                self.broadcast(w, rec);
            }
        }
        self.schedule_tick(w);
    }

    /// A request from node `from`, as the API handler answers it.
    pub fn deliver(&mut self, w: &mut World, rec: &mut Record, from: usize, msg: Msg) {
        if !self.up {
            // No leader: the request fails; the node's loop tries again.
            return;
        }
        let node = NodeId(from as u64 + 1);
        let now = w.instant_now();
        match msg {
            Msg::Register { token, sent } => {
                let cmd = Command::RegisterNode {
                    node,
                    addr: super::params::addr_of(from).to_string(),
                    ram_bytes: 1 << 30,
                    ssd_bytes: 0,
                    registration: token,
                };
                if let CommandResult::NodeRegistered { incarnation, placement_epoch } = self.state.apply(&cmd) {
                    self.leases.handle_renewed(node, incarnation, now);
                    rec.renewed(from, w.now);
                    w.log(format_args!("coordinator registers n{from} as {incarnation}: epoch {placement_epoch}"));
                    let reply = Msg::Registered { token, incarnation, epoch: placement_epoch, sent };
                    w.send(Addr::Coord, 0, Addr::Node(from), 0, reply);
                    self.broadcast(w, rec);
                }
            }
            Msg::Heartbeat { incarnation, epoch, sent } => {
                let live = self.state.nodes.get(&node).is_some_and(|r| r.live && r.incarnation == incarnation);
                if live {
                    self.leases.handle_renewed(node, incarnation, now);
                    rec.renewed(from, w.now);
                    let renewed = Msg::Renewed { incarnation, epoch: self.state.placement_epoch, sent };
                    w.send(Addr::Coord, 0, Addr::Node(from), 0, renewed);
                    if epoch != self.state.placement_epoch {
                        w.send(
                            Addr::Coord,
                            0,
                            Addr::Node(from),
                            0,
                            Msg::Placement {
                                epoch: self.state.placement_epoch,
                                owners: self.owners(),
                                handed_from: self.handed_from(),
                            },
                        );
                    }
                } else {
                    w.send(Addr::Coord, 0, Addr::Node(from), 0, Msg::Expired);
                }
            }
            _ => {}
        }
    }

    /// The leader died: no leader until [`Coord::elected`].
    pub fn lost(&mut self) {
        self.up = false;
    }

    /// A new leader in a new term.
    pub fn elected(&mut self, w: &mut World) {
        self.up = true;
        self.term += 1;
        w.log(format_args!("coordinator: new leader in term {}", self.term));
    }

    /// The final placement: the owner of every shard (None: no live node).
    pub fn final_owners(&self) -> Vec<Option<usize>> {
        self.owners()
    }

    /// Live nodes in the replicated state.
    pub fn live(&self) -> Vec<usize> {
        self.state.nodes.iter().filter(|(_, r)| r.live).map(|(n, _)| n.0 as usize - 1).collect()
    }
}
