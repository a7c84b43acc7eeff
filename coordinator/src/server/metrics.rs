//! The voter's Prometheus metrics, named `granary_coordinator_*`: Raft's
//! view (term, leader, log, applied and snapshot indexes), the applied
//! cluster state (placement epoch, datasets, nodes with their leases as the
//! leader sees them, shards owned), and the API requests answered by kind
//! and result (counted as they are answered: `requests.rs`). Everything but
//! the request counter is read at each scrape.
//!
//! openraft 0.9's metrics carry no commit index: the applied index trails
//! it by the entries waiting to be applied.

use super::ctx::{Ctx, node_statuses};
use openraft::ServerState;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;

/// Every metric of the voter that `ctx` belongs to.
pub(super) fn registry(ctx: &Arc<Ctx>) -> Registry {
    let mut root = Registry::default();
    granary_net::process::register(&mut root, "coordinator");
    let r = root.sub_registry_with_prefix("granary_coordinator");
    r.register("api_requests", "API requests answered, by kind and result", ctx.api_requests.clone());
    r.register_collector(Box::new(VoterCollector { ctx: ctx.clone() }));
    root
}

struct VoterCollector {
    ctx: Arc<Ctx>,
}

impl std::fmt::Debug for VoterCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VoterCollector")
    }
}

use granary_net::metrics::const_gauge as gauge;

