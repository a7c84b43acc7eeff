//! The peer fabric's fixture (`peer.rs`, `ownership.rs`, `peer_footer.rs`, `verify.rs`): node 1 serving a
//! generated dataset to peers over real QUIC with the cluster's
//! certificates, a second node beside it, and fake peers that answer
//! whatever a test makes them.

use granary_net::tls::{self, ALPN_PEER, Identity};
use granary_node::Node;
use granary_node::config::{DatasetConfig, NodeConfig, ViewRef};
use granary_node::fabric::{Cluster, FabricConfig, PeerLink, serve};
use granary_proto::peer::PeerResponse;
use granary_proto::wire::encode;
use granary_proto::{DatasetVersion, NodeId, ShardId};
use granary_testkit::datagen::{self, GenSpec};
use std::net::SocketAddr;
use std::time::Duration;

pub(crate) fn local() -> SocketAddr {
    "127.0.0.1:0".parse().expect("addr")
}

pub(crate) struct Fixture {
    pub(crate) _tmp: tempfile::TempDir,
    pub(crate) certs: std::path::PathBuf,
    pub(crate) addr: SocketAddr,
    pub(crate) version: DatasetVersion,
    pub(crate) shard: ShardId,
    /// The chunk's length from the manifest's layout (0 with jagged
    /// tensors).
    pub(crate) len: u64,
    /// What a peer's chunk of the shard must be: its length (with jagged
    /// tensors, its rows and tensors).
    pub(crate) expected: granary_proto::chunk::Expected,
    pub(crate) node: Node,
}

pub(crate) async fn start() -> Fixture {
    start_with(1_000, 500).await
}

/// Node 1 serving a generated dataset of `rows` rows in row groups of
/// `row_group_rows` to peers.
pub(crate) async fn start_with(rows: u64, row_group_rows: u64) -> Fixture {
    start_spec(rows, row_group_rows, false).await
}

/// [`start_with`], the dataset with list and byte columns (`jagged`) and
/// the generator's view of them: its chunks' lengths are known only once
/// converted.
pub(crate) async fn start_spec(rows: u64, row_group_rows: u64, jagged: bool) -> Fixture {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let spec =
        GenSpec { seed: 3, rows, files: 1, row_group_rows, compression: "snappy".into(), jagged, ..GenSpec::default() };
    datagen::generate(&data, &spec, |_| {}).expect("gen");
    let certs = tmp.path().join("certs");
    tls::init_cluster(&certs).expect("certs");
    let cfg = node_config_of(&data, jagged);
    let node = Node::start(&cfg).await.expect("node");
    let info = node.describe("ads", None).expect("describe");
    let identity = Identity::load(&certs, "node").expect("identity");
    let endpoint = tls::server_endpoint(&identity, local(), identity.server_config(tls::PEER_PROTOCOLS).expect("cfg"))
        .expect("ep");
    let addr = endpoint.local_addr().expect("addr");
    tokio::spawn(serve(node.clone(), endpoint, shared_cert()));
    let target = info.shards[1];
    let expected = node.dataset(info.version).expect("dataset").expected(target.shard).expect("a shard");
    let len = match &expected {
        granary_proto::chunk::Expected::Len(len) => *len,
        granary_proto::chunk::Expected::Shape { .. } => 0,
    };
    Fixture { _tmp: tmp, certs, addr, version: info.version, shard: target.shard, len, expected, node }
}

/// A node serving the generated dataset in `data` as "ads", with a 64 MiB
/// RAM tier.
pub(crate) fn node_config(data: &std::path::Path) -> NodeConfig {
    node_config_of(data, false)
}

/// [`node_config`], the view with the jagged tensors where the data has
/// them.
pub(crate) fn node_config_of(data: &std::path::Path, jagged: bool) -> NodeConfig {
    let view = toml::from_str::<granary_proto::View>(&datagen::view_toml(jagged))
        .expect("view")
        .validated()
        .expect("valid view");
    NodeConfig {
        datasets: vec![DatasetConfig {
            name: "ads".into(),
            source: format!("file://{}", data.display()),
            view: ViewRef::Inline(view),
        }],
        ram_bytes: 64 << 20,
        ..NodeConfig::default()
    }
}

