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
    let leader = is_leader(ctx);
    let (voters, quorum_margin) = voters_seen(ctx, &m, leader);
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
            quorum_margin,
        })
    }))
}

/// The voters of `m`'s membership; on the leader (`leader`) with how it
/// sees each (issue 48: who answered it within half a lease, how long
/// ago, how many entries behind) and how many more may become unreachable
/// before the quorum is lost.
pub(in crate::server) fn voters_seen(
    ctx: &Ctx,
    m: &openraft::RaftMetrics<crate::types::VoterId, openraft::BasicNode>,
    leader: bool,
) -> (Vec<VoterStatus>, Option<i64>) {
    let answers = ctx.network.last_answers();
    let now = std::time::Instant::now();
    let fresh = ctx.lease / 2;
    let last_log = m.last_log_index.unwrap_or(0);
    let voters: Vec<VoterStatus> = m
        .membership_config
        .membership()
        .nodes()
        .map(|(id, n)| {
            let mut v = VoterStatus {
                id: id.0,
                addr: n.addr.clone(),
                reachable: None,
                answered_ms_ago: None,
                lag_entries: None,
            };
            if leader {
                let ago = match *id == ctx.id {
                    true => Some(std::time::Duration::ZERO),
                    false => answers.get(id).map(|t| now.saturating_duration_since(*t)),
                };
                v.reachable = Some(crate::health::reachable(ago, fresh));
                v.answered_ms_ago = ago.map(|a| a.as_millis() as u64);
                let matched = match *id == ctx.id {
                    true => Some(last_log),
                    false => m.replication.as_ref().and_then(|r| r.get(id).copied().flatten()).map(|l| l.index),
                };
                v.lag_entries = Some(last_log.saturating_sub(matched.unwrap_or(0)));
            }
            v
        })
        .collect();
    let margin = leader.then(|| {
        crate::health::quorum_margin(voters.iter().filter(|v| v.reachable == Some(true)).count(), voters.len())
    });
    (voters, margin)
}