/// An optional index as a gauge value (-1: none yet).
fn index(v: Option<u64>) -> i64 {
    v.map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabel {
    node: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VoterLabel {
    voter: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabel {
    role: &'static str,
}

impl Collector for VoterCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let m = self.ctx.raft.metrics().borrow().clone();
        let leader = m.state == ServerState::Leader;
        let e = &mut enc;
        gauge(e, "term", "The current Raft term", None, index(Some(m.current_term)))?;
        gauge(e, "is_leader", "1 on the leader, 0 elsewhere", None, i64::from(leader))?;
        gauge(
            e,
            "leader",
            "The leader's voter id as this voter knows it (-1: none)",
            None,
            index(m.current_leader.map(|l| l.0)),
        )?;
        gauge(e, "last_log_index", "The last index in this voter's log (-1: empty)", None, index(m.last_log_index))?;
        if leader {
            // Issue 48: the leader's view of its voters.
            let (voters, margin) = crate::server::handlers::status::voters_seen(&self.ctx, &m, true);
            let margin_help = "Voters that may still become unreachable before the quorum is lost (leader only)";
            gauge(e, "quorum_margin", margin_help, None, margin.unwrap_or(0))?;
            let g = prometheus_client::metrics::gauge::ConstGauge::new(0i64);
            let mut family = e.encode_descriptor(
                "voter_reachable",
                "1 for each voter that answered the leader within half a lease (leader only)",
                None,
                g.metric_type(),
            )?;
            for v in &voters {
                let up = prometheus_client::metrics::gauge::ConstGauge::new(i64::from(v.reachable == Some(true)));
                up.encode(family.encode_family(&VoterLabel { voter: v.id })?)?;
            }
            let mut family = e.encode_descriptor(
                "voter_lag_entries",
                "Log entries each voter has yet to take (leader only)",
                None,
                g.metric_type(),
            )?;
            for v in &voters {
                let lag = i64::try_from(v.lag_entries.unwrap_or(0)).unwrap_or(i64::MAX);
                prometheus_client::metrics::gauge::ConstGauge::new(lag)
                    .encode(family.encode_family(&VoterLabel { voter: v.id })?)?;
            }
        }
        let largest = self.ctx.largest_entry.load(std::sync::atomic::Ordering::Relaxed);
        gauge(
            e,
            "log_entry_max",
            "The largest log entry this voter appended since it started (its encoding)",
            Some(&Unit::Bytes),
            i64::try_from(largest).unwrap_or(i64::MAX),
        )?;
        gauge(
            e,
            "applied_index",
            "The last index applied to the state (-1: none)",
            None,
            index(m.last_applied.map(|l| l.index)),
        )?;
        gauge(
            e,
            "snapshot_index",
            "The last index the snapshot covers (-1: none)",
            None,
            index(m.snapshot.map(|l| l.index)),
        )?;
        gauge(
            e,
            "purged_index",
            "The last index purged from the log (-1: none)",
            None,
            index(m.purged.map(|l| l.index)),
        )?;
        let r = &self.ctx.responses;
        gauge(
            e,
            "response_in_flight",
            "Bytes of large API answers written and not yet acknowledged by their clients",
            Some(&Unit::Bytes),
            i64::try_from(r.bytes_in_flight()).unwrap_or(i64::MAX),
        )?;
        gauge(
            e,
            "response_budget",
            "The most bytes of large API answers in flight (response_budget_bytes)",
            Some(&Unit::Bytes),
            i64::try_from(r.budget_bytes()).unwrap_or(i64::MAX),
        )?;
        let in_flight = self.ctx.requests.lock().unwrap_or_else(|p| p.into_inner()).in_progress();
        gauge(e, "api_requests_in_flight", "API requests being answered", None, in_flight as i64)?;
        let (by_role, per_node, nodes_connected) = {
            let a = self.ctx.admission();
            let by_role: Vec<_> = granary_net::tls::Role::ALL.iter().map(|r| (r.as_str(), a.open_of(*r))).collect();
            (by_role, a.most_per_node(), a.nodes_connected())
        };
        let mut conns = e.encode_descriptor(
            "connections",
            "Connections open (after the handshake), by the role of their certificate",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for (role, open) in by_role {
            ConstGauge::new(open as i64).encode(conns.encode_family(&RoleLabel { role })?)?;
        }
        gauge(
            e,
            "connected_nodes",
            "Node identities (bound in their certificates) with a connection open",
            None,
            nodes_connected as i64,
        )?;
        gauge(
            e,
            "connections_most_per_node",
            "The most connections one node identity holds open (a node needs one per voter)",
            None,
            per_node as i64,
        )?;
        for (name, help, n) in [
            (
                "handshakes_refused",
                "Handshakes refused since start (the handshake budget spent)",
                &self.ctx.handshakes_refused,
            ),
            (
                "connections_refused",
                "Connections closed after their handshake since start (a cap in all, per role or per node reached)",
                &self.ctx.connections_refused,
            ),
        ] {
            let c = ConstCounter::new(n.load(std::sync::atomic::Ordering::Relaxed));
            c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        let voters = m.membership_config.membership().nodes().count();
        gauge(e, "voters", "Voters in the group's membership", None, voters as i64)?;
        let quorum_ack = m.millis_since_quorum_ack.map_or(-1.0, |ms| ms as f64 / 1000.0);
        let g = ConstGauge::new(quorum_ack);
        g.encode(e.encode_descriptor(
            "quorum_ack_age",
            "On the leader: time since a quorum last acknowledged it (-1 elsewhere)",
            Some(&Unit::Seconds),
            g.metric_type(),
        )?)?;

        let (epoch, datasets, nodes) = self.ctx.shared.read(|a| {
            (a.cluster.placement_epoch, a.cluster.datasets.len(), node_statuses(&self.ctx, &a.cluster, leader))
        });
        gauge(
            e,
            "placement_epoch",
            "The placement's epoch (moves when nodes join, leave or expire)",
            None,
            index(Some(epoch)),
        )?;
        gauge(e, "datasets", "Datasets registered", None, datasets as i64)?;
        let mut live = e.encode_descriptor(
            "node_live",
            "1 while the node's lease is live",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for n in &nodes {
            ConstGauge::new(i64::from(n.live)).encode(live.encode_family(&NodeLabel { node: n.node.0 })?)?;
        }
        let mut shards =
            e.encode_descriptor("node_shards", "Shards each node owns", None, ConstGauge::new(0i64).metric_type())?;
        for n in &nodes {
            ConstGauge::new(i64::try_from(n.shards).unwrap_or(i64::MAX))
                .encode(shards.encode_family(&NodeLabel { node: n.node.0 })?)?;
        }
        let mut left = e.encode_descriptor(
            "node_lease_left",
            "On the leader: time until each live node's lease runs out",
            Some(&Unit::Seconds),
            ConstGauge::new(0.0f64).metric_type(),
        )?;
        for n in &nodes {
            if let Some(ms) = n.lease_left_ms {
                ConstGauge::new(ms as f64 / 1000.0).encode(left.encode_family(&NodeLabel { node: n.node.0 })?)?;
            }
        }
        Ok(())
    }
}
