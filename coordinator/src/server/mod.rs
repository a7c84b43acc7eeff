//! The coordinator process: one QUIC endpoint serving both Raft RPCs
//! (ALPN `granary-raft/1`, coordinator certificates only) and the API
//! (ALPN `granary-api/1`, any certificate of the cluster, each request
//! checked against the role in it), the Raft group on redb, and the two
//! timer tasks.
//!
//! This file starts a voter and accepts its connections; the rest is split
//! by concern, each file using only those listed before it:
//! - `ctx`: what the tasks share, and the role checks the API answers with.
//! - `watch`: the placement watch stream.
//! - `respond`: requests in flight per identity, the byte budget and
//!   write deadline of answers.
//! - `api`: one API request per stream, with its role checks.
//! - `metrics`: the voter's Prometheus registry (uses `ctx`).
//! - `timers`: the shells that drive the pure [`crate::leases::Leases`] (on
//!   the leader: expire nodes whose heartbeats stopped) and
//!   [`crate::election::Watchdog`] (on followers: campaign once the leader
//!   lease has run out).

mod api;
mod ctx;
mod feed;
mod handlers;
mod metrics;
mod progress;
mod requests;
mod respond;
mod timers;
mod watch;

pub use api::MAX_API_REQUEST_BYTES;
pub use respond::{
    BUDGET_WAIT, MAX_ANSWERS_BUILDING, MAX_REQUESTS_IN_FLIGHT, MAX_REQUESTS_PER_IDENTITY, SMALL_ANSWER_BYTES,
};

use crate::election::Watchdog;
use crate::leases::Leases;
use crate::network::{LeaderContact, QuicNetwork, serve_rpc};
use crate::sm::StateMachineStore;
use crate::store::{LogStore, StoreError};
use crate::types::{Raft, VoterId};
use ctx::Ctx;
use granary_net::tls::{self, ALPN_API, ALPN_RAFT, ALPN_RAFT_PREVIOUS, Identity, Role, TlsError};
use granary_proto::NodeId;
use openraft::{BasicNode, SnapshotPolicy};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

pub use crate::admission::{MAX_CONNECTIONS, MAX_CONNECTIONS_PER_NODE, role_limit};

/// Handshakes in progress at once, apart from [`MAX_CONNECTIONS`]: a peer
/// that starts handshakes and never finishes them (or has no certificate)
/// holds none of the connections nodes and voters need. More are refused.
pub const MAX_HANDSHAKES: usize = 256;

/// Handshakes in progress from one source address: a flooding host cannot
/// take the budget other hosts' handshakes need.
pub const MAX_HANDSHAKES_PER_ADDRESS: usize = 32;

/// A handshake not finished by then is dropped.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(3);

/// The ALPN names a voter serves: the API, then Raft, newest first.
const SERVES: &[&[u8]] = &[ALPN_API, ALPN_RAFT, ALPN_RAFT_PREVIOUS];

/// Entries per AppendEntries RPC.
pub const MAX_PAYLOAD_ENTRIES: u64 = 16;

