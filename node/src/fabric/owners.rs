//! [`Cluster`]: what this node knows of placement (every live node's
//! address and, per dataset version it serves, the owner of each shard),
//! the link to peers, and the fabric's configuration. The placement
//! follower (`follow.rs`) replaces it on every placement update; a load
//! whose owner failed waits here for the next update ([`Cluster::reroute`]).

use super::config::FabricConfig;
use super::link::PeerLink;
use super::verify::{Quarantine, Quarantined, Sampler};
use granary_node_core::route::{LeaseView, Owner, may_read_as_owner};
use granary_proto::{DatasetVersion, NodeId, ShardId};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::RwLock;
use std::time::Duration;
use tokio::sync::watch;

/// What this node knows of placement.
pub struct Cluster {
    me: NodeId,
    link: PeerLink,
    config: FabricConfig,
    map: RwLock<PlacementMap>,
    /// Bumped on every placement update, so fetches can wait for one.
    updates: watch::Sender<u64>,
    /// This node's lease as membership keeps it (None: no lease is
    /// followed, as in tests that set placements by hand).
    lease: watch::Sender<Option<LeaseView>>,
    /// Which peer chunks are verified ([`Cluster::verify_next`]).
    sampler: Sampler,
    /// Chunks fetched from peers so far (each draw's index).
    fetched: std::sync::atomic::AtomicU64,
    /// Peers whose chunk differed from this node's own conversion: never
    /// asked again ([`Cluster::owner`] and [`Cluster::handed_from`] skip
    /// them).
    quarantine: RwLock<Quarantine>,
}

#[derive(Default)]
pub(crate) struct PlacementMap {
    pub(crate) epoch: u64,
    pub(crate) addrs: HashMap<NodeId, SocketAddr>,
    pub(crate) owners: HashMap<DatasetVersion, HashMap<ShardId, NodeId>>,
    /// The placement epoch each version's owners were read at (the
    /// coordinator's answer can be newer than the watch's view, or older
    /// when the last known owners were kept).
    pub(crate) owner_epochs: HashMap<DatasetVersion, u64>,
    /// Per version, for shards a placement handed over from another live
    /// node: that node (the coordinator's `handed_from`).
    pub(crate) former: HashMap<DatasetVersion, HashMap<ShardId, NodeId>>,
}

impl Cluster {
    /// This node is `me`; peers are reached through `link`, within the
    /// bounds of `config`.
    pub fn new(me: NodeId, link: PeerLink, config: FabricConfig) -> Self {
        Self {
            me,
            link,
            map: RwLock::new(PlacementMap::default()),
            updates: watch::channel(0).0,
            lease: watch::channel(None).0,
            sampler: Sampler::random(config.verify_peer_chunks),
            fetched: std::sync::atomic::AtomicU64::new(0),
            quarantine: RwLock::new(Quarantine::default()),
            config,
        }
    }

    /// Whether the chunk of `shard` just fetched from a peer is to be
    /// verified (`verify_peer_chunks`; a fresh draw per fetch).
    pub(crate) fn verify_next(&self, version: DatasetVersion, shard: ShardId) -> bool {
        let nth = self.fetched.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.sampler.sampled(version, shard, nth)
    }

    /// Quarantines `peer` (its chunk differed from this node's own
    /// conversion); true the first time.
    pub(crate) fn quarantine(&self, peer: NodeId, why: Quarantined) -> bool {
        self.quarantine.write().unwrap_or_else(|p| p.into_inner()).add(peer, why)
    }

    /// Whether `peer` is quarantined.
    pub fn is_quarantined(&self, peer: NodeId) -> bool {
        self.quarantine.read().unwrap_or_else(|p| p.into_inner()).contains(peer)
    }

