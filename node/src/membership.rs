//! Cluster membership: a node registers with the coordinators, renews its
//! lease, and follows the placement watch.
//!
//! The loop never gives up while the daemon runs: coordinators may be
//! restarting or electing. A lost lease (the coordinator expired this
//! incarnation while we were partitioned or paused) is answered by
//! registering again, which yields a new incarnation and a new placement
//! epoch. Chunks are immutable and versioned, so serving during that gap is
//! safe (docs/DESIGN.md, failure semantics).

use crate::config::ClusterConfig;
use granary_net::api::{ApiRequest, ApiResponse};
use granary_net::client::{ClientError, ClientOptions, CoordinatorClient, WatchError, parse_addrs};
use granary_net::placement::Placement;
use granary_net::tls::{Identity, Role};
use granary_proto::NodeId;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Joining the cluster could not even start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// The certificate or CA could not be loaded, or is not a node's.
    #[error("cluster certificate: {0}")]
    Identity(String),
    /// The client could not be built (bad coordinator address).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The fabric's times and sizes cannot work together.
    #[error(transparent)]
    Fabric(#[from] crate::fabric::config::FabricConfigError),
}

/// This node's standing in the cluster.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub(crate) struct Standing {
    /// The incarnation of the current registration, if registered.
    pub incarnation: Option<u64>,
    /// The latest placement epoch heard of.
    pub placement_epoch: u64,
    /// When the last heartbeat or registration the coordinator accepted
    /// was sent (the lease runs from no earlier); None while not
    /// registered or once the lease is known to be lost.
    pub renewed_at: Option<std::time::Instant>,
    /// The coordinator's lease.
    pub lease: Duration,
}

impl Standing {
    /// What the fetch route needs of it ([`granary_node_core::route::may_read_as_owner`]).
    pub(crate) fn lease_view(&self) -> granary_node_core::route::LeaseView {
        granary_node_core::route::LeaseView {
            renewed_at: self.renewed_at,
            lease: self.lease,
            epoch: self.placement_epoch,
        }
    }
}

/// A running membership: registration, heartbeats and the placement watch.
pub(crate) struct Membership {
    client: Arc<CoordinatorClient>,
    view: watch::Receiver<Option<Arc<Placement>>>,
    standing: watch::Receiver<Standing>,
    fatal: watch::Receiver<Option<String>>,
    tasks: JoinSet<()>,
}

/// The node identity `cfg` names and the node id it is, or why it cannot be
/// one: the configured `node_id`, else the id the certificate is bound to;
/// both given, they must agree (the coordinator would refuse the mismatch
/// at every registration; the node says so at start instead).
pub fn node_identity(cfg: &ClusterConfig) -> Result<(Identity, NodeId), JoinError> {
    let (identity, name) = Identity::load_in(&cfg.certs, cfg.cert_name.as_deref(), Role::Node.as_str())
        .map_err(|e| JoinError::Identity(e.to_string()))?;
    let file = || format!("{}/{name}.pem", cfg.certs.display());
    if identity.role() != Role::Node {
        return Err(JoinError::Identity(format!(
            "{} is a {} certificate; a node needs a node certificate",
            file(),
            identity.role()
        )));
    }
    let bound = identity.bound_node_id().map_err(|e| JoinError::Identity(format!("{}: {e}", file())))?;
    let id = match (cfg.node_id, bound) {
        (Some(given), Some(bound)) if given != bound => {
            return Err(JoinError::Identity(format!(
                "node_id = {given}, but {} is bound to node {bound}: a node registers only as the node its \
                 certificate names",
                file()
            )));
        }
        (Some(id), _) | (None, Some(id)) => id,
        (None, None) => {
            return Err(JoinError::Identity(format!(
                "{} names no node id and node.toml sets no node_id: give this host its own folder of `granary \
                 certs init --nodes N` (hosts/node-ID/), or set node_id",
                file()
            )));
        }
    };
    Ok((identity, NodeId(id)))
}