impl Fixture {
    /// The configuration of another node serving the fixture's dataset.
    pub(crate) fn node_config(&self) -> NodeConfig {
        let jagged = matches!(self.expected, granary_proto::chunk::Expected::Shape { .. });
        node_config_of(&self._tmp.path().join("data"), jagged)
    }
}

/// The fabric settings of these tests' links: every node here shares the
/// `node` certificate of `certs init`, bound to no node id.
pub(crate) fn shared_cert() -> FabricConfig {
    FabricConfig { allow_unbound_peers: true, ..FabricConfig::default() }
}

pub(crate) fn link(f: &Fixture, name: &str) -> PeerLink {
    let identity = Identity::load(&f.certs, name).expect("identity");
    PeerLink::new(tls::endpoint(local(), None).expect("endpoint"), &identity, &shared_cert()).expect("link")
}

/// A peer with a node certificate that reads each request and answers it
/// with `answer(connection, stream)`.
pub(crate) fn fake_peer<F, Fut>(f: &Fixture, answer: F) -> SocketAddr
where
    F: Fn(quinn::Connection, quinn::SendStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    fake_peer_speaking(f, &[ALPN_PEER], answer)
}

/// [`fake_peer`] listing the ALPN names `alpns` (versions of the peer
/// protocol).
pub(crate) fn fake_peer_speaking<F, Fut>(f: &Fixture, alpns: &[&[u8]], answer: F) -> SocketAddr
where
    F: Fn(quinn::Connection, quinn::SendStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let identity = Identity::load(&f.certs, "node").expect("identity");
    let ep = tls::server_endpoint(&identity, local(), identity.server_config(alpns).expect("cfg")).expect("ep");
    let addr = ep.local_addr().expect("addr");
    let answer = std::sync::Arc::new(answer);
    tokio::spawn(async move {
        while let Some(incoming) = ep.accept().await {
            let Ok(conn) = incoming.await else { continue };
            let answer = answer.clone();
            tokio::spawn(async move {
                while let Ok((send, mut recv)) = conn.accept_bi().await {
                    let _ = recv.read_to_end(1 << 16).await;
                    tokio::spawn(answer(conn.clone(), send));
                }
            });
        }
    });
    addr
}

/// The response frame saying the owner is still working on the answer.
pub(crate) fn working_frame() -> Vec<u8> {
    let head = encode(&PeerResponse::Working);
    [(head.len() as u32).to_le_bytes().to_vec(), head.to_vec()].concat()
}

/// The response frame announcing a chunk of `len` bytes.
pub(crate) fn chunk_head(len: u64) -> Vec<u8> {
    let head = encode(&PeerResponse::Chunk { len });
    [(head.len() as u32).to_le_bytes().to_vec(), head.to_vec()].concat()
}

/// A second node (id 2, no prefetch) and its cluster view, whose fetch
/// deadline and reroute wait (60 s) outlast any test: a test that finishes
/// sooner shows a decision, not a timeout.
pub(crate) async fn patient_node2(f: &Fixture) -> (Node, Cluster) {
    let cfg = NodeConfig { prefetch_bytes: 0, ..f.node_config() };
    let node2 = Node::start(&cfg).await.expect("node 2");
    let fabric = FabricConfig {
        fetch_deadline: Duration::from_secs(60),
        reroute_wait: Duration::from_secs(60),
        ..FabricConfig::default()
    };
    (node2, Cluster::new(NodeId(2), link(f, "node"), fabric))
}

/// Node 2 owns the fixture's shard, handed over from node 1 (the fixture's
/// node, serving peers) by the placement.
pub(crate) fn handed_over_to_node2(f: &Fixture, cluster: &Cluster) {
    let one = |n: u64| std::iter::once((f.version, std::iter::once((f.shard, NodeId(n))).collect())).collect();
    let addrs = [(NodeId(1), f.addr), (NodeId(2), local())].into_iter().collect();
    cluster.apply_placement_with_handoffs(1, addrs, one(2), one(1));
}

/// Waits (at most 10 s) until `node` has no load in flight: a load hands
/// its chunk to the waiters first and keeps it (tier or guest area) after.
pub(crate) async fn settled(node: &Node) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while node.stats().loads_in_flight > 0 {
        assert!(std::time::Instant::now() < deadline, "loads still in flight after 10 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
