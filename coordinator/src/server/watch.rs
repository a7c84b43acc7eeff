//! The placement watch: a stream of [`PlacementView`]s that the leader
//! pushes to nodes and trainers whenever the placement epoch, a dataset's
//! current version, or the set of older versions (held or not) changes;
//! or, to watchers that ask for deltas, the whole placement with every
//! placed version's owners, then only what changed ([`super::feed`]).

use super::ctx::{Ctx, is_leader, leads_with_quorum, node_statuses, not_leader};
use super::feed::Next;
use granary_net::api::{ApiResponse, PlacementView};
use granary_net::frame::{self, StreamError};
use std::sync::Arc;
use std::time::Duration;

/// Pushes the current [`PlacementView`] at once, then a new one whenever
/// the placement epoch or a dataset's current version changes, until this
/// voter stops leading with a quorum or the watcher goes away.
pub(super) async fn watch(
    ctx: &Arc<Ctx>,
    after_revision: u64,
    mut send: quinn::SendStream,
    peer: std::net::SocketAddr,
) -> Result<(), StreamError> {
    if !is_leader(ctx) {
        frame::write_frame(&mut send, &not_leader(ctx)).await?;
        let _ = send.finish();
        return Ok(());
    }
    let _ = after_revision; // the first view is always sent; watchers drop what they have seen
    let mut changes = ctx.shared.subscribe();
    type Versions = Vec<(String, granary_proto::DatasetVersion)>;
    let mut last: Option<(u64, Versions, Versions, Option<Versions>)> = None;
    loop {
        let view = ctx.shared.read(|a| PlacementView {
            revision: a.last_applied.map(|l| l.index).unwrap_or(0),
            placement_epoch: a.cluster.placement_epoch,
            nodes: node_statuses(ctx, &a.cluster, false),
            datasets: a
                .cluster
                .datasets
                .iter()
                .filter_map(|(n, r)| r.current().map(|v| (n.clone(), v.version)))
                .collect(),
            held: a.cluster.held_versions(),
            older: Some(
                a.cluster
                    .datasets
                    .iter()
                    .flat_map(|(n, r)| r.older().iter().map(move |v| (n.clone(), v.version)))
                    .collect(),
            ),
        });
        let key = (view.placement_epoch, view.datasets.clone(), view.held.clone(), view.older.clone());
        if last.as_ref() != Some(&key) {
            if !ctx.responses.send_view(&mut send, &ApiResponse::PlacementChanged(view), peer).await? {
                return Ok(());
            }
            last = Some(key);
        }
        // Wake on a change, when the watcher stops reading, or every second
        // to notice a lost leadership.
        tokio::select! {
            _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()) => {}
            _ = send.stopped() => return Ok(()),
        }
        if !leads_with_quorum(ctx) {
            let _ = send.finish();
            return Ok(());
        }
    }
}

/// The watch for a watcher that asked for deltas: the whole placement (the
/// view and every placed version's owner table) at once, then, whenever the
/// applied state moves, the update from what this watcher was last sent
/// (nothing when nothing it sees changed), until this voter stops leading
/// with a quorum or the watcher goes away. A watcher that reopens the watch
/// (it fell behind, or the leader changed) starts from the whole again.
pub(super) async fn watch_deltas(
    ctx: &Arc<Ctx>,
    mut send: quinn::SendStream,
    peer: std::net::SocketAddr,
) -> Result<(), StreamError> {
    if !is_leader(ctx) {
        frame::write_frame(&mut send, &not_leader(ctx)).await?;
        let _ = send.finish();
        return Ok(());
    }
    let mut changes = ctx.shared.subscribe();
    let mut sent: Option<Arc<granary_net::placement::Placement>> = None;
    loop {
        let next = ctx.feed.current(&ctx.shared).await;
        if sent.as_ref().map(|s| s.view.revision) != Some(next.view.revision) {
            match ctx.feed.frame(sent.as_ref(), &next, &ctx.responses).await? {
                Next::Nothing => {}
                Next::Frame(bytes) => {
                    if !ctx.responses.send_shared(&mut send, bytes, peer).await? {
                        return Ok(());
                    }
                }
                Next::NoRoom => {
                    tracing::warn!(%peer, "ending a placement watch: no room in the answer budget for its update");
                    let _ = send.reset(1u32.into());
                    return Ok(());
                }
            }
            sent = Some(next);
        }
        tokio::select! {
            _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()) => {}
            _ = send.stopped() => return Ok(()),
        }
        if !leads_with_quorum(ctx) {
            let _ = send.finish();
            return Ok(());
        }
    }
}
