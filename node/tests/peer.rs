//! The peer endpoint in process, over real QUIC with the cluster's
//! certificates: a node fetches and validates a chunk; a non-node
//! certificate, a malformed frame, a corrupt chunk, a stalled, truncated or
//! dying peer are refused with a clear error and the endpoint keeps serving.
//! When ownership moves: `ownership.rs`; footers: `peer_footer.rs`;
//! verification of what peers send: `verify.rs`.

use granary_net::tls::{self, ALPN_PEER, Identity, Role};
use granary_node::Node;
use granary_node::config::NodeConfig;
use granary_node::fabric::{Cluster, Corruption, FabricConfig, LinkFault, PeerError, PeerLink, serve};
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
    tokio::spawn(serve(f.node.clone(), ep, FabricConfig::default()));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stalls_mid_chunk_runs_into_the_deadline() {
    let f = start().await;
    // Announce a chunk, send half a kilobyte of it, then go quiet with the
    // stream open.
    let len = f.len;
    let stall_addr = fake_peer(&f, move |_, mut send| async move {
        let _ = send.write_all(&chunk_head(len)).await;
        let _ = send.write_all(&[0u8; 512]).await;
        tokio::time::sleep(Duration::from_secs(3600)).await;
    });
    let started = std::time::Instant::now();
    match link(&f, "node").fetch(stall_addr, 0, f.version, f.shard, &f.expected, Duration::from_millis(500)).await {
        Err(PeerError::Timeout { addr, shard, .. }) => assert_eq!((addr, shard), (stall_addr, f.shard)),
        other => panic!("a stalled transfer returned {:?}", other.map(|b| b.len())),
    }
    assert!(started.elapsed() < Duration::from_secs(5), "the deadline bounds the fetch");
    // The honest peer still serves through the same link.
    link(&f, "node").fetch(f.addr, 0, f.version, f.shard, &f.expected, Duration::from_secs(10)).await.expect("fetch");
}

/// A peer that dies mid-transfer (its connection closes after part of a
/// chunk) or truncates its response frame: the fetch fails at once with an
/// error naming the peer and the shard, well before the deadline, and the
/// link keeps working with other peers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_dies_mid_chunk_or_truncates_a_frame_fails_the_fetch_at_once() {
    let f = start().await;
    let len = f.len;
    for truncate_header in [false, true] {
        let bad_addr = fake_peer(&f, move |conn, mut send| async move {
            let head = chunk_head(len);
            if truncate_header {
                // Part of the response frame, then the stream ends.
                let _ = send.write_all(&head[..head.len() / 2]).await;
                let _ = send.finish();
                let _ = send.stopped().await;
            } else {
                // Part of the chunk, then the process "dies".
                let _ = send.write_all(&head).await;
                let _ = send.write_all(&[0u8; 4096]).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                conn.close(0u32.into(), b"gone");
            }
        });
        let started = std::time::Instant::now();
        match link(&f, "node").fetch(bad_addr, 0, f.version, f.shard, &f.expected, Duration::from_secs(20)).await {
            Err(PeerError::Transfer { addr, shard, fault }) => {
                assert_eq!((addr, shard), (bad_addr, f.shard), "{fault}");
                // The header cut short ends the stream; the dead process
                // closes the connection under the read.
                if truncate_header {
                    assert!(matches!(fault, LinkFault::Ended { what: "response header", .. }), "{fault}");
                } else {
                    assert!(
                        matches!(fault, LinkFault::Read { what: "chunk bytes", .. } | LinkFault::Ended { .. }),
                        "{fault}"
                    );
                }
            }
            other => panic!("truncate_header={truncate_header}: {:?}", other.map(|b| b.len())),
        }
        assert!(started.elapsed() < Duration::from_secs(5), "failed at once, not at the deadline");
    }
    link(&f, "node").fetch(f.addr, 0, f.version, f.shard, &f.expected, Duration::from_secs(10)).await.expect("fetch");
}

