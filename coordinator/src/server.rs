//! The coordinator process: one QUIC endpoint serving both Raft RPCs
//! (ALPN `granary-raft/1`, coordinator certificates only) and the API
//! (ALPN `granary-api/1`, any certificate of the cluster, each request
//! checked against the role in it), the Raft group on redb, and the two
//! timer tasks. Their decisions live in the pure [`crate::leases`] (on the
//! leader: expire nodes whose heartbeats stopped) and [`crate::election`]
//! (on followers: campaign once the leader lease has run out); the tasks
//! here only feed them and carry out what they decide.

use crate::election::Watchdog;
use crate::leases::Leases;
use crate::network::{LeaderContact, QuicNetwork, serve_rpc};
use crate::sm::{Shared, StateMachineStore};
use crate::state::{ClusterState, VersionRecord};
use crate::store::{LogStore, StoreError};
use crate::types::{Command, CommandResult, Raft, VoterId};
use granary_net::api::{
    ApiRequest, ApiResponse, ClusterStatus, DatasetSummary, FailureKind, NodeStatus, PlacementReport, PlacementView,
    VoterStatus,
};
use granary_net::frame::{self, FrameError};
use granary_net::tls::{self, ALPN_API, ALPN_RAFT, Identity, Role, TlsError};
use granary_node::dataset::Dataset;
use granary_node::remote::{Remote, RemoteCounters};
use granary_proto::NodeId;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, SnapshotPolicy};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// Largest API request accepted (a view is small; a dataset add carries no
/// manifest).
pub const MAX_API_REQUEST_BYTES: usize = 1 << 20;
/// Connections served at once; more are refused.
pub const MAX_CONNECTIONS: usize = 4096;
/// Largest command one log entry may carry (a dataset's manifest). With at
/// most [`MAX_PAYLOAD_ENTRIES`] entries per AppendEntries, a replication
/// message stays under the 64 MiB frame limit.
pub const MAX_COMMAND_BYTES: usize = 3 << 20;
/// Entries per AppendEntries RPC.
pub const MAX_PAYLOAD_ENTRIES: u64 = 16;

/// How to run one voter.
#[derive(Clone)]
pub struct CoordinatorConfig {
    /// This voter's id.
    pub id: VoterId,
    /// UDP address to serve on (Raft and API share it).
    pub listen: SocketAddr,
    /// Every voter of the group with its address, this one included. Empty
    /// means a group of one at `listen`'s bound address.
    pub voters: BTreeMap<VoterId, String>,
    /// Folder for the log (`raft.redb`) and snapshots (`snapshot.json`).
    pub data_dir: PathBuf,
    /// This voter's certificate (role coordinator) and the cluster CA.
    pub identity: Identity,
    /// A node whose heartbeats stop for this long is expired. Default 3 s.
    pub lease: Duration,
    /// Leader heartbeat interval. Default 100 ms.
    pub heartbeat_interval: Duration,
    /// Lower bound of the election timeout; the upper bound is 1.25 times
    /// it. Default 500 ms.
    pub election_timeout: Duration,
    /// Take a snapshot (and compact the log) after this many entries.
    /// Default 1000.
    pub snapshot_after_entries: u64,
    /// Entries kept in the log behind a snapshot, so that a briefly lagging
    /// follower catches up from the log rather than a whole snapshot.
    /// Default 100.
    pub keep_log_entries: u64,
    /// object_store options for reading dataset sources (credentials,
    /// endpoint); the usual environment variables apply too.
    pub remote_options: BTreeMap<String, String>,
}

impl CoordinatorConfig {
    /// Defaults for everything but identity, addresses and folder.
    pub fn new(id: VoterId, listen: SocketAddr, data_dir: PathBuf, identity: Identity) -> Self {
        Self {
            id,
            listen,
            voters: BTreeMap::new(),
            data_dir,
            identity,
            lease: Duration::from_secs(3),
            heartbeat_interval: Duration::from_millis(100),
            election_timeout: Duration::from_millis(500),
            snapshot_after_entries: 1000,
            keep_log_entries: 100,
            remote_options: BTreeMap::new(),
        }
    }
}

/// Starting a voter failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data folder could not be created.
    #[error("data folder {path}: {source}")]
    DataDir {
        /// The folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The log or snapshot could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// TLS or the endpoint could not be set up.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The certificate given is not a coordinator's.
    #[error("the coordinator needs a coordinator certificate, got a {0} certificate")]
    WrongRole(Role),
    /// The voter list does not contain this voter.
    #[error("--peers lists voters {listed:?} but not this voter ({id})")]
    NotAVoter {
        /// This voter.
        id: VoterId,
        /// Those listed.
        listed: Vec<VoterId>,
    },
    /// openraft refused the configuration or failed to start.
    #[error("raft: {0}")]
    Raft(String),
}

