//! The incremental re-placement, [`plan_rebalance`]: keep, shed, place the
//! orphans, fill the newcomers (see the module doc of `placement`,
//! "Incremental re-placement", for what each step guarantees).

use super::accept::{defer, plan_placement, propose_first};
use super::model::{NodeWeight, Placement, PlacementError, cap_of, checked_nodes, floor_of};
use super::ring::{Claim, Ring, claim_on, lattice_order, sorted_points};
use crate::ids::NodeId;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Re-places `shard_keys` on `nodes` after a membership change, starting
/// from `previous`, the owner of each shard (same order as `shard_keys`;
/// owners may be nodes no longer in `nodes`). Pure: the owners depend only
/// on the keys, the previous owners and the set of nodes with their
/// weights, not on the order of `nodes`; permuting the keys together with
/// `previous` permutes the owners alike.
///
/// A shard keeps its owner unless that owner is gone or has weight 0, or is
/// above its new cap and ranks the shard among its farthest. Such orphans
/// are placed by deferred acceptance within the room the kept shards leave.
/// Then every newcomer (a node of non-zero weight that owned no shard in
/// `previous`) pulls the shards nearest its points from nodes above their
/// floor `floor(S * w / W)`, up to its own floor. See the module doc,
/// "Incremental re-placement", for what moves. When no previous owner is
/// still live with non-zero weight, this is [`plan_placement`].
pub fn plan_rebalance(
    shard_keys: &[u64],
    previous: &[NodeId],
    nodes: &[NodeWeight],
) -> Result<Placement, PlacementError> {
    rebalance(shard_keys, previous, nodes, FillBudget::DEFAULT)
}

/// [`plan_rebalance`] with a given bound on the fill step's work.
fn rebalance(
    shard_keys: &[u64],
    previous: &[NodeId],
    nodes: &[NodeWeight],
    budget: FillBudget,
) -> Result<Placement, PlacementError> {
    let shards = shard_keys.len();
    if previous.len() != shards {
        return Err(PlacementError::PreviousLength { shards, owners: previous.len() });
    }
    let (nodes, total_weight) = checked_nodes(shards, nodes)?;

    // 1. Keep every shard whose previous owner is live with non-zero
    // weight. The steps work in rank order, the order of the lattice. The
    // map only answers lookups, so its order cannot leak into the result;
    // lookups run in the caller's order, then are permuted, because a
    // million binary searches in random order cost a tenth of a second.
    let order = lattice_order(shard_keys);
    let index: HashMap<NodeId, u32> =
        nodes.iter().enumerate().filter(|(_, n)| n.weight > 0).map(|(i, n)| (n.node, i as u32)).collect();
    let kept: Vec<u32> = previous.iter().map(|id| index.get(id).copied().unwrap_or(UNOWNED)).collect();
    let mut own: Vec<u32> = order.iter().map(|&(_, i)| kept[i as usize]).collect();
    drop(kept);
    if own.iter().all(|&n| n == UNOWNED) {
        // Nothing to keep: the initial assignment.
        return plan_placement(shard_keys, &nodes);
    }
    let caps: Vec<u32> = nodes.iter().map(|n| cap_of(shards, n.weight, total_weight)).collect();
    let floors: Vec<u32> = nodes.iter().map(|n| floor_of(shards, n.weight, total_weight)).collect();
    let mut loads = vec![0u32; nodes.len()];
    for &n in own.iter().filter(|&&n| n != UNOWNED) {
        loads[n as usize] += 1;
    }
    let newcomer: Vec<bool> = nodes.iter().zip(&loads).map(|(n, &load)| n.weight > 0 && load == 0).collect();

    // 2. Nodes above their cap shed their weakest claims.
    shed(&nodes, &caps, &mut own, &mut loads);
    // 3. Orphans go where deferred acceptance sends them, within the room
    // the kept shards leave.
    place_orphans(&nodes, &caps, &mut own, &mut loads);
    // 4. Newcomers pull up to their floor.
    fill(&nodes, &floors, &newcomer, &mut own, &mut loads, budget);

    let mut owner = vec![0u32; shards];
    for (&(_, i), &n) in order.iter().zip(&own) {
        owner[i as usize] = n;
    }
    Ok(Placement { nodes, owner, loads, caps })
}

/// A shard without an owner (yet), in [`plan_rebalance`]'s working state.
const UNOWNED: u32 = u32::MAX;

/// How many (newcomer, shard) pairs the fill step of [`plan_rebalance`]
/// examines in order of claim before it hands out the remaining deficits in
/// one pass over the shards: `per_shard * S + per_newcomer * (newcomers
/// below their floor)`.
#[derive(Clone, Copy, Debug)]
struct FillBudget {
    per_shard: u64,
    per_newcomer: u64,
}

