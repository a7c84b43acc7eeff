//! The timer tasks. Each sleeps until its pure core's next deadline,
//! feeds it what Raft and the applied state say at that moment, and carries
//! out what it decides: the lease loop proposes `ExpireNode`, the
//! collection loop `CollectVersions`, the election loop starts an
//! election. The decisions, and their tests, live in [`crate::leases`],
//! [`crate::state`] and [`crate::election`].

use super::ctx::{Ctx, write};
use crate::election::Watchdog;
use crate::types::{Command, CommandResult, VoterId};
use granary_proto::NodeId;
use std::sync::Arc;

/// On the leader: expires nodes whose heartbeats stopped, by the rules of
/// [`crate::leases::Leases`]. The expiries of one tick are proposed as one
/// command and awaited, so the next tick sees them committed in the state.
pub(super) async fn lease_loop(ctx: Arc<Ctx>) {
    loop {
        let wake = ctx.leases().poll_timeout();
        tokio::time::sleep_until(wake.into()).await;
        let now = tokio::time::Instant::now().into_std();
        let term = {
            let m = ctx.raft.metrics().borrow().clone();
            (m.current_leader == Some(ctx.id)).then_some(m.current_term)
        };
        let live: Vec<(NodeId, u64)> = ctx
            .shared
            .read(|a| a.cluster.nodes.iter().filter(|(_, r)| r.live).map(|(&n, r)| (n, r.incarnation)).collect());
        let expired = {
            let mut leases = ctx.leases();
            leases.handle_timeout(now);
            leases.handle_leadership(term, now);
            leases.handle_state(live, now);
            leases.poll_expired(now)
        };
        if expired.is_empty() {
            continue;
        }
        // The leases that ran out by this tick, in one command: one
        // re-placement and one epoch, however many lapsed together.
        let nodes: Vec<(NodeId, u64)> = expired.iter().map(|e| (e.node, e.incarnation)).collect();
        match write(&ctx, Command::ExpireNodes { nodes: nodes.clone() }).await {
            Ok(CommandResult::NodesExpired { expired: gone, placement_epoch: Some(epoch) }) => {
                for (node, incarnation) in nodes.iter().filter(|(n, _)| gone.contains(n)) {
                    // What on-call wants to see (issue 48): a node lost.
                    tracing::warn!(%node, incarnation, placement_epoch = epoch, "lease expired");
                }
            }
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(nodes = nodes.len(), "could not commit lease expiries: {err:?}");
                let mut leases = ctx.leases();
                for e in expired {
                    leases.handle_expiry_failed(e);
                }
            }
        }
    }
}

/// On the leader: collects older dataset versions nobody has used for the
/// retention, and the records of nodes down for the node retention ([`crate::state::ClusterState::collection_due`] decides; the
/// command carries the leader's clock, so applying it reads none). Checks
/// once a second, and proposes only when the command would change
/// something.
pub(super) async fn collect_loop(ctx: Arc<Ctx>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !super::ctx::leads_with_quorum(&ctx) {
            continue;
        }
        let now_ms = super::ctx::wall_ms();
        let retention_ms = ctx.retention_ms();
        let node_retention_ms = Some(ctx.node_retention_ms());
        if !ctx.shared.read(|a| a.cluster.collection_due(now_ms, retention_ms, node_retention_ms)) {
            continue;
        }
        match write(&ctx, Command::CollectVersions { now_ms, retention_ms, node_retention_ms }).await {
            Ok(CommandResult::VersionsCollected { collected, nodes }) => {
                for (dataset, version) in collected {
                    tracing::info!(%dataset, %version, "collected a version nobody used for the retention");
                }
                for node in nodes {
                    tracing::info!(%node, "collected the record of a node down for the node retention");
                }
            }
            Ok(_) => {}
            Err(err) => tracing::warn!("could not commit a version collection: {err:?}"),
        }
    }
}

/// On the leader: turns on owners that follow content once every voter
/// speaks the version of Raft that carries the entry
/// ([`crate::switch::content_owners_due`] decides). Checks once a second.
pub(super) async fn switch_loop(ctx: Arc<Ctx>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !super::ctx::leads_with_quorum(&ctx) {
            continue;
        }
        let voters: Vec<VoterId> = ctx.raft.metrics().borrow().membership_config.membership().voter_ids().collect();
        let on = ctx.shared.read(|a| a.cluster.content_owners);
        if !crate::switch::content_owners_due(on, ctx.id, &voters, &ctx.network.raft_versions()) {
            continue;
        }
        match write(&ctx, Command::EnableContentOwners).await {
            Ok(CommandResult::ContentOwners { turned_on: true }) => {
                tracing::info!(
                    voters = voters.len(),
                    "every voter speaks granary-raft/2: new versions' shards now start with the owners of the same content"
                );
            }
            Ok(_) => {}
            Err(err) => tracing::warn!("could not commit EnableContentOwners: {err:?}"),
        }
    }
}

/// On followers: starts an election when [`Watchdog`] says the leader
/// lease has run out.
pub(super) async fn election_loop(ctx: Arc<Ctx>, mut watchdog: Watchdog) {
    loop {
        tokio::time::sleep_until(watchdog.poll_timeout().into()).await;
        let now = tokio::time::Instant::now().into_std();
        watchdog.handle_timeout(now);
        if let Some(at) = ctx.contact.last() {
            watchdog.handle_contact(at);
        }
        let (leader, voters) = {
            let m = ctx.raft.metrics().borrow().clone();
            let voters: Vec<VoterId> = m.membership_config.membership().voter_ids().collect();
            (m.current_leader, voters)
        };
        watchdog.handle_membership(leader, voters, now);
        if let Some(c) = watchdog.poll_campaign(now) {
            tracing::info!(silent_ms = c.silent.as_millis() as u64, "no leader contact: campaigning");
            if let Err(e) = ctx.raft.trigger().elect().await {
                tracing::warn!("cannot start an election: {e}");
            }
        }
    }
}
