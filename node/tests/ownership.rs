//! When ownership moves or is in doubt, over real QUIC: an owner that
//! stalls is read around at once, a load on an outdated placement reads
//! for the newer asker, a new owner takes the copy the former owner holds
//! (a handoff), a node whose lease is in doubt waits for it, and requests
//! queued while a shard moved go to its new owner. Split from `peer.rs`.

use granary_net::tls::{self, ALPN_PEER, Identity};
use granary_node::Node;
use granary_node::config::NodeConfig;
use granary_node::fabric::{Cluster, FabricConfig, PeerError, serve};
use granary_proto::NodeId;
use std::time::Duration;

mod common;
use common::fabric::*;

/// A node whose owner stalls reads the shard from remote storage itself at
/// once: it does not wait for the placement to move the shard (the owner
/// is alive and keeps its lease, so it never would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_owner_stalls_reads_remote_storage_without_waiting_for_placement() {
    use granary_proto::peer::PEER_STALL_TIMEOUT;
    let f = start().await;
    let quiet = fake_peer(&f, |_, send| async move {
        // Holds the stream open (dropping it would finish it) and says nothing.
        let _open = send;
        tokio::time::sleep(Duration::from_secs(3600)).await;
    });
    let (node2, cluster) = patient_node2(&f).await;
    let owners = std::iter::once((f.version, std::iter::once((f.shard, NodeId(9))).collect())).collect();
    cluster.apply_placement(1, std::iter::once((NodeId(9), quiet)).collect(), owners);
    assert!(node2.join_cluster(std::sync::Arc::new(cluster)));
    let started = std::time::Instant::now();
    let chunk = node2.chunk(f.version, f.shard).await.expect("read here after the stall");
    let local = f.node.chunk(f.version, f.shard).await.expect("owner's copy");
    assert_eq!(chunk.bytes(), local.bytes());
    let took = started.elapsed();
    assert!(took < PEER_STALL_TIMEOUT + Duration::from_secs(3), "no wait for placement: {took:?}");
    let s = node2.stats();
    assert_eq!((s.peer_failures, s.conversions), (1, 1), "{s:?}");
}

/// A load asking a former owner on an old placement, when a peer asks for
/// the shard on a newer placement that names this node the owner, stops
/// asking and reads the shard here, and the peer gets it at once (found by
/// `granary-chaos sim`, seed 136349: such loads closed a wait cycle of
/// three nodes). The former owner here is alive and slow: it says
/// "working" every second and never answers, so without the rule the load
/// and the peer would wait for the fetch deadline (60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_on_an_outdated_placement_reads_the_shard_here_for_a_peer_on_the_newer_one() {
    let f = start().await;
    let slow = fake_peer(&f, |_, mut send| async move {
        loop {
            if send.write_all(&working_frame()).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let (node2, cluster) = patient_node2(&f).await;
    let cluster = std::sync::Arc::new(cluster);
    let owned_by = |n: u64| std::iter::once((f.version, std::iter::once((f.shard, NodeId(n))).collect())).collect();
    let addrs: std::collections::HashMap<_, _> = [(NodeId(9), slow), (NodeId(2), local())].into_iter().collect();
    cluster.apply_placement(1, addrs.clone(), owned_by(9));
    assert!(node2.join_cluster(cluster.clone()));
    let started = std::time::Instant::now();
    let trainer = {
        let node2 = node2.clone();
        let (v, s) = (f.version, f.shard);
        tokio::spawn(async move { node2.chunk(v, s).await })
    };
    // The load asks node 9; then placement 2 gives the shard to node 2.
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.apply_placement(2, addrs, owned_by(2));
    let peer = node2.chunk_for_peer(f.version, f.shard, local(), 2).await.expect("the peer's copy");
    let mine = trainer.await.expect("task").expect("the trainer's copy");
    let took = started.elapsed();
    assert_eq!(peer.bytes(), mine.bytes());
    assert!(took < Duration::from_secs(10), "no wait for the deadline: {took:?}");
    let s = node2.stats();
    assert_eq!(s.conversions, 1, "{s:?}");
}

/// A handoff: a node that a placement made the owner of a shard another
/// live node held takes that node's copy instead of reading remote storage
/// (`granary-chaos sim --scenario stop` measured the cost without it: a
/// node back from a stop read again, in warm epochs, shards the others
/// read while it was away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_owner_takes_the_copy_held_by_the_node_the_shard_was_handed_over_from() {
    let f = start().await;
    let held = f.node.chunk(f.version, f.shard).await.expect("node 1 holds the chunk");
    let (node2, cluster) = patient_node2(&f).await;
    handed_over_to_node2(&f, &cluster);
    assert!(node2.join_cluster(std::sync::Arc::new(cluster)));
    let chunk = node2.chunk(f.version, f.shard).await.expect("handed over");
    assert_eq!(chunk.bytes(), held.bytes());
    let (s1, s2) = (f.node.stats(), node2.stats());
    assert_eq!((s2.conversions, s2.peer_fetched, s2.peer_failures), (0, 1, 0), "{s2:?}");
    assert_eq!(s1.conversions, 1, "node 1 converted only its own load: {s1:?}");
    // Node 2's copy is a guest until verified (issue 29: a former owner
    // with a valid certificate could hand over wrong values): asked again,
    // a guest hit, and nothing in its own tiers.
    settled(&node2).await;
    node2.chunk(f.version, f.shard).await.expect("again");
    let s2 = node2.stats();
    assert_eq!((s2.peer_fetched, s2.guest_hits, s2.ram_hits), (1, 1, 0), "{s2:?}");
    assert!(s2.guest_bytes >= f.len, "kept as a guest copy: {s2:?}");
}

/// The node asked for a copy it does not hold says so at once and loads
/// nothing for the asker (a handoff that made the former owner convert was
/// the first try at this, taken back in 48a233e); the new owner reads the
/// shard itself, and no peer failure is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_asked_for_a_copy_it_does_not_hold_says_so_at_once_and_loads_nothing() {
    let f = start().await;
    let l = link(&f, "node");
    let started = std::time::Instant::now();
    match l.fetch_held(f.addr, f.version, f.shard, &f.expected, Duration::from_secs(60)).await {
        Err(PeerError::NotHeld { shard, .. }) => assert_eq!(shard, f.shard),
        other => panic!("expected NotHeld, got {:?}", other.map(|c| c.len())),
    }
    assert!(started.elapsed() < Duration::from_secs(1), "at once: {:?}", started.elapsed());
    let (node2, cluster) = patient_node2(&f).await;
    handed_over_to_node2(&f, &cluster);
    assert!(node2.join_cluster(std::sync::Arc::new(cluster)));
    node2.chunk(f.version, f.shard).await.expect("read here");
    let (s1, s2) = (f.node.stats(), node2.stats());
    assert_eq!(s1.conversions, 0, "node 1 loaded nothing: {s1:?}");
    assert_eq!((s2.conversions, s2.peer_fetched, s2.peer_failures), (1, 0, 0), "{s2:?}");
}