/// The owner cannot be reached, the placement does not move the shard, and
/// remote storage fails too: the trainer's error names the shard, the peer
/// tried and the file, and comes within the fetch deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_no_source_delivers_the_error_names_the_shard_and_the_sources_tried() {
    let f = start().await;
    let dead = std::net::UdpSocket::bind(local()).expect("bind").local_addr().expect("addr");
    let fabric = FabricConfig {
        fetch_deadline: Duration::from_secs(2),
        reroute_wait: Duration::from_millis(200),
        ..FabricConfig::default()
    };
    let cluster = Cluster::new(NodeId(1), link(&f, "node"), fabric);
    let owners = std::iter::once((f.version, std::iter::once((f.shard, NodeId(9))).collect())).collect();
    cluster.apply_placement(1, std::iter::once((NodeId(9), dead)).collect(), owners);
    assert!(f.node.join_cluster(std::sync::Arc::new(cluster)));
    // The shard's file disappears from remote storage.
    let file = f.node.dataset(f.version).expect("dataset").files[f.shard.file as usize].path.to_string();
    let data = f._tmp.path().join("data");
    for e in std::fs::read_dir(&data).expect("data") {
        std::fs::remove_file(e.expect("entry").path()).expect("remove");
    }
    let started = std::time::Instant::now();
    let err = f.node.chunk(f.version, f.shard).await.expect_err("no source can deliver");
    let msg = err.to_string();
    assert!(msg.contains(&f.shard.to_string()), "names the shard: {msg}");
    assert!(msg.contains(&dead.to_string()), "names the peer tried: {msg}");
    assert!(msg.contains(&file), "names the file: {msg}");
    assert!(started.elapsed() < Duration::from_secs(5), "within the deadline: {:?}", started.elapsed());
}

/// Node 2: the fixture's dataset with a guest area of `guest_bytes` and a
/// large prefetch budget, in a cluster where node 1 owns every shard.
async fn guest_node(f: &Fixture, guest_bytes: u64) -> Node {
    let cfg = NodeConfig { guest_bytes: Some(guest_bytes), prefetch_bytes: 1 << 30, ..f.node_config() };
    let node2 = Node::start(&cfg).await.expect("node 2");
    let shards = f.node.dataset(f.version).expect("dataset").manifest.shards();
    let cluster = Cluster::new(NodeId(2), link(f, "node"), FabricConfig::default());
    let owners = std::iter::once((f.version, shards.iter().map(|s| (s.shard, NodeId(1))).collect())).collect();
    cluster.apply_placement(1, std::iter::once((NodeId(1), f.addr)).collect(), owners);
    assert!(node2.join_cluster(std::sync::Arc::new(cluster)));
    node2
}

/// Prefetch along a rank's plan fetches the current epoch's shards from
/// their owner, and later epochs' only while this rank's guest copies fit
/// the guest area: looking ahead never evicts what the epoch needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_looks_ahead_only_while_guest_copies_fit() {
    use granary_proto::{PlanParams, Shuffle, plan_rank};
    let f = start_with(4_000, 250).await;
    let shards = f.node.dataset(f.version).expect("dataset").manifest.shards();
    let chunk = f.node.dataset(f.version).expect("dataset").chunk_len(shards[0].shard).expect("len") as u64;
    let params = PlanParams {
        seed: 2,
        epoch: 0,
        world_size: 4,
        rank: 0,
        batch_size: 50,
        shuffle: Shuffle::Windowed { window_shards: 2 },
        drop_last: false,
    };
    let epoch0 = plan_rank(f.node.dataset(f.version).expect("dataset").plan_key, &shards, &params)
        .expect("plan")
        .shard_order()
        .len() as u64;
    let mut ahead = std::collections::BTreeSet::new();
    for e in 0..=granary_node::PREFETCH_EPOCHS_AHEAD {
        let p = PlanParams { epoch: e, ..params };
        ahead.extend(
            plan_rank(f.node.dataset(f.version).expect("dataset").plan_key, &shards, &p)
                .expect("plan")
                .shard_order()
                .iter()
                .copied(),
        );
    }
    assert!(ahead.len() as u64 > epoch0 + 1, "later epochs bring new shards");
    for (guest_chunks, want) in [(epoch0 + 1, epoch0 + 1), (64, ahead.len() as u64)] {
        let node2 = guest_node(&f, guest_chunks * chunk).await;
        let _follower = node2.follow(f.version, &params).expect("follow");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while node2.stats().peer_fetched < want {
            assert!(std::time::Instant::now() < deadline, "{:?}", node2.stats());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let s = node2.stats();
        assert_eq!(s.peer_fetched, want, "guest area of {guest_chunks} chunks: {s:?}");
        assert_eq!(s.conversions, 0, "{s:?}");
    }
}