/// The default of [`CoordinatorConfig::response_budget_bytes`]: 256 MiB of
/// answers in flight (the voter's memory limit in deploy/k8s counts it).
pub const DEFAULT_RESPONSE_BUDGET_BYTES: u64 = 256 << 20;

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
    /// Let node certificates that name no node id register and heartbeat
    /// (as any node). Default false: a node certificate must be bound to
    /// the id it registers as (`granary certs init --nodes N`, or `certs
    /// issue --node-id`), so one leaked key cannot pose as every node.
    pub allow_unbound_node_certs: bool,
    /// Let coordinator certificates that name no voter id speak Raft (as
    /// any voter). Default false: in a group of more than one voter each
    /// voter needs a certificate bound to its id (`granary certs init
    /// --voters N`), so one leaked coordinator key cannot vote as, or
    /// lead as, every voter.
    pub allow_unbound_voter_certs: bool,
    /// An older dataset version that no node's trainers use is collected
    /// (removed from the replicated state; nodes drop its chunks) this
    /// long after the leader first finds it unused. Default 24 h.
    pub version_retention: Duration,
    /// The record of a node that is not live is removed from the replicated
    /// state (with every hand-over naming it) this long after the leader
    /// first finds it down; a node that comes back later registers anew.
    /// Default 24 h.
    pub node_retention: Duration,
    /// Bytes of large API answers (over 4 KiB) written and not yet
    /// acknowledged by their clients, at most; an answer that finds no room
    /// within 10 s is answered "unavailable". Default 256 MiB.
    pub response_budget_bytes: u64,
    /// An API answer (or a placement watch's view) its client has not
    /// taken this long after it was written is abandoned and its stream
    /// reset. Default 30 s.
    pub response_write_wait: Duration,
    /// Bytes of a manifest's compact form per log entry when a dataset is
    /// registered, and per `ManifestPiece` answer (clamped to 1 byte ..
    /// [`MANIFEST_PIECE_BYTES`](granary_proto::manifest::MANIFEST_PIECE_BYTES),
    /// the default). Smaller pieces only make more entries; tests use them
    /// to cut small manifests into many pieces.
    pub manifest_piece_bytes: usize,
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
            allow_unbound_node_certs: false,
            allow_unbound_voter_certs: false,
            version_retention: Duration::from_secs(24 * 3600),
            node_retention: Duration::from_secs(24 * 3600),
            response_budget_bytes: DEFAULT_RESPONSE_BUDGET_BYTES,
            response_write_wait: Duration::from_secs(30),
            manifest_piece_bytes: granary_proto::manifest::MANIFEST_PIECE_BYTES,
        }
    }
}

