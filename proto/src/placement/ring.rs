//! The ring: where shards and nodes sit, and in what order a shard ranks
//! the nodes.
//!
//! Shards sit on an even lattice in the order of their hashed key
//! ([`lattice_order`], [`lattice`]); each node of non-zero weight has
//! [`POINTS_PER_NODE`] points drawn from its id alone ([`points_of`]). A
//! shard's [`Claim`] on a node is its distance to the node's nearest point;
//! its preference list ([`Choices`]) is every node in increasing distance
//! over weight, found by walking the points outwards band by band
//! ([`Ring`], [`Band`], [`Walk`]). The planners only read this geometry.

use super::model::NodeWeight;
use crate::ids::NodeId;
use crate::rng::{Rng, seed_of};
use std::cmp::Ordering;
use std::collections::BTreeMap;

/// Points on the ring of every node of non-zero weight. Changing it changes
/// every placement.
pub const POINTS_PER_NODE: u32 = 160;

/// Domain tags, so that these hashes never coincide with other uses of
/// [`seed_of`] (the third, `SHARDKEY`, is in `model.rs`).
const POINT_TAG: u64 = 0x504c_4143_4550_4f49; // "PLACEPOI"
pub(super) const SHARD_TAG: u64 = 0x504c_4143_4553_4844; // "PLACESHD"

/// `node`'s points, sorted.
pub(super) fn sorted_points(node: NodeId) -> Vec<u64> {
    let mut pts: Vec<u64> = points_of(node).collect();
    pts.sort_unstable();
    pts
}

/// The claim of the shard of rank `rank` on a node with sorted points
/// `pts`: the nearer of its first point clockwise (at or after the shard)
/// and its first point counter-clockwise, clockwise on a tie.
pub(super) fn claim_on(pts: &[u64], rank: u32, shards: usize) -> Claim {
    let x = lattice(rank, shards);
    let k = pts.len();
    let i = pts.partition_point(|&p| p < x);
    let cw = pts[i % k].wrapping_sub(x);
    let ccw = x.wrapping_sub(pts[(i + k - 1) % k]);
    if cw <= ccw { Claim { d: cw, dir: 0, rank } } else { Claim { d: ccw, dir: 1, rank } }
}

/// `(hash, caller index)` of every shard, sorted: the shard at index `r`
/// has rank `r` and sits at [`lattice`]`(r)`. Equal keys are told apart by
/// their index.
pub(super) fn lattice_order(shard_keys: &[u64]) -> Vec<(u64, u32)> {
    let mut order: Vec<(u64, u32)> =
        shard_keys.iter().enumerate().map(|(i, &k)| (seed_of(&[SHARD_TAG, k]), i as u32)).collect();
    order.sort_unstable();
    order
}

/// Ring position of the shard of rank `rank` among `shards`: `rank * 2^64 / shards`.
pub(super) fn lattice(rank: u32, shards: usize) -> u64 {
    ((u128::from(rank) << 64) / shards as u128) as u64
}

/// A shard's claim on a node: how far it is from the node's nearest point
/// (and on which side), then its rank. Smaller is stronger; a full node's
/// heap keeps its weakest claim on top.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(super) struct Claim {
    pub(super) d: u64,
    pub(super) dir: u8,
    pub(super) rank: u32,
}

/// The [`POINTS_PER_NODE`] ring positions of `node`, in the order they are
/// drawn: a function of the node's id alone.
pub(super) fn points_of(node: NodeId) -> impl Iterator<Item = u64> {
    let mut rng = Rng::new(seed_of(&[POINT_TAG, node.0]));
    (0..POINTS_PER_NODE).map(move |_| rng.next_u64())
}

/// Every live node's points, in bands of similar weight, and the nodes'
/// weights. Bands only organise the search for a shard's next node: the
/// order itself is `d / w` over all nodes.
pub(super) struct Ring {
    weight: Vec<u64>,
    pub(super) bands: Vec<Band>,
}

