//! Shard placement: which live node owns each shard.
//!
//! Two pure planners, both the same input to the same owners, byte for byte,
//! on every process and whatever order the nodes come in:
//!
//! - [`plan_placement`], the **initial assignment**: a function of (shard
//!   keys, live nodes with weights) alone.
//! - [`plan_rebalance`], the **incremental re-placement** after a membership
//!   change: a function of the keys, the owners before the change and the
//!   live nodes. The coordinator applies membership one event at a time
//!   through its replicated log and re-places with it on every event, so
//!   every replica holds the same owners.
//!
//! Together they do three things at once: stay **balanced** (no node above
//! 1.1 times its weighted share, or above its share rounded up where that
//! share is under 10 shards), move **few shards** when membership changes
//! (on a leave exactly the leaver's shards; on a join only shards that go
//! to the joiner, plus one per capped node when the cap itself falls), and
//! run in well under a second for a million shards over ten thousand nodes.
//!
//! ## Why not plain consistent hashing
//!
//! Any rule where each shard independently picks "its" node (a ring, or
//! rendezvous hashing) gives a node about `Poisson(S/N)` shards: at 100
//! shards per node the fullest of 10,000 nodes holds about 140, far above
//! 1.1 times the mean. Yet only such rules move *exactly* the leaver's shards
//! on a leave (that property forces each shard to rank all nodes in one
//! fixed order). So a balanced placement must trade some movement for
//! balance; the construction below keeps that trade small.
//!
//! ## The construction
//!
//! 1. **Shards on a lattice.** Shards are sorted by a frozen hash of their
//!    key, and the shard of rank `r` sits at ring position `r * 2^64 / S`.
//!    Evenly spaced shards remove the Poisson noise of random positions: what
//!    a node gets depends only on how much of the ring it covers.
//! 2. **Nodes as points.** Every node of non-zero weight has
//!    [`POINTS_PER_NODE`] points, drawn from a generator seeded by its id
//!    ([`crate::rng`]), so its points never depend on who else is live.
//! 3. **Nearest point, scaled by weight.** A shard ranks nodes by `d / w`:
//!    the distance from the shard to the node's nearest point, clockwise or
//!    counter-clockwise, over the node's weight (ties: lower node id). The
//!    distance to a node's nearest point is close to exponential with a rate
//!    set by its point count, so `d / w` is exponential with rate
//!    proportional to `w`, and the smallest of them belongs to node `n` with
//!    probability `w_n / W`: demand follows weight with no global rescaling.
//!    With equal weights a node's region is a union of Voronoi cells (half of
//!    the gap on each side of a point), whose size varies less than the
//!    single gap of a clockwise-only ring. At 100 shards per node a node's
//!    demand (shards ranking it first) then has a standard deviation of
//!    about 7.6 shards. The point count trades the spread of cell sizes
//!    (falls with more points) against rounding at cell edges (grows with
//!    them); 160 is near the best trade.
//! 4. **Bounded loads by deferred acceptance.** Node `n` accepts at most
//!    `cap_n = max(floor(1.1 * S * w_n / W), ceil(S * w_n / W))` shards. Each
//!    shard proposes to nodes in its order; a full node keeps the shards
//!    nearest its points (distance, side, shard rank) and rejects the rest,
//!    who propose to their next node. This is the shard-proposing
//!    Gale–Shapley algorithm: its result is the shard-optimal stable
//!    assignment, whatever order proposals are processed in. At 100 shards
//!    per node about 12% of nodes reach their cap; every other node keeps
//!    exactly its demand.
//!
//! ## What moves when the initial assignment is recomputed
//!
//! Recomputing [`plan_placement`] after a membership change moves more than
//! the ideal, and this section says how much; it is why [`plan_rebalance`]
//! exists. Stability gives exact statements, proved from the definition and
//! checked by the property tests in `accept.rs`. A shard whose owner changes
//! either was on the node that left, or went to the node that joined, or was
//! pushed out of a node that is full afterwards, or was pulled into a node
//! that was full before and now has room for it. While caps stay the same, a leave only
//! pushes (shards on nodes with room stay put) and a join only pulls.
//!
//! So all movement beyond the ideal happens at capped nodes, and it cannot
//! be removed: when a shard leaves a capped node, that node has room for a
//! shard it refused before, and a pure function of membership must take it
//! back. Caps move too: they follow `S / N`, and when `1.1 * S * w / W`
//! crosses an integer every capped node of that weight sheds or takes back
//! one shard.
//!
//! Measured at 1,000,000 shards over 10,000 equal nodes (release build, 30
//! leaves and joins of different nodes, caps unchanged): a leave moves 1.11
//! times the ideal `S / N` on average (0.93–1.26 for a single event, of
//! which the leaver's own load is 0.85–1.10), a join 1.09 (0.96–1.22). A
//! join that lowers the cap from 110 to 109 (10,000 to 10,001 nodes) moves
//! 13.9 times the ideal: about 0.15 per event when spread over the ~90
//! joins between two such steps.
//!
//! ## Incremental re-placement
//!
//! No function of membership alone can move only the leaver's shards and
//! keep the bound (above: a capped node that loses a shard must take back
//! one it refused). [`plan_rebalance`] also reads the owners before the
//! change, and runs four steps over the new node set, with the caps above
//! and a floor `floor(S * w / W)` per node:
//!
//! 1. **Keep.** A shard whose previous owner is live with non-zero weight
//!    stays.
//! 2. **Shed.** A node above its new cap gives up the shards it ranks
//!    lowest (its weakest claims: farthest from its points, then side, then
//!    rank) down to its cap.
//! 3. **Place the orphans.** Shards whose owner is gone, has weight 0 or
//!    shed them propose down their usual `d / w` order to the nodes with
//!    room, `cap - kept load`, by the deferred acceptance above. An orphan
//!    never displaces a kept shard; among themselves the orphans are placed
//!    as the construction places shards, given that room.
//! 4. **Fill.** Every *newcomer*, a node of non-zero weight that owned no
//!    shard before, pulls shards from nodes above their floor (donors), its
//!    strongest claims first (nearest its points), until it reaches its
//!    floor. Newcomers pull together: (newcomer, shard) pairs go in order of
//!    claim, so a contested shard goes to the nearest newcomer still short.
//!
//! Ties are broken by distance, side, shard rank, then node id. When no
//! previous owner is live with non-zero weight, nothing is kept and the
//! result is [`plan_placement`]'s.
//!
//! What that guarantees, for any previous owners (each statement is checked
//! by a property test in `rebalance.rs`):
//!
//! - **Within caps.** Shedding brings each node to its cap; the room given
//!   to orphans is what the caps leave, which suffices because caps sum to
//!   at least `S`; a newcomer pulls only up to its floor, at most its cap.
//! - **What moves.** A shard changes owner only if its previous owner is
//!   gone or has weight 0, or that owner shed it (at most `previous load -
//!   new cap` shards per node, which never come back to it: it has no room
//!   left), or it ends on a newcomer. A node that loses shards ends at or
//!   above its floor.
//! - **Newcomers reach their floor.** The shards above their owners' floors
//!   number `S - sum(floors) + (the deficits below floors)`, at least the
//!   newcomers' deficits; a donor stops being one only at its floor.
//! - **A leave** lowers the total weight, so no cap falls and nothing is
//!   shed: exactly the leaver's shards move (unless a node of positive
//!   floor was empty, see below), placed by deferred acceptance within the
//!   room left.
//! - **A join** moves the shards that go to the joiner, which gets exactly
//!   its floor when no cap fell, plus the shards shed where a cap fell:
//!   when `1.1 * S * w / W` crosses an integer, each node of that weight at
//!   its old cap sheds one. Any placement within the bound must move those.
//! - **A fixed point.** Re-placing its own output with the same membership
//!   moves nothing.
//!
//! Only newcomers pull, not every node below its floor: [`plan_placement`]
//! leaves a node with its demand, so about 45% of nodes sit a few shards
//! below their floor (at 1,000,000 shards over 10,000 equal nodes, 4,531
//! nodes lacking 29,219 shards in all), and floors rise as nodes leave;
//! filling them would move some 290 times a leaver's shards on the first
//! event, and more whenever a floor rises. The price: an empty node of
//! positive floor counts as a newcomer, since the owners alone do not say
//! whether it just joined. The initial assignment leaves a node empty only
//! where its share is a few shards (weights spread over 1–1000: a leave
//! right after it moved 209 shards, 184 of them the leaver's). The four
//! steps never leave a node of positive floor empty, so once they have run
//! (from the second event on, or at once by re-placing the initial
//! assignment with unchanged membership), a leave moves exactly the
//! leaver's shards unless some node's share was under one shard.
//!
//! Measured at 1,000,000 shards over 10,000 equal nodes (release build, 30
//! leaves and 30 joins applied one after another, caps unchanged): a leave
//! moves exactly the leaver's load, 0.85–1.10 times the ideal (mean 1.01),
//! and max load / mean stays 1.100; a join moves exactly the joiner's floor,
//! 1.00. The join from 10,000 to 10,001 nodes (cap 110 to 109) moves 13.4
//! times the ideal: 12.5% of the nodes sat at their cap and shed one each.
//!
//! ## Cost
//!
//! [`plan_placement`]: sorting the shards and the points, one merge pass
//! for every shard's first choice, a bounded heap per node, and a short walk
//! along the ring for the few percent of shards that overflow: about 0.3 s
//! for 1,000,000 shards over 10,000 equal nodes on one core. To keep walks
//! short when weights differ, the points are kept in bands of weights
//! within a factor of two, walked separately and merged; each band adds a
//! merge pass (0.8 s with weights spread over 1–1000, ten bands).
//!
//! [`plan_rebalance`]: sorting the shards, a hash lookup of each previous
//! owner, the ring only when there are orphans (its sort is most of the
//! cost of a leave), the merge pass for the orphans alone, and a walk per
//! newcomer over the shards nearest its points, about twice its floor when
//! half the shards sit above their owner's floor. Measured as above: 0.2 s
//! for a leave, 0.1 s for a join (0.2 s when caps fall), 0.7 s for 5,000
//! nodes joining 5,000 at once. A walk can cost up to `S` when donors are
//! scarce, so many newcomers at once could cost `S` each: past `2 * S` plus
//! 1,024 per newcomer pairs examined, the remaining deficits are filled by
//! one pass over the shards in rank order instead, with every guarantee
//! above (only which donor shards go to which newcomer changes).
//!
//! ## Files
//!
//! One direction of use, each file only reading the ones above it:
//!
//! - `model.rs`: the inputs and the output ([`NodeWeight`], [`shard_key`],
//!   [`Placement`], [`PlacementError`]) and the load bound (caps, floors).
//! - `ring.rs`: the geometry: the shard lattice, every node's
//!   [`POINTS_PER_NODE`] points, claims, and each shard's preference list.
//! - `accept.rs`: [`plan_placement`], by deferred acceptance.
//! - `rebalance.rs`: [`plan_rebalance`], its four steps.
//!
//! The benchmark that times them reads the clock, so it lives in
//! `granary-bench` (`granary_bench::placement`), not in this clock-free crate.

mod accept;
mod model;
mod rebalance;
mod ring;
#[cfg(test)]
mod test_support;

pub use accept::plan_placement;
pub use model::{LOAD_BOUND_DEN, LOAD_BOUND_NUM, NodeWeight, Placement, PlacementError, shard_key};
pub use rebalance::plan_rebalance;
pub use ring::POINTS_PER_NODE;
