//! An `http://` source: object_store's HTTP store, which lists a folder
//! with WebDAV `PROPFIND` and reads with ranged `GET`s, against a read-only
//! WebDAV file server on loopback (in this test's process). Every tensor of
//! every shard must equal what the same files give from `file://`.

mod sources;
mod webdav;

use granary_node::Node;
use granary_node::datagen::{self, GenSpec};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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
    let refused =
        Node::start(&sources::node_config(url.clone(), BTreeMap::new())).await.err().expect("http needs allow_http");
    let message = refused.to_string();
    assert!(message.contains(&url) && message.contains("allow_http"), "{message}");

    let remote = BTreeMap::from([("allow_http".to_string(), "true".to_string())]);
    let http = Node::start(&sources::node_config(url, remote)).await.expect("http:// node");
    let disk =
        Node::start(&sources::node_config(format!("file://{}", data.display()), BTreeMap::new())).await.expect("node");
    let a = sources::assert_same_tensors(&http, &disk).await;
    assert_eq!(a.files.len(), 2);
    let stats = http.stats();
    assert_eq!(stats.conversions, a.shards.len() as u64, "{stats:?}");
    // Each row group once, plus each footer read as the file's last 64 KiB.
    let bound = generated.bytes + 2 * (64 << 10);
    assert!(stats.remote_bytes > 0 && stats.remote_bytes <= bound, "{stats:?} vs {} bytes", generated.bytes);
    assert!(requests.load(Ordering::Relaxed) > a.shards.len() as u64, "every read went to the server");
}