impl FillBudget {
    /// One newcomer examines about twice its floor when half the shards sit
    /// above their owner's floor (measured: 200 pairs for a floor of 100,
    /// 250 per newcomer when 4,500 of them join at once). `2 * S` lets a
    /// single newcomer examine every shard, with as much again to share
    /// among the rest, when donors are scarce.
    const DEFAULT: FillBudget = FillBudget { per_shard: 2, per_newcomer: 1024 };
}

/// Step 2 of [`plan_rebalance`]: every node above its cap gives up the
/// shards it ranks lowest (largest claim: farthest from its points, then
/// counter-clockwise, then higher rank) until it is at its cap. `own[r]` is
/// the owner of the shard of rank `r`, or [`UNOWNED`].
fn shed(nodes: &[NodeWeight], caps: &[u32], own: &mut [u32], loads: &mut [u32]) {
    let points: Vec<Option<Vec<u64>>> =
        (0..nodes.len()).map(|n| (loads[n] > caps[n]).then(|| sorted_points(nodes[n].node))).collect();
    if points.iter().all(Option::is_none) {
        return;
    }
    // The claims of the shards of each node above its cap, grouped by node.
    let shards = own.len();
    let mut start = vec![0usize; nodes.len() + 1];
    for n in 0..nodes.len() {
        start[n + 1] = start[n] + if points[n].is_some() { loads[n] as usize } else { 0 };
    }
    let mut claims = vec![Claim { d: 0, dir: 0, rank: 0 }; start[nodes.len()]];
    let mut next = start.clone();
    for (r, &n) in own.iter().enumerate().filter(|&(_, &n)| n != UNOWNED) {
        if let Some(pts) = &points[n as usize] {
            claims[next[n as usize]] = claim_on(pts, r as u32, shards);
            next[n as usize] += 1;
        }
    }
    for n in (0..nodes.len()).filter(|&n| points[n].is_some()) {
        let group = &mut claims[start[n]..start[n + 1]];
        let cap = caps[n] as usize;
        // Claims are distinct (ranks are), so the `cap` strongest are one
        // set; the rest are shed.
        group.select_nth_unstable(cap);
        for claim in &group[cap..] {
            own[claim.rank as usize] = UNOWNED;
        }
        loads[n] = caps[n];
    }
}

/// Step 3 of [`plan_rebalance`]: shard-proposing deferred acceptance of the
/// unowned shards over every node, node `n` taking at most
/// `caps[n] - loads[n]` of them. The kept shards are not part of it: an
/// orphan never displaces a kept shard.
fn place_orphans(nodes: &[NodeWeight], caps: &[u32], own: &mut [u32], loads: &mut [u32]) {
    let orphans: Vec<u32> = (0..own.len() as u32).filter(|&r| own[r as usize] == UNOWNED).collect();
    if orphans.is_empty() {
        return;
    }
    let shards = own.len();
    let ring = Ring::new(nodes);
    // Loads are at most caps after shedding; caps sum to at least the shard
    // count, so the room left is at least the number of orphans.
    let room: Vec<u32> = caps.iter().zip(loads.iter()).map(|(&c, &l)| c - l).collect();
    let mut held: Vec<BinaryHeap<Claim>> = vec![BinaryHeap::new(); nodes.len()];
    let refused = propose_first(&ring, shards, orphans.into_iter(), &mut held, &room);
    defer(&ring, shards, &mut held, &room, refused);
    for (n, heap) in held.iter().enumerate() {
        loads[n] += heap.len() as u32;
        for claim in heap.iter() {
            own[claim.rank as usize] = n as u32;
        }
    }
}

/// Step 4 of [`plan_rebalance`]: every newcomer below its floor pulls
/// shards from nodes above their floor (donors), strongest claim first
/// (nearest its points), until it reaches its floor. All newcomers pull at
/// once: (newcomer, shard) pairs are taken in order of claim, then shard
/// rank, then node, so a contested shard goes to the nearest newcomer that
/// still wants one. Past the work bound, the rest of the deficits are
/// handed out in one pass over the shards in rank order.
///
/// Both always fill every deficit: the shards above floors number
/// `S - sum(floors) + (the deficits below floors)`, at least the newcomers'
/// deficits; a node that stops being a donor never becomes one again here
/// (donors only lose shards, newcomers never pass their floor); so a
/// newcomer that has examined every shard, or a pass over every shard, has
/// found all the donors' shards there are.
fn fill(
    nodes: &[NodeWeight],
    floors: &[u32],
    newcomer: &[bool],
    own: &mut [u32],
    loads: &mut [u32],
    budget: FillBudget,
) {
    let shards = own.len();
    let mut pullers: Vec<Puller> = (0..nodes.len())
        .filter(|&n| newcomer[n] && loads[n] < floors[n])
        .map(|n| Puller::new(n as u32, nodes[n].node, floors[n] - loads[n], shards))
        .collect();
    let mut remaining: u64 = pullers.iter().map(|p| u64::from(p.deficit)).sum();
    if remaining == 0 {
        return;
    }
    let limit = budget.per_shard * shards as u64 + budget.per_newcomer * pullers.len() as u64;
    let mut take = |r: usize, p: &mut Puller| {
        let donor = own[r] as usize;
        if loads[donor] <= floors[donor] {
            return false;
        }
        own[r] = p.node;
        loads[donor] -= 1;
        loads[p.node as usize] += 1;
        p.deficit -= 1;
        true
    };

    // Each hungry newcomer's strongest claim not yet examined, by slot
    // (slots follow node index, so ties go to the lower node id).
    let mut heads: BinaryHeap<Reverse<(Claim, u32)>> =
        pullers.iter().enumerate().filter_map(|(slot, p)| Some(Reverse((p.peek()?, slot as u32)))).collect();
    let mut work = 0u64;
    while remaining > 0 && work < limit {
        let Some(Reverse((claim, slot))) = heads.pop() else { break };
        work += 1;
        let p = &mut pullers[slot as usize];
        p.advance(shards);
        if take(claim.rank as usize, p) {
            remaining -= 1;
        }
        if p.deficit > 0
            && let Some(next) = p.peek()
        {
            heads.push(Reverse((next, slot)));
        }
    }

    // Over the work bound: the first donors' shards in rank order.
    let mut hungry = pullers.iter_mut().filter(|p| p.deficit > 0);
    let mut current = hungry.next();
    for r in 0..shards {
        let Some(p) = current.as_deref_mut() else { break };
        if take(r, p) && p.deficit == 0 {
            current = hungry.next();
        }
    }
    debug_assert!(pullers.iter().all(|p| p.deficit == 0), "donors hold at least the newcomers' deficits");
}