impl Membership {
    /// Starts joining: returns at once; registration proceeds in the
    /// background (its standing is kept by the lease loop).
    /// Every call to the coordinator goes out from `endpoint`, the node's
    /// one peer socket, so the voters see one address per node.
    pub(crate) fn start(
        cfg: &ClusterConfig,
        node: NodeId,
        identity: &Identity,
        endpoint: &quinn::Endpoint,
        ram_bytes: u64,
        ssd_bytes: u64,
    ) -> Result<Self, JoinError> {
        let addrs = parse_addrs(&cfg.coordinators)?;
        // Short attempts: a heartbeat must reach the new leader well within
        // a lease (default 3 s) after the old one dies with our connection
        // to it open.
        let options = ClientOptions {
            deadline: Duration::from_millis(1500),
            connect_timeout: Duration::from_millis(500),
            attempt_timeout: Duration::from_millis(500),
            ..Default::default()
        };
        // Every call of this node's to the voters (heartbeats, the watch,
        // holds, placement lookups) is a stream on one connection per voter:
        // the handles below share this client's connections.
        let client = Arc::new(CoordinatorClient::on_endpoint(endpoint.clone(), identity, addrs, options)?);
        // The watch has its own handle, so that its long-lived stream and its
        // retries never disturb the heartbeats' leader hint.
        let watch_client = Arc::new(client.sharing(ClientOptions::default()));
        let (standing_tx, standing) = watch::channel(Standing::default());
        let (view_tx, view) = watch::channel(None);
        let (fatal_tx, fatal) = watch::channel(None);
        let mut tasks = JoinSet::new();
        let register =
            ApiRequest::RegisterNode { node, addr: cfg.advertise.clone(), ram_bytes, ssd_bytes, registration: 0 };
        tasks.spawn(lease_loop(client.clone(), node, register, standing_tx, fatal_tx));
        tasks.spawn(watch_loop(watch_client, view_tx));
        Ok(Self { client, view, standing, fatal, tasks })
    }

    /// Why this node cannot be in the cluster, once that is known (another
    /// daemon holds its identity, or its address, for good): the daemon
    /// exits with it (issue 48).
    pub(crate) fn fatal(&self) -> watch::Receiver<Option<String>> {
        self.fatal.clone()
    }

    /// A handle on this node's connections to the voters, with `options`
    /// and its own leader hint ([`CoordinatorClient::sharing`]).
    pub(crate) fn client(&self, options: ClientOptions) -> CoordinatorClient {
        self.client.sharing(options)
    }

    /// This node's standing, as the lease loop keeps it.
    pub(crate) fn standing(&self) -> watch::Receiver<Standing> {
        self.standing.clone()
    }

    /// The latest placement from the placement watch (the cluster view and
    /// every placed version's owners).
    pub(crate) fn view(&self) -> watch::Receiver<Option<Arc<Placement>>> {
        self.view.clone()
    }

    /// Stops heartbeating and watching.
    pub(crate) fn stop(mut self) {
        self.tasks.abort_all();
    }
}

/// A random, non-zero registration token.
fn registration_token() -> u64 {
    use std::hash::BuildHasher;
    // RandomState is seeded from the OS once per process and varies per
    // instance; hashing the time mixes in when the registration began.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    std::collections::hash_map::RandomState::new().hash_one(nanos).max(1)
}

