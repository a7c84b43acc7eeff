//! The peer endpoint in process, over real QUIC with the cluster's
//! certificates: who may ask and be asked (the certificate's node id, the
//! placement's owner), and what is taken from a peer: a validated chunk,
//! never a malformed, corrupt or oversized one; a stream that sends no
//! request is ended; two nodes that disagree about an owner do not wait on
//! each other. A peer that stalls, dies or goes quiet: `peer_faults.rs`;
//! prefetch through peers: `peer_prefetch.rs`; when ownership moves:
//! `ownership.rs`; footers: `peer_footer.rs`; verification of what peers
//! send: `verify.rs`.

use granary_net::tls::{self, ALPN_PEER, Identity, Role};
use granary_node::Node;
use granary_node::config::NodeConfig;
use granary_node::fabric::{Cluster, Corruption, FabricConfig, PeerError, PeerLink, serve};
use granary_proto::peer::PeerResponse;
use granary_proto::wire::{ErrorKind, decode};
use granary_proto::{ChunkView, NodeId, ShardId};
use std::net::SocketAddr;
use std::time::Duration;

mod common;
use common::fabric::*;

/// Issue 15: a node takes a chunk only from the node the placement names
/// at the address it dials, proven by the node id in that peer's
/// certificate; a peer with another node's key, or with a certificate
/// bound to no id, is refused before it is asked anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_serves_only_as_the_node_its_certificate_names() {
    let f = start().await;
    tls::issue_bound(&f.certs, Role::Node, "node-1", Some(1)).expect("issue");
    let identity = Identity::load(&f.certs, "node-1").expect("identity");
    let ep = tls::server_endpoint(&identity, local(), identity.server_config(&[ALPN_PEER]).expect("cfg")).expect("ep");
    let bound_addr = ep.local_addr().expect("addr");
    tokio::spawn(serve(f.node.clone(), ep, shared_cert()));
    let strict = |placed: &[(u64, SocketAddr)]| {
        let me = Identity::load(&f.certs, "node").expect("identity");
        let link = PeerLink::new(tls::endpoint(local(), None).expect("endpoint"), &me, &FabricConfig::default())
            .expect("link");
        link.expect_peers(&placed.iter().map(|&(n, a)| (NodeId(n), a)).collect());
        link
    };
    let fetch = |link: PeerLink, addr| {
        let expected = f.expected.clone();
        async move { link.fetch(addr, 0, f.version, f.shard, &expected, Duration::from_secs(10)).await }
    };
    // Node 1's own certificate at the address the placement gives node 1.
    fetch(strict(&[(1, bound_addr)]), bound_addr).await.expect("node 1 serves as node 1");
    // The same peer where the placement names node 2.
    match fetch(strict(&[(2, bound_addr)]), bound_addr).await {
        Err(e) => assert!(e.to_string().contains("names node-1; the placement names node-2"), "{e}"),
        Ok(_) => panic!("a chunk was taken from a peer posing as node 2"),
    }
    // A certificate bound to no id, where the placement names node 1.
    match fetch(strict(&[(1, f.addr)]), f.addr).await {
        Err(e) => assert!(e.to_string().contains("names no node id"), "{e}"),
        Ok(_) => panic!("a chunk was taken from an unbound peer"),
    }
}

