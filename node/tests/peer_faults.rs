//! A peer that fails while it is asked, over real QUIC in process: one
//! that stalls, dies mid-chunk, truncates a frame, goes quiet, or whose
//! host vanishes is given up on with an error naming it and the shard,
//! well before the fetch deadline; one that is slow but steady, or keeps
//! the fetch alive with progress frames, is not; when no source delivers,
//! the error names every source tried. The endpoint's trust and
//! validation: `peer.rs`.

use granary_net::tls::{self, ALPN_PEER, Identity};
use granary_node::Node;
use granary_node::config::NodeConfig;
use granary_node::fabric::{Cluster, FabricConfig, LinkFault, PeerError, serve};
use granary_proto::NodeId;
use std::net::SocketAddr;
use std::time::Duration;

mod common;
use common::fabric::*;

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
    tokio::spawn(serve(owner.clone(), ep, shared_cert()));

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
