//! Rolling upgrades on the peer fabric (issue 42): this build speaks
//! `granary-peer/5` (chunks of format 3, naming their converter) and `/4`
//! (format 2, the build before's) and hands each peer the format its
//! version reads; a node set to `peer_protocol = 4` speaks as the build
//! before. The whole fleet halfway through an upgrade: `tests/upgrade.rs`.

use granary_net::tls::{self, ALPN_PEER_PREVIOUS, Identity};
use granary_node::fabric::{Corruption, FabricConfig, PeerError, PeerLink, serve};
use granary_proto::ChunkView;
use granary_proto::chunk::{CONVERTER_VERSION, Verify};
use std::time::Duration;

mod common;
use common::fabric::*;

fn pinned_to_4() -> FabricConfig {
    FabricConfig { peer_protocol: 4, ..shared_cert() }
}

fn link_with(f: &Fixture, config: &FabricConfig) -> PeerLink {
    let identity = Identity::load(&f.certs, "node").expect("identity");
    PeerLink::new(tls::endpoint(local(), None).expect("endpoint"), &identity, config).expect("link")
}

/// `chunk` with its format and converter, and its payload.
fn described(chunk: &[u8]) -> ((u32, Option<u16>), Vec<u8>) {
    let v = ChunkView::parse(chunk, Verify::Full).expect("a valid chunk");
    let payload = chunk[chunk.len() - v.header().payload_len as usize..].to_vec();
    ((v.format(), v.converter()), payload)
}

/// A new node hands a new peer its chunk as stored (format 3) and a peer
/// of the build before a format-2 copy: the same length and payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_peer_gets_the_chunk_format_its_protocol_reads() {
    let f = start().await;
    let own = f.node.chunk(f.version, f.shard).await.expect("the node's own chunk");
    let fetch = |link: PeerLink| {
        let expected = f.expected.clone();
        async move { link.fetch(f.addr, 0, f.version, f.shard, &expected, Duration::from_secs(10)).await }
    };
    let new = fetch(link(&f, "node")).await.expect("a new peer's fetch");
    assert_eq!(new.bytes(), own.bytes(), "format 3, as stored");
    let old = fetch(link_with(&f, &pinned_to_4())).await.expect("an old peer's fetch");
    let (own_format, own_payload) = described(own.bytes());
    assert_eq!(own_format, (3, Some(CONVERTER_VERSION)));
    assert_eq!(old.len(), own.len());
    assert_eq!(described(old.bytes()), ((2, None), own_payload));
}

/// A node set to `peer_protocol = 4` lists only `/4` and sends format 2;
/// a new node takes that (it reads both formats).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_speaking_as_the_build_before_is_read_by_a_new_one() {
    let f = start().await;
    let identity = Identity::load(&f.certs, "node").expect("identity");
    let config = pinned_to_4();
    let ep = tls::server_endpoint(&identity, local(), identity.server_config(config.peer_alpns()).expect("cfg"))
        .expect("ep");
    let old_addr = ep.local_addr().expect("addr");
    tokio::spawn(serve(f.node.clone(), ep, config));
    let got = link(&f, "node")
        .fetch(old_addr, 0, f.version, f.shard, &f.expected, Duration::from_secs(10))
        .await
        .expect("a new node reads the old one's chunk");
    let own = f.node.chunk(f.version, f.shard).await.expect("own");
    assert_eq!(described(got.bytes()), ((2, None), described(own.bytes()).1));
}

/// `granary-peer/4` carries format 2 only: a format-3 chunk on it is what
/// the build before could not read, refused as corrupt, never kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_of_format_3_on_protocol_4_is_refused() {
    let f = start().await;
    let bytes = bytes::Bytes::copy_from_slice(f.node.chunk(f.version, f.shard).await.expect("own").bytes());
    let peer = fake_peer_speaking(&f, &[ALPN_PEER_PREVIOUS], move |_, mut send| {
        let bytes = bytes.clone();
        async move {
            let _ = send.write_all(&chunk_head(bytes.len() as u64)).await;
            let _ = send.write_all(&bytes).await;
            let _ = send.finish();
        }
    });
    match link(&f, "node").fetch(peer, 0, f.version, f.shard, &f.expected, Duration::from_secs(10)).await {
        Err(PeerError::Corrupt { corruption: Corruption::Invalid(e), .. }) => {
            assert!(e.to_string().contains("format 3"), "{e}");
        }
        other => panic!("a format-3 chunk on granary-peer/4 gave {:?}", other.map(|b| b.len())),
    }
}
