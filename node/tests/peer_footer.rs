//! Footers over the fabric, over real QUIC: a footer fetch takes no
//! chunk-fetch slot, and a node asked for a footer another node reads says
//! so at once. Split from `peer.rs`.

use granary_net::tls::{self, ALPN_PEER, Identity};
use granary_node::Node;
use granary_node::config::NodeConfig;
use granary_node::fabric::{Cluster, FabricConfig};
use granary_proto::NodeId;
use granary_proto::peer::PeerResponse;
use granary_proto::wire::{decode, encode};
use granary_testkit::datagen;
use std::time::Duration;

mod common;
use common::fabric::*;

/// A footer fetch never waits behind chunk fetches to the same peer: with
/// every fetch slot to a peer held by chunk fetches whose answers are slow
/// (the owner says "working"), the footer still comes at once. (Sharing
/// the slots made two nodes wait on each other in cold epochs: each one's
/// chunk fetches waited on the other's loads, which waited on footers from
/// the first, queued behind those chunk fetches.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_footer_fetch_does_not_wait_behind_chunk_fetches_to_the_same_peer() {
    use granary_proto::peer::PeerRequest;
    let f = start().await;
    let footer = f.node.footer_for_peer(f.version, 0).await.expect("footer");
    let file_size = f.node.dataset(f.version).expect("dataset").files[0].size;
    let identity = Identity::load(&f.certs, "node").expect("identity");
    let ep = tls::server_endpoint(&identity, local(), identity.server_config(&[ALPN_PEER]).expect("cfg")).expect("ep");
    let owner = ep.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Some(incoming) = ep.accept().await {
            let Ok(conn) = incoming.await else { continue };
            let footer = footer.clone();
            tokio::spawn(async move {
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    let footer = footer.clone();
                    tokio::spawn(async move {
                        let request = recv.read_to_end(1 << 16).await.expect("request");
                        match decode::<PeerRequest>(&request[4..]).expect("decode") {
                            PeerRequest::FetchChunk { .. } | PeerRequest::HandOver { .. } => {
                                while send.write_all(&working_frame()).await.is_ok() {
                                    tokio::time::sleep(Duration::from_millis(500)).await;
                                }
                            }
                            PeerRequest::FetchFooter { .. } => {
                                let head = encode(&PeerResponse::Footer { len: footer.len() as u64 });
                                let _ = send.write_all(&(head.len() as u32).to_le_bytes()).await;
                                let _ = send.write_all(&head).await;
                                let _ = send.write_all(&footer).await;
                                let _ = send.finish();
                            }
                        }
                    });
                }
            });
        }
    });
    let l = std::sync::Arc::new(link(&f, "node"));
    let mut chunks = Vec::new();
    for _ in 0..FabricConfig::default().max_fetches_per_peer {
        let (l, v, s, n) = (l.clone(), f.version, f.shard, f.expected.clone());
        chunks.push(tokio::spawn(async move { l.fetch(owner, 0, v, s, &n, Duration::from_secs(60)).await }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    let got = l.fetch_footer(owner, f.version, 0, file_size, Duration::from_secs(10)).await.expect("footer");
    assert!(started.elapsed() < Duration::from_secs(3), "waited {:?} for a slot", started.elapsed());
    assert!(!got.is_empty());
    for c in &chunks {
        assert!(!c.is_finished(), "the chunk fetches were still holding every slot");
    }
    for c in chunks {
        c.abort();
    }
}

/// A node asked for a footer it does not hold, and that by its placement
/// another node reads, says so at once instead of reading it or asking
/// that node (two nodes whose placements disagree would otherwise wait on
/// each other until the footer deadline); a footer it holds it gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_asked_for_a_footer_another_node_reads_says_so_at_once() {
    let f = start().await;
    let manifest = f.node.dataset(f.version).expect("dataset").manifest.clone();
    let node = Node::start(&NodeConfig { ram_bytes: 64 << 20, ..NodeConfig::default() }).await.expect("node");
    let version = node.serve_manifest("ads", datagen::view(), manifest.clone()).expect("serve");
    let cluster = Cluster::new(NodeId(2), link(&f, "node"), FabricConfig::default());
    let owners = std::iter::once((version, manifest.shards().iter().map(|s| (s.shard, NodeId(1))).collect())).collect();
    cluster.apply_placement(1, std::iter::once((NodeId(1), f.addr)).collect(), owners);
    assert!(node.join_cluster(std::sync::Arc::new(cluster)));
    let started = std::time::Instant::now();
    match node.footer_for_peer(version, 0).await {
        Err(e @ granary_node::error::FetchError::NotFooterOwner { .. }) => {
            assert!(e.to_string().contains("file 0") && e.to_string().contains("node-1"), "{e}");
        }
        other => panic!("expected a refusal, got {:?}", other.map(|b| b.len())),
    }
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(node.stats().remote_bytes, 0, "nothing read for the refusal");
    // Once it holds the footer (read for a load of its own), it gives it.
    node.dataset(version).expect("dataset").footer(0).await.expect("footer read here");
    let held = node.footer_for_peer(version, 0).await.expect("held footer");
    assert_eq!(held, f.node.footer_for_peer(version, 0).await.expect("owner's footer"));
}
