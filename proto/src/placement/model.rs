//! What a placement is: its inputs ([`NodeWeight`], [`shard_key`]), its
//! output ([`Placement`]), what refuses it ([`PlacementError`]), and the
//! load bound every planner keeps (caps and floors per node).
//!
//! Nothing here places a shard; the planners in the sibling modules build a
//! [`Placement`] through its fields, which is why they are `pub(super)`.

use crate::ids::{DatasetVersion, NodeId, ShardId};
use crate::rng::seed_of;
use thiserror::Error;

/// The load bound, as a fraction: no node holds more than
/// `LOAD_BOUND_NUM / LOAD_BOUND_DEN` times its weighted share of the shards
/// (rounded down), unless that share is under `LOAD_BOUND_DEN` shards, where
/// it may hold its share rounded up.
pub const LOAD_BOUND_NUM: u64 = 11;
/// Denominator of the load bound; see [`LOAD_BOUND_NUM`].
pub const LOAD_BOUND_DEN: u64 = 10;

/// Domain tag, so that [`shard_key`] never coincides with other uses of
/// [`seed_of`].
const SHARD_KEY_TAG: u64 = 0x5348_4152_444b_4559; // "SHARDKEY"

/// A live node and its weight (its cache capacity in bytes; only ratios
/// between weights matter).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize)]
pub struct NodeWeight {
    /// The node.
    pub node: NodeId,
    /// Its weight. A node of weight 0 is live but owns nothing.
    pub weight: u64,
}

/// Inputs that admit no placement.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlacementError {
    /// The node list is empty.
    #[error("no live nodes to place shards on")]
    NoNodes,
    /// Every node has weight 0.
    #[error("the live nodes have a total weight of 0")]
    ZeroWeight,
    /// A node appears twice in the node list.
    #[error("node {0} is listed twice")]
    DuplicateNode(NodeId),
    /// More shards or nodes than a placement can index (`u32`).
    #[error("{what} count {count} exceeds {max}", max = u32::MAX)]
    TooMany {
        /// "shard" or "node".
        what: &'static str,
        /// The count given.
        count: usize,
    },
    /// Two placements compared shard by shard cover different shard counts.
    #[error("placements of {before} and {after} shards cannot be compared")]
    ShardCountMismatch {
        /// Shards in the earlier placement.
        before: usize,
        /// Shards in the later placement.
        after: usize,
    },
    /// The previous owners given to [`plan_rebalance`](super::plan_rebalance) are not one per shard.
    #[error("{owners} previous owners given for {shards} shards")]
    PreviousLength {
        /// Shard keys given.
        shards: usize,
        /// Previous owners given.
        owners: usize,
    },
}

/// The stable placement key of one shard of one dataset version, for
/// [`plan_placement`](super::plan_placement). Different versions place their shards independently.
pub fn shard_key(version: DatasetVersion, shard: ShardId) -> u64 {
    let mut hi = [0u8; 8];
    hi.copy_from_slice(&version.0[8..]);
    seed_of(&[
        SHARD_KEY_TAG,
        version.prefix_u64(),
        u64::from_le_bytes(hi),
        u64::from(shard.file),
        u64::from(shard.row_group),
    ])
}

/// The owner of every shard, and each node's load and cap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Live nodes, sorted by id.
    pub(super) nodes: Vec<NodeWeight>,
    /// Per shard (in the caller's order), an index into `nodes`.
    pub(super) owner: Vec<u32>,
    /// Per node, the shards it owns.
    pub(super) loads: Vec<u32>,
    /// Per node, the most shards it may own.
    pub(super) caps: Vec<u32>,
}

impl Placement {
    /// Number of shards placed.
    pub fn len(&self) -> usize {
        self.owner.len()
    }

    /// Whether there are no shards.
    pub fn is_empty(&self) -> bool {
        self.owner.is_empty()
    }

    /// The owner of shard `i` (the `i`-th key given to [`plan_placement`](super::plan_placement)
    /// or [`plan_rebalance`](super::plan_rebalance)), or `None` if there is no such shard.
    pub fn owner(&self, i: usize) -> Option<NodeId> {
        self.owner.get(i).map(|&n| self.nodes[n as usize].node)
    }