/// One newcomer in the fill step: its deficit, and its walk over the ring
/// in order of its claim.
struct Puller {
    /// The newcomer's node index.
    node: u32,
    /// Shards still wanted.
    deficit: u32,
    /// The gaps between its consecutive points.
    gaps: Vec<Gap>,
    /// The strongest claim left in each gap that has shards left, with the
    /// gap's index.
    heads: BinaryHeap<Reverse<(Claim, u32)>>,
}

impl Puller {
    fn new(node: u32, id: NodeId, deficit: u32, shards: usize) -> Puller {
        let pts = sorted_points(id);
        let gaps: Vec<Gap> = (0..pts.len())
            .map(|i| {
                let b = pts.get(i + 1).map_or(u128::from(pts[0]) + (1 << 64), |&b| u128::from(b));
                Gap::new(pts[i], b, shards)
            })
            .collect();
        let heads =
            gaps.iter().enumerate().filter_map(|(g, gap)| Some(Reverse((gap.head(shards)?, g as u32)))).collect();
        Puller { node, deficit, gaps, heads }
    }

    /// The newcomer's strongest claim not yet examined.
    fn peek(&self) -> Option<Claim> {
        self.heads.peek().map(|h| h.0.0)
    }

    /// Marks the strongest claim examined.
    fn advance(&mut self, shards: usize) {
        if let Some(Reverse((claim, g))) = self.heads.pop() {
            let gap = &mut self.gaps[g as usize];
            gap.take(claim.dir);
            if let Some(next) = gap.head(shards) {
                self.heads.push(Reverse((next, g)));
            }
        }
    }
}

/// The shards between two consecutive points `a < b` of one node (`b` is
/// past `2^64` for the gap that wraps, and `a + 2^64` for a node with one
/// point), as the range `lo..hi` of unwrapped ranks (rank `v` sits at
/// [`position`]`(v)`; the shard is `v mod S`) at positions in `(a, b]`.
/// Such a shard's claim on the node is the smaller of `(b - x, clockwise)`
/// and `(x - a, counter-clockwise)`, so taking the nearer end each time
/// yields the gap's shards in order of claim. A node's gaps partition the
/// ring.
#[derive(Clone, Copy, Debug)]
struct Gap {
    a: u128,
    b: u128,
    lo: u64,
    hi: u64,
}

impl Gap {
    fn new(a: u64, b: u128, shards: usize) -> Gap {
        let a = u128::from(a);
        Gap { a, b, lo: first_rank_at(a + 1, shards), hi: first_rank_at(b + 1, shards) }
    }

    /// The strongest claim on a shard of the gap not yet taken.
    fn head(&self, shards: usize) -> Option<Claim> {
        if self.lo >= self.hi {
            return None;
        }
        let ccw = position(self.lo, shards) - self.a;
        let cw = self.b - position(self.hi - 1, shards);
        // `cw < b - a <= 2^64`: the shard nearest `b` lies after `a`.
        let (d, dir, v) = if cw <= ccw { (cw, 0, self.hi - 1) } else { (ccw, 1, self.lo) };
        Some(Claim { d: d as u64, dir, rank: (v % shards as u64) as u32 })
    }

    /// Drops the head, which came from the clockwise end (`dir` 0: the
    /// shard nearest `b`) or the counter-clockwise end.
    fn take(&mut self, dir: u8) {
        if dir == 0 {
            self.hi -= 1;
        } else {
            self.lo += 1;
        }
    }
}

