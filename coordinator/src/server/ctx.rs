//! What every task of a voter shares: the Raft handle, the applied state,
//! the leader's lease table, and the role checks the API answers with
//! (leader or not, leading with a quorum, a current read, a commit).
//!
//! The other server files use this one; it uses none of them.

use crate::leases::Leases;
use crate::network::LeaderContact;
use crate::sm::Shared;
use crate::state::ClusterState;
use crate::types::{Command, CommandResult, Raft, VoterId};
use granary_net::api::{ApiResponse, FailureKind, NodeStatus};
use openraft::error::{ClientWriteError, RaftError};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Per-voter state the handlers share.
pub(super) struct Ctx {
    /// The Raft links to the other voters (which version of Raft each speaks).
    pub(super) network: crate::network::QuicNetwork,
    pub(super) id: VoterId,
    pub(super) raft: Raft,
    pub(super) shared: Arc<Shared>,
    pub(super) lease: Duration,
    pub(super) remote_options: BTreeMap<String, String>,
    /// How long an older version nobody uses is kept.
    pub(super) version_retention: Duration,
    /// How long the record of a node that is not live is kept.
    pub(super) node_retention: Duration,
    /// Bytes of compact manifest per staged piece.
    pub(super) manifest_piece_bytes: usize,
    /// Whether node certificates without a node id may register.
    pub(super) allow_unbound_node_certs: bool,
    /// Whether coordinator certificates without a voter id may speak Raft.
    pub(super) allow_unbound_voter_certs: bool,
    /// The leader's lease table; only the leader's holds clocks.
    pub(super) leases: Mutex<Leases>,
    /// Handshakes in progress, in all ([`super::MAX_HANDSHAKES`]) and per
    /// source address ([`super::MAX_HANDSHAKES_PER_ADDRESS`]).
    pub(super) handshakes: Arc<Mutex<granary_net::budget::AddressBudget>>,
    /// Connections open (after the handshake), in all, per role and per
    /// node identity, each bounded ([`crate::admission`]).
    pub(super) admission: Mutex<crate::admission::Admission>,
    /// How often each node may make the leader commit
    /// ([`crate::commit_rate`]).
    pub(super) commit_rate: Mutex<crate::commit_rate::CommitRate>,
    /// Handshakes refused since start (the handshake budget spent).
    pub(super) handshakes_refused: std::sync::atomic::AtomicU64,
    /// Connections closed after their handshake since start (a cap of
    /// [`crate::admission`] reached).
    pub(super) connections_refused: std::sync::atomic::AtomicU64,
    /// Last AppendEntries accepted from a leader.
    pub(super) contact: LeaderContact,
    /// API requests answered, by kind and result (the metrics endpoint).
    pub(super) api_requests: super::requests::ApiRequests,
    /// API requests in flight, in all and per certificate identity
    /// ([`super::respond`]).
    pub(super) requests: Arc<Mutex<granary_net::budget::Budget<String>>>,
    /// The byte budget and write deadline of answers.
    pub(super) responses: super::respond::Responses,
    /// The compact manifests last served in pieces, newest last (at most
    /// [`COMPACT_CACHED`]): a thousand nodes fetching one version's pieces
    /// encode it once.
    pub(super) compact: Mutex<Vec<Compact>>,
    /// What the placement watch publishes to watchers of deltas, shared.
    pub(super) feed: super::feed::Feed,
    /// Bytes of the largest log entry this voter appended since it started.
    pub(super) largest_entry: Arc<std::sync::atomic::AtomicU64>,
}

/// How many versions' compact manifests a voter keeps for serving pieces.
pub(super) const COMPACT_CACHED: usize = 4;

/// A version's compact manifest and how it is cut into the pieces served.
pub(super) struct Compact {
    pub(super) version: granary_proto::DatasetVersion,
    pub(super) bytes: Arc<Vec<u8>>,
    pub(super) pieces: Arc<granary_proto::manifest::ManifestPieces>,
}

impl Ctx {
    /// The connections open. Its methods never panic midway.
    pub(super) fn admission(&self) -> MutexGuard<'_, crate::admission::Admission> {
        self.admission.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes one of `node`'s commits at `now`, or answers "unavailable,
    /// retry in N ms" ([`crate::commit_rate`]).
    #[allow(clippy::result_large_err)]
    pub(super) fn admit_commit(&self, node: granary_proto::NodeId, what: &str) -> Result<(), ApiResponse> {
        let slowed = self.commit_rate.lock().unwrap_or_else(|p| p.into_inner()).admit(node, Instant::now());
        slowed.map_err(|s| {
            tracing::warn!(%node, request = what, retry_ms = s.retry_in.as_millis() as u64, "a node commits too often");
            failed(
                FailureKind::Unavailable,
                format!(
                    "{node} asked for more commits than its share ({what}); try again in {} ms",
                    s.retry_in.as_millis().max(1)
                ),
            )
        })
    }

