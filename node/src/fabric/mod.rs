//! The peer fabric: a node that does not own a shard asks its owner over
//! QUIC, so the cluster reads each shard from remote storage once. Chunks
//! are immutable and versioned, so a chunk from any node is as good as the
//! owner's. Wire format: `granary_proto::peer`.
//!
//! Pure cores (no tokio, no sockets, `now` as an argument): the fetch
//! route and the footer rule (`granary_node_core::route`), the stall clock
//! and the liveness probe (`granary_node_core::stall`), in the pure crate;
//! here:
//! - `config` — [`FabricConfig`], every time and size, validated.
//! - `verify` — which peer chunks are checked against this node's own
//!   conversion, the comparison, and the quarantine of a peer that lied.
//!
//! Shells:
//! - `link` — [`PeerLink`]: connections, fetch slots and byte budgets
//!   towards peers; fetching and validating chunks and footers.
//! - `read` — reading a peer's stream under the stall clock.
//! - `owners` — [`Cluster`]: what this node knows of placement.
//! - `follow` — keeping [`Cluster`] current from the coordinator.
//! - `holds` — telling the coordinator which versions trainers here use.
//! - `server` — answering other nodes.
//! - this file — [`ClusterHandle`], a node's part in the cluster.
//!
//! Files depend one way: `server`, `follow` → `owners` → `link` → `read`;
//! `verify` depends on nothing here, `config` on `verify`.

pub(crate) mod config;
mod error;
mod follow;
mod holds;
mod link;
pub mod manifest;
pub(crate) mod owners;
mod read;
mod server;
pub mod verify;

pub use config::{FabricConfig, FabricConfigError};
pub use error::{Corruption, LinkFault, PeerError, Stall};
pub use follow::follow_placement;
pub use granary_node_core::route::Owner;
pub use link::PeerLink;
pub use owners::Cluster;
pub use server::{
    MAX_PEER_CONNECTIONS, MAX_PEER_CONNECTIONS_PER_NODE, MAX_PEER_HANDSHAKES, MAX_PEER_HANDSHAKES_PER_ADDRESS,
    PeerAnswers, serve, serve_with,
};

use crate::service::Node;
use granary_net::tls;
use std::net::SocketAddr;
use std::sync::Arc;

/// A node's part in the cluster: membership, the peer endpoint, and the
/// placement it follows. Dropping it leaves the tasks running; call
/// [`ClusterHandle::stop`].
pub struct ClusterHandle {
    membership: crate::membership::Membership,
    endpoint: quinn::Endpoint,
    tasks: tokio::task::JoinSet<()>,
}

impl ClusterHandle {
    /// Joins the cluster `cfg` describes: registers (in the background),
    /// serves chunks to peers on the advertised address, and makes `node`
    /// fetch the shards others own from them. Must run inside a tokio
    /// runtime.
    pub fn start(
        node: &Node,
        cfg: &crate::config::ClusterConfig,
        ram_bytes: u64,
        ssd_bytes: u64,
    ) -> Result<Self, crate::membership::JoinError> {
        Self::start_with(node, cfg, ram_bytes, ssd_bytes, PeerAnswers::Honest)
    }

    /// [`ClusterHandle::start`], its peer server sending chunks as
    /// `answers` says (see [`PeerAnswers`]).
    pub fn start_with(
        node: &Node,
        cfg: &crate::config::ClusterConfig,
        ram_bytes: u64,
        ssd_bytes: u64,
        answers: PeerAnswers,
    ) -> Result<Self, crate::membership::JoinError> {
        use crate::membership::{JoinError, Membership};
        // A config built in code (not loaded from node.toml) is checked here.
        cfg.fabric.validate()?;
        let id_err = |e: tls::TlsError| JoinError::Identity(e.to_string());
        let (identity, node_id) = crate::membership::node_identity(cfg)?;
        let (key, bind) = match &cfg.listen {
            Some(l) => ("listen", l),
            None => ("advertise", &cfg.advertise),
        };
        let listen: SocketAddr =
            bind.parse().map_err(|e| JoinError::Identity(format!("{key} address {bind:?}: {e}")))?;
        let endpoint =
            tls::server_endpoint(&identity, listen, identity.server_config(cfg.fabric.peer_alpns()).map_err(id_err)?)
                .map_err(id_err)?;
        // One socket for everything: peers and voters see this node at one
        // address (what a firewall rule or a fault relay keys on).
        let membership = Membership::start(cfg, node_id, &identity, &endpoint, ram_bytes, ssd_bytes)?;
        let link = PeerLink::new(endpoint.clone(), &identity, &cfg.fabric).map_err(id_err)?;
        let cluster = Arc::new(Cluster::new(node_id, link, cfg.fabric.clone()));
        node.join_cluster(cluster.clone());
        let mut tasks = tokio::task::JoinSet::new();
        let mut standing = membership.standing();
        let lease_cluster = cluster.clone();
        tasks.spawn(async move {
            loop {
                let view = standing.borrow_and_update().lease_view();
                lease_cluster.set_lease(Some(view));
                if standing.changed().await.is_err() {
                    return;
                }
            }
        });
        // Placement lookups and holds: handles on the membership's one
        // connection per voter, each with its own leader hint.
        let client = membership.client(Default::default());
        tasks.spawn(serve_with(node.clone(), endpoint.clone(), cfg.fabric.clone(), answers));
        let holds_client = membership.client(Default::default());
        tasks.spawn(holds::report_holds(
            node_id,
            node.holds(),
            holds_client,
            membership.standing(),
            cfg.fabric.hold_linger,
        ));
        tasks.spawn(follow_placement(cluster, node.clone(), client, membership.view()));
        tracing::info!(%listen, "serving chunks to peers");
        Ok(Self { membership, endpoint, tasks })
    }

    /// What `/readyz` answers for this node (issue 48): ready once it is
    /// registered, its lease is live and it knows the placement the
    /// coordinators reported ([`granary_node_core::health::node_readiness`]).
    pub fn readiness(&self) -> granary_net::metrics::Readiness {
        let standing = self.membership.standing();
        let view = self.membership.view();
        Arc::new(move || {
            let s = *standing.borrow();
            let epoch = view.borrow().as_ref().map(|p| p.view.placement_epoch);
            granary_node_core::health::node_readiness(std::time::Instant::now(), Some(s.lease_view()), epoch)
                .map(|()| format!("in the cluster, placement epoch {}", epoch.unwrap_or_default()))
                .map_err(|why| why.to_string())
        })
    }

    /// Why this node cannot be in the cluster, once known (another daemon
    /// holds its identity or address for good): the daemon exits with it.
    pub fn fatal(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.membership.fatal()
    }

    /// Stops heartbeating, following placement and serving peers.
    pub fn stop(mut self) {
        self.tasks.abort_all();
        self.endpoint.close(0u32.into(), b"node stopping");
        self.membership.stop();
    }
}