/// Unwrapped ring position of unwrapped rank `v` (`0 <= v < 2S`):
/// [`lattice`](super::ring::lattice) for `v < S`, plus `2^64` beyond.
fn position(v: u64, shards: usize) -> u128 {
    (u128::from(v) << 64) / shards as u128
}

/// The first unwrapped rank at unwrapped position `y` or later
/// (`0 <= y <= 2^65`): `ceil(y * S / 2^64)`, since `position(v) >= y`
/// exactly when `v * 2^64 / S >= y`.
fn first_rank_at(y: u128, shards: usize) -> u64 {
    ((y * shards as u128 + u128::from(u64::MAX)) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::test_support::{Oracle, arb_nodes, equal_nodes, keys};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn owners_of(p: &Placement) -> Vec<NodeId> {
        p.owners().collect()
    }

    fn share_floor(shards: usize, weight: u64, total_weight: u64) -> u32 {
        (shards as u128 * u128::from(weight) / u128::from(total_weight)) as u32
    }

    /// One owner per shard among the nodes of non-zero weight; loads
    /// counted right and within caps; caps as the module doc states.
    fn assert_valid(shards: usize, nodes: &[NodeWeight], p: &Placement) -> Result<(), TestCaseError> {
        prop_assert_eq!(p.len(), shards);
        let mut counted: BTreeMap<NodeId, u32> = BTreeMap::new();
        for owner in p.owners() {
            let w = nodes.iter().find(|w| w.node == owner);
            prop_assert!(w.is_some_and(|w| w.weight > 0), "owner {} is not a live node of positive weight", owner);
            *counted.entry(owner).or_default() += 1;
        }
        let total_weight: u64 = nodes.iter().map(|w| w.weight).sum();
        prop_assert_eq!(p.nodes().len(), nodes.len());
        for (node, load, cap) in p.loads() {
            prop_assert_eq!(counted.get(&node).copied().unwrap_or(0), load);
            prop_assert!(load <= cap, "node {} holds {} over its cap {}", node, load, cap);
            let w = nodes.iter().find(|w| w.node == node).unwrap().weight;
            let share = shards as f64 * w as f64 / total_weight as f64;
            prop_assert!(f64::from(cap) <= (1.1 * share).floor().max(share.ceil()) + 1e-9);
        }
        Ok(())
    }

    /// Whether every node of non-zero weight has a share of at least 10
    /// shards, where the caps give max/mean <= 1.1.
    fn shares_allow_balance(shards: usize, nodes: &[NodeWeight]) -> bool {
        let total_weight: u64 = nodes.iter().map(|w| w.weight).sum();
        nodes.iter().filter(|w| w.weight > 0).all(|w| share_floor(shards, w.weight, total_weight) >= 10)
    }

    /// What any re-placement from `previous` to `after` on `nodes` moves, as
    /// the module doc states it. Call a node of non-zero weight that owned
    /// no shard in `previous` a newcomer, and a node's excess
    /// `max(0, previous load - new cap)`. Then: a shard whose previous owner
    /// is live with non-zero weight keeps it, unless it ends on a newcomer
    /// or its owner had an excess; at most the excess of each node leaves it
    /// for a node other than a newcomer, and at least the excess leaves it;
    /// every newcomer ends at or above its floor, and so does every node
    /// that lost a shard. Returns the shards moved.
    fn assert_rebalance_moves(
        previous: &[NodeId],
        nodes: &[NodeWeight],
        after: &Placement,
    ) -> Result<usize, TestCaseError> {
        let weight: BTreeMap<NodeId, u64> = nodes.iter().map(|w| (w.node, w.weight)).collect();
        let live = |n: NodeId| weight.get(&n).is_some_and(|&w| w > 0);
        let mut before: BTreeMap<NodeId, u32> = BTreeMap::new();
        for &n in previous.iter().filter(|&&n| live(n)) {
            *before.entry(n).or_default() += 1;
        }
        let newcomer = |n: NodeId| live(n) && !before.contains_key(&n);
        // Per previous owner: (shards moved off, of which not to a newcomer).
        let mut off: BTreeMap<NodeId, (u32, u32)> = BTreeMap::new();
        let mut moved = 0;
        for (i, &a) in previous.iter().enumerate() {
            let b = after.owner(i).unwrap();
            if a == b {
                continue;
            }
            moved += 1;
            if live(a) {
                let e = off.entry(a).or_default();
                e.0 += 1;
                e.1 += u32::from(!newcomer(b));
            }
        }
        for (&n, &load) in &before {
            let excess = load.saturating_sub(after.cap(n).unwrap());
            let (all, other) = off.get(&n).copied().unwrap_or_default();
            prop_assert!(other <= excess, "{} shards left {} for old nodes, beyond its excess {}", other, n, excess);
            prop_assert!(all >= excess, "{} still holds more than its cap", n);
        }
        let total_weight: u64 = nodes.iter().map(|w| w.weight).sum();
        let floor = |n: NodeId| share_floor(previous.len(), weight[&n], total_weight);
        for w in nodes.iter().filter(|w| newcomer(w.node)) {
            prop_assert!(after.load(w.node).unwrap() >= floor(w.node), "newcomer {} below its floor", w.node);
        }
        for &n in off.keys() {
            prop_assert!(after.load(n).unwrap() >= floor(n), "{} lost shards and ended below its floor", n);
        }
        Ok(moved)
    }

    /// In a re-placement without newcomers, the shards that moved (the
    /// orphans) sit where deferred acceptance within the room left puts
    /// them: no orphan ranks a node above its owner while that node has
    /// room left for orphans or holds an orphan with a weaker claim.
    fn assert_orphans_stable(
        shard_keys: &[u64],
        previous: &[NodeId],
        nodes: &[NodeWeight],
        after: &Placement,
    ) -> Result<(), TestCaseError> {
        let o = Oracle::new(shard_keys, nodes);
        let n = o.nodes.len();
        let owners: Vec<usize> = after.owners().map(|id| o.index(id)).collect();
        let mut held = vec![0u32; n];
        let mut weakest: Vec<Option<Claim>> = vec![None; n];
        let orphans: Vec<usize> = (0..shard_keys.len()).filter(|&i| previous[i] != o.nodes[owners[i]].node).collect();
        for &i in &orphans {
            weakest[owners[i]] = weakest[owners[i]].max(o.claim(i, owners[i]));
        }
        for &m in &owners {
            held[m] += 1;
        }
        for &i in &orphans {
            for m in (0..n).filter(|&m| m != owners[i]) {
                let Some(c) = o.claim(i, m) else { continue };
                if o.prefers(i, m, owners[i]) {
                    let full = held[m] == after.caps[m];
                    prop_assert!(full && weakest[m] < Some(c), "orphan {} and node {} block the placement", i, m);
                }
            }
        }
        Ok(())
    }

    #[test]
    fn rebalance_refuses_bad_inputs() {
        let nodes = equal_nodes([1, 2]);
        assert_eq!(
            plan_rebalance(&[1, 2, 3], &[NodeId(1)], &nodes),
            Err(PlacementError::PreviousLength { shards: 3, owners: 1 })
        );
        assert_eq!(plan_rebalance(&[1], &[NodeId(1)], &[]), Err(PlacementError::NoNodes));
        let zero = [NodeWeight { node: NodeId(1), weight: 0 }];
        assert_eq!(plan_rebalance(&[1], &[NodeId(1)], &zero), Err(PlacementError::ZeroWeight));
        let twice = [NodeWeight { node: NodeId(3), weight: 1 }, NodeWeight { node: NodeId(3), weight: 2 }];
        assert_eq!(plan_rebalance(&[1], &[NodeId(3)], &twice), Err(PlacementError::DuplicateNode(NodeId(3))));
        assert!(plan_rebalance(&[], &[], &nodes).unwrap().is_empty());
    }

    /// A newcomer's walk over the gaps between its points yields every
    /// shard once, in order of the node's claim on it, and `claim_on`
    /// agrees with the brute-force claim.
    #[test]
    fn a_newcomers_walk_visits_every_shard_once_by_claim() {
        for shards in [1usize, 2, 3, 7, 1000] {
            let k = keys(shards, 11);
            let nodes = equal_nodes([5, 6]);
            let o = Oracle::new(&k, &nodes);
            let pts = sorted_points(NodeId(5));
            let mut expected: Vec<Claim> = (0..shards).map(|i| o.claim(i, 0).unwrap()).collect();
            for (i, c) in expected.iter().enumerate() {
                assert_eq!(claim_on(&pts, o.rank[i], shards), *c);
            }
            expected.sort_unstable();
            let mut walk = Puller::new(0, NodeId(5), 0, shards);
            let mut got = Vec::new();
            while let Some(c) = walk.peek() {
                got.push(c);
                walk.advance(shards);
            }
            assert_eq!(got, expected, "{shards} shards");
            // A node with a single point: one gap, the whole ring.
            for q in [0u64, 1, pts[0], u64::MAX] {
                let mut gap = Gap::new(q, u128::from(q) + (1 << 64), shards);
                let mut got = Vec::new();
                while let Some(c) = gap.head(shards) {
                    got.push(c);
                    gap.take(c.dir);
                }
                let mut expected: Vec<Claim> = (0..shards as u32).map(|r| claim_on(&[q], r, shards)).collect();
                expected.sort_unstable();
                assert_eq!(got, expected, "{shards} shards, point {q}");
            }
        }
    }

    /// At 100 shards per node, re-placing one event at a time: a leave moves
    /// exactly the leaver's shards, a join (caps unchanged) exactly the
    /// joiner's, which get its floor; balance holds throughout.
    #[test]
    fn rebalance_moves_only_the_event_s_shards_at_scale() {
        let n = 300u64;
        let k = keys(100 * n as usize, 5);
        let mut live = equal_nodes(1..=n);
        let mut now = plan_placement(&k, &live).unwrap();
        for e in 0..10u64 {
            let leaver = live[(e as usize * 37) % live.len()].node;
            live.retain(|w| w.node != leaver);
            let gone = plan_rebalance(&k, &owners_of(&now), &live).unwrap();
            assert_eq!(gone.moved_since(&now).unwrap(), now.load(leaver).unwrap() as usize);
            assert!(gone.max_over_mean() <= 1.1 + 1e-9);
            let joiner = NodeId(1000 + e);
            live.push(NodeWeight { node: joiner, weight: 1 << 30 });
            let back = plan_rebalance(&k, &owners_of(&gone), &live).unwrap();
            assert_eq!(back.cap(joiner), gone.cap(live[0].node), "caps unchanged");
            assert_eq!(back.moved_since(&gone).unwrap(), back.load(joiner).unwrap() as usize);
            assert_eq!(back.load(joiner), Some(100));
            assert!(back.max_over_mean() <= 1.1 + 1e-9);
            now = back;
        }
    }

    /// Half the nodes join at once: only shards that end on the newcomers
    /// move, each newcomer gets its floor; with a work bound of zero the
    /// fill step hands out the same number of shards by its linear pass.
    #[test]
    fn many_joins_at_once_move_only_shards_to_newcomers() {
        let k = keys(20_000, 6);
        let all = equal_nodes(1..=200);
        let first = plan_placement(&k, &all[..100]).unwrap();
        let previous = owners_of(&first);
        for budget in [FillBudget::DEFAULT, FillBudget { per_shard: 0, per_newcomer: 0 }] {
            let p = rebalance(&k, &previous, &all, budget).unwrap();
            let newcomers: u32 = all[100..].iter().map(|w| p.load(w.node).unwrap()).sum();
            // Caps drop from 220 to 110: the old nodes shed down to 110, and
            // the newcomers pull what they lack of their floor of 100.
            let moved = p.moved_since(&first).unwrap();
            assert_eq!(moved, newcomers as usize, "{budget:?}");
            assert!(all[100..].iter().all(|w| p.load(w.node) >= Some(100)), "{budget:?}");
            assert!(p.max_over_mean() <= 1.1 + 1e-9);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn rebalance_is_deterministic_and_order_free(
            nodes in arb_nodes(),
            extra in arb_nodes(),
            keep in any::<u64>(),
            n in 0usize..300,
            salt in any::<u64>(),
            seed in any::<u64>(),
        ) {
            // Previous owners from a placement over some of `nodes` and
            // some other nodes.
            let k = keys(n, salt);
            let mut before: Vec<NodeWeight> =
                nodes.iter().enumerate().filter(|(i, _)| keep >> (i % 64) & 1 == 1).map(|(_, w)| *w).collect();
            before.extend(extra.iter().filter(|e| nodes.iter().all(|w| w.node != e.node)));
            let previous = match plan_placement(&k, &before) {
                Ok(p) => owners_of(&p),
                Err(_) => vec![NodeId(0); n],
            };
            let p = plan_rebalance(&k, &previous, &nodes).unwrap();
            prop_assert_eq!(&p, &plan_rebalance(&k, &previous, &nodes).unwrap());
            let mut rng = crate::rng::Rng::new(seed);
            let mut shuffled_nodes = nodes.clone();
            rng.shuffle(&mut shuffled_nodes);
            let mut perm: Vec<usize> = (0..n).collect();
            rng.shuffle(&mut perm);
            let shuffled_keys: Vec<u64> = perm.iter().map(|&i| k[i]).collect();
            let shuffled_previous: Vec<NodeId> = perm.iter().map(|&i| previous[i]).collect();
            let q = plan_rebalance(&shuffled_keys, &shuffled_previous, &shuffled_nodes).unwrap();
            for (j, &i) in perm.iter().enumerate() {
                prop_assert_eq!(q.owner(j), p.owner(i));
            }
        }

        #[test]
        fn rebalance_from_any_previous_is_valid_and_moves_little(
            nodes in arb_nodes(),
            dead in prop::collection::vec(any::<u64>(), 0..3),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 0..400),
            salt in any::<u64>(),
        ) {
            // Arbitrary previous owners: live, zero-weight and unknown
            // nodes, loads anywhere from zero to far above the caps.
            let pool: Vec<NodeId> = nodes.iter().map(|w| w.node).chain(dead.into_iter().map(NodeId)).collect();
            let previous: Vec<NodeId> = picks.iter().map(|i| pool[i.index(pool.len())]).collect();
            let k = keys(previous.len(), salt);
            let p = plan_rebalance(&k, &previous, &nodes).unwrap();
            assert_valid(k.len(), &nodes, &p)?;
            assert_rebalance_moves(&previous, &nodes, &p)?;
        }

        #[test]
        fn rebalance_with_unchanged_membership_moves_nothing(
            nodes in arb_nodes(),
            dead in any::<u64>(),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 0..400),
            salt in any::<u64>(),
        ) {
            // Its own output is a fixed point: no node is above its cap, and
            // none of positive floor is empty, so nothing is orphaned, shed
            // or pulled.
            let pool: Vec<NodeId> = nodes.iter().map(|w| w.node).chain([NodeId(dead)]).collect();
            let previous: Vec<NodeId> = picks.iter().map(|i| pool[i.index(pool.len())]).collect();
            // (Not so for `plan_placement`'s output, which it returns when no
            // previous owner is live: a node of positive floor may own
            // nothing there.)
            prop_assume!(previous.iter().any(|&o| nodes.iter().any(|w| w.node == o && w.weight > 0)));
            let k = keys(previous.len(), salt);
            let p = plan_rebalance(&k, &previous, &nodes).unwrap();
            prop_assert_eq!(&plan_rebalance(&k, &owners_of(&p), &nodes).unwrap(), &p);
        }

        #[test]
        fn rebalance_is_balanced_when_shares_allow(
            nodes in arb_nodes(),
            per_weight in 20usize..60,
            salt in any::<u64>(),
            seed in any::<u64>(),
        ) {
            // Previous owners drawn at random among the nodes: far from
            // balanced.
            let total: u64 = nodes.iter().map(|w| w.weight).sum();
            let k = keys(per_weight * total as usize, salt);
            let mut rng = crate::rng::Rng::new(seed);
            let previous: Vec<NodeId> = k.iter().map(|_| nodes[rng.below(nodes.len() as u64) as usize].node).collect();
            let p = plan_rebalance(&k, &previous, &nodes).unwrap();
            prop_assert!(p.max_over_mean() <= 1.1 + 1e-9, "max/mean {}", p.max_over_mean());
        }

        #[test]
        fn rebalance_without_live_previous_owners_is_plan_placement(
            nodes in arb_nodes(),
            n in 0usize..300,
            salt in any::<u64>(),
            dead in any::<u64>(),
        ) {
            // Unknown owners, or live owners of weight 0.
            let k = keys(n, salt);
            let zero: Vec<NodeId> = nodes.iter().filter(|w| w.weight == 0).map(|w| w.node).collect();
            let unknown = NodeId(dead);
            prop_assume!(nodes.iter().all(|w| w.node != unknown));
            let previous: Vec<NodeId> =
                (0..n).map(|i| if i % 3 == 0 { zero.first().copied().unwrap_or(unknown) } else { unknown }).collect();
            prop_assert_eq!(plan_rebalance(&k, &previous, &nodes).unwrap(), plan_placement(&k, &nodes).unwrap());
        }

        #[test]
        fn rebalance_on_leave_moves_exactly_the_leavers_shards(
            nodes in arb_nodes(),
            per_weight in 1usize..40,
            salt in any::<u64>(),
            pick in any::<prop::sample::Index>(),
        ) {
            let total: u64 = nodes.iter().map(|w| w.weight).sum();
            let k = keys(per_weight * total as usize, salt);
            let before = plan_placement(&k, &nodes).unwrap();
            let leaver = nodes[pick.index(nodes.len())].node;
            let rest: Vec<NodeWeight> = nodes.iter().copied().filter(|w| w.node != leaver).collect();
            prop_assume!(rest.iter().any(|w| w.weight > 0));
            let previous = owners_of(&before);
            let after = plan_rebalance(&k, &previous, &rest).unwrap();
            assert_valid(k.len(), &rest, &after)?;
            let moved = assert_rebalance_moves(&previous, &rest, &after)?;
            // A leave never lowers a cap. So unless a live node owned
            // nothing before (then it pulls up to its floor as a newcomer),
            // exactly the leaver's shards move, and they sit where
            // deferred acceptance within the room left sends them.
            if rest.iter().all(|w| w.weight == 0 || before.load(w.node) > Some(0)) {
                prop_assert_eq!(moved, before.load(leaver).unwrap() as usize);
                assert_orphans_stable(&k, &previous, &rest, &after)?;
            } else {
                for (i, &a) in previous.iter().enumerate() {
                    let b = after.owner(i).unwrap();
                    let allowed = a == b || a == leaver || before.load(b) == Some(0);
                    prop_assert!(allowed, "shard {} moved from {} to {}", i, a, b);
                }
            }
            // From a re-placement's output (here: of the same membership,
            // which fills the empty nodes once), no node with a share of a
            // shard or more is empty, so a leave moves exactly the leaver's
            // shards.
            let settled = plan_rebalance(&k, &previous, &nodes).unwrap();
            let after = plan_rebalance(&k, &owners_of(&settled), &rest).unwrap();
            prop_assert_eq!(after.moved_since(&settled).unwrap(), settled.load(leaver).unwrap() as usize);
        }

        #[test]
        fn rebalance_on_join_moves_shards_to_the_joiner_and_shed_ones(
            nodes in arb_nodes(),
            per_weight in 1usize..40,
            salt in any::<u64>(),
            new_id in any::<u64>(),
            new_weight in 1u64..=4,
        ) {
            prop_assume!(nodes.iter().all(|w| w.node.0 != new_id));
            let total: u64 = nodes.iter().map(|w| w.weight).sum();
            let k = keys(per_weight * total as usize, salt);
            let before = plan_placement(&k, &nodes).unwrap();
            let joiner = NodeId(new_id);
            let mut more = nodes.clone();
            more.push(NodeWeight { node: joiner, weight: new_weight });
            let previous = owners_of(&before);
            let after = plan_rebalance(&k, &previous, &more).unwrap();
            assert_valid(k.len(), &more, &after)?;
            let moved = assert_rebalance_moves(&previous, &more, &after)?;
            let floor = share_floor(k.len(), new_weight, total + new_weight);
            prop_assert!(after.load(joiner).unwrap() >= floor);
            // Shards shed because a cap shrank, plus the joiner's.
            let excess: u32 = before.loads().map(|(n, load, _)| load.saturating_sub(after.cap(n).unwrap())).sum();
            prop_assert!(moved <= (excess + after.load(joiner).unwrap()) as usize);
            if excess == 0 {
                prop_assert_eq!(moved, after.load(joiner).unwrap() as usize);
                prop_assert_eq!(after.load(joiner), Some(floor), "with no orphans the joiner takes exactly its floor");
                // Nearest first: a shard the joiner has a stronger claim on
                // than on some shard it took was skipped because its owner
                // was not above its floor, and it cannot have risen since.
                let o = Oracle::new(&k, &more);
                let j = o.index(joiner);
                let mine = (0..k.len()).filter(|&i| after.owner(i) == Some(joiner));
                let weakest = mine.filter_map(|i| o.claim(i, j)).max();
                for i in (0..k.len()).filter(|&i| after.owner(i) != Some(joiner)) {
                    if o.claim(i, j) < weakest {
                        let owner = after.owner(i).unwrap();
                        let w = more[more.iter().position(|w| w.node == owner).unwrap()].weight;
                        prop_assert!(after.load(owner).unwrap() <= share_floor(k.len(), w, total + new_weight),
                                     "the joiner passed over shard {} of {}, which had shards to spare", i, owner);
                    }
                }
            }
        }

        #[test]
        fn rebalance_sequences_stay_within_caps(
            nodes in arb_nodes(),
            per_weight in 10usize..40,
            salt in any::<u64>(),
            // (join or leave, joiner's id and weight, leaver)
            events in prop::collection::vec(
                (any::<bool>(), any::<u64>(), 0u64..=4, any::<prop::sample::Index>()),
                1..16,
            ),
        ) {
            let total: u64 = nodes.iter().map(|w| w.weight).sum();
            let k = keys(per_weight * total as usize, salt);
            let mut live = nodes.clone();
            let mut now = plan_placement(&k, &live).unwrap();
            for (join, id, weight, pick) in events {
                let mut next = live.clone();
                let leaver = live[pick.index(live.len())].node;
                if join {
                    if live.iter().any(|w| w.node.0 == id) { continue; }
                    next.push(NodeWeight { node: NodeId(id), weight });
                } else {
                    next.retain(|w| w.node != leaver);
                    if next.iter().all(|w| w.weight == 0) { continue; }
                }
                let previous = owners_of(&now);
                let after = plan_rebalance(&k, &previous, &next).unwrap();
                assert_valid(k.len(), &next, &after)?;
                let moved = assert_rebalance_moves(&previous, &next, &after)?;
                if !join && next.iter().all(|w| w.weight == 0 || now.load(w.node) > Some(0)) {
                    prop_assert_eq!(moved, now.load(leaver).unwrap() as usize, "a leave moves the leaver's shards");
                }
                if shares_allow_balance(k.len(), &next) {
                    prop_assert!(after.max_over_mean() <= 1.1 + 1e-9, "max/mean {}", after.max_over_mean());
                }
                live = next;
                now = after;
            }
        }

        #[test]
        fn rebalance_past_the_fill_bound_keeps_its_guarantees(
            nodes in arb_nodes(),
            joiners in arb_nodes(),
            per_weight in 1usize..30,
            salt in any::<u64>(),
        ) {
            // Several joins at once, with no work allowed to the claim-order
            // pull: the linear pass must fill every newcomer to its floor,
            // moving only shards that end on newcomers (or were shed).
            let total: u64 = nodes.iter().map(|w| w.weight).sum();
            let k = keys(per_weight * total as usize, salt);
            let before = plan_placement(&k, &nodes).unwrap();
            let mut more = nodes.clone();
            more.extend(joiners.iter().filter(|j| nodes.iter().all(|w| w.node != j.node)));
            let previous = owners_of(&before);
            let after = rebalance(&k, &previous, &more, FillBudget { per_shard: 0, per_newcomer: 0 }).unwrap();
            assert_valid(k.len(), &more, &after)?;
            assert_rebalance_moves(&previous, &more, &after)?;
        }
    }
}