/// Copies fetched ahead for later epochs give way first: a second rank's
/// epoch filling a full guest area evicts the first rank's look-ahead
/// copies, never the copies either epoch in progress needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn look_ahead_copies_give_way_to_the_epochs_in_progress() {
    use granary_proto::{PlanParams, Shuffle, plan_rank};
    let f = start_with(4_000, 250).await;
    let shards = f.node.dataset(f.version).expect("dataset").manifest.shards();
    let chunk = f.node.dataset(f.version).expect("dataset").chunk_len(shards[0].shard).expect("len") as u64;
    let params = |rank| PlanParams {
        seed: 2,
        epoch: 0,
        world_size: 4,
        rank,
        batch_size: 50,
        shuffle: Shuffle::Windowed { window_shards: 2 },
        drop_last: false,
    };
    let current: Vec<Vec<ShardId>> = (0..2)
        .map(|r| {
            let plan =
                plan_rank(f.node.dataset(f.version).expect("dataset").plan_key, &shards, &params(r)).expect("plan");
            plan.shard_order().iter().map(|&i| shards[i as usize].shard).collect()
        })
        .collect();
    let both = (current[0].len() + current[1].len()) as u64;
    let node2 = guest_node(&f, (both + 2) * chunk).await;
    // Settled: every load started has ended, and nothing moved for 300 ms.
    let settle = || async {
        let (mut last, mut same) = (u64::MAX, 0);
        for _ in 0..400 {
            let s = node2.stats();
            let done = s.peer_fetched + s.peer_failures >= s.misses;
            same = if s.peer_fetched == last && done { same + 1 } else { 0 };
            if same == 6 {
                return s.peer_fetched;
            }
            last = s.peer_fetched;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("prefetch did not settle: {:?}", node2.stats());
    };
    // Rank 0 alone fills the whole area: its epoch, then later epochs'.
    let _rank0 = node2.follow(f.version, &params(0)).expect("follow");
    let fetched = settle().await;
    assert!(fetched > current[0].len() as u64, "rank 0 looked ahead: {:?}", node2.stats());
    // Rank 1's epoch then needs room.
    let _rank1 = node2.follow(f.version, &params(1)).expect("follow");
    let fetched = settle().await;
    for s in current.iter().flatten() {
        node2.chunk(f.version, *s).await.expect("chunk");
    }
    let s = node2.stats();
    assert_eq!(s.peer_fetched, fetched, "every shard of both epochs in progress was still held: {s:?}");
}

/// A load started for a later epoch that a current request joins while it
/// is in flight keeps a regular guest copy, not a low-priority one: a later
/// look-ahead copy gives way before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_ahead_load_joined_by_a_current_request_keeps_a_regular_copy() {
    let f = start_with(2_000, 250).await;
    let shards: Vec<ShardId> =
        f.node.dataset(f.version).expect("dataset").manifest.shards().iter().map(|s| s.shard).collect();
    let chunk = f.node.dataset(f.version).expect("dataset").chunk_len(shards[0]).expect("len") as u64;
    assert!(shards.iter().all(|s| f.node.dataset(f.version).expect("ds").chunk_len(*s) == Some(chunk as usize)));
    let node2 = guest_node(&f, 2 * chunk).await;
    let (a, later, b) = (shards[0], shards[1], shards[2]);
    // Polled in turn in one task: the look-ahead load of `a` is in flight
    // (a peer round trip) when the current request for it arrives.
    let (x, y) = futures::join!(node2.chunk_ahead(f.version, a), node2.chunk(f.version, a));
    x.expect("ahead");
    y.expect("now");
    assert_eq!(node2.stats().joined, 1, "the current request joined the load: {:?}", node2.stats());
    node2.chunk_ahead(f.version, later).await.expect("later");
    // Room for `b` is taken from the look-ahead copy, not from `a`.
    node2.chunk(f.version, b).await.expect("b");
    let before = node2.stats();
    node2.chunk(f.version, a).await.expect("a again");
    let after = node2.stats();
    assert_eq!(after.peer_fetched, before.peer_fetched, "a was still held: {after:?}");
    assert_eq!(after.guest_hits, before.guest_hits + 1);
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
        tokio::spawn(serve(node.clone(), ep.clone(), FabricConfig::default()));
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