/// Issue 15: a node does not serve as the owner what its placement gives
/// another node: a peer asking on a placement no newer than the node's
/// is refused without a remote read (it asks the owner instead); a peer
/// asking on a newer placement is served (the node may own the shard
/// there and not know it yet). Before, the node read any shard a peer
/// asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_to_serve_as_owner_what_its_placement_gives_another_node() {
    let f = start().await;
    let cluster = Cluster::new(NodeId(1), link(&f, "node"), shared_cert());
    let dead = std::net::UdpSocket::bind(local()).expect("bind").local_addr().expect("addr");
    let owners = std::iter::once((f.version, std::iter::once((f.shard, NodeId(9))).collect())).collect();
    cluster.apply_placement(3, std::iter::once((NodeId(9), dead)).collect(), owners);
    assert!(f.node.join_cluster(std::sync::Arc::new(cluster)));
    let read_before = f.node.stats().remote_bytes;
    let asker = link(&f, "node");
    let fetch = |epoch| asker.fetch(f.addr, epoch, f.version, f.shard, &f.expected, Duration::from_secs(10));
    for epoch in [2, 3] {
        match fetch(epoch).await {
            Err(e) => assert!(e.to_string().contains("its placement names node-9 the owner"), "{e}"),
            Ok(_) => panic!("served a shard placed on node 9 to a peer asking on epoch {epoch}"),
        }
    }
    let s = f.node.stats();
    assert_eq!((s.remote_bytes - read_before, s.peer_refused), (0, 2), "refused without reading");
    fetch(4).await.expect("a peer asking on a newer placement is served");
    assert!(f.node.stats().remote_bytes > read_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_fetches_a_validated_chunk_and_others_are_refused() {
    let f = start().await;
    let buf = link(&f, "node")
        .fetch(f.addr, 0, f.version, f.shard, &f.expected, Duration::from_secs(10))
        .await
        .expect("fetch");
    let view = ChunkView::parse(buf.bytes(), granary_proto::chunk::Verify::Full).expect("valid");
    assert_eq!(view.header().shard, f.shard);
    let local = f.node.chunk(f.version, f.shard).await.expect("local");
    assert_eq!(buf.bytes(), local.bytes(), "the bytes as stored");
    assert_eq!(f.node.stats().peer_served, 1);

    // A trainer's certificate is refused; the error names the peer.
    let err = link(&f, "trainer")
        .fetch(f.addr, 0, f.version, f.shard, &f.expected, Duration::from_secs(10))
        .await
        .expect_err("refused");
    assert!(err.to_string().contains(&f.addr.to_string()), "{err}");

    // An unknown shard is a clear refusal, not a hang.
    let bad = ShardId { file: 9, row_group: 9 };
    match link(&f, "node").fetch(f.addr, 0, f.version, bad, &f.expected, Duration::from_secs(10)).await {
        Err(PeerError::Refused { kind: ErrorKind::BadRequest, .. }) => {}
        other => panic!("unknown shard: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_request_is_answered_with_bad_request() {
    let f = start().await;
    let identity = Identity::load(&f.certs, "node").expect("identity");
    let ep = tls::endpoint(local(), None).expect("endpoint");
    let conn = ep
        .connect_with(identity.client_config(ALPN_PEER).expect("cfg"), f.addr, Role::Node.server_name())
        .expect("connect")
        .await
        .expect("handshake");
    for frame in [[5u32.to_le_bytes().to_vec(), b"hello".to_vec()].concat(), (1u32 << 30).to_le_bytes().to_vec()] {
        let (mut send, mut recv) = conn.open_bi().await.expect("stream");
        send.write_all(&frame).await.expect("write");
        let _ = send.finish();
        let reply = tokio::time::timeout(Duration::from_secs(5), recv.read_to_end(1 << 16))
            .await
            .expect("bounded")
            .expect("reply");
        let resp: PeerResponse = decode(&reply[4..]).expect("a response frame");
        assert!(matches!(resp, PeerResponse::Failed { kind: ErrorKind::BadRequest, .. }), "{resp:?}");
    }
    // Still serving.
    link(&f, "node").fetch(f.addr, 0, f.version, f.shard, &f.expected, Duration::from_secs(10)).await.expect("fetch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_chunk_from_a_peer_is_rejected() {
    let f = start().await;
    // A peer that flips one payload byte of every chunk it sends.
    let mut bytes = f.node.chunk(f.version, f.shard).await.expect("chunk").bytes().to_vec();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    let bytes = std::sync::Arc::new(bytes);
    let evil_addr = fake_peer(&f, move |_, mut send| {
        let bytes = bytes.clone();
        async move {
            let _ = send.write_all(&chunk_head(bytes.len() as u64)).await;
            let _ = send.write_all(&bytes).await;
            let _ = send.finish();
        }
    });
    match link(&f, "node").fetch(evil_addr, 0, f.version, f.shard, &f.expected, Duration::from_secs(10)).await {
        Err(PeerError::Corrupt { addr, shard, .. }) => {
            assert_eq!((addr, shard), (evil_addr, f.shard));
        }
        other => panic!("a corrupt chunk was accepted: {:?}", other.map(|b| b.len())),
    }
}

/// A peer announcing a chunk length other than the manifest's layout gives
/// (here 3 GiB, under the 4 GiB frame cap) is refused at once, before any
/// memory is committed for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_announcing_another_chunk_length_is_refused_before_memory_is_committed() {
    let f = start().await;
    let liar = fake_peer(&f, |_, mut send| async move {
        let _ = send.write_all(&chunk_head(3 << 30)).await;
        tokio::time::sleep(Duration::from_secs(3600)).await;
    });
    let before = granary_node::live_chunk_bytes();
    let started = std::time::Instant::now();
    match link(&f, "node").fetch(liar, 0, f.version, f.shard, &f.expected, Duration::from_secs(20)).await {
        Err(PeerError::Corrupt { addr, shard, corruption: Corruption::Length { announced, expected } }) => {
            assert_eq!((addr, shard), (liar, f.shard));
            assert_eq!((announced, expected), (3u64 << 30, f.len));
        }
        other => panic!("a 3 GiB announcement gave {:?}", other.map(|b| b.len())),
    }
    assert!(started.elapsed() < Duration::from_secs(5), "refused at once, not at the deadline");
    assert!(granary_node::live_chunk_bytes() < before + (1 << 30), "no memory committed for the announcement");
}

/// A peer that opens a stream and never sends its request does not hold
/// the serving task: the node gives up on it after 10 s and ends the
/// stream, and keeps serving others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_never_sends_its_request_is_ended_by_the_server() {
    let f = start().await;
    let identity = Identity::load(&f.certs, "node").expect("identity");
    let ep = tls::endpoint(local(), None).expect("endpoint");
    let conn = ep
        .connect_with(identity.client_config(ALPN_PEER).expect("cfg"), f.addr, tls::Role::Node.server_name())
        .expect("connect")
        .await
        .expect("handshake");
    let (mut send, mut recv) = conn.open_bi().await.expect("stream");
    // Opening a stream is only seen by the server once something is sent
    // on it: send one byte of the 4-byte frame length, then go quiet.
    send.write_all(&[0]).await.expect("one byte");
    let started = std::time::Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(30), recv.read_to_end(1 << 16)).await;
    assert!(ended.is_ok(), "the server still holds the stream after 30 s");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(9) && waited < Duration::from_secs(20), "ended after {waited:?}");
    link(&f, "node").fetch(f.addr, 0, f.version, f.shard, &f.expected, Duration::from_secs(10)).await.expect("fetch");
}