    /// Peers quarantined.
    pub fn quarantined(&self) -> usize {
        self.quarantine.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// What this node knows of its lease now (membership forwards every
    /// change; tests may set it).
    pub fn set_lease(&self, view: Option<LeaseView>) {
        self.lease.send_replace(view);
    }

    /// What this node knows of its lease now (a node whose membership has
    /// not reported yet: not registered).
    pub fn lease_view(&self) -> LeaseView {
        (*self.lease.borrow()).unwrap_or(LeaseView { renewed_at: None, lease: Duration::ZERO, epoch: 0 })
    }

    /// Whether this node may read a shard its placement gives it as the
    /// owner now: its lease is not in doubt and its placement is at least
    /// as new as the one the coordinator last reported
    /// ([`may_read_as_owner`]).
    pub fn may_read_as_owner(&self) -> bool {
        may_read_as_owner(tokio::time::Instant::now().into_std(), *self.lease.borrow(), self.epoch())
    }

    /// Waits until this node may read as an owner again
    /// ([`Cluster::may_read_as_owner`]: a heartbeat or registration
    /// accepted, and the placement that came with it known), or `wait`
    /// passes. Returns whether it may.
    pub async fn lease_settled(&self, wait: Duration) -> bool {
        let mut lease = self.lease.subscribe();
        let mut updates = self.updates.subscribe();
        let settled = tokio::time::timeout(wait, async {
            while !self.may_read_as_owner() {
                // A lease a lease old only changes when membership renews
                // it; a check every 100 ms is a backstop.
                tokio::select! {
                    _ = lease.changed() => {}
                    _ = updates.changed() => {}
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
        })
        .await;
        settled.is_ok()
    }

    /// This node's id.
    pub fn me(&self) -> NodeId {
        self.me
    }

    /// The fabric's times and sizes.
    pub fn config(&self) -> &FabricConfig {
        &self.config
    }

    /// The live owner of `shard`, when it is another node and not
    /// quarantined, with the placement epoch that named it.
    pub fn owner(&self, version: DatasetVersion, shard: ShardId) -> Option<Owner> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let owner = *map.owners.get(&version)?.get(&shard)?;
        if owner == self.me || self.is_quarantined(owner) {
            return None;
        }
        let epoch = map.owner_epochs.get(&version).copied().unwrap_or(map.epoch);
        map.addrs.get(&owner).map(|a| Owner { node: owner, addr: *a, epoch })
    }

    /// For a shard this node owns that a placement handed over from
    /// another live node: that node, asked for a copy it holds before this
    /// node reads remote storage ([`granary_node_core::route::Step::AskHeld`]).
    pub fn handed_from(&self, version: DatasetVersion, shard: ShardId) -> Option<Owner> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        if *map.owners.get(&version)?.get(&shard)? != self.me {
            return None;
        }
        let from = *map.former.get(&version)?.get(&shard)?;
        if from == self.me || self.is_quarantined(from) {
            return None;
        }
        let epoch = map.owner_epochs.get(&version).copied().unwrap_or(map.epoch);
        map.addrs.get(&from).map(|a| Owner { node: from, addr: *a, epoch })
    }

    /// The node the placement moved `shard` from, whichever it is (this
    /// one included, live or not); `None` when it did not move it.
    pub fn former_owner(&self, version: DatasetVersion, shard: ShardId) -> Option<NodeId> {
        self.map.read().unwrap_or_else(|p| p.into_inner()).former.get(&version)?.get(&shard).copied()
    }

    /// The owner the placement gives `shard`, whichever node it is (this
    /// one included); `None` when the version or shard is not placed.
    pub fn placed_owner(&self, version: DatasetVersion, shard: ShardId) -> Option<NodeId> {
        self.map.read().unwrap_or_else(|p| p.into_inner()).owners.get(&version)?.get(&shard).copied()
    }

    /// The link to peers.
    pub fn link(&self) -> &PeerLink {
        &self.link
    }

    /// The placement epoch known.
    pub fn epoch(&self) -> u64 {
        self.map.read().unwrap_or_else(|p| p.into_inner()).epoch
    }

    /// The placement epoch the owners of `version` were read at.
    pub(crate) fn owner_epoch(&self, version: DatasetVersion) -> u64 {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        map.owner_epochs.get(&version).copied().unwrap_or(map.epoch)
    }

    /// The owners last known for `version`, the epoch they were read at,
    /// and the nodes shards were handed over from.
    #[allow(clippy::type_complexity)]
    pub(crate) fn owners_of(
        &self,
        version: DatasetVersion,
    ) -> Option<(u64, HashMap<ShardId, NodeId>, HashMap<ShardId, NodeId>)> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let owners = map.owners.get(&version)?.clone();
        let former = map.former.get(&version).cloned().unwrap_or_default();
        Some((map.owner_epochs.get(&version).copied().unwrap_or(map.epoch), owners, former))
    }

