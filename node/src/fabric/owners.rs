//! [`Cluster`]: what this node knows of placement (every live node's
//! address and, per dataset version it serves, the owner of each shard),
//! the link to peers, and the fabric's configuration. The placement
//! follower (`follow.rs`) replaces it on every placement update; a load
//! whose owner failed waits here for the next update ([`Cluster::reroute`]).

use super::config::FabricConfig;
use super::link::PeerLink;
use super::route::{Owner, former_owner};
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
}

#[derive(Default)]
pub(crate) struct PlacementMap {
    pub(crate) epoch: u64,
    pub(crate) addrs: HashMap<NodeId, SocketAddr>,
    pub(crate) owners: HashMap<DatasetVersion, HashMap<ShardId, NodeId>>,
    /// For shards a placement moved to this node: the live node that owned
    /// them before (see [`Cluster::source`]). Filled by [`Cluster::replace`].
    pub(crate) former: HashMap<DatasetVersion, HashMap<ShardId, NodeId>>,
}

impl Cluster {
    /// This node is `me`; peers are reached through `link`, within the
    /// bounds of `config`.
    pub fn new(me: NodeId, link: PeerLink, config: FabricConfig) -> Self {
        Self { me, link, config, map: RwLock::new(PlacementMap::default()), updates: watch::channel(0).0 }
    }

    /// This node's id.
    pub fn me(&self) -> NodeId {
        self.me
    }

    /// The fabric's times and sizes.
    pub fn config(&self) -> &FabricConfig {
        &self.config
    }

    /// The live owner of `shard`, when it is another node.
    pub fn owner(&self, version: DatasetVersion, shard: ShardId) -> Option<Owner> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let owner = *map.owners.get(&version)?.get(&shard)?;
        if owner == self.me {
            return None;
        }
        map.addrs.get(&owner).map(|a| Owner { node: owner, addr: *a })
    }

    /// Whom a load of `shard` asks first: its owner when that is another
    /// node; when this node owns it, the live node that owned it before
    /// the placement moved it here (a handoff: that node may hold the
    /// chunk, and asking costs a round trip where reading remote storage
    /// costs a conversion); else nobody.
    ///
    /// `granary chaos sim --scenario stop` measured the cost without it: a
    /// node that came back after a stop was given shards the survivors had
    /// read while it was away, and read them again in the warm epochs.
    pub fn source(&self, version: DatasetVersion, shard: ShardId) -> Option<Owner> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let owner = *map.owners.get(&version)?.get(&shard)?;
        let node = if owner == self.me { *map.former.get(&version)?.get(&shard)? } else { owner };
        map.addrs.get(&node).map(|a| Owner { node, addr: *a })
    }

    /// The link to peers.
    pub fn link(&self) -> &PeerLink {
        &self.link
    }

    /// The placement epoch known.
    pub fn epoch(&self) -> u64 {
        self.map.read().unwrap_or_else(|p| p.into_inner()).epoch
    }

    /// The owners last known for `version`.
    pub(crate) fn owners_of(&self, version: DatasetVersion) -> Option<HashMap<ShardId, NodeId>> {
        self.map.read().unwrap_or_else(|p| p.into_inner()).owners.get(&version).cloned()
    }

    /// Replaces the placement. `map.former` holds what the coordinator
    /// says each shard was handed from; shards it says nothing of get this
    /// node's own reckoning from the placement before ([`handoffs`]).
    pub(crate) fn replace(&self, mut map: PlacementMap) {
        let mut current = self.map.write().unwrap_or_else(|p| p.into_inner());
        for (version, local) in handoffs(self.me, &current, &map) {
            let given = map.former.entry(version).or_default();
            for (shard, from) in local {
                given.entry(shard).or_insert(from);
            }
        }
        // Only shards this node owns, from live nodes, matter.
        for (version, former) in &mut map.former {
            let owners = map.owners.get(version);
            former.retain(|shard, from| {
                owners.and_then(|o| o.get(shard)) == Some(&self.me) && *from != self.me && map.addrs.contains_key(from)
            });
        }
        *current = map;
        drop(current);
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
        self.replace(PlacementMap { epoch, addrs, owners, former: HashMap::new() });
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
            let owner = c.map.read().unwrap_or_else(|p| p.into_inner()).owners.get(&version)?.get(&shard).copied()?;
            (owner != failed).then_some(())
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

/// For every shard `next` gives to `me`, its former owner by
/// [`former_owner`] (live: has an address in `next`).
fn handoffs(
    me: NodeId,
    before: &PlacementMap,
    next: &PlacementMap,
) -> HashMap<DatasetVersion, HashMap<ShardId, NodeId>> {
    let mut out: HashMap<DatasetVersion, HashMap<ShardId, NodeId>> = HashMap::new();
    for (version, owners) in &next.owners {
        for (shard, owner) in owners {
            let before_owner = before.owners.get(version).and_then(|o| o.get(shard)).copied();
            let before_former = before.former.get(version).and_then(|f| f.get(shard)).copied();
            let live = |n: NodeId| next.addrs.contains_key(&n);
            if let Some(f) = former_owner(me, *owner, before_owner, before_former, live) {
                out.entry(*version).or_default().insert(*shard, f);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(epoch: u64, live: &[u64], owners: &[u64]) -> PlacementMap {
        let v = DatasetVersion([7; 16]);
        PlacementMap {
            epoch,
            addrs: live.iter().map(|&n| (NodeId(n), SocketAddr::from(([10, 0, 0, n as u8], 7000)))).collect(),
            owners: [(
                v,
                owners
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| (ShardId { file: 0, row_group: i as u32 }, NodeId(n)))
                    .collect(),
            )]
            .into(),
            former: HashMap::new(),
        }
    }

    #[test]
    fn a_shard_moved_here_is_asked_of_its_former_owner_while_that_node_lives() {
        let me = NodeId(1);
        let v = DatasetVersion([7; 16]);
        let s = |i: u32| ShardId { file: 0, row_group: i };
        // Shard 0 moves from node 2 to me; shard 1 stays mine; shard 2
        // stays node 3's.
        let before = map(1, &[1, 2, 3], &[2, 1, 3]);
        let mut next = map(2, &[1, 2, 3], &[1, 1, 3]);
        next.former = handoffs(me, &before, &next);
        assert_eq!(next.former[&v].get(&s(0)), Some(&NodeId(2)));
        assert_eq!(next.former[&v].len(), 1);
        // The next placement keeps me as owner: the handoff is remembered.
        let mut later = map(3, &[1, 2, 3], &[1, 1, 3]);
        later.former = handoffs(me, &next, &later);
        assert_eq!(later.former[&v].get(&s(0)), Some(&NodeId(2)));
        // Node 2 dies: it is not asked.
        let mut gone = map(4, &[1, 3], &[1, 1, 3]);
        gone.former = handoffs(me, &later, &gone);
        assert!(gone.former.get(&v).is_none_or(|f| f.is_empty()));
    }
}