/// Two nodes whose placements disagree (each believes the other owns a
/// shard) and whose trainers ask for it at once: each node's load asks the
/// other, whose server would join its own forwarding load, a cycle that
/// lasted the whole fetch deadline. A peer's request that meets a
/// forwarding load is now answered at once ("placement disagrees"), each
/// node waits briefly for placement and reads the shard itself. (A load
/// asking a third node, such as a dead owner, is still joined.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_disagree_about_an_owner_do_not_wait_on_each_other() {
    let f = start().await;
    let cfg = NodeConfig { prefetch_bytes: 0, ..f.node_config() };
    let node2 = Node::start(&cfg).await.expect("node 2");
    // Each node serves peers and dials them from one endpoint, as a node
    // does, so a request's source address is the requester's peer address.
    let identity = Identity::load(&f.certs, "node").expect("identity");
    let mut endpoints = Vec::new();
    for node in [&f.node, &node2] {
        let ep =
            tls::server_endpoint(&identity, local(), identity.server_config(&[ALPN_PEER]).expect("cfg")).expect("ep");
        tokio::spawn(serve(node.clone(), ep.clone(), shared_cert()));
        endpoints.push(ep);
    }
    let addr = |i: usize| endpoints[i].local_addr().expect("addr");
    let addrs: std::collections::HashMap<_, _> = [(NodeId(1), addr(0)), (NodeId(2), addr(1))].into_iter().collect();
    for (i, (node, me, other)) in [(&f.node, 1, 2), (&node2, 2, 1)].into_iter().enumerate() {
        let link = PeerLink::new(endpoints[i].clone(), &identity, &shared_cert()).expect("link");
        let fabric = FabricConfig {
            fetch_deadline: Duration::from_secs(10),
            reroute_wait: Duration::from_millis(200),
            ..FabricConfig::default()
        };
        let cluster = Cluster::new(NodeId(me), link, fabric);
        let owners = std::iter::once((f.version, std::iter::once((f.shard, NodeId(other))).collect())).collect();
        cluster.apply_placement(1, addrs.clone(), owners);
        assert!(node.join_cluster(std::sync::Arc::new(cluster)));
    }
    let started = std::time::Instant::now();
    let (a, b) = tokio::join!(f.node.chunk(f.version, f.shard), node2.chunk(f.version, f.shard));
    let (a, b) = (a.expect("node 1"), b.expect("node 2"));
    assert_eq!(a.bytes(), b.bytes());
    assert!(started.elapsed() < Duration::from_secs(5), "no wait for the fetch deadline: {:?}", started.elapsed());
}