/// The points of the nodes whose weight lies in `[2^b, 2^(b+1))`, sorted by
/// (position, node index). Never empty.
pub(super) struct Band {
    pub(super) pos: Vec<u64>,
    node: Vec<u32>,
    max_weight: u64,
}

impl Ring {
    pub(super) fn new(nodes: &[NodeWeight]) -> Ring {
        let mut bands: BTreeMap<u32, Band> = BTreeMap::new();
        for (i, n) in nodes.iter().enumerate().filter(|(_, n)| n.weight > 0) {
            let band = bands.entry(n.weight.ilog2()).or_insert_with(|| Band {
                pos: Vec::new(),
                node: Vec::new(),
                max_weight: 0,
            });
            band.max_weight = band.max_weight.max(n.weight);
            for p in points_of(n.node) {
                band.pos.push(p);
                band.node.push(i as u32);
            }
        }
        let bands = bands
            .into_values()
            .map(|b| {
                let mut points: Vec<(u64, u32)> = b.pos.into_iter().zip(b.node).collect();
                points.sort_unstable();
                Band {
                    pos: points.iter().map(|p| p.0).collect(),
                    node: points.iter().map(|p| p.1).collect(),
                    max_weight: b.max_weight,
                }
            })
            .collect();
        Ring { weight: nodes.iter().map(|n| n.weight).collect(), bands }
    }
}

impl Band {
    pub(super) fn len(&self) -> usize {
        self.pos.len()
    }

    /// Index of the first point clockwise from `x` (position `>= x`, or the
    /// first point after wrapping).
    fn first_cw(&self, x: u64) -> usize {
        self.pos.partition_point(|&p| p < x) % self.len()
    }
}

/// A point as seen from a shard: its distance, side (0 clockwise, 1
/// counter-clockwise) and node index.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Seen {
    pub(super) d: u64,
    pub(super) dir: u8,
    pub(super) node: u32,
}

/// A walk over a band's points in order of distance from a shard, taking
/// the nearer of the next clockwise and counter-clockwise point at each
/// step (clockwise on a tie). Each point is visited once.
#[derive(Clone, Copy, Debug)]
pub(super) struct Walk {
    x: u64,
    /// Next clockwise point.
    cw: usize,
    /// Next counter-clockwise point.
    ccw: usize,
    /// Points visited so far.
    steps: usize,
}

impl Walk {
    /// A walk from `x` over `band`, whose first clockwise point has index
    /// `first_cw`.
    fn starting_at(x: u64, first_cw: usize, band: &Band) -> Walk {
        let n = band.len();
        Walk { x, cw: first_cw, ccw: (first_cw + n - 1) % n, steps: 0 }
    }

    /// The next point, without visiting it.
    fn peek(&self, band: &Band) -> Option<Seen> {
        if self.steps == band.len() {
            return None;
        }
        let d_cw = band.pos[self.cw].wrapping_sub(self.x);
        let d_ccw = self.x.wrapping_sub(band.pos[self.ccw]);
        Some(if d_cw <= d_ccw {
            Seen { d: d_cw, dir: 0, node: band.node[self.cw] }
        } else {
            Seen { d: d_ccw, dir: 1, node: band.node[self.ccw] }
        })
    }

    /// Visits the next point.
    fn advance(&mut self, band: &Band) -> Option<Seen> {
        let p = self.peek(band)?;
        let n = band.len();
        self.steps += 1;
        if p.dir == 0 {
            self.cw = (self.cw + 1) % n;
        } else {
            self.ccw = (self.ccw + n - 1) % n;
        }
        Some(p)
    }
}

/// A shard's preference list within one band: its nodes in increasing
/// `d / w`, the distance to the node's nearest point over its weight, ties
/// to the lower node index. Lists a node again (with a larger distance) for
/// each further point it has; a node refuses such repeats, since it refused
/// or evicted the shard at a stronger claim already.
struct BandChoices {
    walk: Walk,
    /// Points visited but not yet listed.
    seen: Vec<Seen>,
}

