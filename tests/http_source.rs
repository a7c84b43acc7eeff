//! An `http://` source: object_store's HTTP store, which lists a folder
//! with WebDAV `PROPFIND` and reads with ranged `GET`s, against a read-only
//! WebDAV file server on loopback (in this test's process). Every tensor of
//! every shard must equal what the same files give from `file://`.

mod webdav;

use granary_node::Node;
use granary_node::config::{DatasetConfig, NodeConfig, ViewRef};
use granary_node::datagen::{self, GenSpec};
use granary_proto::{ChunkView, chunk::Verify};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

fn node_config(source: String, remote: BTreeMap<String, String>) -> NodeConfig {
    NodeConfig {
        datasets: vec![DatasetConfig { name: "ads".into(), source, view: ViewRef::Inline(datagen::view()) }],
        remote,
        ram_bytes: 64 << 20,
        prefetch_bytes: 0,
        ..NodeConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_source_gives_the_same_tensors_as_the_same_files_on_disk() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("train/ads");
    let spec = GenSpec { seed: 13, rows: 3_000, files: 2, row_group_rows: 1_000, compression: "snappy".into() };
    let generated = datagen::generate(&data, &spec, |_| {}).expect("generate");
    let requests = Arc::new(AtomicU64::new(0));
    let addr = webdav::serve_webdav(tmp.path(), requests.clone()).await;
    let url = format!("http://{addr}/train/ads/");

    // Plain HTTP must be allowed explicitly; the refusal names the source.
    let refused = Node::start(&node_config(url.clone(), BTreeMap::new())).await.err().expect("http needs allow_http");
    let message = refused.to_string();
    assert!(message.contains(&url) && message.contains("allow_http"), "{message}");

    let remote = BTreeMap::from([("allow_http".to_string(), "true".to_string())]);
    let http = Node::start(&node_config(url, remote)).await.expect("http:// node");
    let disk = Node::start(&node_config(format!("file://{}", data.display()), BTreeMap::new())).await.expect("node");
    let (a, b) = (http.describe("ads").expect("describe"), disk.describe("ads").expect("describe"));
    assert_eq!(a.files.len(), 2);
    assert_eq!(a.shards, b.shards, "same row groups");
    for s in &a.shards {
        let x = http.chunk(a.version, s.shard).await.expect("http chunk");
        let y = disk.chunk(b.version, s.shard).await.expect("disk chunk");
        let (x, y) = (
            ChunkView::parse(x.bytes(), Verify::Full).expect("valid"),
            ChunkView::parse(y.bytes(), Verify::Full).expect("valid"),
        );
        assert_eq!(x.rows(), y.rows());
        let tensors = datagen::view().tensors.len();
        for i in 0..tensors {
            assert_eq!(x.tensor_at(i).expect("tensor").1, y.tensor_at(i).expect("tensor").1, "{} tensor {i}", s.shard);
        }
        assert!(x.tensor_at(tensors).is_none());
    }
    let stats = http.stats();
    assert_eq!(stats.conversions, a.shards.len() as u64, "{stats:?}");
    // Each row group once, plus each footer read as the file's last 64 KiB.
    let bound = generated.bytes + 2 * (64 << 10);
    assert!(stats.remote_bytes > 0 && stats.remote_bytes <= bound, "{stats:?} vs {} bytes", generated.bytes);
    assert!(requests.load(Ordering::Relaxed) > a.shards.len() as u64, "every read went to the server");
}
