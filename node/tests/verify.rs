//! Issue 29: what a peer sends is kept as a guest copy until verified, and
//! with `verify_peer_chunks` a node converts peers' chunks itself and
//! compares; a peer with a valid certificate that sends well-formed wrong
//! values is caught, never served, and quarantined.

use granary_node::Node;
use granary_node::config::NodeConfig;
use granary_node::fabric::verify::Fraction;
use granary_node::fabric::{Cluster, FabricConfig};
use granary_proto::{ChunkLayout, ChunkView, NodeId, ShardId};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

mod common;
use common::fabric::*;

/// Node 2 (no prefetch) verifying `fraction` of the chunks peers send, in
/// a cluster whose fetch deadline and reroute wait outlast any test.
async fn checking_node2(f: &Fixture, fraction: f64) -> (Node, Cluster) {
    let cfg = NodeConfig { prefetch_bytes: 0, ..f.node_config() };
    let node2 = Node::start(&cfg).await.expect("node 2");
    let fabric = FabricConfig {
        fetch_deadline: Duration::from_secs(60),
        reroute_wait: Duration::from_secs(60),
        verify_peer_chunks: Fraction(fraction),
        ..FabricConfig::default()
    };
    (node2, Cluster::new(NodeId(2), link(f, "node"), fabric))
}

/// The fixture's chunk with one value changed and its checksums sealed
/// again: well formed, of the right shard and length, and wrong.
async fn forged(f: &Fixture) -> Vec<u8> {
    let honest = f.node.chunk(f.version, f.shard).await.expect("chunk");
    let info = f.node.describe("ads", Some(f.version)).expect("describe");
    let rows = info.shards.iter().find(|s| s.shard == f.shard).expect("shard").rows;
    let layout = ChunkLayout::new(f.version, f.shard, rows, &info.tensors).expect("layout");
    let mut bytes = honest.bytes().to_vec();
    bytes[layout.tensor_range(0).start] ^= 0x01;
    layout.seal(&mut bytes).expect("sealed again");
    ChunkView::parse(&bytes, granary_proto::chunk::Verify::Full).expect("passes every check a peer chunk gets");
    assert_ne!(bytes, honest.bytes());
    bytes
}

/// A peer holding a node certificate that answers every request with
/// `bytes` as the chunk, counting the requests.
fn lying_peer(f: &Fixture, bytes: Vec<u8>) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let (bytes, asked) = (Arc::new(bytes), Arc::new(AtomicUsize::new(0)));
    let counter = asked.clone();
    let addr = fake_peer(f, move |_, mut send| {
        let bytes = bytes.clone();
        counter.fetch_add(1, Ordering::SeqCst);
        async move {
            let _ = send.write_all(&chunk_head(bytes.len() as u64)).await;
            let _ = send.write_all(&bytes).await;
            let _ = send.finish();
        }
    });
    (addr, asked)
}

/// Every shard of the fixture's version owned by node 1 at `addr`.
fn all_owned_by_node1(f: &Fixture, cluster: &Cluster, addr: std::net::SocketAddr) -> Vec<ShardId> {
    let shards: Vec<ShardId> =
        f.node.dataset(f.version).expect("dataset").manifest.shards().iter().map(|s| s.shard).collect();
    let owners = std::iter::once((f.version, shards.iter().map(|s| (*s, NodeId(1))).collect())).collect();
    cluster.apply_placement(1, std::iter::once((NodeId(1), addr)).collect(), owners);
    shards
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_sending_well_formed_wrong_values_is_caught_never_served_and_quarantined() {
    let f = start().await;
    let honest = f.node.chunk(f.version, f.shard).await.expect("honest chunk").bytes().to_vec();
    let (evil, asked) = lying_peer(&f, forged(&f).await);
    let (node2, cluster) = checking_node2(&f, 1.0).await;
    let shards = all_owned_by_node1(&f, &cluster, evil);
    assert!(node2.join_cluster(Arc::new(cluster)));

    let got = node2.chunk(f.version, f.shard).await.expect("served");
    assert_eq!(got.bytes(), &honest[..], "this node's own conversion is served, not the peer's");
    settled(&node2).await;
    let s = node2.stats();
    assert_eq!((s.peer_fetched, s.peer_mismatched, s.peer_verified, s.peers_quarantined), (1, 1, 0, 1), "{s:?}");
    assert_eq!(s.guest_bytes, 0, "nothing from the peer is kept");

    // Quarantined: its other shards are read here; it is asked nothing more.
    let other = *shards.iter().find(|s| **s != f.shard).expect("another shard");
    let again = node2.chunk(f.version, other).await.expect("read here");
    assert_eq!(again.bytes(), f.node.chunk(f.version, other).await.expect("honest").bytes());
    let s = node2.stats();
    assert_eq!((s.peer_fetched, s.peer_failures, s.conversions), (1, 0, 2), "{s:?}");
    assert_eq!(asked.load(Ordering::SeqCst), 1, "the quarantined peer was asked once");
}

/// With no verification drawn, a peer's chunk is served but only ever as a
/// guest copy: RAM, first to go, never this node's own tier or SSD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unverified_peer_chunk_is_only_a_guest_copy() {
    let f = start().await;
    let (evil, _) = lying_peer(&f, forged(&f).await);
    let (node2, cluster) = checking_node2(&f, 0.0).await;
    all_owned_by_node1(&f, &cluster, evil);
    assert!(node2.join_cluster(Arc::new(cluster)));
    node2.chunk(f.version, f.shard).await.expect("served");
    settled(&node2).await;
    let s = node2.stats();
    assert_eq!((s.peer_fetched, s.peer_verified, s.peer_mismatched, s.conversions), (1, 0, 0, 0), "{s:?}");
    assert!(s.guest_bytes >= f.len, "a guest copy: {s:?}");
}

