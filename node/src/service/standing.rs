//! What the node reports beyond [`granary_proto::wire::NodeStats`] (local
//! protocol 3's counters by name), and its standing in its cluster
//! (issue 48: `granary stats` and the metrics show it).

use super::Node;

impl Node {
    /// The counters beyond [`granary_proto::wire::NodeStats`] that the local
    /// socket reports by name (`LocalRequest::Counters`).
    /// `mapping_advice_bytes`, the advice now, where the node's memory is
    /// known. A cluster node adds its membership (issue 48): `in_cluster` 1,
    /// `registered` 0 or 1, and while registered `lease_left_ms` and
    /// `since_renewal_ms`; `placement_epoch` known.
    pub fn counters(&self) -> Vec<granary_proto::wire::Counter> {
        let c = |name: &str, value: u64| granary_proto::wire::Counter { name: name.into(), value };
        let mut out = vec![c("chunks_reused", self.chunks_reused())];
        // The mapping advice as it is now: trainers read it again each
        // time they announce a plan (issue 42).
        let advice = self.mapping_advice();
        if advice != u64::MAX {
            out.push(c("mapping_advice_bytes", advice));
        }
        if let Some(m) = self.membership() {
            out.push(c("in_cluster", 1));
            out.push(c("registered", u64::from(m.since_renewal.is_some())));
            if let Some(since) = m.since_renewal {
                out.push(c("since_renewal_ms", since.as_millis() as u64));
                out.push(c("lease_left_ms", m.lease.saturating_sub(since).as_millis() as u64));
            }
            out.push(c("placement_epoch", m.placement_epoch));
        }
        out
    }

    /// This node's standing in its cluster now, or None for a node alone.
    pub fn membership(&self) -> Option<ClusterStanding> {
        let cluster = self.inner.cluster.get()?;
        let lease = cluster.lease_view();
        let now = tokio::time::Instant::now().into_std();
        Some(ClusterStanding {
            since_renewal: lease.renewed_at.map(|t| now.saturating_duration_since(t)),
            lease: lease.lease,
            placement_epoch: cluster.epoch(),
        })
    }
}

/// A cluster node's standing ([`Node::membership`]).
#[derive(Clone, Copy, Debug)]
pub struct ClusterStanding {
    /// How long ago the last heartbeat or registration the coordinators
    /// accepted was sent; None while not registered (or the lease is known
    /// lost).
    pub since_renewal: Option<std::time::Duration>,
    /// The coordinators' lease.
    pub lease: std::time::Duration,
    /// The placement epoch this node knows.
    pub placement_epoch: u64,
}
