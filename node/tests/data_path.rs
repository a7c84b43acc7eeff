//! End to end in one process: generated Parquet on a `file://` source, an
//! embedded node, the client's loader; every value of every batch is
//! checked against the generator's formula.

use granary_client::{ChunkSource, Loader, LoaderConfig};
use granary_node::EmbeddedNode;
use granary_node::config::{DatasetConfig, NodeConfig, ViewRef};
use granary_proto::{Shuffle, View};
use granary_testkit::datagen::{self, GenSpec};
use std::sync::Arc;

fn view() -> View {
    datagen::view()
}

fn node_config(dir: &std::path::Path) -> NodeConfig {
    NodeConfig {
        datasets: vec![DatasetConfig {
            name: "ads".into(),
            source: format!("file://{}", dir.display()),
            view: ViewRef::Inline(view()),
        }],
        ram_bytes: 256 << 20,
        prefetch_bytes: 8 << 20,
        ..NodeConfig::default()
    }
}

#[test]
fn every_batch_value_matches_the_generator() {
    let dir = tempfile::tempdir().unwrap();
    let spec = GenSpec {
        seed: 11,
        rows: 2_500,
        files: 3,
        row_group_rows: 300,
        compression: "zstd".into(),
        ..GenSpec::default()
    };
    datagen::generate(dir.path(), &spec, |_| {}).unwrap();
    let node = Arc::new(EmbeddedNode::start(&node_config(dir.path()), 2).unwrap());
    let info = node.describe("ads", None).unwrap();
    // Global row of each shard's first row, in manifest order.
    let mut first_row = Vec::new();
    let mut acc = 0u64;
    for s in &info.shards {
        first_row.push(acc);
        acc += s.rows;
    }
    assert_eq!(acc, 2_500);
    let mut seen = vec![false; 2_500];
    for rank in 0..2u32 {
        let cfg = LoaderConfig {
            rank,
            world_size: 2,
            seed: 5,
            shuffle: Shuffle::Windowed { window_shards: 2 },
            ..LoaderConfig::new("ads", 64)
        };
        let loader = Loader::new(node.clone(), cfg).unwrap();
        let plan = loader.plan(1).unwrap();
        for (i, batch) in loader.epoch(1).unwrap().enumerate() {
            let batch = batch.unwrap();
            let dense = batch.tensor::<f32>("dense").unwrap();
            assert_eq!(dense.shape(), &[batch.rows(), 150]);
            let emb = batch.tensor::<f32>("emb").unwrap();
            let ids = batch.tensor::<i64>("ids").unwrap();
            assert_eq!(ids.shape(), &[batch.rows(), 2]);
            let label = batch.tensor::<f32>("label").unwrap();
            assert_eq!(label.shape(), &[batch.rows()]);
            for (k, r) in plan.batch(i).iter().enumerate() {
                let g = first_row[r.shard_index as usize] + u64::from(r.row);
                assert!(!seen[g as usize], "row {g} delivered twice");
                seen[g as usize] = true;
                for c in 0..150 {
                    assert_eq!(dense.data()[k * 150 + c], datagen::dense_value(11, g, c), "row {g} col {c}");
                }
                for e in 0..32 {
                    assert_eq!(emb.data()[k * 32 + e], datagen::emb_value(11, g, e));
                }
                assert_eq!(ids.data()[k * 2], datagen::user_id(11, g));
                assert_eq!(ids.data()[k * 2 + 1], datagen::item_id(11, g));
                assert_eq!(label.data()[k], datagen::label(11, g));
            }
        }
    }
    assert!(seen.iter().all(|&s| s), "every row delivered once");
    let stats = node.node().stats();
    assert_eq!(stats.conversions, info.shards.len() as u64, "each shard converted exactly once");
}

/// `granary doctor` in-process: a loader over an embedded node reports its
/// clocks to it, and two snapshots around an epoch give a verdict about
/// that rank (here it reads as fast as it can, so it waits on Granary).
#[test]
fn the_doctor_reads_an_embedded_node_and_its_loader() {
    let dir = tempfile::tempdir().unwrap();
    let spec = GenSpec { rows: 2_500, files: 2, row_group_rows: 500, ..GenSpec::default() };
    datagen::generate(dir.path(), &spec, |_| {}).unwrap();
    let node = Arc::new(EmbeddedNode::start(&node_config(dir.path()), 2).unwrap());
    let loader = Loader::new(node.clone(), LoaderConfig::new("ads", 64)).unwrap();
    let before = node.doctor_snapshot();
    let mut batches = 0u64;
    for b in loader.epoch(0).unwrap() {
        b.unwrap();
        batches += 1;
    }
    let after = node.doctor_snapshot();
    assert_eq!(loader.times().batches, batches);
    assert_eq!(after.ranks.len(), 1, "the epoch's end reported the rank's clocks");
    assert_eq!(after.ranks[0].times.batches, batches);
    assert!(after.stages.loads >= 5 && after.stages.chunk_requests >= 5, "{:?}", after.stages);
    let d = granary_proto::doctor::diagnose(&before, &after);
    assert_ne!(d.stage, granary_proto::doctor::Stage::Idle, "{d:?}");
    assert_ne!(d.stage, granary_proto::doctor::Stage::Trainer, "a loop that only reads waits on Granary: {d:?}");
    assert_eq!(d.ranks[0].rank, 0);
}
