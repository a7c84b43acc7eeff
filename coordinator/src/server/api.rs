//! The API on `granary-api/1`: one request per stream, checked against
//! the role (and bound node id) in the caller's certificate, then answered
//! from the applied state or by proposing a command. The placement watch,
//! the one request answered by a stream of views, is handed to [`super::watch`].

use super::ctx::{Ctx, failed};
use super::handlers::{datasets, nodes, status};
use super::respond::{MAX_REQUESTS_IN_FLIGHT, MAX_REQUESTS_PER_IDENTITY};
use super::watch::{watch, watch_deltas};
use granary_net::api::{ApiRequest, ApiResponse, FailureKind};
use granary_net::frame::{self, StreamError};
use granary_net::tls::Role;
use granary_proto::NodeId;
use std::sync::Arc;

/// How long a stream may take to send its whole request: a client that
/// opens streams and sends nothing does not hold them.
const API_REQUEST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Largest API request accepted (a view is small; a dataset add carries no
/// manifest).
pub const MAX_API_REQUEST_BYTES: usize = 1 << 20;

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
    if let ApiRequest::WatchPlacement { after_revision, deltas } = req {
        ctx.api_requests.get_or_create(&super::requests::ApiLabels::watch()).inc();
        return match deltas {
            true => watch_deltas(ctx, send, peer).await,
            false => watch(ctx, after_revision, send, peer).await,
        };
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
    let resp = match req {
        ApiRequest::AddDataset { name, source, view, progress: true } => {
            super::progress::add_reporting(ctx, name, source, view, &mut send).await?
        }
        req => handle(ctx, req, peer).await,
    };
    super::requests::count(&ctx.api_requests, kind, &resp);
    ctx.responses.send(&mut send, resp, turn, kind, peer).await
}

/// The answer to `req`, by its handler ([`super::handlers`]).
async fn handle(ctx: &Arc<Ctx>, req: ApiRequest, peer: std::net::SocketAddr) -> ApiResponse {
    let answer = match req {
        ApiRequest::RegisterNode { node, addr, ram_bytes, ssd_bytes, registration } => {
            nodes::register(ctx, node, addr, ram_bytes, ssd_bytes, registration, peer).await
        }
        ApiRequest::Heartbeat { node, incarnation } => nodes::heartbeat(ctx, node, incarnation).await,
        ApiRequest::SetNodeWeight { node, weight } => nodes::set_weight(ctx, node, weight).await,
        ApiRequest::HoldVersions { node, incarnation, versions } => {
            nodes::hold_versions(ctx, node, incarnation, versions).await
        }
        ApiRequest::AddDataset { name, source, view, .. } => {
            datasets::add(ctx, name, source, view, &tokio::sync::watch::channel(Default::default()).0).await
        }
        ApiRequest::ListDatasets => datasets::list(ctx).await,
        ApiRequest::DescribeDataset { name, version } => datasets::describe(ctx, name, version).await,
        ApiRequest::DescribePlacement { name, version } => datasets::placement(ctx, name, version).await,
        ApiRequest::ManifestPiece { name, version, index } => datasets::manifest_piece(ctx, name, version, index).await,
        ApiRequest::Status => status::status(ctx).await,
        ApiRequest::WatchPlacement { .. } => Err(failed(FailureKind::Internal, "watch is served as a stream")),
    };
    match answer {
        Ok(r) | Err(r) => r,
    }
}
