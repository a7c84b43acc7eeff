//! The relay between two plain UDP sockets on loopback: delivery, address
//! mapping, partitions and duplication, each wait bounded so a hang fails.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use granary_chaos::relay::{Link, LinkFaults, PartitionWindow, ProcessId, RelayConfig, RelayHandle};
use tokio::net::UdpSocket;
use tokio::time::timeout;

const A: ProcessId = ProcessId(0);
const B: ProcessId = ProcessId(1);
const STEP: Duration = Duration::from_secs(5);

async fn socket() -> UdpSocket {
    UdpSocket::bind("127.0.0.1:0").await.expect("bind a loopback socket")
}

/// Two processes and a relay in front of them.
async fn pair(config: impl FnOnce(&mut RelayConfig)) -> (UdpSocket, UdpSocket, RelayHandle) {
    let (a, b) = (socket().await, socket().await);
    let mut cfg = RelayConfig::new(2026, [a.local_addr().expect("addr"), b.local_addr().expect("addr")]);
    config(&mut cfg);
    let relay = RelayHandle::start(cfg).await.expect("relay starts");
    (a, b, relay)
}

async fn recv(s: &UdpSocket) -> (Vec<u8>, SocketAddr) {
    let mut buf = vec![0u8; 70_000];
    let (n, from) = timeout(STEP, s.recv_from(&mut buf)).await.expect("datagram within 5 s").expect("recv");
    buf.truncate(n);
    (buf, from)
}

/// Everything that arrives until `quiet` passes with nothing new.
async fn recv_until_quiet(s: &UdpSocket, quiet: Duration) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 70_000];
    while let Ok(r) = timeout(quiet, s.recv_from(&mut buf)).await {
        let (n, _) = r.expect("recv");
        got.push(buf[..n].to_vec());
    }
    got
}

