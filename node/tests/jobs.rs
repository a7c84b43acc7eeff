//! Issue 32: jobs with different seeds, batch sizes, world sizes and plan
//! kinds on one dataset version share every chunk the node holds: each
//! shard is read from remote storage and converted once for all of them.

use granary_client::{Loader, LoaderConfig, PlanKind};
use granary_node::EmbeddedNode;
use granary_node::config::{DatasetConfig, NodeConfig, ViewRef};
use granary_proto::Shuffle;
use granary_testkit::datagen::{self, GenSpec};
use std::sync::Arc;

#[test]
fn two_jobs_of_different_plans_share_every_chunk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = GenSpec {
        seed: 5,
        rows: 6_000,
        files: 3,
        row_group_rows: 250,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    let report = datagen::generate(dir.path(), &spec, |_| {}).expect("generate");
    let cfg = NodeConfig {
        datasets: vec![DatasetConfig {
            name: "ads".into(),
            source: format!("file://{}", dir.path().display()),
            view: ViewRef::Inline(datagen::view()),
        }],
        ram_bytes: 512 << 20,
        prefetch_bytes: 64 << 20,
        ..NodeConfig::default()
    };
    let node = Arc::new(EmbeddedNode::start(&cfg, 2).expect("node"));
    // Job A: the rank plan, 2 ranks, batches of 100, windows of 2 shards.
    // Job B: the global plan, 3 ranks, global batches of 300 over 3
    // partitions, blocks; another seed.
    let a = |rank| LoaderConfig {
        seed: 1,
        rank,
        world_size: 2,
        shuffle: Shuffle::Windowed { window_shards: 2 },
        ..LoaderConfig::new("ads", 100)
    };
    let b = |rank| LoaderConfig {
        seed: 2,
        shuffle: Shuffle::Blocks { window_batches: 4 },
        ..LoaderConfig::global("ads", 300, 3, 3, rank)
    };
    let jobs: Vec<LoaderConfig> = vec![a(0), a(1), b(0), b(1), b(2)];
    assert!(matches!(jobs[2].plan, PlanKind::Global { .. }));
    let rows: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .into_iter()
            .map(|cfg| {
                let node = node.clone();
                s.spawn(move || {
                    let loader = Loader::new(node, cfg).expect("loader");
                    let mut rows = 0u64;
                    for epoch in 0..2 {
                        for batch in loader.epoch(epoch).expect("epoch") {
                            rows += batch.expect("batch").rows() as u64;
                        }
                    }
                    rows
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    assert_eq!(rows[..2].iter().sum::<u64>(), 2 * 6_000, "job A: every row, both epochs");
    assert_eq!(rows[2..].iter().sum::<u64>(), 2 * 6_000, "job B: every row, both epochs");
    let stats = node.node().stats();
    let shards = 6_000 / 250;
    assert_eq!(stats.conversions, shards, "each shard converted once for both jobs: {stats:?}");
    let read = stats.remote_bytes as f64 / report.bytes as f64;
    assert!(read <= 1.01, "each shard read once for both jobs: {read:.3} of the dataset ({stats:?})");
}