    /// The lease table. Its methods never panic midway, so a poisoned lock
    /// still holds a consistent table.
    pub(super) fn leases(&self) -> MutexGuard<'_, Leases> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`Ctx::node_retention`] in milliseconds.
    pub(super) fn node_retention_ms(&self) -> u64 {
        u64::try_from(self.node_retention.as_millis()).unwrap_or(u64::MAX)
    }

    /// [`Ctx::version_retention`] in milliseconds.
    pub(super) fn retention_ms(&self) -> u64 {
        u64::try_from(self.version_retention.as_millis()).unwrap_or(u64::MAX)
    }
}

pub(super) fn failed(kind: FailureKind, message: impl Into<String>) -> ApiResponse {
    ApiResponse::Failed { kind, message: message.into() }
}

/// The leader as this voter knows it, with its address.
fn leader_of(ctx: &Ctx) -> Option<(u64, String)> {
    let m = ctx.raft.metrics().borrow().clone();
    let leader = m.current_leader?;
    let addr = m.membership_config.membership().get_node(&leader)?.addr.clone();
    Some((leader.0, addr))
}

pub(super) fn not_leader(ctx: &Ctx) -> ApiResponse {
    ApiResponse::NotLeader { leader: leader_of(ctx).filter(|(id, _)| *id != ctx.id.0) }
}

/// Waits until this voter may answer a read that must be current.
#[allow(clippy::result_large_err)]
pub(super) async fn linearize(ctx: &Ctx) -> Result<(), ApiResponse> {
    match ctx.raft.ensure_linearizable().await {
        Ok(_) => Ok(()),
        Err(RaftError::APIError(openraft::error::CheckIsLeaderError::ForwardToLeader(_))) => Err(not_leader(ctx)),
        Err(e) => Err(failed(FailureKind::Unavailable, format!("cannot confirm leadership: {e}"))),
    }
}

/// Proposes `cmd` and waits until it is committed and applied here.
#[allow(clippy::result_large_err)]
pub(super) async fn write(ctx: &Ctx, cmd: Command) -> Result<CommandResult, ApiResponse> {
    match ctx.raft.client_write(cmd).await {
        Ok(r) => Ok(r.data),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => Err(not_leader(ctx)),
        Err(e) => Err(failed(FailureKind::Unavailable, format!("commit failed: {e}"))),
    }
}

/// This voter's wall clock in ms since the Unix epoch, for commands that
/// carry the leader's time (applying them reads no clock).
pub(super) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

pub(super) fn is_leader(ctx: &Ctx) -> bool {
    ctx.raft.metrics().borrow().current_leader == Some(ctx.id)
}

/// Leader, and heard from a quorum within half a lease. openraft 0.9 never
/// steps a leader down on its own when it loses its quorum, so a
/// partitioned old leader still reports itself as leader; it must not keep
/// renewing leases that the majority has already expired.
pub(super) fn leads_with_quorum(ctx: &Ctx) -> bool {
    let m = ctx.raft.metrics().borrow().clone();
    if m.current_leader != Some(ctx.id) {
        return false;
    }
    if m.membership_config.membership().voter_ids().count() <= 1 {
        return true;
    }
    let fresh = (ctx.lease / 2).as_millis() as u64;
    m.millis_since_quorum_ack.is_some_and(|ms| ms <= fresh)
}

/// Every node of `state`, with what is left of its lease if `with_leases`
/// (only the leader's table knows).
pub(super) fn node_statuses(ctx: &Ctx, state: &ClusterState, with_leases: bool) -> Vec<NodeStatus> {
    let shards = state.shards_per_node();
    let leases = ctx.leases();
    let now = Instant::now();
    state
        .nodes
        .iter()
        .map(|(&node, r)| NodeStatus {
            node,
            addr: r.addr.clone(),
            incarnation: r.incarnation,
            live: r.live,
            ram_bytes: r.ram_bytes,
            ssd_bytes: r.ssd_bytes,
            weight: state.weight(node),
            lease_left_ms: leases
                .lease_left(node, r.incarnation, now)
                .filter(|_| with_leases && r.live)
                .map(|left| left.as_millis() as u64),
            shards: shards.get(&node).copied().unwrap_or(0),
        })
        .collect()
}
