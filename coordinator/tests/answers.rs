//! Issue 29: what API requests may hold on a voter. Its own test file:
//! it measures the process's resident memory, which other tests running
//! beside it in one process would disturb.

use granary_net::api::{ApiRequest, ApiResponse};
use granary_net::client::{ClientError, ClientOptions, CoordinatorClient};
use granary_net::frame;
use granary_net::tls::{self, ALPN_API, Role};
use granary_proto::NodeId;
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::*;

/// This process's resident memory in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).expect("VmRSS");
    kib.trim().trim_end_matches(" kB").trim().parse::<u64>().expect("kB") << 10
}

/// The voter's gauge `name` from its metrics registry.
fn gauge(f: &Fixture, name: &str) -> u64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &f.coordinator.metrics_registry()).expect("encode");
    let line = text.lines().find(|l| l.starts_with(&format!("granary_coordinator_{name} "))).expect(name);
    line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).expect("value") as u64
}

/// Issue 29: clients that send 512 dataset descriptions and never read
/// the answers (a stream window of 1 KiB) pin no more than the response budget on the
/// voter, and each answer is abandoned at the write deadline; meanwhile a
/// node's heartbeat is answered at once, and one identity's requests past
/// its limit are answered "unavailable", naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_nobody_reads_hold_at_most_the_budget_until_their_deadline() {
    const BUDGET: u64 = 2 << 20;
    let tmp = tempfile::tempdir().expect("tempdir");
    let f = start_tuned(tmp, Duration::from_secs(30), false, |c| {
        c.response_budget_bytes = BUDGET;
        c.response_write_wait = Duration::from_secs(5);
    })
    .await;
    let node = f.client("node");
    let incarnation = register(&node, 1).await;
    // A large description: a dataset of 4,000 row groups registered.
    let data = f.tmp.path().join("data");
    let spec = granary_testkit::datagen::GenSpec { rows: 100_000, row_group_rows: 25, ..Default::default() };
    granary_testkit::datagen::generate(&data, &spec, |_| {}).expect("generate");
    let add = ApiRequest::AddDataset {
        name: "ads".into(),
        source: format!("file://{}/", data.display()),
        view: granary_testkit::datagen::view(),
        progress: false,
    };
    f.client("admin").call(&add).await.expect("dataset added");
    let describe = ApiRequest::DescribeDataset { name: "ads".into(), version: None };
    let (_, described) = node.call(&describe).await.expect("describe");
    let answer = frame::encode_frame(&described).expect("encode").len() as u64;
    assert!(answer > 64 << 10, "a large answer: {answer} bytes");
    // 16 identities x 32 requests (each identity's whole share), on
    // connections whose streams take 1 KiB.
    let mut tiny = tls::transport_config();
    tiny.stream_receive_window(1024u32.into()).receive_window((64u32 << 10).into());
    let tiny = Arc::new(tiny);
    let request = frame::encode_frame(&describe).expect("encode");
    let before = rss();
    let (mut unread, mut held) = (Vec::new(), Vec::new());
    for id in 1..=16u64 {
        let name = format!("node-{id}");
        tls::issue_bound(&f.certs, Role::Node, &name, Some(id)).expect("issue");
        let ep = tls::endpoint("127.0.0.1:0".parse().expect("addr"), None).expect("endpoint");
        let mut cfg = f.identity(&name).client_config(ALPN_API).expect("client config");
        cfg.transport_config(tiny.clone());
        let conn = ep
            .connect_with(cfg, f.coordinator.local_addr(), Role::Coordinator.server_name())
            .expect("connect")
            .await
            .expect("handshake");
        for _ in 0..32 {
            let (mut send, recv) = conn.open_bi().await.expect("stream");
            send.write_all(&request).await.expect("write");
            let _ = send.finish();
            unread.push(recv);
        }
        held.push((ep, conn));
    }
    // node-1 has its 32 requests in flight: a 33rd is unavailable, by name.
    let options = ClientOptions { deadline: Duration::from_secs(2), ..Default::default() };
    let node1 =
        CoordinatorClient::new(&f.identity("node-1"), vec![f.coordinator.local_addr()], options).expect("client");
    match node1.call(&describe).await {
        Err(ClientError::Unavailable { last, .. }) => {
            assert!(last.contains("32 requests of the node-1 certificate are in flight (at most 32)"), "{last}")
        }
        other => panic!("a 33rd request of node-1 was not refused: {other:?}"),
    }
    // Small answers take no budget: a heartbeat is answered at once.
    let beat = std::time::Instant::now();
    match node.call(&ApiRequest::Heartbeat { node: NodeId(1), incarnation }).await {
        Ok((_, ApiResponse::HeartbeatAccepted { .. })) => {}
        other => panic!("a heartbeat failed during the flood: {other:?}"),
    }
    assert!(beat.elapsed() < Duration::from_secs(1), "heartbeat took {:?}", beat.elapsed());
    let mut peak = (0, 0);
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        peak = (peak.0.max(gauge(&f, "response_in_flight_bytes")), peak.1.max(rss().saturating_sub(before)));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "description {answer} bytes, 512 unread: {} MiB unbounded; peak in flight {} KiB, peak RSS growth {} MiB",
        (512 * answer) >> 20,
        peak.0 >> 10,
        peak.1 >> 20
    );
    assert!(peak.0 > 0 && peak.0 <= BUDGET, "answers in flight stay within the budget: {peak:?}");
    assert!(peak.1 < (512 * answer) / 2, "RSS grew {} MiB of {} unbounded", peak.1 >> 20, (512 * answer) >> 20);
    // Every unread answer is abandoned by its deadline (or answered
    // "unavailable" after waiting for the budget): nothing stays pinned.
    let drained = std::time::Instant::now();
    while gauge(&f, "response_in_flight_bytes") > 0 || gauge(&f, "api_requests_in_flight") > 0 {
        assert!(drained.elapsed() < Duration::from_secs(30), "answers still pinned after 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, status) = f.client("admin").call(&ApiRequest::Status).await.expect("status after the flood");
    assert!(matches!(status, ApiResponse::Status(_)));
    drop((unread, held));
    f.coordinator.shutdown().await;
}