/// Bytes a peer sends after the chunk's announced length (in the same
/// write as its last bytes) are not part of the chunk: the chunk is taken,
/// whole and valid, and the rest left unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_past_the_announced_chunk_are_not_taken() {
    let f = start().await;
    let bytes = std::sync::Arc::new(f.node.chunk(f.version, f.shard).await.expect("chunk").bytes().to_vec());
    let chatty = fake_peer(&f, move |_, mut send| {
        let bytes = bytes.clone();
        async move {
            let _ = send.write_all(&[chunk_head(bytes.len() as u64), bytes.to_vec(), vec![0xAB; 5000]].concat()).await;
            let _ = send.finish();
            let _ = send.stopped().await;
        }
    });
    let chunk = link(&f, "node")
        .fetch(chatty, 0, f.version, f.shard, &f.expected, Duration::from_secs(10))
        .await
        .expect("the chunk");
    let local = f.node.chunk(f.version, f.shard).await.expect("local");
    assert_eq!(chunk.bytes(), local.bytes());
}

/// Issue 45: by default a node serves only peers whose node certificate
/// is bound to a node id (the cap per identity counts ids); an unbound
/// one is closed with the reason. `allow_unbound_peers` serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_a_certificate_bound_to_no_node_id_is_not_served_by_default() {
    let f = start().await;
    let identity = Identity::load(&f.certs, "node").expect("identity");
    let ep = tls::server_endpoint(&identity, local(), identity.server_config(&[ALPN_PEER]).expect("cfg")).expect("ep");
    let strict = ep.local_addr().expect("addr");
    tokio::spawn(serve(f.node.clone(), ep, FabricConfig::default()));
    assert!(
        link(&f, "node").fetch(strict, 0, f.version, f.shard, &f.expected, Duration::from_secs(10)).await.is_err(),
        "an unbound peer was served"
    );
    // The connection is closed with the reason.
    let conn = tls::endpoint(local(), None)
        .expect("endpoint")
        .connect_with(identity.client_config(ALPN_PEER).expect("cfg"), strict, Role::Node.server_name())
        .expect("connect")
        .await
        .expect("handshake");
    match tokio::time::timeout(Duration::from_secs(5), conn.closed()).await {
        Ok(quinn::ConnectionError::ApplicationClosed(c)) => {
            assert!(String::from_utf8_lossy(&c.reason).contains("bound to no node id"), "{c:?}");
        }
        other => panic!("an unbound peer's connection was kept: {other:?}"),
    }
    tls::issue_bound(&f.certs, Role::Node, "node-9", Some(9)).expect("issue");
    let bound = Identity::load(&f.certs, "node-9").expect("identity");
    let link = PeerLink::new(tls::endpoint(local(), None).expect("endpoint"), &bound, &shared_cert()).expect("link");
    link.fetch(strict, 0, f.version, f.shard, &f.expected, Duration::from_secs(10))
        .await
        .expect("a bound peer is served");
}

/// Issue 45: a node's peer endpoint holds at most
/// `MAX_PEER_CONNECTIONS_PER_NODE` connections of one node identity: one
/// more is closed at once with the reason, and the first ones still fetch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_identity_holds_a_bounded_number_of_connections() {
    use granary_node::fabric::MAX_PEER_CONNECTIONS_PER_NODE;
    let f = start().await;
    tls::issue_bound(&f.certs, Role::Node, "node-7", Some(7)).expect("issue");
    let identity = Identity::load(&f.certs, "node-7").expect("identity");
    let mut open = Vec::new();
    for i in 0..=MAX_PEER_CONNECTIONS_PER_NODE {
        let ep = tls::endpoint(local(), None).expect("endpoint");
        let conn = ep
            .connect_with(identity.client_config(ALPN_PEER).expect("cfg"), f.addr, Role::Node.server_name())
            .expect("connect")
            .await
            .expect("handshake");
        let closed = tokio::time::timeout(Duration::from_millis(500), conn.closed()).await;
        if i < MAX_PEER_CONNECTIONS_PER_NODE {
            assert!(closed.is_err(), "connection {i} was closed: {closed:?}");
            open.push((ep, conn));
        } else {
            match closed {
                Ok(quinn::ConnectionError::ApplicationClosed(c)) => {
                    assert_eq!(c.error_code, 3u32.into());
                    assert!(String::from_utf8_lossy(&c.reason).contains("too many connections"), "{c:?}");
                }
                other => panic!("connection {i} of one identity was kept: {other:?}"),
            }
        }
    }
    // The ones kept are served.
    let link = PeerLink::new(open.pop().expect("one").0, &identity, &shared_cert()).expect("link");
    drop(open);
    link.fetch(f.addr, 0, f.version, f.shard, &f.expected, Duration::from_secs(10)).await.expect("served");
}
