//! The voter fixture of the coordinator's test files (`server.rs`,
//! `answers.rs`): one voter in process with the cluster's certificates,
//! elected and ready, and clients of it.
#![allow(dead_code)]

use granary_coordinator::types::VoterId;
use granary_coordinator::{Coordinator, CoordinatorConfig};
use granary_net::api::{ApiRequest, ApiResponse};
use granary_net::client::{ClientOptions, CoordinatorClient};
use granary_net::tls::{self, Identity, Role};
use granary_proto::NodeId;
use std::path::PathBuf;
use std::time::Duration;

pub(crate) struct Fixture {
    pub(crate) tmp: tempfile::TempDir,
    pub(crate) certs: PathBuf,
    pub(crate) coordinator: Coordinator,
}

/// A voter that lets unbound node certificates register (these tests
/// register many node ids with the one `node` certificate), unless
/// `strict`.
pub(crate) async fn start_in(tmp: tempfile::TempDir, lease: Duration) -> Fixture {
    start_with(tmp, lease, false).await
}

pub(crate) async fn start_with(tmp: tempfile::TempDir, lease: Duration, strict: bool) -> Fixture {
    start_tuned(tmp, lease, strict, |_| {}).await
}

/// [`start_with`], with `tune` applied to the voter's configuration.
pub(crate) async fn start_tuned(
    tmp: tempfile::TempDir,
    lease: Duration,
    strict: bool,
    tune: impl FnOnce(&mut CoordinatorConfig),
) -> Fixture {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let certs = tmp.path().join("certs");
    if !certs.join("ca.key").exists() {
        tls::init_cluster(&certs).expect("certs");
    }
    let identity = Identity::load(&certs, "coordinator").expect("identity");
    let mut cfg =
        CoordinatorConfig::new(VoterId(1), "127.0.0.1:0".parse().expect("addr"), tmp.path().join("data"), identity);
    cfg.lease = lease;
    cfg.allow_unbound_node_certs = !strict;
    cfg.allow_unbound_voter_certs = !strict;
    cfg.election_timeout = Duration::from_millis(150);
    cfg.heartbeat_interval = Duration::from_millis(50);
    tune(&mut cfg);
    let coordinator = Coordinator::start(cfg).await.expect("start");
    let f = Fixture { tmp, certs, coordinator };
    // Wait for the single voter to elect itself.
    let client = f.client("admin");
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok((_, ApiResponse::Status(s))) = client.call(&ApiRequest::Status).await
                && s.leader == Some(1)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("leader within 10 s");
    f
}

pub(crate) async fn start(lease: Duration) -> Fixture {
    start_in(tempfile::tempdir().expect("tempdir"), lease).await
}

impl Fixture {
    pub(crate) fn identity(&self, name: &str) -> Identity {
        Identity::load(&self.certs, name).expect("identity")
    }

    pub(crate) fn client(&self, name: &str) -> CoordinatorClient {
        let options = ClientOptions { deadline: Duration::from_secs(5), ..Default::default() };
        CoordinatorClient::new(&self.identity(name), vec![self.coordinator.local_addr()], options).expect("client")
    }

    pub(crate) async fn connect(&self, name: &str, alpn: &[u8]) -> Result<quinn::Connection, String> {
        let ep = tls::endpoint("127.0.0.1:0".parse().expect("addr"), None).map_err(|e| e.to_string())?;
        let cfg = self.identity(name).client_config(alpn).map_err(|e| e.to_string())?;
        let connecting = ep
            .connect_with(cfg, self.coordinator.local_addr(), Role::Coordinator.server_name())
            .map_err(|e| e.to_string())?;
        tokio::time::timeout(Duration::from_secs(5), connecting)
            .await
            .map_err(|_| "timeout".to_string())?
            .map_err(|e| e.to_string())
    }
}

pub(crate) async fn register(c: &CoordinatorClient, node: u64) -> u64 {
    let req = ApiRequest::RegisterNode {
        node: NodeId(node),
        addr: format!("127.0.0.1:{}", 9000 + node),
        ram_bytes: 1 << 30,
        ssd_bytes: 0,
        registration: 0,
    };
    match c.call(&req).await.expect("register") {
        (_, ApiResponse::Registered { incarnation, .. }) => incarnation,
        (_, other) => panic!("{other:?}"),
    }
}