/// Per-voter state the handlers share.
struct Ctx {
    id: VoterId,
    raft: Raft,
    shared: Arc<Shared>,
    lease: Duration,
    remote_options: BTreeMap<String, String>,
    /// The leader's lease table; only the leader's holds clocks.
    leases: Mutex<Leases>,
    connections: AtomicUsize,
    /// Last AppendEntries accepted from a leader.
    contact: LeaderContact,
}

impl Ctx {
    /// The lease table. Its methods never panic midway, so a poisoned lock
    /// still holds a consistent table.
    fn leases(&self) -> MutexGuard<'_, Leases> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running voter.
pub struct Coordinator {
    ctx: Arc<Ctx>,
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
    tasks: JoinSet<()>,
}

impl Coordinator {
    /// Opens the folder, binds the endpoint, starts Raft, and (on the
    /// lowest-numbered voter of a pristine group) initializes the group.
    pub async fn start(cfg: CoordinatorConfig) -> Result<Self, StartError> {
        if cfg.identity.role() != Role::Coordinator {
            return Err(StartError::WrongRole(cfg.identity.role()));
        }
        std::fs::create_dir_all(&cfg.data_dir)
            .map_err(|source| StartError::DataDir { path: cfg.data_dir.clone(), source })?;
        let log = LogStore::open(&cfg.data_dir.join("raft.redb"))?;
        let sm = StateMachineStore::open(&cfg.data_dir)?;
        let shared = sm.shared();

        let server = cfg.identity.server_config(&[ALPN_API, ALPN_RAFT])?;
        let endpoint = tls::server_endpoint(&cfg.identity, cfg.listen, server)?;
        let addr = endpoint.local_addr().map_err(|e| StartError::Raft(format!("endpoint address: {e}")))?;
        // Raft links notice a dead or restarted peer within the election
        // timeout: keep-alive every heartbeat, idle timeout one election
        // timeout. A vote then never waits on a connection to a process that
        // is gone.
        let mut raft_client = cfg.identity.client_config(ALPN_RAFT)?;
        raft_client.transport_config(Arc::new(tls::transport_config_with(
            cfg.heartbeat_interval.max(Duration::from_millis(10)),
            cfg.election_timeout,
        )));
        let network = QuicNetwork::new(endpoint.clone(), raft_client, cfg.election_timeout.min(Duration::from_secs(1)));

        let election_ms = cfg.election_timeout.as_millis().max(2) as u64;
        let election_max_ms = election_max(election_ms);
        let raft_config = openraft::Config {
            cluster_name: "granary".into(),
            heartbeat_interval: cfg.heartbeat_interval.as_millis().max(1) as u64,
            election_timeout_min: election_ms,
            election_timeout_max: election_max_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_after_entries),
            max_in_snapshot_log_to_keep: cfg.keep_log_entries,
            max_payload_entries: MAX_PAYLOAD_ENTRIES,
            ..Default::default()
        }
        .validate()
        .map_err(|e| StartError::Raft(e.to_string()))?;
        let raft = Raft::new(cfg.id, Arc::new(raft_config), network, log, sm)
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;

        let mut voters = cfg.voters.clone();
        if voters.is_empty() {
            voters.insert(cfg.id, addr.to_string());
        }
        if !voters.contains_key(&cfg.id) {
            return Err(StartError::NotAVoter { id: cfg.id, listed: voters.keys().copied().collect() });
        }
        let initialized = raft.is_initialized().await.map_err(|e| StartError::Raft(e.to_string()))?;
        if !initialized && voters.keys().next() == Some(&cfg.id) {
            let members: BTreeMap<VoterId, BasicNode> =
                voters.iter().map(|(id, a)| (*id, BasicNode { addr: a.clone() })).collect();
            match raft.initialize(members).await {
                Ok(()) => tracing::info!(voters = voters.len(), "initialized a new coordinator group"),
                Err(e) => tracing::warn!("initialize: {e} (the group already exists)"),
            }
        }