/// Starting a voter failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    /// This voter's certificate cannot speak Raft as this voter.
    #[error("{id}: {reason}")]
    VoterIdentity {
        /// This voter.
        id: VoterId,
        /// Why (see [`crate::network::voter_verdict`]).
        reason: String,
    },
    /// The endpoint's bound address could not be read.
    #[error("endpoint address: {0}")]
    Endpoint(std::io::Error),
    /// openraft refused the configuration.
    #[error("raft configuration: {0}")]
    RaftConfig(#[from] openraft::ConfigError),
    /// openraft failed to start or to read its state.
    #[error("raft: {0}")]
    Raft(#[from] openraft::error::Fatal<VoterId>),
}

/// A running voter.
pub struct Coordinator {
    ctx: Arc<Ctx>,
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
    tasks: JoinSet<()>,
}

impl Coordinator {
    /// This voter's Prometheus metrics (`granary_coordinator_*`), to serve
    /// with `granary_net::metrics::MetricsServer`.
    pub fn metrics_registry(&self) -> prometheus_client::registry::Registry {
        metrics::registry(&self.ctx)
    }

    /// Opens the folder, binds the endpoint, starts Raft, and (on the
    /// lowest-numbered voter of a pristine group) initializes the group.
    pub async fn start(cfg: CoordinatorConfig) -> Result<Self, StartError> {
        if cfg.identity.role() != Role::Coordinator {
            return Err(StartError::WrongRole(cfg.identity.role()));
        }
        // Peers would refuse this voter's Raft traffic: say so at start.
        let own = cfg.identity.chain().first().map(|c| tls::voter_id_of_cert(c)).transpose()?.flatten();
        let group = cfg.voters.len() > 1;
        if own.is_some() || group {
            crate::network::voter_verdict(own, cfg.id, cfg.allow_unbound_voter_certs || !group)
                .map_err(|reason| StartError::VoterIdentity { id: cfg.id, reason })?;
        }
        std::fs::create_dir_all(&cfg.data_dir)
            .map_err(|source| StartError::DataDir { path: cfg.data_dir.clone(), source })?;
        let sm = StateMachineStore::open(&cfg.data_dir)?;
        let log = LogStore::open(&cfg.data_dir.join("raft.redb"), sm.durable_snapshot())?;
        let largest_entry = log.largest_entry();
        let shared = sm.shared();

        let server = cfg.identity.server_config(SERVES)?;
        let endpoint = tls::server_endpoint(&cfg.identity, cfg.listen, server)?;
        let addr = endpoint.local_addr().map_err(StartError::Endpoint)?;
        // Raft links notice a dead or restarted peer within the election
        // timeout: keep-alive every heartbeat, idle timeout one election
        // timeout. A vote then never waits on a connection to a process that
        // is gone.
        let mut raft_client = cfg.identity.client_config_for(tls::RAFT_PROTOCOLS)?;
        raft_client.transport_config(Arc::new(tls::transport_config_with(
            cfg.heartbeat_interval.max(Duration::from_millis(10)),
            cfg.election_timeout,
        )));
        let network = QuicNetwork::new(
            endpoint.clone(),
            raft_client,
            cfg.election_timeout.min(Duration::from_secs(1)),
            cfg.allow_unbound_voter_certs,
        );

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
        .validate()?;
        let raft = Raft::new(cfg.id, Arc::new(raft_config), network.clone(), log, sm).await?;

        let mut voters = cfg.voters.clone();
        if voters.is_empty() {
            voters.insert(cfg.id, addr.to_string());
        }
        if !voters.contains_key(&cfg.id) {
            return Err(StartError::NotAVoter { id: cfg.id, listed: voters.keys().copied().collect() });
        }
        let initialized = raft.is_initialized().await?;
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
            network,
            shared,
            lease: cfg.lease,
            remote_options: cfg.remote_options.clone(),
            allow_unbound_node_certs: cfg.allow_unbound_node_certs,
            allow_unbound_voter_certs: cfg.allow_unbound_voter_certs,
            version_retention: cfg.version_retention,
            node_retention: cfg.node_retention,
            manifest_piece_bytes: cfg.manifest_piece_bytes.clamp(1, granary_proto::manifest::MANIFEST_PIECE_BYTES),
            leases: Mutex::new(Leases::new(cfg.lease, Instant::now())),
            commit_rate: Mutex::new(crate::commit_rate::CommitRate::default_rate()),
            handshakes: Arc::new(Mutex::new(granary_net::budget::AddressBudget::new(
                MAX_HANDSHAKES,
                MAX_HANDSHAKES_PER_ADDRESS,
            ))),
            admission: Default::default(),
            handshakes_refused: Default::default(),
            connections_refused: Default::default(),
            contact: LeaderContact::default(),
            api_requests: Default::default(),
            requests: Arc::new(Mutex::new(granary_net::budget::Budget::new(
                MAX_REQUESTS_IN_FLIGHT,
                MAX_REQUESTS_PER_IDENTITY,
            ))),
            responses: respond::Responses::new(cfg.response_budget_bytes, cfg.response_write_wait),
            compact: Mutex::new(Vec::new()),
            feed: Default::default(),
            largest_entry,
        });
        let mut tasks = JoinSet::new();
        tasks.spawn(accept_loop(ctx.clone(), endpoint.clone()));
        tasks.spawn(timers::lease_loop(ctx.clone()));
        tasks.spawn(timers::collect_loop(ctx.clone()));
        tasks.spawn(timers::switch_loop(ctx.clone()));
        let watchdog = Watchdog::new(
            cfg.id,
            Duration::from_millis(election_max_ms),
            cfg.heartbeat_interval.max(Duration::from_millis(10)),
            Instant::now(),
        );
        tasks.spawn(timers::election_loop(ctx.clone(), watchdog));
        tracing::info!(id = %cfg.id, %addr, "coordinator serving");
        Ok(Self { ctx, endpoint, addr, tasks })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connections open at this voter now (after their handshakes).
    pub fn connection_counts(&self) -> crate::admission::ConnectionCounts {
        self.ctx.admission().counts()
    }

    /// What `/readyz` answers for this voter (issue 48): ready when it is
    /// in the membership and knows a leader ([`crate::health::voter_readiness`]).
    pub fn readiness(&self) -> granary_net::metrics::Readiness {
        let metrics = self.ctx.raft.metrics();
        let own = self.ctx.id;
        // As fresh as a leader must be to renew leases (ctx::leads_with_quorum).
        let fresh = self.ctx.lease / 2;
        Arc::new(move || {
            let m = metrics.borrow();
            let voters: Vec<crate::types::VoterId> = m.membership_config.membership().voter_ids().collect();
            let ack = m.millis_since_quorum_ack.map(std::time::Duration::from_millis);
            crate::health::voter_readiness(own, &voters, m.current_leader, ack, fresh)
        })
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

/// A connection [`crate::admission::Admission`] admitted, given back when
/// dropped.
struct Admitted<'a> {
    ctx: &'a Ctx,
    role: Role,
    node: Option<NodeId>,
}

impl<'a> Admitted<'a> {
    fn take(ctx: &'a Ctx, role: Role, node: Option<NodeId>) -> Result<Self, crate::admission::Refusal> {
        ctx.admission().admit(role, node)?;
        Ok(Self { ctx, role, node })
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.ctx.admission().release(self.role, self.node);
    }
}

/// Accepts connections: a source address not yet validated gets a QUIC
/// Retry (no state is kept until the peer proves it receives at that
/// address, so spoofed Initials cost nothing); a validated one takes one
/// of [`MAX_HANDSHAKES`] (at most [`MAX_HANDSHAKES_PER_ADDRESS`] from one
/// address) for at most [`HANDSHAKE_WAIT`], and only a finished
/// handshake, its certificate checked, takes a connection slot.
async fn accept_loop(ctx: Arc<Ctx>, endpoint: quinn::Endpoint) {
    while let Some(incoming) = endpoint.accept().await {
        if !incoming.remote_address_validated() && incoming.may_retry() {
            if let Err(e) = incoming.retry() {
                tracing::debug!(error = %e, "a QUIC retry could not be sent");
            }
            continue;
        }
        let peer = incoming.remote_address();
        let handshake = match granary_net::budget::Taken::from(&ctx.handshakes, peer.ip()) {
            Ok(taken) => taken,
            Err(spent) => {
                ctx.handshakes_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(%peer, ?spent, "refusing a connection: its handshake budget is spent");
                incoming.refuse();
                continue;
            }
        };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let conn = match tokio::time::timeout(HANDSHAKE_WAIT, incoming).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    tracing::warn!(%peer, "refused a connection during the handshake: {e}");
                    return;
                }
                Err(_) => {
                    tracing::warn!(%peer, "dropped a handshake not finished within {} s", HANDSHAKE_WAIT.as_secs());
                    return;
                }
            };
            drop(handshake);
            serve_connection(&ctx, conn, peer).await;
        });
    }
}

