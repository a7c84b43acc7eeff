//! Issue 15, order from content: a job's batch order is seeded from the
//! dataset's shape (file names relative to their folder, rows per row
//! group, the view) and the job's seed, not from its version, which hashes
//! the source URL and each file's store tag. The same files served from
//! `file://` and from `s3://` (s3s-fs, in this test's process) have two
//! versions but give every rank the same batches, byte for byte; before,
//! the two orders differed.

mod common;

use granary_client::{Loader, LoaderConfig};
use granary_node::EmbeddedNode;
use granary_node::config::{DatasetConfig, NodeConfig, ViewRef};
use granary_testkit::datagen::{self, GenSpec};
use std::collections::BTreeMap;
use std::sync::Arc;

fn node(source: String, remote: BTreeMap<String, String>) -> Arc<EmbeddedNode> {
    let cfg = NodeConfig {
        datasets: vec![DatasetConfig { name: "ads".into(), source, view: ViewRef::Inline(datagen::view()) }],
        remote,
        ram_bytes: 64 << 20,
        prefetch_bytes: 0,
        ..NodeConfig::default()
    };
    Arc::new(EmbeddedNode::start(&cfg, 2).expect("node"))
}

/// Every tensor byte of every batch of `rank`'s epochs 0 and 1, hashed per
/// batch.
fn batches(node: &Arc<EmbeddedNode>, rank: u32) -> Vec<u64> {
    let cfg = LoaderConfig { seed: 11, rank, world_size: 2, ..LoaderConfig::new("ads", 300) };
    let loader = Loader::new(node.clone(), cfg).expect("loader");
    let mut out = Vec::new();
    for epoch in 0..2 {
        for b in loader.epoch(epoch).expect("epoch") {
            let b = b.expect("batch");
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            for i in 0..b.layouts().len() {
                h.update(b.tensor_bytes(i));
            }
            out.push(h.digest());
        }
    }
    out
}

#[test]
fn the_same_files_from_file_and_s3_give_every_rank_the_same_batches() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("train/ads");
    let spec = GenSpec {
        seed: 4,
        rows: 6_000,
        files: 3,
        row_group_rows: 500,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    datagen::generate(&data, &spec, |_| {}).expect("generate");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let addr = rt.block_on(common::serve_object_store(tmp.path(), Some(("AKTEST", "SKTEST"))));
    let remote = common::s3_options(addr);
    let disk = node(format!("file://{}", data.display()), BTreeMap::new());
    let s3 = node("s3://train/ads/".into(), remote);
    let (a, b) =
        (disk.node().describe("ads", None).expect("describe"), s3.node().describe("ads", None).expect("describe"));
    assert_ne!(a.version, b.version, "two sources, two versions");
    assert_eq!(a.plan_key, b.plan_key, "one shape, one plan key");
    for rank in 0..2 {
        let (x, y) = (batches(&disk, rank), batches(&s3, rank));
        assert!(!x.is_empty());
        assert_eq!(x, y, "rank {rank}: the same batches from either source");
    }
}