        let ctx = Arc::new(Ctx {
            id: cfg.id,
            raft,
            shared,
            lease: cfg.lease,
            remote_options: cfg.remote_options.clone(),
            leases: Mutex::new(Leases::new(cfg.lease, Instant::now())),
            connections: AtomicUsize::new(0),
            contact: LeaderContact::default(),
        });
        let mut tasks = JoinSet::new();
        tasks.spawn(accept_loop(ctx.clone(), endpoint.clone()));
        tasks.spawn(lease_loop(ctx.clone()));
        let watchdog = Watchdog::new(
            cfg.id,
            Duration::from_millis(election_max_ms),
            cfg.heartbeat_interval.max(Duration::from_millis(10)),
            Instant::now(),
        );
        tasks.spawn(election_loop(ctx.clone(), watchdog));
        tracing::info!(id = %cfg.id, %addr, "coordinator serving");
        Ok(Self { ctx, endpoint, addr, tasks })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The Raft handle (metrics, tests).
    pub fn raft(&self) -> &Raft {
        &self.ctx.raft
    }

    /// Stops serving and shuts Raft down.
    pub async fn shutdown(mut self) {
        self.tasks.abort_all();
        self.endpoint.close(0u32.into(), b"coordinator shutting down");
        if let Err(e) = self.ctx.raft.shutdown().await {
            tracing::warn!("raft shutdown: {e}");
        }
    }
}

struct ConnSlot<'a>(&'a AtomicUsize);
impl Drop for ConnSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn accept_loop(ctx: Arc<Ctx>, endpoint: quinn::Endpoint) {
    while let Some(incoming) = endpoint.accept().await {
        if ctx.connections.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            tracing::warn!(peer = %incoming.remote_address(), "refusing a connection: {MAX_CONNECTIONS} already open");
            incoming.refuse();
            continue;
        }
        let ctx = ctx.clone();
        ctx.connections.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let _slot = ConnSlot(&ctx.connections);
            let peer = incoming.remote_address();
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(%peer, "refused a connection during the handshake: {e}");
                    return;
                }
            };
            serve_connection(&ctx, conn, peer).await;
        });
    }
}

async fn serve_connection(ctx: &Arc<Ctx>, conn: quinn::Connection, peer: SocketAddr) {
    let role = match tls::peer_role(&conn) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(%peer, "closing a connection: {e}");
            conn.close(1u32.into(), b"certificate carries no granary role");
            return;
        }
    };
    // A node certificate bound to a node id may act only as that node.
    let bound = match tls::peer_node_id(&conn) {
        Ok(b) => b.map(NodeId),
        Err(e) => {
            tracing::warn!(%peer, "closing a connection: {e}");
            conn.close(1u32.into(), b"unreadable node id in the certificate");
            return;
        }
    };
    let alpn = tls::alpn_of(&conn);
    let raft = alpn.as_deref() == Some(ALPN_RAFT);
    if raft && role != Role::Coordinator {
        tracing::warn!(%peer, %role, "refusing Raft traffic from a {role} certificate");
        conn.close(2u32.into(), b"raft requires a coordinator certificate");
        return;
    }
    loop {
        let (send, recv) = match conn.accept_bi().await {
            Ok(s) => s,
            Err(_) => return,
        };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let result = if raft {
                serve_rpc(&ctx.raft, &ctx.contact, send, recv).await
            } else {
                serve_api(&ctx, role, bound, send, recv).await
            };
            if let Err(e) = result {
                tracing::debug!(%peer, "stream ended: {e}");
            }
        });
    }
}

fn failed(kind: FailureKind, message: impl Into<String>) -> ApiResponse {
    ApiResponse::Failed { kind, message: message.into() }
}

async fn serve_api(
    ctx: &Arc<Ctx>,
    role: Role,
    bound: Option<NodeId>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) -> Result<(), FrameError> {
    let req = match frame::read_frame::<ApiRequest>(&mut recv, MAX_API_REQUEST_BYTES).await {
        Ok(Some(r)) => r,
        Ok(None) => return Ok(()),
        Err(e) => {
            let resp = failed(FailureKind::BadRequest, format!("malformed request: {e}"));
            frame::write_frame(&mut send, &resp).await?;
            let _ = send.finish();
            return Err(e);
        }
    };
    if !req.allowed(role) {
        tracing::warn!(%role, request = req.kind(), "refused: wrong role");
        let resp = failed(FailureKind::Forbidden, format!("a {role} certificate may not send {}", req.kind()));
        frame::write_frame(&mut send, &resp).await?;
        let _ = send.finish();
        return Ok(());
    }
    if let (Some(b), ApiRequest::RegisterNode { node, .. } | ApiRequest::Heartbeat { node, .. }) = (bound, &req)
        && *node != b
    {
        tracing::warn!(certificate = %b, request = %node, "refused: a certificate bound to another node");
        let resp = failed(
            FailureKind::Forbidden,
            format!("this certificate is bound to {b} and may not send {} for {node}", req.kind()),
        );
        frame::write_frame(&mut send, &resp).await?;
        let _ = send.finish();
        return Ok(());
    }
    if let ApiRequest::WatchPlacement { after_revision } = req {
        return watch(ctx, after_revision, send).await;
    }
    let resp = handle(ctx, req).await;
    frame::write_frame(&mut send, &resp).await?;
    let _ = send.finish();
    Ok(())
}