impl BandChoices {
    fn next(&mut self, ring: &Ring, band: &Band) -> Option<Seen> {
        loop {
            let best = (0..self.seen.len()).min_by(|&a, &b| rank_cmp(ring, self.seen[a], self.seen[b]));
            match (best, self.walk.peek(band)) {
                (Some(i), Some(p)) if precedes_all_beyond(ring, band, self.seen[i], p.d) => {
                    return Some(self.seen.swap_remove(i));
                }
                (_, Some(_)) => {
                    let p = self.walk.advance(band)?;
                    self.seen.push(p);
                }
                (Some(i), None) => return Some(self.seen.swap_remove(i)),
                (None, None) => return None,
            }
        }
    }
}

/// The first node of a shard at `x` within `band`, whose first clockwise
/// point is `first_cw`. `seen` is scratch space, left empty.
pub(super) fn first_in_band(ring: &Ring, band: &Band, x: u64, first_cw: usize, seen: &mut Vec<Seen>) -> Seen {
    let start = Walk::starting_at(x, first_cw, band);
    let mut walk = start;
    // Bands are never empty.
    let nearest = walk.advance(band).expect("a band has at least one point");
    match walk.peek(band) {
        // The nearest point's node comes first unless a point beyond it
        // could beat it by weight (never, with equal weights).
        Some(next) if !precedes_all_beyond(ring, band, nearest, next.d) => {
            let mut choices = BandChoices { walk: start, seen: std::mem::take(seen) };
            let p = choices.next(ring, band).expect("a band has at least one point");
            *seen = choices.seen;
            seen.clear();
            p
        }
        _ => nearest,
    }
}

/// A shard's whole preference list: the bands' lists merged.
pub(super) struct Choices {
    /// Per band: its list, and its next entry once drawn.
    bands: Vec<(BandChoices, Option<Seen>)>,
}

impl Choices {
    pub(super) fn new(ring: &Ring, x: u64) -> Choices {
        let bands = ring
            .bands
            .iter()
            .map(|b| (BandChoices { walk: Walk::starting_at(x, b.first_cw(x), b), seen: Vec::new() }, None))
            .collect();
        Choices { bands }
    }

    /// The next node, as the point that makes it next.
    pub(super) fn next(&mut self, ring: &Ring) -> Option<Seen> {
        for ((choices, head), band) in self.bands.iter_mut().zip(&ring.bands) {
            if head.is_none() {
                *head = choices.next(ring, band);
            }
        }
        let best = (0..self.bands.len())
            .filter(|&b| self.bands[b].1.is_some())
            .min_by(|&a, &b| rank_cmp(ring, self.bands[a].1.unwrap(), self.bands[b].1.unwrap()))?;
        self.bands[best].1.take()
    }
}

/// Whether `p` comes before every point of `band` at distance `d` or more:
/// none of their nodes weighs more than the band's heaviest, so none has a
/// smaller `d / w`.
fn precedes_all_beyond(ring: &Ring, band: &Band, p: Seen, d: u64) -> bool {
    u128::from(p.d) * u128::from(band.max_weight) < u128::from(d) * u128::from(ring.weight[p.node as usize])
}

/// Orders points by `d / weight` of their node, then node index, then side.
pub(super) fn rank_cmp(ring: &Ring, a: Seen, b: Seen) -> Ordering {
    let wa = u128::from(ring.weight[a.node as usize]);
    let wb = u128::from(ring.weight[b.node as usize]);
    (u128::from(a.d) * wb).cmp(&(u128::from(b.d) * wa)).then(a.node.cmp(&b.node)).then(a.dir.cmp(&b.dir))
}

