//! The nodes' requests: register, heartbeat, set a weight, hold versions.

use super::{Answer, confirmed, leading};
use crate::server::ctx::{Ctx, failed, leads_with_quorum, write};
use crate::state::ClusterState;
use crate::types::{Command, CommandResult};
use granary_net::api::{ApiResponse, FailureKind};
use granary_proto::{DatasetVersion, NodeId};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Instant;

/// A node registers (a new incarnation), unless another daemon holds its
/// id live from another address (the lease table decides).
pub(in crate::server) async fn register(
    ctx: &Ctx,
    node: NodeId,
    addr: String,
    ram_bytes: u64,
    ssd_bytes: u64,
    registration: u64,
    peer: SocketAddr,
) -> Answer {
    leading(ctx)?;
    let live =
        ctx.shared.read(|a| a.cluster.nodes.get(&node).filter(|r| r.live).map(|r| (r.incarnation, r.addr.clone())));
    let refused = ctx.leases().refuse_registration(
        node,
        live.as_ref().map(|(i, a)| (*i, a.as_str())),
        &addr,
        peer,
        Instant::now(),
    );
    if let Some(r) = refused {
        tracing::warn!(
            %node, live_addr = %r.live_addr, incarnation = r.incarnation, refused_addr = %addr, from = %peer,
            "refused a second daemon: the node is live elsewhere"
        );
        return Err(failed(
            FailureKind::Forbidden,
            format!(
                "{node} is live at {} (incarnation {}, lease renewed {} ms ago): a second daemon at {addr} \
                 (from {peer}) may not register as it; stop one of them (each host needs its own node id and \
                 certificate)",
                r.live_addr,
                r.incarnation,
                r.since_renewal.as_millis()
            ),
        ));
    }
    // Two live nodes at one address would make every peer read one of them
    // as the other. And the live daemon registering again from the socket
    // it registered from, as it was, has nothing to commit and nothing to
    // re-place (a storm of such registrations costs no log entries and
    // moves no epoch).
    let (taken, standing) = ctx.shared.read(|a| {
        let taken = a.cluster.nodes.iter().find(|(id, r)| **id != node && r.live && r.addr == addr).map(|(id, _)| *id);
        let standing = a.cluster.nodes.get(&node).and_then(|r| {
            let same = r.live && r.addr == addr && r.ram_bytes == ram_bytes && r.ssd_bytes == ssd_bytes;
            same.then_some((r.incarnation, a.cluster.placement_epoch))
        });
        (taken, standing)
    });
    if let Some(other) = taken {
        tracing::warn!(%node, %other, %addr, from = %peer, "refused a registration at another live node's address");
        return Err(failed(
            FailureKind::Forbidden,
            format!(
                "{node} may not register at {addr}: {other} is live there; each node advertises its own address \
                 (check `advertise` in both hosts' node.toml)"
            ),
        ));
    }
    let now = Instant::now();
    if let Some((incarnation, placement_epoch)) = standing {
        let mut leases = ctx.leases();
        if leases.same_daemon(node, incarnation, peer, now) {
            leases.handle_renewed(node, incarnation, now);
            drop(leases);
            tracing::debug!(%node, incarnation, %peer, "a live node registered again: its incarnation stands");
            return Ok(ApiResponse::Registered {
                incarnation,
                placement_epoch,
                lease_ms: ctx.lease.as_millis() as u64,
            });
        }
    }
    ctx.admit_commit(node, "register-node")?;
    match write(ctx, Command::RegisterNode { node, addr, ram_bytes, ssd_bytes, registration }).await? {
        CommandResult::NodeRegistered { incarnation, placement_epoch } => {
            ctx.leases().handle_registered(node, incarnation, peer, Instant::now());
            tracing::info!(%node, incarnation, placement_epoch, %peer, "node registered");
            Ok(ApiResponse::Registered { incarnation, placement_epoch, lease_ms: ctx.lease.as_millis() as u64 })
        }
        other => Err(failed(FailureKind::Internal, format!("register applied as {other:?}"))),
    }
}

/// A node renews its lease: accepted only while the leader has heard from
/// a quorum recently and the node's incarnation is live.
pub(in crate::server) async fn heartbeat(ctx: &Ctx, node: NodeId, incarnation: u64) -> Answer {
    leading(ctx)?;
    if !leads_with_quorum(ctx) {
        return Err(failed(FailureKind::Unavailable, "the leader has not heard from a quorum recently"));
    }
    let (live, epoch, _) = confirmed(ctx, node, incarnation, |c| c.placement_epoch).await?;
    if !live {
        return Ok(ApiResponse::LeaseLost { node });
    }
    ctx.leases().handle_renewed(node, incarnation, Instant::now());
    Ok(ApiResponse::HeartbeatAccepted { placement_epoch: epoch })
}

/// An operator sets (or clears) a node's placement weight.
pub(in crate::server) async fn set_weight(ctx: &Ctx, node: NodeId, weight: Option<u64>) -> Answer {
    leading(ctx)?;
    if weight == Some(0) {
        return Err(failed(FailureKind::BadRequest, format!("a weight of 0 for {node}: weights are at least 1")));
    }
    match write(ctx, Command::SetNodeWeight { node, weight }).await? {
        CommandResult::WeightSet { placement_epoch } => {
            tracing::info!(%node, ?weight, placement_epoch, "node weight set");
            Ok(ApiResponse::WeightSet { placement_epoch })
        }
        other => Err(failed(FailureKind::Internal, format!("set-node-weight applied as {other:?}"))),
    }
}

/// A node says which versions its trainers use; a repeat of what the state
/// already holds commits nothing, so the log does not grow with repeats.
pub(in crate::server) async fn hold_versions(
    ctx: &Ctx,
    node: NodeId,
    incarnation: u64,
    versions: Vec<(String, DatasetVersion)>,
) -> Answer {
    leading(ctx)?;
    let wanted: BTreeSet<_> = versions.iter().cloned().collect();
    let (live, same, _) = confirmed(ctx, node, incarnation, |c| holds_of(c, node) == wanted).await?;
    if !live {
        return Ok(ApiResponse::LeaseLost { node });
    }
    if same {
        return Ok(ApiResponse::VersionsHeld { unknown: Vec::new() });
    }
    ctx.admit_commit(node, "hold-versions")?;
    let held = versions.len();
    match write(ctx, Command::HoldVersions { node, incarnation, versions }).await? {
        CommandResult::VersionsHeld { stale: true, .. } => Ok(ApiResponse::LeaseLost { node }),
        CommandResult::VersionsHeld { unknown, stale: false } => {
            tracing::info!(%node, held, unknown = unknown.len(), "versions held");
            Ok(ApiResponse::VersionsHeld { unknown })
        }
        other => Err(failed(FailureKind::Internal, format!("hold applied as {other:?}"))),
    }
}

/// The (dataset, version) pairs `node` holds in `state` that the state
/// knows.
fn holds_of(state: &ClusterState, node: NodeId) -> BTreeSet<(String, DatasetVersion)> {
    let mut out = BTreeSet::new();
    for (name, r) in &state.datasets {
        out.extend(r.versions.iter().filter(|v| v.held_by.contains(&node)).map(|v| (name.clone(), v.version)));
    }
    out
}
