//! The summary line of `granary bench scale`: the largest run against
//! issue 31's targets, and how its costs grew from the run a tenth its size.

use super::{FleetRun, ScaleRun};
use serde::Serialize;

/// The last line (`"scenario":"summary"`): the largest run against the
/// issue's targets, and how its costs grew from the run a tenth its size.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleSummary {
    /// Always "summary".
    pub scenario: &'static str,
    /// Row groups of the largest run.
    pub row_groups: u64,
    /// Its nodes.
    pub nodes: u64,
    /// Its registration.
    pub register_s: f64,
    /// Its registration over its footer reads.
    pub register_over_footers: f64,
    /// Target ≤ 1 MiB.
    pub log_entry_max_bytes: u64,
    /// Target ≤ 64.
    pub snapshot_bytes_per_row_group: f64,
    /// A follower behind the leader's purged log catching up.
    pub snapshot_install_s: f64,
    /// Target ≤ 2 GiB.
    pub voter_rss_bytes: u64,
    /// The slower of the leave's and the join's re-placement.
    pub replace_s: f64,
    /// Target ≤ 50.
    pub api_p99_ms: f64,
    /// Target ≤ 2: what a node's watch receives for a leave over the moved
    /// shards' entries.
    pub watch_bytes_per_node_over_moved: f64,
    /// The same over one node's share of them (the moved entries over the
    /// nodes left).
    pub watch_bytes_per_node_over_share: f64,
    /// Target ≤ 2.
    pub failover_vs_election_timeout: f64,
    /// Every node re-opening its watch on the new leader at once: until the
    /// last had the whole placement.
    pub watch_storm_s: f64,
    /// The new leader's peak RSS after that storm.
    pub watch_storm_leader_rss_bytes: u64,
    /// The fleet's nodes, each its own identity, address and connection
    /// (0: no fleet ran).
    pub real_nodes: u64,
    /// Heartbeats of the fleet not accepted in its steady state.
    pub heartbeats_failed: u64,
    /// The most connections one of the fleet's nodes held at the leader.
    pub leader_connections_per_node: u64,
    /// From the leader kill until every node of the fleet had a heartbeat
    /// accepted or a registration by the new leader.
    pub reregister_after_failover_s: f64,
    /// From the kill until every node had its watch open again.
    pub rewatch_after_failover_s: f64,
    /// The leader's peak RSS under the fleet.
    pub fleet_leader_rss_bytes: u64,
    /// The leader's CPU under the fleet's steady state, in cores.
    pub fleet_leader_cpu_cores: f64,
    /// Size of the largest run over the smaller one's (row groups), or
    /// `None` without a smaller run.
    pub size_ratio: Option<f64>,
    /// `register_s`, `snapshot_bytes`, `voter_rss_bytes` and `replace_s` of
    /// the largest run over the smaller one's (linear growth: at most
    /// `size_ratio`).
    pub register_growth: Option<f64>,
    /// See `register_growth`.
    pub snapshot_growth: Option<f64>,
    /// See `register_growth`.
    pub rss_growth: Option<f64>,
    /// See `register_growth`.
    pub replace_growth: Option<f64>,
}

impl ScaleSummary {
    /// The summary of `big`, with growth from `small` where it ran.
    pub fn of(small: Option<&ScaleRun>, big: &ScaleRun, fleet: Option<&FleetRun>) -> Self {
        let replace = |r: &ScaleRun| r.replace_leave_s.max(r.replace_join_s);
        let grow = |f: &dyn Fn(&ScaleRun) -> f64| small.map(|s| f(big) / f(s).max(1e-9));
        ScaleSummary {
            scenario: "summary",
            row_groups: big.row_groups,
            nodes: big.nodes,
            register_s: big.register_s,
            register_over_footers: big.register_s / big.footers_s.max(1e-9),
            log_entry_max_bytes: big.log_entry_max_bytes,
            snapshot_bytes_per_row_group: big.snapshot_bytes_per_row_group,
            snapshot_install_s: big.snapshot_install_s,
            voter_rss_bytes: big.voter_rss_bytes,
            replace_s: replace(big),
            api_p99_ms: big.api_p99_ms,
            watch_bytes_per_node_over_moved: big.watch_bytes_per_node_over_moved,
            watch_bytes_per_node_over_share: big.watch_bytes_per_node_over_share,
            failover_vs_election_timeout: big.failover_vs_election_timeout,
            watch_storm_s: big.watch_storm_s,
            watch_storm_leader_rss_bytes: big.watch_storm_leader_rss_bytes,
            real_nodes: fleet.map_or(0, |f| f.real_nodes),
            heartbeats_failed: fleet.map_or(0, |f| f.heartbeats_failed),
            leader_connections_per_node: fleet.map_or(0, |f| f.leader_connections_per_node),
            reregister_after_failover_s: fleet.map_or(f64::NAN, |f| f.reregister_after_failover_s),
            rewatch_after_failover_s: fleet.map_or(f64::NAN, |f| f.rewatch_after_failover_s),
            fleet_leader_rss_bytes: fleet.map_or(0, |f| f.leader_rss_bytes),
            fleet_leader_cpu_cores: fleet.map_or(f64::NAN, |f| f.leader_cpu_cores),
            size_ratio: small.map(|s| big.row_groups as f64 / s.row_groups as f64),
            register_growth: grow(&|r| r.register_s),
            snapshot_growth: grow(&|r| r.snapshot_bytes as f64),
            rss_growth: grow(&|r| r.voter_rss_bytes as f64),
            replace_growth: grow(&replace),
        }
    }
}
