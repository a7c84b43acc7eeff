//! One handler per coordinator API request, by what it concerns: the nodes
//! (`nodes`: register, heartbeat, weight, held versions), the datasets
//! (`datasets`: add, list, describe, placement) and the cluster's status
//! (`status`). `super::api` reads, checks and dispatches a request; a
//! handler answers it, from the applied state or by proposing a command.
//!
//! The rules handlers share are written once, here: the leader check, and
//! the liveness rule ([`confirmed`]): a request that names a node's
//! incarnation is checked against the applied state, and only when that
//! says the node is not live is the state linearized and read again (a new
//! leader may not have applied the latest registration yet), so a node is
//! never told its lease is gone on a stale read, and the common case costs
//! no round.

// A handler's `Err` is the response to send (see [`Answer`]): written out
// at once, never propagated further, so its size does not matter.
#![allow(clippy::result_large_err)]

pub(super) mod datasets;
pub(super) mod nodes;
pub(super) mod status;

use super::ctx::{Ctx, is_leader, linearize, not_leader};
use crate::state::ClusterState;
use granary_net::api::ApiResponse;
use granary_proto::NodeId;

/// A handler's answer: both arms carry the response to send (`Err` ends
/// a handler early with `?`).
pub(super) type Answer = Result<ApiResponse, ApiResponse>;

/// Refuses with the leader's address unless this voter leads.
pub(super) fn leading(ctx: &Ctx) -> Result<(), ApiResponse> {
    if is_leader(ctx) { Ok(()) } else { Err(not_leader(ctx)) }
}

/// What `read` says of the applied state, with whether `node` at
/// `incarnation` is live in it, confirmed on linearized state when the
/// first read says it is not (see the module doc). The flag is true when
/// the answer comes from the second read.
pub(super) async fn confirmed<T>(
    ctx: &Ctx,
    node: NodeId,
    incarnation: u64,
    read: impl Fn(&ClusterState) -> T,
) -> Result<(bool, T, bool), ApiResponse> {
    let check = |ctx: &Ctx| {
        ctx.shared.read(|a| {
            let live = a.cluster.nodes.get(&node).is_some_and(|r| r.live && r.incarnation == incarnation);
            (live, read(&a.cluster))
        })
    };
    let (live, value) = check(ctx);
    if live {
        return Ok((true, value, false));
    }
    linearize(ctx).await?;
    let (live, value) = check(ctx);
    Ok((live, value, true))
}
