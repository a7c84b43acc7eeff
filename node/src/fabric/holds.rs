//! Reporting this node's held versions ([`crate::holds`]) to the
//! coordinator: whenever the set changes, or the node registers again (a
//! new incarnation starts with no holds), the whole set is sent with
//! `HoldVersions`; a failure is retried every half second.

use crate::holds::{Held, HoldRegistry};
use crate::membership::Standing;
use granary_net::api::{ApiRequest, ApiResponse};
use granary_net::client::CoordinatorClient;
use granary_proto::NodeId;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Keeps the coordinator's record of `node`'s holds equal to `registry`'s.
pub(crate) async fn report_holds(
    node: NodeId,
    registry: Arc<HoldRegistry>,
    client: CoordinatorClient,
    mut standing: watch::Receiver<Standing>,
    linger: Duration,
) {
    let retry = Duration::from_millis(500);
    let mut acked: Option<(u64, BTreeSet<Held>)> = None;
    loop {
        let incarnation = standing.borrow_and_update().incarnation;
        let held = registry.held(std::time::Instant::now(), linger);
        let mut failed = false;
        if let Some(incarnation) = incarnation
            && acked.as_ref() != Some(&(incarnation, held.clone()))
        {
            let versions: Vec<Held> = held.iter().cloned().collect();
            match client.call(&ApiRequest::HoldVersions { node, incarnation, versions }).await {
                Ok((_, ApiResponse::VersionsHeld { unknown })) => {
                    for (dataset, version) in &unknown {
                        tracing::warn!(%dataset, %version, "the coordinator does not know a version trainers here use");
                    }
                    tracing::debug!(held = held.len(), "holds reported");
                    acked = Some((incarnation, held));
                }
                // The lease loop registers again; the new incarnation is
                // reported when the standing changes.
                Ok((_, ApiResponse::LeaseLost { .. })) => {}
                Ok((addr, other)) => {
                    tracing::warn!(%addr, "unexpected answer to hold-versions: {other:?}");
                    failed = true;
                }
                Err(e) => {
                    tracing::warn!("cannot report held versions: {e}");
                    failed = true;
                }
            }
        }
        let linger_ends = registry.next_change(linger).map(tokio::time::Instant::from_std);
        tokio::select! {
            changed = standing.changed() => if changed.is_err() { return },
            _ = registry.changed() => {}
            _ = tokio::time::sleep_until(linger_ends.unwrap_or_else(far)), if linger_ends.is_some() => {}
            _ = tokio::time::sleep(retry), if failed => {}
        }
    }
}

fn far() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(3600)
}