/// Every point of the ring as (position, node index), band by band: the
/// tests' view of the points, apart from the walks that search them.
#[cfg(test)]
pub(super) fn all_points(ring: &Ring) -> Vec<(u64, u32)> {
    ring.bands.iter().flat_map(|b| b.pos.iter().copied().zip(b.node.iter().copied())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lattice_is_even_and_increasing() {
        for shards in [1usize, 2, 3, 7, 1000] {
            assert_eq!(lattice(0, shards), 0);
            let xs: Vec<u64> = (0..shards as u32).map(|r| lattice(r, shards)).collect();
            assert!(xs.windows(2).all(|w| w[0] < w[1]));
            let step = (1u128 << 64) / shards as u128;
            assert!(xs.windows(2).all(|w| (u128::from(w[1] - w[0])).abs_diff(step) <= 1));
        }
    }

    #[test]
    fn walks_visit_every_point_once_nearest_first() {
        let nodes: Vec<NodeWeight> = (1..=4).map(|i| NodeWeight { node: NodeId(i), weight: 1 << 30 }).collect();
        let ring = Ring::new(&nodes);
        assert_eq!(ring.bands.len(), 1);
        let band = &ring.bands[0];
        for x in [0u64, 1, u64::MAX, band.pos[3], band.pos[3] + 1, 1 << 63, seed_of(&[5])] {
            let mut walk = Walk::starting_at(x, band.first_cw(x), band);
            let mut seen = vec![false; band.len()];
            let mut last = (0u64, 0u8);
            let mut visited = 0;
            while let Some(Seen { d, dir, .. }) = walk.advance(band) {
                assert!((d, dir) >= last);
                last = (d, dir);
                let p = if dir == 0 { x.wrapping_add(d) } else { x.wrapping_sub(d) };
                let i = band.pos.iter().position(|&q| q == p).unwrap();
                assert!(!seen[i]);
                seen[i] = true;
                visited += 1;
            }
            assert_eq!(visited, band.len());
        }
    }

    #[test]
    fn points_depend_only_on_the_node() {
        let nodes = [
            NodeWeight { node: NodeId(1), weight: 1 },
            NodeWeight { node: NodeId(2), weight: 1000 },
            NodeWeight { node: NodeId(3), weight: 0 },
        ];
        let ring = Ring::new(&nodes);
        assert_eq!(all_points(&ring).len(), 2 * POINTS_PER_NODE as usize);
        let alone = Ring::new(&nodes[..1]);
        let mut mine: Vec<u64> = all_points(&ring).into_iter().filter(|p| p.1 == 0).map(|p| p.0).collect();
        mine.sort_unstable();
        assert_eq!(mine, alone.bands[0].pos);
    }

    /// The preference list is every node in order of distance over weight,
    /// each first at its nearest point.
    #[test]
    fn choices_follow_distance_over_weight() {
        let nodes: Vec<NodeWeight> = (1..=6u64).map(|i| NodeWeight { node: NodeId(i * 11), weight: i * i }).collect();
        let ring = Ring::new(&nodes);
        for x in [0u64, 12345, u64::MAX / 3, seed_of(&[9])] {
            let mut choices = Choices::new(&ring, x);
            let mut firsts: Vec<Seen> = Vec::new();
            while let Some(p) = choices.next(&ring) {
                if firsts.iter().all(|f| f.node != p.node) {
                    firsts.push(p);
                }
            }
            let mut expected: Vec<Seen> = (0..nodes.len() as u32)
                .map(|n| {
                    all_points(&ring)
                        .into_iter()
                        .filter(|p| p.1 == n)
                        .map(|(p, _)| {
                            let (cw, ccw) = (p.wrapping_sub(x), x.wrapping_sub(p));
                            if cw <= ccw { Seen { d: cw, dir: 0, node: n } } else { Seen { d: ccw, dir: 1, node: n } }
                        })
                        .min_by_key(|s| (s.d, s.dir))
                        .unwrap()
                })
                .collect();
            expected.sort_by(|&a, &b| rank_cmp(&ring, a, b));
            assert_eq!(firsts, expected);
        }
    }
}
