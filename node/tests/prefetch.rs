//! Prefetch along a rank's plan: this epoch's shards, then the new shards of
//! the next epochs, within the byte budget.

use granary_node::EmbeddedNode;
use granary_node::PREFETCH_EPOCHS_AHEAD;
use granary_node::config::{DatasetConfig, NodeConfig, ViewRef};
use granary_proto::{PlanParams, Shuffle, plan_rank};
use granary_testkit::datagen::{self, GenSpec};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

fn start(dir: &std::path::Path, prefetch_bytes: u64) -> EmbeddedNode {
    let spec = GenSpec {
        seed: 3,
        rows: 4_000,
        files: 2,
        row_group_rows: 250,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    datagen::generate(dir, &spec, |_| {}).expect("generate");
    let cfg = NodeConfig {
        datasets: vec![DatasetConfig {
            name: "ads".into(),
            source: format!("file://{}", dir.display()),
            view: ViewRef::Inline(datagen::view()),
        }],
        ram_bytes: 256 << 20,
        prefetch_bytes,
        ..NodeConfig::default()
    };
    EmbeddedNode::start(&cfg, 2).expect("node")
}

fn params(epoch: u64) -> PlanParams {
    PlanParams {
        seed: 9,
        epoch,
        world_size: 4,
        rank: 1,
        batch_size: 100,
        shuffle: Shuffle::Windowed { window_shards: 2 },
        drop_last: false,
    }
}

fn wait_conversions(node: &EmbeddedNode, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.node().stats().conversions < n {
        assert!(Instant::now() < deadline, "only {:?} after 30 s", node.node().stats());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn prefetch_reaches_into_the_next_epochs_within_the_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(dir.path(), 1 << 30);
    let info = node.node().describe("ads", None).expect("describe");
    let shards = node.node().dataset(info.version).expect("dataset").manifest.shards();
    // The shards rank 1 of 4 uses in epochs 0..=AHEAD: a quarter per epoch.
    let mut expected = BTreeSet::new();
    for e in 0..=PREFETCH_EPOCHS_AHEAD {
        let plan = plan_rank(info.plan_key, &shards, &params(e)).expect("plan");
        expected.extend(plan.shard_order().iter().map(|&i| shards[i as usize].shard));
    }
    let epoch0 = plan_rank(info.plan_key, &shards, &params(0)).expect("plan").shard_order().len();
    assert!(expected.len() > epoch0, "later epochs use other shards");
    let _follower = node
        .block_on(async {
            node.node().follow(info.version, &granary_proto::Walk::Rank { params: params(0), start: 0 })
        })
        .expect("follow");
    wait_conversions(&node, expected.len() as u64);
    std::thread::sleep(Duration::from_millis(200));
    let stats = node.node().stats();
    assert_eq!(stats.prefetched, expected.len() as u64, "{stats:?}");
    assert_eq!(stats.conversions, expected.len() as u64, "nothing beyond those epochs: {stats:?}");
}

#[test]
fn a_budget_of_one_chunk_prefetches_only_the_next_shard() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = start(dir.path(), 1);
    let info = node.node().describe("ads", None).expect("describe");
    let _follower = node
        .block_on(async {
            node.node().follow(info.version, &granary_proto::Walk::Rank { params: params(0), start: 0 })
        })
        .expect("follow");
    wait_conversions(&node, 1);
    std::thread::sleep(Duration::from_millis(300));
    let stats = node.node().stats();
    assert_eq!((stats.prefetched, stats.conversions), (1, 1), "{stats:?}");
}