/// An owner that accepts a request and then sends nothing, before its
/// answer or in the middle of the chunk, is given up on after
/// `PEER_STALL_TIMEOUT` of silence (not at the fetch deadline), with an
/// error naming the peer, the shard and where the stream stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_goes_quiet_is_given_up_on_long_before_the_deadline() {
    use granary_proto::peer::PEER_STALL_TIMEOUT;
    let f = start().await;
    let len = f.len;
    let silent = fake_peer(&f, |_, send| async move {
        // Holds the stream open (dropping it would finish it) and says nothing.
        let _open = send;
        tokio::time::sleep(Duration::from_secs(3600)).await;
    });
    let mid_chunk = fake_peer(&f, move |_, mut send| async move {
        let _ = send.write_all(&chunk_head(len)).await;
        let _ = send.write_all(&[0u8; 512]).await;
        tokio::time::sleep(Duration::from_secs(3600)).await;
    });
    let started = std::time::Instant::now();
    let l = link(&f, "node");
    let deadline = Duration::from_secs(60);
    let (a, b) = tokio::join!(
        l.fetch(silent, 0, f.version, f.shard, &f.expected, deadline),
        l.fetch(mid_chunk, 0, f.version, f.shard, &f.expected, deadline)
    );
    let mid = format!("chunk bytes: nothing came after 512 of {len} bytes");
    for (result, addr, during) in
        [(a, silent, "response header: nothing came after 0 of 4 bytes"), (b, mid_chunk, &*mid)]
    {
        match result {
            Err(e @ PeerError::Stalled { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(&addr.to_string()) && msg.contains(&f.shard.to_string()), "{msg}");
                assert!(msg.contains(during), "{msg}");
            }
            other => panic!("a quiet peer gave {:?}", other.map(|c| c.len())),
        }
    }
    let took = started.elapsed();
    assert!(took >= PEER_STALL_TIMEOUT && took < PEER_STALL_TIMEOUT + Duration::from_secs(3), "{took:?}");
    // The link still fetches from the honest owner.
    l.fetch(f.addr, 0, f.version, f.shard, &f.expected, Duration::from_secs(10)).await.expect("fetch");
}

/// A UDP relay on loopback in front of `to` that forwards datagrams both
/// ways until `cut` is set, and then drops everything: a host that
/// vanished (no close, no reset, nothing).
struct Relay {
    addr: SocketAddr,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

async fn relay(to: SocketAddr) -> Relay {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::net::UdpSocket;
    let front = std::sync::Arc::new(UdpSocket::bind(local()).await.expect("front"));
    let back = std::sync::Arc::new(UdpSocket::bind(local()).await.expect("back"));
    back.connect(to).await.expect("connect");
    let addr = front.local_addr().expect("addr");
    let cut = std::sync::Arc::new(AtomicBool::new(false));
    let client = std::sync::Arc::new(std::sync::Mutex::new(None::<SocketAddr>));
    let (f, b, c, k) = (front.clone(), back.clone(), cut.clone(), client.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 1 << 16];
        while let Ok((n, from)) = f.recv_from(&mut buf).await {
            *k.lock().expect("lock") = Some(from);
            if !c.load(Ordering::Relaxed) {
                let _ = b.send(&buf[..n]).await;
            }
        }
    });
    let c = cut.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(n) = back.recv(&mut buf).await {
            let to = *client.lock().expect("lock");
            if let Some(to) = to
                && !c.load(Ordering::Relaxed)
            {
                let _ = front.send_to(&buf[..n], to).await;
            }
        }
    });
    Relay { addr, cut }
}

/// An owner whose host vanishes mid-chunk (after it, nothing arrives at
/// all: no close, no reset) is taken for gone, not for stalled: the fetch
/// fails as a transfer failure, after which a node waits for the placement
/// to move the shard to one survivor instead of reading remote storage
/// itself (as it does for a live owner that stalls). The error names the
/// peer and the shard, and comes within a few seconds of the stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_whose_host_vanishes_mid_chunk_is_taken_for_gone_not_stalled() {
    use granary_proto::peer::PEER_STALL_TIMEOUT;
    let f = start().await;
    let len = f.len;
    let owner = fake_peer(&f, move |_, mut send| async move {
        let _ = send.write_all(&chunk_head(len)).await;
        let _ = send.write_all(&[0u8; 512]).await;
        tokio::time::sleep(Duration::from_secs(3600)).await;
    });
    let relay = relay(owner).await;
    let cut = relay.cut.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        cut.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let started = std::time::Instant::now();
    match link(&f, "node").fetch(relay.addr, 0, f.version, f.shard, &f.expected, Duration::from_secs(60)).await {
        Err(PeerError::Transfer { addr, shard, fault }) => {
            assert_eq!((addr, shard), (relay.addr, f.shard), "{fault}");
            assert!(matches!(fault, LinkFault::Gone(_)), "a cut-off owner is gone, not stalled: {fault}");
        }
        other => panic!("a vanished owner gave {:?}", other.map(|c| c.len())),
    }
    let took = started.elapsed();
    assert!(took < PEER_STALL_TIMEOUT + Duration::from_secs(4), "{took:?}");
}