async fn lease_loop(
    client: Arc<CoordinatorClient>,
    node: NodeId,
    register: ApiRequest,
    standing: watch::Sender<Standing>,
    fatal: watch::Sender<Option<String>>,
) {
    // Registrations that fail in a row wait longer each time, jittered
    // (a thousand nodes refused at boot do not all come back at once).
    let retry = Duration::from_millis(500);
    let mut refused = 0u32;
    let pause = |refused: &mut u32| {
        *refused = refused.saturating_add(1);
        tokio::time::sleep(granary_net::backoff::pause(retry, *refused, granary_net::backoff::jitter_unit()))
    };
    let mut register = register;
    let mut token: Option<u64> = None;
    let mut refusals = granary_node_core::health::Refusals::default();
    loop {
        // Register (again). One token per registration, repeated by its
        // retries, so a retry of one that committed is not a second one.
        let t = *token.get_or_insert_with(registration_token);
        if let ApiRequest::RegisterNode { registration, .. } = &mut register {
            *registration = t;
        }
        let sent = tokio::time::Instant::now().into_std();
        let (incarnation, lease) = match client.call(&register).await {
            Ok((_, ApiResponse::Registered { incarnation, placement_epoch, lease_ms })) => {
                tracing::info!(%node, incarnation, placement_epoch, "joined the cluster");
                token = None;
                refused = 0;
                refusals.handle_registered();
                let lease = Duration::from_millis(lease_ms.max(30));
                standing.send_replace(Standing {
                    incarnation: Some(incarnation),
                    placement_epoch,
                    renewed_at: Some(sent),
                    lease,
                });
                (incarnation, lease)
            }
            Ok((addr, other)) => {
                tracing::warn!(%node, %addr, "unexpected answer to register: {other:?}");
                pause(&mut refused).await;
                continue;
            }
            Err(e @ ClientError::Failed { kind: granary_net::api::FailureKind::Forbidden, .. }) => {
                // Another daemon holds this identity (or this address)
                // live: for a lease that can be this node's former self;
                // for longer, two daemons share it.
                if refusals.handle_refused(tokio::time::Instant::now().into_std()) {
                    tracing::error!(%node, "another daemon holds this node's identity or address; stopping: {e}");
                    fatal.send_replace(Some(e.to_string()));
                    return;
                }
                tracing::warn!(%node, "registration refused: {e}");
                pause(&mut refused).await;
                continue;
            }
            Err(e) => {
                tracing::warn!(%node, "cannot register yet: {e}");
                pause(&mut refused).await;
                continue;
            }
        };
        // Heartbeat three times per lease, on a fixed clock (a slow answer
        // does not push the next beat back), until the lease is lost.
        let mut beat = tokio::time::interval(lease / 3);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        beat.tick().await;
        loop {
            beat.tick().await;
            let sent = tokio::time::Instant::now().into_std();
            match client.call(&ApiRequest::Heartbeat { node, incarnation }).await {
                Ok((_, ApiResponse::HeartbeatAccepted { placement_epoch })) => {
                    standing.send_modify(|s| {
                        s.placement_epoch = s.placement_epoch.max(placement_epoch);
                        s.renewed_at = s.renewed_at.max(Some(sent));
                    });
                }
                Ok((_, ApiResponse::LeaseLost { .. })) => {
                    tracing::warn!(%node, incarnation, "lease lost; registering again");
                    standing.send_modify(|s| {
                        s.incarnation = None;
                        s.renewed_at = None;
                    });
                    break;
                }
                Ok((addr, other)) => tracing::warn!(%node, %addr, "unexpected answer to heartbeat: {other:?}"),
                Err(e) => tracing::warn!(%node, "heartbeat failed: {e}"),
            }
        }
    }
}

async fn watch_loop(client: Arc<CoordinatorClient>, view: watch::Sender<Option<Arc<Placement>>>) {
    let mut revision = 0;
    let mut refused = 0u32;
    loop {
        // Deltas: the whole placement once per stream, then what changed;
        // a stream that ends (or an update that does not fit) is opened
        // again and starts from the whole.
        match client.watch_placement(revision).await {
            Ok(mut w) => loop {
                refused = 0;
                match w.next_placement().await {
                    Ok(Some(p)) => {
                        revision = p.view.revision;
                        tracing::info!(
                            placement_epoch = p.view.placement_epoch,
                            live_nodes = p.view.nodes.iter().filter(|n| n.live).count(),
                            datasets = p.view.datasets.len(),
                            owner_tables = p.tables.len(),
                            "placement changed"
                        );
                        view.send_replace(Some(p));
                    }
                    Ok(None) => break,
                    Err(WatchError::Update(e)) => {
                        tracing::warn!("a placement update did not fit; opening the watch again: {e}");
                        break;
                    }
                    Err(e) => {
                        tracing::debug!("placement watch ended: {e}");
                        break;
                    }
                }
            },
            Err(e) => {
                tracing::debug!("cannot open the placement watch yet: {e}");
                refused = refused.saturating_add(1);
                let base = Duration::from_millis(500);
                tokio::time::sleep(granary_net::backoff::pause(base, refused, granary_net::backoff::jitter_unit()))
                    .await;
            }
        }
    }
}