/// The leader as this voter knows it, with its address.
fn leader_of(ctx: &Ctx) -> Option<(u64, String)> {
    let m = ctx.raft.metrics().borrow().clone();
    let leader = m.current_leader?;
    let addr = m.membership_config.membership().get_node(&leader)?.addr.clone();
    Some((leader.0, addr))
}

fn not_leader(ctx: &Ctx) -> ApiResponse {
    ApiResponse::NotLeader { leader: leader_of(ctx).filter(|(id, _)| *id != ctx.id.0) }
}

/// Waits until this voter may answer a read that must be current.
#[allow(clippy::result_large_err)]
async fn linearize(ctx: &Ctx) -> Result<(), ApiResponse> {
    match ctx.raft.ensure_linearizable().await {
        Ok(_) => Ok(()),
        Err(RaftError::APIError(openraft::error::CheckIsLeaderError::ForwardToLeader(_))) => Err(not_leader(ctx)),
        Err(e) => Err(failed(FailureKind::Unavailable, format!("cannot confirm leadership: {e}"))),
    }
}

#[allow(clippy::result_large_err)]
async fn write(ctx: &Ctx, cmd: Command) -> Result<CommandResult, ApiResponse> {
    match ctx.raft.client_write(cmd).await {
        Ok(r) => Ok(r.data),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => Err(not_leader(ctx)),
        Err(e) => Err(failed(FailureKind::Unavailable, format!("commit failed: {e}"))),
    }
}

fn is_leader(ctx: &Ctx) -> bool {
    ctx.raft.metrics().borrow().current_leader == Some(ctx.id)
}

/// Leader, and heard from a quorum within half a lease. openraft 0.9 never
/// steps a leader down on its own when it loses its quorum, so a
/// partitioned old leader still reports itself as leader; it must not keep
/// renewing leases that the majority has already expired.
fn leads_with_quorum(ctx: &Ctx) -> bool {
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

fn summary(name: &str, record: &crate::state::DatasetRecord) -> Option<DatasetSummary> {
    let v = record.current()?;
    Some(DatasetSummary {
        name: name.to_string(),
        version: v.version,
        versions: record.versions.len(),
        source: v.manifest.source.clone(),
        files: v.manifest.files.len(),
        shards: v.manifest.files.iter().map(|f| f.row_groups.len()).sum(),
        rows: v.manifest.total_rows(),
        source_bytes: v.manifest.total_file_bytes(),
    })
}

fn summaries(state: &ClusterState) -> Vec<DatasetSummary> {
    state.datasets.iter().filter_map(|(n, r)| summary(n, r)).collect()
}

/// Every node of `state`, with what is left of its lease if `with_leases`
/// (only the leader's table knows).
fn node_statuses(ctx: &Ctx, state: &ClusterState, with_leases: bool) -> Vec<NodeStatus> {
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
            lease_left_ms: leases
                .lease_left(node, r.incarnation, now)
                .filter(|_| with_leases && r.live)
                .map(|left| left.as_millis() as u64),
            shards: shards.get(&node).copied().unwrap_or(0),
        })
        .collect()
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

async fn handle(ctx: &Arc<Ctx>, req: ApiRequest) -> ApiResponse {
    match handle_inner(ctx, req).await {
        Ok(r) | Err(r) => r,
    }
}