async fn serve_connection(ctx: &Arc<Ctx>, conn: quinn::Connection, peer: SocketAddr) {
    if tls::answer_versions(&conn, SERVES) {
        tracing::warn!(%peer, "refused a client that speaks no version of the API or Raft this voter speaks");
        return;
    }
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
    // The cap per node identity counts only ids the voter accepts: one
    // the certificate is bound to.
    let _admitted = match Admitted::take(ctx, role, bound) {
        Ok(a) => a,
        Err(refusal) => {
            ctx.connections_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(%peer, %role, "refusing a connection: {refusal}");
            conn.close(3u32.into(), format!("too many connections: {refusal}").as_bytes());
            return;
        }
    };
    let alpn = tls::alpn_of(&conn);
    let raft = alpn.as_deref() == Some(ALPN_RAFT) || alpn.as_deref() == Some(ALPN_RAFT_PREVIOUS);
    if raft && role != Role::Coordinator {
        tracing::warn!(%peer, %role, "refusing Raft traffic from a {role} certificate");
        conn.close(2u32.into(), b"raft requires a coordinator certificate");
        return;
    }
    // Which voter a coordinator certificate may speak Raft as.
    let voter = match tls::peer_voter_id(&conn) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(%peer, "closing a connection: {e}");
            conn.close(1u32.into(), b"unreadable voter id in the certificate");
            return;
        }
    };
    if raft && voter.is_none() && !ctx.allow_unbound_voter_certs {
        tracing::warn!(%peer, "refusing Raft traffic from a coordinator certificate that names no voter id");
        conn.close(2u32.into(), b"raft requires a coordinator certificate bound to a voter id");
        return;
    }
    let identity: Arc<str> = respond::identity_key(role, bound, voter).into();
    loop {
        let (send, recv) = match conn.accept_bi().await {
            Ok(s) => s,
            Err(_) => return,
        };
        let (ctx, identity) = (ctx.clone(), identity.clone());
        tokio::spawn(async move {
            let result = if raft {
                serve_rpc(&ctx.raft, &ctx.contact, voter, ctx.allow_unbound_voter_certs, send, recv).await
            } else {
                api::serve_api(&ctx, role, bound, &identity, peer, send, recv).await
            };
            if let Err(e) = result {
                tracing::debug!(%peer, "stream ended: {e}");
            }
        });
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