    pub(crate) fn replace(&self, map: PlacementMap) {
        self.link().expect_peers(&map.addrs);
        *self.map.write().unwrap_or_else(|p| p.into_inner()) = map;
        self.updates.send_modify(|n| *n += 1);
    }

    /// Replaces what this node knows of placement: the live nodes'
    /// addresses and, per dataset version, each shard's owner. The
    /// placement follower calls it with what the coordinator says; tests
    /// may call it directly.
    pub fn apply_placement(
        &self,
        epoch: u64,
        addrs: HashMap<NodeId, SocketAddr>,
        owners: HashMap<DatasetVersion, HashMap<ShardId, NodeId>>,
    ) {
        self.apply_placement_with_handoffs(epoch, addrs, owners, HashMap::new());
    }

    /// [`Cluster::apply_placement`], with the node each shard was handed
    /// over from (see [`Cluster::handed_from`]).
    pub fn apply_placement_with_handoffs(
        &self,
        epoch: u64,
        addrs: HashMap<NodeId, SocketAddr>,
        owners: HashMap<DatasetVersion, HashMap<ShardId, NodeId>>,
        former: HashMap<DatasetVersion, HashMap<ShardId, NodeId>>,
    ) {
        let owner_epochs = owners.keys().map(|&v| (v, epoch)).collect();
        self.replace(PlacementMap { epoch, addrs, owners, owner_epochs, former });
    }

    /// Whether this node knows a placement of `version` (any epoch).
    pub fn version_known(&self, version: DatasetVersion) -> bool {
        self.map.read().unwrap_or_else(|p| p.into_inner()).owners.contains_key(&version)
    }

    /// Waits until this node knows a placement of `version`
    /// ([`Cluster::version_known`]), or `wait` passes. Returns whether it
    /// does.
    pub async fn version_placed(&self, version: DatasetVersion, wait: Duration) -> bool {
        let mut updates = self.updates.subscribe();
        tokio::time::timeout(wait, async {
            while !self.version_known(version) {
                if updates.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        })
        .await
        .is_ok()
    }

    /// Waits until the owner of `shard` is no longer `failed` (a newer
    /// placement moved it), or `wait` passes. Returns the new owner (None:
    /// this node owns it now, or the owner is unknown), or `Err` when the
    /// placement did not move it in time.
    pub async fn reroute(
        &self,
        version: DatasetVersion,
        shard: ShardId,
        failed: NodeId,
        wait: Duration,
    ) -> Result<Option<Owner>, ()> {
        let mut updates = self.updates.subscribe();
        let moved = |c: &Self| {
            let owner = c.map.read().unwrap_or_else(|p| p.into_inner()).owners.get(&version)?.get(&shard).copied();
            granary_node_core::engine::moved_away(owner, failed).then_some(())
        };
        let waited = tokio::time::timeout(wait, async {
            loop {
                if moved(self).is_some() {
                    return;
                }
                if updates.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        })
        .await;
        match waited {
            Ok(()) => Ok(self.owner(version, shard)),
            Err(_) => Err(()),
        }
    }
}
