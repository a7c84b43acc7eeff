//! Helpers shared by the tests of `accept.rs` and `rebalance.rs`: inputs,
//! and an oracle that rebuilds each shard's claims by brute force, apart
//! from the planners it checks.

use super::model::NodeWeight;
use super::ring::{Claim, Ring, SHARD_TAG, all_points, lattice};
use crate::ids::NodeId;
use crate::rng::seed_of;
use proptest::prelude::*;

/// Nodes with the given ids, all of the same weight.
pub(super) fn equal_nodes(ids: impl IntoIterator<Item = u64>) -> Vec<NodeWeight> {
    ids.into_iter().map(|i| NodeWeight { node: NodeId(i), weight: 1 << 30 }).collect()
}

/// `n` distinct-looking shard keys, drawn from `salt`.
pub(super) fn keys(n: usize, salt: u64) -> Vec<u64> {
    (0..n as u64).map(|i| seed_of(&[salt, i])).collect()
}

/// The placement's view of one instance, rebuilt independently of
/// [`plan_placement`]: the ring, each shard's rank, and a brute-force
/// claim of any shard on any node.
pub(super) struct Oracle {
    pub(super) nodes: Vec<NodeWeight>,
    /// Each node's points.
    points: Vec<Vec<u64>>,
    /// Rank of each shard (caller order).
    pub(super) rank: Vec<u32>,
    shards: usize,
}

impl Oracle {
    pub(super) fn new(shard_keys: &[u64], nodes: &[NodeWeight]) -> Oracle {
        let mut nodes = nodes.to_vec();
        nodes.sort_unstable();
        let mut order: Vec<(u64, usize)> =
            shard_keys.iter().enumerate().map(|(i, &k)| (seed_of(&[SHARD_TAG, k]), i)).collect();
        order.sort_unstable();
        let mut rank = vec![0u32; shard_keys.len()];
        for (r, &(_, i)) in order.iter().enumerate() {
            rank[i] = r as u32;
        }
        let ring = Ring::new(&nodes);
        let mut points = vec![Vec::new(); nodes.len()];
        for (pos, n) in all_points(&ring) {
            points[n as usize].push(pos);
        }
        Oracle { nodes, points, rank, shards: shard_keys.len() }
    }

    /// Shard `i`'s claim on node index `n`: the nearest of the node's
    /// points, by (distance, side), then the shard's rank. `None` if the
    /// node has no points.
    pub(super) fn claim(&self, i: usize, n: usize) -> Option<Claim> {
        let x = lattice(self.rank[i], self.shards);
        self.points[n]
            .iter()
            .map(|&p| {
                let (cw, ccw) = (p.wrapping_sub(x), x.wrapping_sub(p));
                if cw <= ccw { (cw, 0) } else { (ccw, 1) }
            })
            .min()
            .map(|(d, dir)| Claim { d, dir, rank: self.rank[i] })
    }

    pub(super) fn index(&self, node: NodeId) -> usize {
        self.nodes.binary_search_by_key(&node, |n| n.node).unwrap()
    }

    /// Whether shard `i` ranks node index `a` above node index `b`: a
    /// smaller distance over weight, ties to the lower node.
    pub(super) fn prefers(&self, i: usize, a: usize, b: usize) -> bool {
        let (ca, cb) = (self.claim(i, a).unwrap(), self.claim(i, b).unwrap());
        let (wa, wb) = (u128::from(self.nodes[a].weight), u128::from(self.nodes[b].weight));
        (u128::from(ca.d) * wb, a) < (u128::from(cb.d) * wa, b)
    }
}

/// One to eleven nodes of weights 0 to 4, at least one of them positive.
pub(super) fn arb_nodes() -> impl Strategy<Value = Vec<NodeWeight>> {
    prop::collection::btree_map(any::<u64>(), prop_oneof![9 => 1u64..=4, 1 => Just(0u64)], 1..12).prop_map(|m| {
        let mut v: Vec<NodeWeight> =
            m.into_iter().map(|(node, weight)| NodeWeight { node: NodeId(node), weight }).collect();
        if v.iter().all(|n| n.weight == 0) {
            v[0].weight = 1;
        }
        v
    })
}