/// Issue 45: a guest copy (a peer's chunk, unverified) is never passed on:
/// a node that holds a forgery as one answers a handoff "not held" and a
/// peer asking it as owner with its own conversion, so the forgery goes
/// no further than this node's trainers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_copy_is_never_passed_on_to_another_node() {
    let f = start().await;
    let honest = f.node.chunk(f.version, f.shard).await.expect("honest chunk").bytes().to_vec();
    let (evil, _) = lying_peer(&f, forged(&f).await);
    let (node2, cluster) = checking_node2(&f, 0.0).await;
    all_owned_by_node1(&f, &cluster, evil);
    assert!(node2.join_cluster(Arc::new(cluster)));
    let guest = node2.chunk(f.version, f.shard).await.expect("served");
    assert!(guest.bytes() != &honest[..], "node 2's trainers got the forgery, as a guest copy");
    settled(&node2).await;
    assert!(node2.held_for_peer(f.version, f.shard).await.is_none(), "a handoff is not answered from a guest copy");
    // A peer asking on a newer placement (node 2 may own the shard there).
    let asker = "127.0.0.1:9".parse().expect("addr");
    let served = node2.chunk_for_peer(f.version, f.shard, asker, 2).await.expect("served to a peer");
    assert!(served.bytes() == &honest[..], "the peer gets node 2's own conversion, not the guest copy");
    assert_eq!(node2.stats().conversions, 1);
}

/// A handed-over chunk that a verification finds right becomes this
/// node's own (its RAM tier, and SSD where there is one); an honest peer
/// is not quarantined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_chunk_verified_here_becomes_this_nodes_own() {
    let f = start().await;
    let held = f.node.chunk(f.version, f.shard).await.expect("node 1 holds the chunk");
    let (node2, cluster) = checking_node2(&f, 1.0).await;
    handed_over_to_node2(&f, &cluster);
    assert!(node2.join_cluster(Arc::new(cluster)));
    let chunk = node2.chunk(f.version, f.shard).await.expect("handed over and verified");
    assert_eq!(chunk.bytes(), held.bytes());
    settled(&node2).await;
    node2.chunk(f.version, f.shard).await.expect("again");
    let s = node2.stats();
    assert_eq!((s.peer_fetched, s.peer_verified, s.peer_mismatched, s.peers_quarantined), (1, 1, 0, 0), "{s:?}");
    assert_eq!((s.conversions, s.ram_hits, s.guest_hits, s.guest_bytes), (1, 1, 0, 0), "its own copy: {s:?}");
}

/// The byzantine peer of `granary-chaos run` (`PeerAnswers::Forged`): a
/// real node's server sending each chunk with one value changed and its
/// checksums sealed again. Its chunks pass every check but verification,
/// which catches them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_serving_forged_chunks_passes_every_check_but_verification() {
    use granary_net::tls::{self, ALPN_PEER, Identity};
    let f = start().await;
    let identity = Identity::load(&f.certs, "node").expect("identity");
    let config = identity.server_config(&[ALPN_PEER]).expect("cfg");
    let ep = tls::server_endpoint(&identity, "127.0.0.1:0".parse().expect("addr"), config).expect("endpoint");
    let forger = ep.local_addr().expect("addr");
    tokio::spawn(granary_node::fabric::serve_with(
        f.node.clone(),
        ep,
        shared_cert(),
        granary_node::fabric::PeerAnswers::Forged,
    ));
    let sent = link(&f, "node").fetch(forger, 0, f.version, f.shard, &f.expected, Duration::from_secs(10)).await;
    let sent = sent.expect("a forged chunk passes the fetch's checks");
    let honest = f.node.chunk(f.version, f.shard).await.expect("honest");
    assert_ne!(sent.bytes(), honest.bytes(), "forged");
    let (node2, cluster) = checking_node2(&f, 1.0).await;
    all_owned_by_node1(&f, &cluster, forger);
    assert!(node2.join_cluster(Arc::new(cluster)));
    let got = node2.chunk(f.version, f.shard).await.expect("served");
    assert_eq!(got.bytes(), honest.bytes());
    assert_eq!((node2.stats().peer_mismatched, node2.stats().peers_quarantined), (1, 1));
}
