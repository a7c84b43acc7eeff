//! The cluster's status: voters, leader, term, nodes and datasets, on
//! linearized state.

use super::Answer;
use super::datasets::summaries;
use crate::server::ctx::{Ctx, is_leader, linearize, node_statuses};
use granary_net::api::{ApiResponse, ClusterStatus, VoterStatus};

/// The cluster's status as this voter sees it (the lease table's view of
/// the nodes only on the leader).
pub(in crate::server) async fn status(ctx: &Ctx) -> Answer {
    linearize(ctx).await?;
    let m = ctx.raft.metrics().borrow().clone();
    let voters = m
        .membership_config
        .membership()
        .nodes()
        .map(|(id, n)| VoterStatus { id: id.0, addr: n.addr.clone() })
        .collect();
    let leader = is_leader(ctx);
    Ok(ctx.shared.read(|a| {
        ApiResponse::Status(ClusterStatus {
            answered_by: ctx.id.0,
            leader: m.current_leader.map(|l| l.0),
            term: m.current_term,
            applied_index: a.last_applied.map(|l| l.index),
            voters,
            placement_epoch: a.cluster.placement_epoch,
            nodes: node_statuses(ctx, &a.cluster, leader),
            datasets: summaries(&a.cluster, ctx.retention_ms()),
            content_owners: a.cluster.content_owners,
        })
    }))
}