/// Sends `n` small numbered datagrams from `s` to `to`, paced so a loopback
/// socket buffer never overflows.
async fn send_numbered(s: &UdpSocket, to: SocketAddr, n: u32) {
    for i in 0..n {
        s.send_to(&i.to_be_bytes(), to).await.expect("send");
        if i % 32 == 31 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

#[tokio::test]
async fn no_faults_delivers_in_order_with_stable_addresses() {
    let (a, b, relay) = pair(|_| {}).await;
    let front_b = relay.front(B).expect("front of B");
    send_numbered(&a, front_b, 200).await;
    let mut seen_from = None;
    for i in 0u32..200 {
        let (bytes, from) = recv(&b).await;
        assert_eq!(bytes, i.to_be_bytes(), "datagram {i}");
        // B sees A at one stable back address, which is neither A nor a front.
        assert_eq!(*seen_from.get_or_insert(from), from);
        assert_ne!(from, a.local_addr().expect("addr"));
    }
    // B replies to the address it saw; A gets it from B's front.
    let back = seen_from.expect("B heard from A");
    b.send_to(b"reply", back).await.expect("send");
    let (bytes, from) = recv(&a).await;
    assert_eq!((bytes.as_slice(), from), (&b"reply"[..], front_b));
    // A datagram near the UDP maximum arrives whole.
    let big: Vec<u8> = (0..65_000u32).map(|i| i as u8).collect();
    a.send_to(&big, front_b).await.expect("send big");
    assert_eq!(recv(&b).await.0, big);
    let s = relay.stats();
    assert_eq!(s.link(Link::new(0, 1)).sent, 201);
    assert_eq!(s.link(Link::new(1, 0)).sent, 1);
    assert_eq!((s.unknown_source, s.send_errors), (0, 0));
    relay.shutdown().await;
}

#[tokio::test]
async fn partition_drops_everything_both_ways_until_healed() {
    let (a, b, relay) = pair(|_| {}).await;
    let (front_a, front_b) = (relay.front(A).expect("front"), relay.front(B).expect("front"));
    relay.partition(A, B, false).expect("known processes");
    send_numbered(&a, front_b, 50).await;
    send_numbered(&b, front_a, 50).await;
    assert!(recv_until_quiet(&b, Duration::from_millis(300)).await.is_empty());
    assert!(recv_until_quiet(&a, Duration::from_millis(50)).await.is_empty());
    let s = relay.stats();
    assert_eq!(s.link(Link::new(0, 1)).partitioned, 50);
    assert_eq!(s.link(Link::new(1, 0)).partitioned, 50);
    relay.heal();
    a.send_to(b"after", front_b).await.expect("send");
    assert_eq!(recv(&b).await.0, b"after");
    relay.shutdown().await;
}

#[tokio::test]
async fn one_way_partition_cuts_one_direction_only() {
    let (a, b, relay) = pair(|_| {}).await;
    let (front_a, front_b) = (relay.front(A).expect("front"), relay.front(B).expect("front"));
    relay.partition(A, B, true).expect("known processes");
    send_numbered(&a, front_b, 20).await;
    b.send_to(b"b to a", front_a).await.expect("send");
    assert_eq!(recv(&a).await.0, b"b to a");
    assert!(recv_until_quiet(&b, Duration::from_millis(300)).await.is_empty());
    assert_eq!(relay.stats().link(Link::new(0, 1)).partitioned, 20);
    assert_eq!(relay.stats().link(Link::new(1, 0)).partitioned, 0);
    relay.shutdown().await;
}

#[tokio::test]
async fn scheduled_window_cuts_then_heals() {
    let window = PartitionWindow { a: A, b: B, oneway: false, start: Duration::ZERO, end: Duration::from_millis(400) };
    let (a, b, relay) = pair(|c| c.partitions = vec![window]).await;
    let front_b = relay.front(B).expect("front");
    a.send_to(b"during", front_b).await.expect("send");
    assert!(recv_until_quiet(&b, Duration::from_millis(100)).await.is_empty());
    tokio::time::sleep(Duration::from_millis(400)).await;
    a.send_to(b"after", front_b).await.expect("send");
    assert_eq!(recv(&b).await.0, b"after");
    relay.shutdown().await;
}

#[tokio::test]
async fn duplication_and_drop_counts_match_what_arrives() {
    let dup = LinkFaults { duplicate: 1.0, ..LinkFaults::NONE };
    let (a, b, relay) = pair(|c| c.link_faults = BTreeMap::from([(Link::new(0, 1), dup)])).await;
    let front_b = relay.front(B).expect("front");
    send_numbered(&a, front_b, 40).await;
    let got = recv_until_quiet(&b, Duration::from_millis(300)).await;
    assert_eq!(got.len(), 80);
    let s = relay.stats().link(Link::new(0, 1));
    assert_eq!((s.received, s.duplicated, s.sent), (40, 40, 80));
    // Half loss at runtime: what arrives is what the relay says it sent.
    relay.set_link_faults(Link::new(0, 1), LinkFaults::lossy(0.5)).expect("valid");
    send_numbered(&a, front_b, 200).await;
    let got = recv_until_quiet(&b, Duration::from_millis(300)).await;
    let s = relay.stats().link(Link::new(0, 1));
    assert_eq!(s.received, 240);
    assert_eq!(got.len() as u64, 200 - s.dropped);
    assert!((60..140).contains(&s.dropped), "dropped {} of 200 at p = 0.5", s.dropped);
    relay.shutdown().await;
}

#[tokio::test]
async fn strangers_and_bad_settings_are_refused() {
    let (_a, b, relay) = pair(|_| {}).await;
    let stranger = socket().await;
    stranger.send_to(b"who", relay.front(B).expect("front")).await.expect("send");
    assert!(recv_until_quiet(&b, Duration::from_millis(200)).await.is_empty());
    assert_eq!(relay.stats().unknown_source, 1);
    let err = relay.set_link_faults(Link::new(0, 7), LinkFaults::NONE).unwrap_err();
    assert!(err.to_string().contains("p0->p7 names a process"), "{err}");
    let err = relay.set_link_faults(Link::new(0, 1), LinkFaults::lossy(2.0)).unwrap_err();
    assert_eq!(err.to_string(), "faults for p0->p1: drop probability 2 is outside 0.0..=1.0");
    relay.shutdown().await;
}

#[tokio::test]
async fn bandwidth_cap_spreads_a_burst_at_the_rate() {
    use granary_chaos::relay::Bandwidth;
    let cap = Bandwidth { bytes_per_sec: 100_000, burst_bytes: 2_000, max_queue: Duration::from_secs(1) };
    let capped = LinkFaults { bandwidth: Some(cap), ..LinkFaults::NONE };
    let (a, b, relay) = pair(|c| c.link_faults = BTreeMap::from([(Link::new(0, 1), capped)])).await;
    let front_b = relay.front(B).expect("front");
    let started = tokio::time::Instant::now();
    for _ in 0..22 {
        a.send_to(&[0u8; 1000], front_b).await.expect("send");
    }
    for _ in 0..22 {
        recv(&b).await;
    }
    // 2,000 bytes go at once, the other 20,000 at 100 kB/s: 200 ms at least.
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(195), "22 kB through a 100 kB/s cap took {took:?}");
    let s = relay.stats().link(Link::new(0, 1));
    assert_eq!((s.throttled, s.throttle_dropped, s.sent), (20, 0, 22));
    relay.shutdown().await;
}

#[tokio::test]
async fn a_second_sending_address_of_a_process_is_relayed_as_that_process() {
    use granary_chaos::relay::{ProcessSpec, RelayError};
    let (a, a2, b) = (socket().await, socket().await, socket().await);
    let (a_addr, a2_addr, b_addr) =
        (a.local_addr().expect("addr"), a2.local_addr().expect("addr"), b.local_addr().expect("addr"));
    let mut cfg = RelayConfig::new(1, [a_addr, b_addr]);
    cfg.processes[0] = ProcessSpec { listen: a_addr, sends_from: vec![a2_addr] };
    let relay = RelayHandle::start(cfg.clone()).await.expect("relay starts");
    let front_b = relay.front(B).expect("front");
    a2.send_to(b"from a2", front_b).await.expect("send");
    let (bytes, back) = recv(&b).await;
    assert_eq!(bytes, b"from a2");
    b.send_to(b"to a2", back).await.expect("send");
    assert_eq!(recv(&a2).await, (b"to a2".to_vec(), front_b));
    let s = relay.stats();
    assert_eq!((s.link(Link::new(0, 1)).sent, s.link(Link::new(1, 0)).sent, s.unknown_source), (1, 1, 0));
    relay.shutdown().await;
    // One address may not belong to two processes.
    cfg.processes[1].sends_from = vec![a2_addr];
    let Err(err) = RelayHandle::start(cfg).await else { panic!("a shared address was accepted") };
    assert!(matches!(err, RelayError::DuplicateAddress { addr, .. } if addr == a2_addr), "{err}");
}

#[tokio::test]
async fn outsiders_pass_without_faults_or_cuts_when_allowed() {
    // Every known link drops everything and A-B is cut: an outsider (an
    // operator's tool on a port of the moment) still gets through both ways.
    let (a, b, relay) = pair(|c| {
        c.pass_outsiders = true;
        c.default_faults = LinkFaults::lossy(1.0);
    })
    .await;
    relay.partition(A, B, false).expect("known processes");
    let front_b = relay.front(B).expect("front");
    let tool = socket().await;
    tool.send_to(b"status?", front_b).await.expect("send");
    let (bytes, back) = recv(&b).await;
    assert_eq!(bytes, b"status?");
    b.send_to(b"leader 1", back).await.expect("send");
    assert_eq!(recv(&tool).await, (b"leader 1".to_vec(), front_b));
    // A known process is still faulted.
    a.send_to(b"lost", front_b).await.expect("send");
    assert!(recv_until_quiet(&b, Duration::from_millis(200)).await.is_empty());
    let s = relay.stats();
    assert_eq!((s.outsiders, s.unknown_source, s.link(Link::new(0, 1)).sent), (2, 0, 0));
    relay.shutdown().await;
}
