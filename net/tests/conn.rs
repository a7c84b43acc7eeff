//! The outgoing connection cache: concurrent first requests to a peer share
//! one handshake and one connection.

mod common;

use common::{Cluster, Endpoints, bounded};
use granary_net::conn::Connections;
use granary_net::tls::{ALPN_API, Role};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_requests_share_one_connection() {
    let cluster = Cluster::new();
    let endpoints = Endpoints::new(&cluster.identity("coordinator"));
    let accepted = Arc::new(AtomicUsize::new(0));
    let server = endpoints.server.clone();
    let count = accepted.clone();
    let serving = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some(incoming) = server.accept().await {
            if let Ok(conn) = incoming.await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(conn);
            }
        }
    });
    let config = cluster.identity("node").client_config(ALPN_API).expect("client config");
    let conns = Arc::new(Connections::new(
        endpoints.client.clone(),
        config,
        ALPN_API,
        Role::Coordinator,
        Duration::from_secs(5),
    ));
    let addr = endpoints.server_addr;
    let ids: Vec<usize> = bounded("eight dials", async {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let conns = conns.clone();
            tasks.spawn(async move { conns.get(addr).await.expect("connect").stable_id() });
        }
        let mut ids = Vec::new();
        while let Some(id) = tasks.join_next().await {
            ids.push(id.expect("task"));
        }
        ids
    })
    .await;
    assert!(ids.iter().all(|id| *id == ids[0]), "one connection for all: {ids:?}");
    settle(&accepted, 1).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "one handshake");
    // Once it is closed, the next request dials again.
    conns.get(addr).await.expect("cached").close(0u32.into(), b"test");
    let again = bounded("redial", conns.get(addr)).await.expect("redial");
    assert_ne!(again.stable_id(), ids[0]);
    settle(&accepted, 2).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    serving.abort();
}

/// Waits until the server side has completed `n` handshakes (it finishes
/// after the client's), then a little longer for any extra one to show.
async fn settle(accepted: &AtomicUsize, n: usize) {
    bounded("server handshakes", async {
        while accepted.load(Ordering::SeqCst) < n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// A server that shares no version of the wire with the client (here a
/// newer API) chooses `granary-versions`, closes naming what it speaks, and
/// the dial fails with both versions and the side to upgrade, not with a
/// TLS alert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_sharing_no_version_is_refused_naming_both() {
    let cluster = Cluster::new();
    let identity = cluster.identity("coordinator");
    let newer: &[u8] = b"granary-api/9";
    let config = identity.server_config(&[newer]).expect("server config");
    let server = granary_net::tls::endpoint("127.0.0.1:0".parse().unwrap(), Some(config)).expect("server");
    let addr = server.local_addr().expect("addr");
    let serving = tokio::spawn(async move {
        while let Some(incoming) = server.accept().await {
            if let Ok(conn) = incoming.await {
                assert!(granary_net::tls::answer_versions(&conn, &[newer]), "chose granary-versions");
            }
        }
    });
    let client = granary_net::tls::endpoint("127.0.0.1:0".parse().unwrap(), None).expect("client");
    let config = cluster.identity("node").client_config(ALPN_API).expect("client config");
    let conns = Connections::new(client, config, ALPN_API, Role::Coordinator, Duration::from_secs(5));
    let e = bounded("a refused dial", conns.get(addr)).await.expect_err("no version in common");
    assert!(matches!(e, granary_net::conn::DialError::Version { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        format!("{addr}: speaks granary-api/9, this build granary-api/1: no version in common; upgrade this build")
    );
    serving.abort();
}
