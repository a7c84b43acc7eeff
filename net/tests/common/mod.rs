//! Helpers shared by the integration tests: a temporary cluster directory, bounded waits, and a connected pair of
//! QUIC endpoints on 127.0.0.1.

// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use granary_net::tls::{self, ALPN_API, Identity, Role};
use serde::{Deserialize, Serialize};
use tempfile::TempDir;

/// Upper bound on every wait in these tests.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// Awaits `fut`, failing the test if it takes longer than [`WAIT`].
pub(crate) async fn bounded<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(out) => out,
        Err(_) => panic!("timed out after {WAIT:?}: {what}"),
    }
}

/// 127.0.0.1 with an OS-chosen port.
pub(crate) fn any_local_port() -> SocketAddr {
    (Ipv4Addr::LOCALHOST, 0).into()
}

/// A cluster directory made by `init_cluster` inside a temporary directory that is removed on drop.
pub(crate) struct Cluster {
    _tmp: TempDir,
    pub dir: PathBuf,
}

impl Cluster {
    pub(crate) fn new() -> Self {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("certs");
        tls::init_cluster(&dir).expect("init_cluster");
        Self { _tmp: tmp, dir }
    }

    pub(crate) fn identity(&self, name: &str) -> Identity {
        Identity::load(&self.dir, name).expect("load identity")
    }

    pub(crate) fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

/// A message for round trips.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Echo {
    pub seq: u64,
    pub text: String,
}

/// A server endpoint with `server_identity` (ALPN_API) and a client endpoint with `client_identity`.
pub(crate) struct Endpoints {
    pub server: quinn::Endpoint,
    pub server_addr: SocketAddr,
    pub client: quinn::Endpoint,
}

impl Endpoints {
    pub(crate) fn new(server_identity: &Identity) -> Self {
        let config = server_identity.server_config(&[ALPN_API]).expect("server config");
        let server = tls::endpoint(any_local_port(), Some(config)).expect("server endpoint");
        let server_addr = server.local_addr().expect("server address");
        let client = tls::endpoint(any_local_port(), None).expect("client endpoint");
        Self { server, server_addr, client }
    }

    /// Dials the server as `server_role`'s DNS name with `config`; the handshake result, unawaited.
    pub(crate) fn dial(&self, config: quinn::ClientConfig, server_role: Role) -> quinn::Connecting {
        self.client.connect_with(config, self.server_addr, server_role.server_name()).expect("connect_with")
    }
}

/// Both ends of an established mutual-TLS connection (coordinator serves, node dials), with the endpoints kept alive.
pub(crate) struct Pair {
    pub server: quinn::Connection,
    pub client: quinn::Connection,
    pub endpoints: Endpoints,
    pub cluster: Cluster,
}

impl Pair {
    pub(crate) async fn new() -> Self {
        let cluster = Cluster::new();
        let endpoints = Endpoints::new(&cluster.identity("coordinator"));
        let config = cluster.identity("node").client_config(ALPN_API).expect("client config");
        let connecting = endpoints.dial(config, Role::Coordinator);
        let accept = async {
            let incoming = endpoints.server.accept().await.expect("server endpoint open");
            incoming.await.expect("server handshake")
        };
        let (server, client) =
            bounded("handshake", async { tokio::join!(accept, async { connecting.await.expect("client handshake") }) })
                .await;
        Self { server, client, endpoints, cluster }
    }
}
