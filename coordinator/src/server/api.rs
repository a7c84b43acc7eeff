//! The API on `granary-api/1`: one request per stream, checked against
//! the role (and bound node id) in the caller's certificate, then answered
//! from the applied state or by proposing a command. The placement watch,
//! the one request answered by a stream of views, is handed to [`super::watch`].

use super::ctx::{Ctx, failed, is_leader, leads_with_quorum, linearize, node_statuses, not_leader, write};
use super::respond::{MAX_REQUESTS_IN_FLIGHT, MAX_REQUESTS_PER_IDENTITY};
use super::watch::watch;
use crate::state::{ClusterState, DatasetRecord, VersionRecord};
use crate::types::{Command, CommandResult};
use granary_net::api::{
    ApiRequest, ApiResponse, ClusterStatus, DatasetSummary, FailureKind, PlacementReport, VersionStatus,
    VersionSummary, VoterStatus,
};
use granary_net::frame::{self, StreamError};
use granary_net::tls::Role;
use granary_proto::NodeId;
use granary_source::dataset::Dataset;
use granary_source::remote::{Remote, RemoteCounters};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

/// How long a stream may take to send its whole request: a client that
/// opens streams and sends nothing does not hold them.
const API_REQUEST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Largest API request accepted (a view is small; a dataset add carries no
/// manifest).
pub const MAX_API_REQUEST_BYTES: usize = 1 << 20;
/// Largest command one log entry may carry (a dataset's manifest). With at
/// most [`MAX_PAYLOAD_ENTRIES`](super::MAX_PAYLOAD_ENTRIES) entries per
/// AppendEntries, a replication message stays under the 64 MiB frame limit.
pub const MAX_COMMAND_BYTES: usize = 3 << 20;

/// Serves one API stream: reads the request, checks it against `role` and
/// the certificate's `bound` node id, and writes the answer, within the
/// limits of `identity` ([`super::respond`]).
pub(super) async fn serve_api(
    ctx: &Arc<Ctx>,
    role: Role,
    bound: Option<NodeId>,
    identity: &str,
    peer: std::net::SocketAddr,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) -> Result<(), StreamError> {
    let read =
        tokio::time::timeout(API_REQUEST_WAIT, frame::read_frame::<ApiRequest>(&mut recv, MAX_API_REQUEST_BYTES));
    let req = match read.await {
        Err(_) => {
            let resp =
                failed(FailureKind::BadRequest, format!("no whole request within {} s", API_REQUEST_WAIT.as_secs()));
            frame::write_frame(&mut send, &resp).await?;
            let _ = send.finish();
            return Ok(());
        }
        Ok(Ok(Some(r))) => r,
        Ok(Ok(None)) => return Ok(()),
        Ok(Err(e)) => {
            let resp = failed(FailureKind::BadRequest, format!("malformed request: {e}"));
            frame::write_frame(&mut send, &resp).await?;
            let _ = send.finish();
            return Err(e);
        }
    };
    let kind = req.kind();
    let _in_flight = match granary_net::budget::Taken::from(&ctx.requests, identity.to_string()) {
        Ok(taken) => taken,
        Err(spent) => {
            let why = match spent {
                granary_net::budget::BudgetSpent::Address(n) => {
                    format!(
                        "{n} requests of the {identity} certificate are in flight (at most {MAX_REQUESTS_PER_IDENTITY})"
                    )
                }
                granary_net::budget::BudgetSpent::Total(n) => {
                    format!("{n} requests are in flight (at most {MAX_REQUESTS_IN_FLIGHT})")
                }
            };
            tracing::warn!(%peer, %identity, request = kind, "answering unavailable: {why}");
            let resp = failed(FailureKind::Unavailable, format!("{why}; try again"));
            super::requests::count(&ctx.api_requests, kind, &resp);
            return ctx.responses.send(&mut send, resp, None, kind, peer).await;
        }
    };
    if !req.allowed(role) {
        tracing::warn!(%role, request = req.kind(), "refused: wrong role");
        let resp = failed(FailureKind::Forbidden, format!("a {role} certificate may not send {}", req.kind()));
        super::requests::count(&ctx.api_requests, kind, &resp);
        return ctx.responses.send(&mut send, resp, None, kind, peer).await;
    }
    if let (
        None,
        Role::Node,
        ApiRequest::RegisterNode { node, .. }
        | ApiRequest::Heartbeat { node, .. }
        | ApiRequest::HoldVersions { node, .. },
    ) = (bound, role, &req)
        && !ctx.allow_unbound_node_certs
    {
        tracing::warn!(request = %node, "refused: a node certificate that names no node id");
        let resp = failed(
            FailureKind::Forbidden,
            format!(
                "this node certificate names no node id, so it may not {} as {node}: give each node a certificate \
                 bound to its id (granary certs init --nodes N, or granary certs issue --role node --name node-ID \
                 --node-id ID), or start the coordinator with --allow-unbound-node-certs",
                req.kind()
            ),
        );
        super::requests::count(&ctx.api_requests, kind, &resp);
        return ctx.responses.send(&mut send, resp, None, kind, peer).await;
    }
    if let (
        Some(b),
        ApiRequest::RegisterNode { node, .. }
        | ApiRequest::Heartbeat { node, .. }
        | ApiRequest::HoldVersions { node, .. },
    ) = (bound, &req)
        && *node != b
    {
        tracing::warn!(certificate = %b, request = %node, "refused: a certificate bound to another node");
        let resp = failed(
            FailureKind::Forbidden,
            format!("this certificate is bound to {b} and may not send {} for {node}", req.kind()),
        );
        super::requests::count(&ctx.api_requests, kind, &resp);
        return ctx.responses.send(&mut send, resp, None, kind, peer).await;
    }
    if let ApiRequest::WatchPlacement { after_revision } = req {
        ctx.api_requests.get_or_create(&super::requests::ApiLabels::watch()).inc();
        return watch(ctx, after_revision, send, peer).await;
    }
    // An answer that can be large waits for its turn to be built, so
    // answers waiting for room in the byte budget are few.
    let turn = if super::respond::builds_large_answer(&req) {
        match ctx.responses.turn_to_build().await {
            Ok(turn) => Some(turn),
            Err(busy) => {
                super::requests::count(&ctx.api_requests, kind, &busy);
                return ctx.responses.send(&mut send, busy, None, kind, peer).await;
            }
        }
    } else {
        None
    };
    let resp = handle(ctx, req, peer).await;
    super::requests::count(&ctx.api_requests, kind, &resp);
    ctx.responses.send(&mut send, resp, turn, kind, peer).await
}

fn summary(name: &str, record: &DatasetRecord, retention_ms: u64) -> Option<DatasetSummary> {
    let v = record.current()?;
    let version_list = record
        .versions
        .iter()
        .map(|r| VersionSummary {
            version: r.version,
            state: if r.version == v.version {
                VersionStatus::Current
            } else if !r.held_by.is_empty() {
                VersionStatus::Held { nodes: r.held_by.iter().copied().collect() }
            } else {
                VersionStatus::Unused { collect_at_ms: r.unused_since_ms.map(|s| s.saturating_add(retention_ms)) }
            },
            held_by: r.held_by.iter().copied().collect(),
            rows: r.manifest.total_rows(),
            files: r.manifest.files.len(),
        })
        .collect();
    Some(DatasetSummary {
        name: name.to_string(),
        version: v.version,
        versions: record.versions.len(),
        source: v.manifest.source.clone(),
        files: v.manifest.files.len(),
        shards: v.manifest.files.iter().map(|f| f.row_groups.len()).sum(),
        rows: v.manifest.total_rows(),
        source_bytes: v.manifest.total_file_bytes(),
        version_list,
    })
}

fn summaries(state: &ClusterState, retention_ms: u64) -> Vec<DatasetSummary> {
    state.datasets.iter().filter_map(|(n, r)| summary(n, r, retention_ms)).collect()
}

/// The (dataset, version) pairs `node` holds in `state` that the state
/// knows.
fn holds_of(state: &ClusterState, node: NodeId) -> BTreeSet<(String, granary_proto::DatasetVersion)> {
    let mut out = BTreeSet::new();
    for (name, r) in &state.datasets {
        out.extend(r.versions.iter().filter(|v| v.held_by.contains(&node)).map(|v| (name.clone(), v.version)));
    }
    out
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

async fn handle(ctx: &Arc<Ctx>, req: ApiRequest, peer: std::net::SocketAddr) -> ApiResponse {
    match handle_inner(ctx, req, peer).await {
        Ok(r) | Err(r) => r,
    }
}

// Both arms carry the response to send; it is written out at once, never
// propagated further, so its size does not matter.
#[allow(clippy::result_large_err)]
async fn handle_inner(ctx: &Arc<Ctx>, req: ApiRequest, peer: std::net::SocketAddr) -> Result<ApiResponse, ApiResponse> {
    match req {
        ApiRequest::RegisterNode { node, addr, ram_bytes, ssd_bytes, registration } => {
            if !is_leader(ctx) {
                return Err(not_leader(ctx));
            }
            let live = ctx
                .shared
                .read(|a| a.cluster.nodes.get(&node).filter(|r| r.live).map(|r| (r.incarnation, r.addr.clone())));
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
            match write(ctx, Command::RegisterNode { node, addr, ram_bytes, ssd_bytes, registration }).await? {
                CommandResult::NodeRegistered { incarnation, placement_epoch } => {
                    ctx.leases().handle_registered(node, incarnation, peer, Instant::now());
                    tracing::info!(%node, incarnation, placement_epoch, %peer, "node registered");
                    Ok(ApiResponse::Registered { incarnation, placement_epoch, lease_ms: ctx.lease.as_millis() as u64 })
                }
                other => Err(failed(FailureKind::Internal, format!("register applied as {other:?}"))),
            }
        }
        ApiRequest::Heartbeat { node, incarnation } => {
            if !is_leader(ctx) {
                return Err(not_leader(ctx));
            }
            if !leads_with_quorum(ctx) {
                return Err(failed(FailureKind::Unavailable, "the leader has not heard from a quorum recently"));
            }
            let check = |ctx: &Ctx| {
                ctx.shared.read(|a| {
                    let live = a.cluster.nodes.get(&node).is_some_and(|r| r.live && r.incarnation == incarnation);
                    (live, a.cluster.placement_epoch)
                })
            };
            let (mut live, mut epoch) = check(ctx);
            if !live {
                // A new leader may not have applied the latest registration
                // yet: confirm on current state before telling a node its
                // lease is gone.
                linearize(ctx).await?;
                (live, epoch) = check(ctx);
            }
            if !live {
                return Ok(ApiResponse::LeaseLost { node });
            }
            ctx.leases().handle_renewed(node, incarnation, Instant::now());
            Ok(ApiResponse::HeartbeatAccepted { placement_epoch: epoch })
        }
        ApiRequest::SetNodeWeight { node, weight } => {
            if !is_leader(ctx) {
                return Err(not_leader(ctx));
            }
            if weight == Some(0) {
                return Err(failed(
                    FailureKind::BadRequest,
                    format!("a weight of 0 for {node}: weights are at least 1"),
                ));
            }
            match write(ctx, Command::SetNodeWeight { node, weight }).await? {
                CommandResult::WeightSet { placement_epoch } => {
                    tracing::info!(%node, ?weight, placement_epoch, "node weight set");
                    Ok(ApiResponse::WeightSet { placement_epoch })
                }
                other => Err(failed(FailureKind::Internal, format!("set-node-weight applied as {other:?}"))),
            }
        }
        ApiRequest::AddDataset { name, source, view } => {
            if !valid_name(&name) {
                return Err(failed(
                    FailureKind::BadRequest,
                    format!("dataset name {name:?}: use 1-128 of [A-Za-z0-9._-]"),
                ));
            }
            let view =
                view.validated().map_err(|e| failed(FailureKind::BadRequest, format!("dataset {name}: view: {e}")))?;
            if !is_leader(ctx) {
                return Err(not_leader(ctx));
            }
            let remote = Remote::open(&source, &ctx.remote_options, None, Arc::new(RemoteCounters::default()))
                .map_err(|e| failed(FailureKind::BadRequest, e.to_string()))?;
            let dataset = Dataset::open(&name, remote, view.clone())
                .await
                .map_err(|e| failed(FailureKind::BadRequest, format!("dataset {name}: {e}")))?;
            if dataset.manifest.files.is_empty() {
                return Err(failed(
                    FailureKind::BadRequest,
                    format!("dataset {name}: {source} holds no .parquet files"),
                ));
            }
            let cmd = Command::AddDataset { name: name.clone(), view, manifest: dataset.manifest.clone() };
            let size = serde_json::to_vec(&cmd).map(|b| b.len()).unwrap_or(usize::MAX);
            if size > MAX_COMMAND_BYTES {
                return Err(failed(
                    FailureKind::BadRequest,
                    format!(
                        "dataset {name}: its manifest ({} files) encodes to {size} bytes, over the {MAX_COMMAND_BYTES}-byte limit of one log entry",
                        dataset.manifest.files.len()
                    ),
                ));
            }
            let new = match write(ctx, cmd).await? {
                CommandResult::DatasetAdded { new, .. } => new,
                other => return Err(failed(FailureKind::Internal, format!("add applied as {other:?}"))),
            };
            let summary = ctx
                .shared
                .read(|a| a.cluster.datasets.get(&name).and_then(|r| summary(&name, r, ctx.retention_ms())))
                .ok_or_else(|| failed(FailureKind::Internal, format!("dataset {name} missing after commit")))?;
            tracing::info!(dataset = %name, version = %summary.version, new, "dataset added");
            Ok(ApiResponse::DatasetAdded { summary, new })
        }
        ApiRequest::HoldVersions { node, incarnation, versions } => {
            if !is_leader(ctx) {
                return Err(not_leader(ctx));
            }
            let (live, same) = ctx.shared.read(|a| {
                let live = a.cluster.nodes.get(&node).is_some_and(|r| r.live && r.incarnation == incarnation);
                (live, holds_of(&a.cluster, node) == versions.iter().cloned().collect::<BTreeSet<_>>())
            });
            if !live {
                linearize(ctx).await?;
                if !ctx
                    .shared
                    .read(|a| a.cluster.nodes.get(&node).is_some_and(|r| r.live && r.incarnation == incarnation))
                {
                    return Ok(ApiResponse::LeaseLost { node });
                }
            } else if same {
                // Nothing to commit: the log does not grow with repeats.
                return Ok(ApiResponse::VersionsHeld { unknown: Vec::new() });
            }
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
        ApiRequest::ListDatasets => {
            linearize(ctx).await?;
            Ok(ApiResponse::Datasets(ctx.shared.read(|a| summaries(&a.cluster, ctx.retention_ms()))))
        }
        ApiRequest::DescribeDataset { name, version } => {
            linearize(ctx).await?;
            ctx.shared.read(|a| {
                let r = a.cluster.datasets.get(&name);
                let v = r.and_then(|r| match version {
                    None => r.current(),
                    Some(want) => r.versions.iter().find(|v| v.version == want),
                });
                match (r.and_then(|r| summary(&name, r, ctx.retention_ms())), v) {
                    (Some(summary), Some(v)) => {
                        Ok(ApiResponse::Dataset { summary, manifest: v.manifest.clone(), view: v.view.clone() })
                    }
                    (Some(_), None) => Err(failed(
                        FailureKind::NotFound,
                        format!("dataset {name:?} has no version {}", version.map(|v| v.to_hex()).unwrap_or_default()),
                    )),
                    _ => Err(failed(FailureKind::NotFound, format!("no dataset named {name:?}"))),
                }
            })
        }
        ApiRequest::DescribePlacement { name, version } => {
            linearize(ctx).await?;
            ctx.shared.read(|a| {
                let r = a
                    .cluster
                    .datasets
                    .get(&name)
                    .ok_or_else(|| failed(FailureKind::NotFound, format!("no dataset named {name:?}")))?;
                let v: &VersionRecord = match version {
                    None => r.current(),
                    Some(want) => r.versions.iter().find(|v| v.version == want),
                }
                .ok_or_else(|| {
                    failed(
                        FailureKind::NotFound,
                        format!("dataset {name:?} has no version {}", version.map(|v| v.to_hex()).unwrap_or_default()),
                    )
                })?;
                let current = r.current().is_some_and(|c| c.version == v.version);
                let owners = v
                    .manifest
                    .shards()
                    .iter()
                    .zip(a.cluster.owners_of(&name, v.version))
                    .map(|(s, &o)| (s.shard.file, s.shard.row_group, o))
                    .collect();
                let handed = if current { a.cluster.handed_from(&name) } else { Vec::new() };
                let handed_from = v
                    .manifest
                    .shards()
                    .iter()
                    .zip(handed)
                    .filter_map(|(s, from)| Some((s.shard.file, s.shard.row_group, from?)))
                    .collect();
                Ok(ApiResponse::Placement(PlacementReport {
                    name: name.clone(),
                    version: v.version,
                    placement_epoch: a.cluster.placement_epoch,
                    owners,
                    handed_from,
                }))
            })
        }
        ApiRequest::Status => {
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
                })
            }))
        }
        ApiRequest::WatchPlacement { .. } => Err(failed(FailureKind::Internal, "watch is served as a stream")),
    }
}
