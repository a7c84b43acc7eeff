//! What the tests of remote sources (`gs://`, `http://`) share: a node
//! configuration for the generated dataset, and the check that a source
//! gives the same tensors as the same files on disk.

use granary_node::Node;
use granary_node::config::{DatasetConfig, NodeConfig, ViewRef};
use granary_proto::wire::DatasetInfo;
use granary_proto::{ChunkView, chunk::Verify};
use granary_testkit::datagen;
use std::collections::BTreeMap;

/// One dataset "ads" at `source` with the generator's view, `remote`
/// options, a 64 MiB RAM tier and no prefetch.
pub(crate) fn node_config(source: String, remote: BTreeMap<String, String>) -> NodeConfig {
    NodeConfig {
        datasets: vec![DatasetConfig { name: "ads".into(), source, view: ViewRef::Inline(datagen::view()) }],
        remote,
        ram_bytes: 64 << 20,
        prefetch_bytes: 0,
        ..NodeConfig::default()
    }
}

/// Asserts that `remote` and `disk` (the same files from `file://`) list the
/// same row groups and give equal tensors for every shard; returns what
/// `remote` describes.
pub(crate) async fn assert_same_tensors(remote: &Node, disk: &Node) -> DatasetInfo {
    let (a, b) = (remote.describe("ads", None).expect("describe"), disk.describe("ads", None).expect("describe"));
    assert_eq!(a.shards, b.shards, "same row groups");
    let tensors = datagen::view().tensors.len();
    for s in &a.shards {
        let x = remote.chunk(a.version, s.shard).await.expect("remote chunk");
        let y = disk.chunk(b.version, s.shard).await.expect("disk chunk");
        let (x, y) = (
            ChunkView::parse(x.bytes(), Verify::Full).expect("valid"),
            ChunkView::parse(y.bytes(), Verify::Full).expect("valid"),
        );
        assert_eq!(x.rows(), y.rows());
        for i in 0..tensors {
            assert_eq!(x.tensor_at(i).expect("tensor").1, y.tensor_at(i).expect("tensor").1, "{} tensor {i}", s.shard);
        }
        assert!(x.tensor_at(tensors).is_none());
    }
    a
}