/// An owner that sends a chunk slowly but steadily (eight parts, one every
/// 0.9 s: longer in all than the stall timeout, never quiet that long) is
/// not taken for stalled: the chunk arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_sending_slowly_but_steadily_is_not_taken_for_stalled() {
    use granary_proto::peer::PEER_STALL_TIMEOUT;
    let f = start().await;
    let bytes = std::sync::Arc::new(f.node.chunk(f.version, f.shard).await.expect("chunk").bytes().to_vec());
    let slow = fake_peer(&f, move |_, mut send| {
        let bytes = bytes.clone();
        async move {
            let _ = send.write_all(&chunk_head(bytes.len() as u64)).await;
            for part in bytes.chunks(bytes.len().div_ceil(8)) {
                tokio::time::sleep(Duration::from_millis(900)).await;
                let _ = send.write_all(part).await;
            }
            let _ = send.finish();
            let _ = send.stopped().await;
        }
    });
    let started = std::time::Instant::now();
    let chunk = link(&f, "node")
        .fetch(slow, 0, f.version, f.shard, &f.expected, Duration::from_secs(60))
        .await
        .expect("the slow chunk");
    assert!(started.elapsed() > PEER_STALL_TIMEOUT, "the transfer took longer than the stall timeout");
    let local = f.node.chunk(f.version, f.shard).await.expect("local");
    assert_eq!(chunk.bytes(), local.bytes());
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

/// An owner whose answer takes longer than the stall timeout (a slow
/// remote read) keeps the fetch alive with progress frames: a scripted
/// owner that says "working" for longer than the timeout, and a real node
/// whose remote storage answers each request after 6 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_owner_keeps_the_fetch_alive_with_progress_frames() {
    use granary_proto::peer::{PEER_PROGRESS_INTERVAL, PEER_STALL_TIMEOUT};
    let f = start().await;
    let bytes = std::sync::Arc::new(f.node.chunk(f.version, f.shard).await.expect("chunk").bytes().to_vec());
    let slow = fake_peer(&f, move |_, mut send| {
        let bytes = bytes.clone();
        async move {
            let started = tokio::time::Instant::now();
            while started.elapsed() < PEER_STALL_TIMEOUT + Duration::from_secs(2) {
                let _ = send.write_all(&working_frame()).await;
                tokio::time::sleep(PEER_PROGRESS_INTERVAL).await;
            }
            let _ = send.write_all(&chunk_head(bytes.len() as u64)).await;
            let _ = send.write_all(&bytes).await;
            let _ = send.finish();
        }
    });
    // A real owner with a slow remote store, serving peers.
    let cfg = NodeConfig {
        prefetch_bytes: 0,
        throttle: Some(granary_node::config::ThrottleConfig { latency_ms: 6_000, bandwidth_bytes_per_s: 1 << 30 }),
        ..f.node_config()
    };
    let owner = Node::start(&cfg).await.expect("slow owner");
    let identity = Identity::load(&f.certs, "node").expect("identity");
    let ep = tls::server_endpoint(&identity, local(), identity.server_config(&[ALPN_PEER]).expect("cfg")).expect("ep");
    let owner_addr = ep.local_addr().expect("addr");
    tokio::spawn(serve(owner.clone(), ep, FabricConfig::default()));

    let l = link(&f, "node");
    let started = std::time::Instant::now();
    let deadline = Duration::from_secs(60);
    let (a, b) = tokio::join!(
        l.fetch(slow, 0, f.version, f.shard, &f.expected, deadline),
        l.fetch(owner_addr, 0, f.version, f.shard, &f.expected, deadline)
    );
    let (a, b) = (a.expect("the scripted slow owner's chunk"), b.expect("the slow node's chunk"));
    assert_eq!(a.bytes(), b.bytes());
    assert!(started.elapsed() > PEER_STALL_TIMEOUT, "the answers took longer than the stall timeout");
    assert_eq!(owner.stats().conversions, 1);
}