    /// Owners of all shards, in the order their keys were given.
    pub fn owners(&self) -> impl ExactSizeIterator<Item = NodeId> + '_ {
        self.owner.iter().map(|&n| self.nodes[n as usize].node)
    }

    /// The live nodes, sorted by id.
    pub fn nodes(&self) -> &[NodeWeight] {
        &self.nodes
    }

    /// `(node, shards owned, cap)` for every live node, sorted by node id.
    pub fn loads(&self) -> impl ExactSizeIterator<Item = (NodeId, u32, u32)> + '_ {
        self.nodes.iter().zip(&self.loads).zip(&self.caps).map(|((n, &l), &c)| (n.node, l, c))
    }

    /// Shards owned by `node`, or `None` if it is not live.
    pub fn load(&self, node: NodeId) -> Option<u32> {
        self.index_of(node).map(|i| self.loads[i])
    }

    /// The most shards `node` may own, or `None` if it is not live.
    pub fn cap(&self, node: NodeId) -> Option<u32> {
        self.index_of(node).map(|i| self.caps[i])
    }

    /// The largest ratio of a node's load to its weighted share of the
    /// shards (`S * w / W`), over nodes of non-zero weight; 0 with no shards.
    pub fn max_over_mean(&self) -> f64 {
        let total_weight: u128 = self.nodes.iter().map(|n| u128::from(n.weight)).sum();
        let shards = self.owner.len() as f64;
        if shards == 0.0 || total_weight == 0 {
            return 0.0;
        }
        self.nodes
            .iter()
            .zip(&self.loads)
            .filter(|(n, _)| n.weight > 0)
            .map(|(n, &l)| f64::from(l) / (shards * n.weight as f64 / total_weight as f64))
            .fold(0.0, f64::max)
    }

    /// Shards whose owner differs between `before` and `self` (two
    /// placements of the same shard keys).
    pub fn moved_since(&self, before: &Placement) -> Result<usize, PlacementError> {
        if before.len() != self.len() {
            return Err(PlacementError::ShardCountMismatch { before: before.len(), after: self.len() });
        }
        Ok(before.owners().zip(self.owners()).filter(|(a, b)| a != b).count())
    }

    fn index_of(&self, node: NodeId) -> Option<usize> {
        self.nodes.binary_search_by_key(&node, |n| n.node).ok()
    }
}

/// `floor(share)` for `share = shards * weight / total`.
pub(super) fn floor_of(shards: usize, weight: u64, total_weight: u128) -> u32 {
    // At most `shards`, which fits in u32 (checked by the caller).
    (shards as u128 * u128::from(weight) / total_weight) as u32
}

/// Checks the node list and returns it sorted by node id, with its total
/// weight. `shards` is checked to fit the `u32` indices of a placement.
pub(super) fn checked_nodes(shards: usize, nodes: &[NodeWeight]) -> Result<(Vec<NodeWeight>, u128), PlacementError> {
    if u32::try_from(shards).is_err() {
        return Err(PlacementError::TooMany { what: "shard", count: shards });
    }
    if u32::try_from(nodes.len()).is_err() {
        return Err(PlacementError::TooMany { what: "node", count: nodes.len() });
    }
    let mut nodes = nodes.to_vec();
    nodes.sort_unstable();
    if nodes.is_empty() {
        return Err(PlacementError::NoNodes);
    }
    if let Some(w) = nodes.windows(2).find(|w| w[0].node == w[1].node) {
        return Err(PlacementError::DuplicateNode(w[0].node));
    }
    let total_weight: u128 = nodes.iter().map(|n| u128::from(n.weight)).sum();
    if total_weight == 0 {
        return Err(PlacementError::ZeroWeight);
    }
    Ok((nodes, total_weight))
}

/// `max(floor(1.1 * share), ceil(share))` for `share = shards * weight / total`.
pub(super) fn cap_of(shards: usize, weight: u64, total_weight: u128) -> u32 {
    let s = shards as u128 * u128::from(weight);
    let bounded = s * u128::from(LOAD_BOUND_NUM) / (total_weight * u128::from(LOAD_BOUND_DEN));
    let share_up = s.div_ceil(total_weight);
    // Both are at most 1.1 * shards, and shards fits in u32 (checked by the caller).
    bounded.max(share_up).min(u128::from(u32::MAX)) as u32
}
