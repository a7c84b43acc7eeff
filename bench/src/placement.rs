//! `granary bench placement`: times the placement planners of
//! [`granary_proto::placement`] on one generated instance.
//!
//! The planners are pure and read no clock; this scenario wraps each call in
//! a wall-clock timer, which is why it lives here and not in `granary-proto`.
//! Its inputs ([`bench_inputs`]) are pure, so `bench/examples/placement.rs`
//! reuses them for its longer run of membership events.

use granary_proto::ids::{DatasetVersion, NodeId, ShardId};
use granary_proto::placement::{NodeWeight, PlacementError, plan_placement, plan_rebalance, shard_key};
use std::time::Instant;

/// One run of the placement benchmark scenario; see [`bench_placement`].
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PlacementBench {
    /// Always `"placement"`.
    pub scenario: &'static str,
    /// Shards placed.
    pub shards: usize,
    /// Nodes in the first placement.
    pub nodes: usize,
    /// Wall time of the first [`plan_placement`] call, in seconds.
    pub assign_s: f64,
    /// [`max_over_mean`](granary_proto::placement::Placement::max_over_mean)
    /// of the first placement.
    pub max_over_mean: f64,
    /// Shards moved by [`plan_rebalance`] from the first placement when one
    /// node leaves (`nodes` to `nodes - 1`), over `shards / nodes`.
    pub moved_on_leave_over_ideal: f64,
    /// Shards moved by [`plan_rebalance`] when a new node joins the
    /// survivors of the leave (`nodes - 1` to `nodes`), over
    /// `shards / nodes`.
    pub moved_on_join_over_ideal: f64,
    /// Wall time of the [`plan_rebalance`] call for the leave, in seconds.
    pub rebalance_leave_s: f64,
    /// Wall time of the [`plan_rebalance`] call for the join, in seconds.
    pub rebalance_join_s: f64,
    /// [`max_over_mean`](granary_proto::placement::Placement::max_over_mean)
    /// after the leave.
    pub max_over_mean_after_leave: f64,
    /// [`max_over_mean`](granary_proto::placement::Placement::max_over_mean)
    /// after the join.
    pub max_over_mean_after_join: f64,
}

/// Weight of every node in [`bench_inputs`].
pub const BENCH_WEIGHT: u64 = 1 << 40;

/// The benchmark's inputs: the keys of `shards` shards of one dataset
/// version, and `nodes` nodes of equal weight with ids `1..=nodes`.
pub fn bench_inputs(shards: usize, nodes: usize) -> (Vec<u64>, Vec<NodeWeight>) {
    let version = DatasetVersion([0x42; 16]);
    let keys = (0..shards as u64)
        .map(|i| shard_key(version, ShardId { file: (i >> 10) as u32, row_group: (i & 1023) as u32 }))
        .collect();
    let all = (1..=nodes as u64).map(|i| NodeWeight { node: NodeId(i), weight: BENCH_WEIGHT }).collect();
    (keys, all)
}

/// The placement scenario: places `shards` shards (keys of one dataset
/// version) on `nodes` equal nodes with ids `1..=nodes` with
/// [`plan_placement`], then re-places from that placement with
/// [`plan_rebalance`] twice: once without the node with id `nodes / 2 + 1`
/// (a leave), then from that result with a new node of id `nodes + 1`
/// added to the survivors (a join, back to `nodes` nodes). Each call is
/// timed alone. Needs at least 2 nodes
/// ([`PlacementError::NoNodes`] otherwise).
pub fn bench_placement(shards: usize, nodes: usize) -> Result<PlacementBench, PlacementError> {
    let (keys, all) = bench_inputs(shards, nodes);

    let started = Instant::now();
    let first = plan_placement(&keys, &all)?;
    let assign_s = started.elapsed().as_secs_f64();
    let previous: Vec<NodeId> = first.owners().collect();

    let leaver = NodeId(nodes as u64 / 2 + 1);
    let rest: Vec<NodeWeight> = all.iter().copied().filter(|n| n.node != leaver).collect();
    let started = Instant::now();
    let after_leave = plan_rebalance(&keys, &previous, &rest)?;
    let rebalance_leave_s = started.elapsed().as_secs_f64();

    // Then a new node joins the survivors, back to `nodes` nodes: the
    // bench's "removes one node, adds one".
    let after_leave_owners: Vec<NodeId> = after_leave.owners().collect();
    let mut more = rest;
    more.push(NodeWeight { node: NodeId(nodes as u64 + 1), weight: BENCH_WEIGHT });
    let started = Instant::now();
    let after_join = plan_rebalance(&keys, &after_leave_owners, &more)?;
    let rebalance_join_s = started.elapsed().as_secs_f64();

    let ideal = shards as f64 / nodes as f64;
    let ratio = |moved: usize| if shards == 0 { 0.0 } else { moved as f64 / ideal };
    Ok(PlacementBench {
        scenario: "placement",
        shards,
        nodes,
        assign_s,
        max_over_mean: first.max_over_mean(),
        moved_on_leave_over_ideal: ratio(after_leave.moved_since(&first)?),
        moved_on_join_over_ideal: ratio(after_join.moved_since(&after_leave)?),
        rebalance_leave_s,
        rebalance_join_s,
        max_over_mean_after_leave: after_leave.max_over_mean(),
        max_over_mean_after_join: after_join.max_over_mean(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_reports_the_scenario_as_one_json_object() {
        let b = bench_placement(4000, 40).unwrap();
        assert!(b.max_over_mean <= 1.1 + 1e-9);
        assert!((0.5..2.0).contains(&b.moved_on_leave_over_ideal), "{b:?}");
        assert!((0.5..2.0).contains(&b.moved_on_join_over_ideal), "{b:?}");
        assert!(b.max_over_mean_after_leave <= 1.1 + 1e-9 && b.max_over_mean_after_join <= 1.1 + 1e-9, "{b:?}");
        let json = serde_json::to_string(&b).unwrap();
        assert!(json.starts_with(r#"{"scenario":"placement","shards":4000,"nodes":40,"assign_s":"#), "{json}");
        let fields: Vec<&str> =
            json.split(',').map(|f| f.split(':').next().unwrap().trim_matches(['{', '"'])).collect();
        assert_eq!(
            fields,
            [
                "scenario",
                "shards",
                "nodes",
                "assign_s",
                "max_over_mean",
                "moved_on_leave_over_ideal",
                "moved_on_join_over_ideal",
                "rebalance_leave_s",
                "rebalance_join_s",
                "max_over_mean_after_leave",
                "max_over_mean_after_join"
            ]
        );
        assert_eq!(bench_placement(10, 1), Err(PlacementError::NoNodes));
    }
}