// Both arms carry the response to send; it is written out at once, never
// propagated further, so its size does not matter.
#[allow(clippy::result_large_err)]
async fn handle_inner(ctx: &Arc<Ctx>, req: ApiRequest) -> Result<ApiResponse, ApiResponse> {
    match req {
        ApiRequest::RegisterNode { node, addr, ram_bytes, ssd_bytes, registration } => {
            if !is_leader(ctx) {
                return Err(not_leader(ctx));
            }
            match write(ctx, Command::RegisterNode { node, addr, ram_bytes, ssd_bytes, registration }).await? {
                CommandResult::NodeRegistered { incarnation, placement_epoch } => {
                    ctx.leases().handle_renewed(node, incarnation, Instant::now());
                    tracing::info!(%node, incarnation, placement_epoch, "node registered");
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
                .read(|a| a.cluster.datasets.get(&name).and_then(|r| summary(&name, r)))
                .ok_or_else(|| failed(FailureKind::Internal, format!("dataset {name} missing after commit")))?;
            tracing::info!(dataset = %name, version = %summary.version, new, "dataset added");
            Ok(ApiResponse::DatasetAdded { summary, new })
        }
        ApiRequest::ListDatasets => {
            linearize(ctx).await?;
            Ok(ApiResponse::Datasets(ctx.shared.read(|a| summaries(&a.cluster))))
        }
        ApiRequest::DescribeDataset { name } => {
            linearize(ctx).await?;
            ctx.shared.read(|a| {
                let r = a.cluster.datasets.get(&name);
                match (r.and_then(|r| summary(&name, r)), r.and_then(|r| r.current())) {
                    (Some(summary), Some(v)) => {
                        Ok(ApiResponse::Dataset { summary, manifest: v.manifest.clone(), view: v.view.clone() })
                    }
                    _ => Err(failed(FailureKind::NotFound, format!("no dataset named {name:?}"))),
                }
            })
        }
        ApiRequest::DescribePlacement { name } => {
            linearize(ctx).await?;
            ctx.shared.read(|a| {
                let v: &VersionRecord = a
                    .cluster
                    .datasets
                    .get(&name)
                    .and_then(|r| r.current())
                    .ok_or_else(|| failed(FailureKind::NotFound, format!("no dataset named {name:?}")))?;
                let owners = v
                    .manifest
                    .shards()
                    .iter()
                    .zip(a.cluster.owners(&name))
                    .map(|(s, &o)| (s.shard.file, s.shard.row_group, o))
                    .collect();
                Ok(ApiResponse::Placement(PlacementReport {
                    name: name.clone(),
                    version: v.version,
                    placement_epoch: a.cluster.placement_epoch,
                    owners,
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
                    datasets: summaries(&a.cluster),
                })
            }))
        }
        ApiRequest::WatchPlacement { .. } => Err(failed(FailureKind::Internal, "watch is served as a stream")),
    }
}

/// Pushes the current [`PlacementView`] at once, then a new one whenever
/// the placement epoch or a dataset's current version changes, until this
/// voter stops leading with a quorum or the watcher goes away.
async fn watch(ctx: &Arc<Ctx>, after_revision: u64, mut send: quinn::SendStream) -> Result<(), FrameError> {
    if !is_leader(ctx) {
        frame::write_frame(&mut send, &not_leader(ctx)).await?;
        let _ = send.finish();
        return Ok(());
    }
    let _ = after_revision; // the first view is always sent; watchers drop what they have seen
    let mut changes = ctx.shared.subscribe();
    let mut last: Option<(u64, Vec<(String, granary_proto::DatasetVersion)>)> = None;
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
        });
        let key = (view.placement_epoch, view.datasets.clone());
        if last.as_ref() != Some(&key) {
            frame::write_frame(&mut send, &ApiResponse::PlacementChanged(view)).await?;
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

/// The upper bound of the election timeout for a lower bound of `min_ms`:
/// 1.25 times it (at least 2 ms more). openraft 0.9 makes a follower wait
/// out a leader lease of `election_timeout_max` since its last heartbeat
/// before it grants or seeks votes, so the jitter above the minimum adds
/// directly to every failover; a narrow band keeps it short.
pub fn election_max(min_ms: u64) -> u64 {
    (min_ms + min_ms / 4).max(min_ms + 2)
}

/// On the leader: expires nodes whose heartbeats stopped, by the rules of
/// [`crate::leases::Leases`]. Expiries are proposed one at a time and
/// awaited, so the next tick sees each committed one in the state.
async fn lease_loop(ctx: Arc<Ctx>) {
    loop {
        let wake = ctx.leases().poll_timeout();
        tokio::time::sleep_until(wake.into()).await;
        let now = Instant::now();
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
        for e in expired {
            let (node, incarnation) = (e.node, e.incarnation);
            match write(&ctx, Command::ExpireNode { node, incarnation }).await {
                Ok(CommandResult::NodeExpired { placement_epoch: Some(epoch) }) => {
                    tracing::info!(%node, incarnation, placement_epoch = epoch, "lease expired");
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(%node, "could not commit a lease expiry: {err:?}");
                    ctx.leases().handle_expiry_failed(e);
                }
            }
        }
    }
}

/// On followers: starts an election when [`Watchdog`] says the leader
/// lease has run out.
async fn election_loop(ctx: Arc<Ctx>, mut watchdog: Watchdog) {
    loop {
        tokio::time::sleep_until(watchdog.poll_timeout().into()).await;
        let now = Instant::now();
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