/// A node asked for a copy it is reading from remote storage right now
/// hands it over when read, keeping the ask alive with progress frames,
/// instead of saying it holds none (`granary-chaos sim --scenario stop`,
/// seed 133: the survivor was reading the shard when the node back from
/// its stop asked, and both read it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reading_the_shard_hands_it_over_when_read() {
    let f = start().await;
    // Node 1 here: a real node with a slow remote store (3 s a request),
    // serving peers.
    let cfg = NodeConfig {
        prefetch_bytes: 0,
        throttle: Some(granary_node::config::ThrottleConfig { latency_ms: 3_000, bandwidth_bytes_per_s: 1 << 30 }),
        ..f.node_config()
    };
    let slow = Node::start(&cfg).await.expect("slow node");
    let identity = Identity::load(&f.certs, "node").expect("identity");
    let ep = tls::server_endpoint(&identity, local(), identity.server_config(&[ALPN_PEER]).expect("cfg")).expect("ep");
    let slow_addr = ep.local_addr().expect("addr");
    tokio::spawn(serve(slow.clone(), ep, shared_cert()));
    let reading = {
        let slow = slow.clone();
        let (v, s) = (f.version, f.shard);
        tokio::spawn(async move { slow.chunk(v, s).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let l = link(&f, "node");
    let chunk =
        l.fetch_held(slow_addr, f.version, f.shard, &f.expected, Duration::from_secs(60)).await.expect("handed over");
    let own = reading.await.expect("task").expect("node 1's read");
    assert_eq!(chunk.bytes(), own.bytes());
    assert_eq!(slow.stats().conversions, 1, "one read for both");
}

/// A node whose lease is in doubt (here: known lost) does not read a shard
/// its placement gives it as the owner: the placement may be stale, the
/// coordinator may have moved the shard to a node that read it meanwhile
/// (`granary-chaos sim` seed 39650). It waits for its lease and the
/// placement that comes with it, then asks the owner that placement names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_lease_is_in_doubt_waits_for_it_before_reading_as_owner() {
    use granary_node::decide::LeaseView;
    let f = start().await;
    let held = f.node.chunk(f.version, f.shard).await.expect("node 1 holds the chunk");
    let (node2, cluster) = patient_node2(&f).await;
    let cluster = std::sync::Arc::new(cluster);
    let owned_by = |n: u64| std::iter::once((f.version, std::iter::once((f.shard, NodeId(n))).collect())).collect();
    let addrs: std::collections::HashMap<_, _> = [(NodeId(1), f.addr), (NodeId(2), local())].into_iter().collect();
    let lease = Duration::from_secs(3);
    // Placement 1 names node 2 the owner, but node 2 lost its lease.
    cluster.apply_placement(1, addrs.clone(), owned_by(2));
    cluster.set_lease(Some(LeaseView { renewed_at: None, lease, epoch: 1 }));
    assert!(node2.join_cluster(cluster.clone()));
    let trainer = {
        let node2 = node2.clone();
        let (v, s) = (f.version, f.shard);
        tokio::spawn(async move { node2.chunk(v, s).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!trainer.is_finished(), "it waits for the lease");
    assert_eq!(node2.stats().conversions, 0);
    // Registered again: placement 2, which gives the shard to node 1.
    cluster.set_lease(Some(LeaseView { renewed_at: Some(std::time::Instant::now()), lease, epoch: 2 }));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!trainer.is_finished(), "the placement reported with the lease is not known yet");
    cluster.apply_placement(2, addrs, owned_by(1));
    let chunk =
        tokio::time::timeout(Duration::from_secs(10), trainer).await.expect("in time").expect("task").expect("chunk");
    assert_eq!(chunk.bytes(), held.bytes());
    let s = node2.stats();
    assert_eq!((s.conversions, s.peer_fetched), (0, 1), "{s:?}");
}

/// A peer's request that waited for a load permit while the placement gave
/// its shard to another node is answered "not the owner" instead of read
/// here: the peer asks the new owner, and the shard is not read twice
/// (`granary-chaos hosts --fault stop`: a survivor read, for a peer, a
/// shard the node back from its stop had been given again, while that node
/// read it too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_request_queued_while_its_shard_moved_away_is_sent_to_the_new_owner() {
    use granary_node::error::FetchError;
    let f = start().await;
    let info = f.node.describe("ads", None).expect("describe");
    let (first, second) = (info.shards[0].shard, f.shard);
    // One load at a time, each remote read taking a second.
    let cfg = NodeConfig {
        prefetch_bytes: 0,
        max_concurrent_loads: 1,
        throttle: Some(granary_node::config::ThrottleConfig { latency_ms: 1_000, bandwidth_bytes_per_s: 1 << 30 }),
        ..f.node_config()
    };
    let node2 = Node::start(&cfg).await.expect("node 2");
    let cluster = std::sync::Arc::new(Cluster::new(NodeId(2), link(&f, "node"), FabricConfig::default()));
    let owned_by = |n: u64| {
        std::iter::once((f.version, [(first, NodeId(n)), (second, NodeId(n))].into_iter().collect())).collect()
    };
    let addrs: std::collections::HashMap<_, _> = [(NodeId(1), f.addr), (NodeId(2), local())].into_iter().collect();
    cluster.apply_placement(1, addrs.clone(), owned_by(2));
    assert!(node2.join_cluster(cluster.clone()));
    // The first shard's load holds the only permit; the peer's request
    // for the second waits for it.
    let busy = {
        let n = node2.clone();
        tokio::spawn(async move { n.chunk_for_peer(f.version, first, local(), 1).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let queued = {
        let n = node2.clone();
        tokio::spawn(async move { n.chunk_for_peer(f.version, second, local(), 1).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    cluster.apply_placement(2, addrs, owned_by(1));
    busy.await.expect("task").expect("the first shard");
    match queued.await.expect("task") {
        Err(e) => assert!(matches!(*e, FetchError::NotOwner { owner: NodeId(1), .. }), "{e}"),
        Ok(_) => panic!("read here though node 1 owns it now"),
    }
    assert_eq!(node2.stats().conversions, 1, "only the first shard was read");
}

/// Find 13 (`granary-chaos run` soak seed 4064): a node that has just
/// joined, asked for a shard before it knows the placement of its version,
/// waits a moment for the placement and fetches the shard from its owner.
/// It read the shard itself before (a node back from a kill read 17 shards
/// its peers held, for its restarted ranks' first requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_asked_before_it_knows_the_placement_waits_for_it_and_asks_the_owner() {
    let f = start().await;
    let (node2, cluster) = patient_node2(&f).await;
    let cluster = std::sync::Arc::new(cluster);
    // Joined, with a placement that does not place this version yet.
    cluster.apply_placement(1, std::iter::once((NodeId(1), f.addr)).collect(), Default::default());
    assert!(node2.join_cluster(cluster.clone()));
    let placing = {
        let (cluster, version, shard, addr) = (cluster.clone(), f.version, f.shard, f.addr);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let owners = std::iter::once((version, std::iter::once((shard, NodeId(1))).collect())).collect();
            cluster.apply_placement(2, std::iter::once((NodeId(1), addr)).collect(), owners);
        })
    };
    let chunk = node2.chunk(f.version, f.shard).await.expect("the owner's copy");
    placing.await.expect("placed");
    let local = f.node.chunk(f.version, f.shard).await.expect("owner's copy");
    assert_eq!(chunk.bytes(), local.bytes());
    let s = node2.stats();
    // (The file's footer is read here either way: it is not a shard.)
    assert_eq!((s.peer_fetched, s.conversions), (1, 0), "fetched, not read here: {s:?}");
}
