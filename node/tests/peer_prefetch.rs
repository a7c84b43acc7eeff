//! Prefetch through peers: a node looks ahead along a rank's plan for
//! chunks its owner holds only while the guest copies fit the guest area,
//! look-ahead copies give way to the epochs in progress, and a look-ahead
//! load a current request joins keeps a regular copy.

use granary_node::Node;
use granary_node::config::NodeConfig;
use granary_node::fabric::{Cluster, FabricConfig};
use granary_proto::{NodeId, ShardId};
use std::time::Duration;

mod common;
use common::fabric::*;

/// Node 2: the fixture's dataset with a guest area of `guest_bytes` and a
/// large prefetch budget, in a cluster where node 1 owns every shard.
async fn guest_node(f: &Fixture, guest_bytes: u64) -> Node {
    let cfg = NodeConfig { guest_bytes: Some(guest_bytes), prefetch_bytes: 1 << 30, ..f.node_config() };
    let node2 = Node::start(&cfg).await.expect("node 2");
    let shards = f.node.dataset(f.version).expect("dataset").manifest.shards();
    let cluster = Cluster::new(NodeId(2), link(f, "node"), FabricConfig::default());
    let owners = std::iter::once((f.version, shards.iter().map(|s| (s.shard, NodeId(1))).collect())).collect();
    cluster.apply_placement(1, std::iter::once((NodeId(1), f.addr)).collect(), owners);
    assert!(node2.join_cluster(std::sync::Arc::new(cluster)));
    node2
}

/// Prefetch along a rank's plan fetches the current epoch's shards from
/// their owner, and later epochs' only while this rank's guest copies fit
/// the guest area: looking ahead never evicts what the epoch needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_looks_ahead_only_while_guest_copies_fit() {
    use granary_proto::{PlanParams, Shuffle, plan_rank};
    let f = start_with(4_000, 250).await;
    let shards = f.node.dataset(f.version).expect("dataset").manifest.shards();
    let chunk = f.node.dataset(f.version).expect("dataset").chunk_len(shards[0].shard).expect("len") as u64;
    let params = PlanParams {
        seed: 2,
        epoch: 0,
        world_size: 4,
        rank: 0,
        batch_size: 50,
        shuffle: Shuffle::Windowed { window_shards: 2 },
        drop_last: false,
    };
    let epoch0 = plan_rank(f.node.dataset(f.version).expect("dataset").plan_key, &shards, &params)
        .expect("plan")
        .shard_order()
        .len() as u64;
    let mut ahead = std::collections::BTreeSet::new();
    for e in 0..=granary_node::PREFETCH_EPOCHS_AHEAD {
        let p = PlanParams { epoch: e, ..params };
        ahead.extend(
            plan_rank(f.node.dataset(f.version).expect("dataset").plan_key, &shards, &p)
                .expect("plan")
                .shard_order()
                .iter()
                .copied(),
        );
    }
    assert!(ahead.len() as u64 > epoch0 + 1, "later epochs bring new shards");
    for (guest_chunks, want) in [(epoch0 + 1, epoch0 + 1), (64, ahead.len() as u64)] {
        let node2 = guest_node(&f, guest_chunks * chunk).await;
        let _follower = node2.follow(f.version, &granary_proto::Walk::Rank { params, start: 0 }).expect("follow");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while node2.stats().peer_fetched < want {
            assert!(std::time::Instant::now() < deadline, "{:?}", node2.stats());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let s = node2.stats();
        assert_eq!(s.peer_fetched, want, "guest area of {guest_chunks} chunks: {s:?}");
        assert_eq!(s.conversions, 0, "{s:?}");
    }
}

/// Copies fetched ahead for later epochs give way first: a second rank's
/// epoch filling a full guest area evicts the first rank's look-ahead
/// copies, never the copies either epoch in progress needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn look_ahead_copies_give_way_to_the_epochs_in_progress() {
    use granary_proto::{PlanParams, Shuffle, plan_rank};
    let f = start_with(4_000, 250).await;
    let shards = f.node.dataset(f.version).expect("dataset").manifest.shards();
    let chunk = f.node.dataset(f.version).expect("dataset").chunk_len(shards[0].shard).expect("len") as u64;
    let params = |rank| PlanParams {
        seed: 2,
        epoch: 0,
        world_size: 4,
        rank,
        batch_size: 50,
        shuffle: Shuffle::Windowed { window_shards: 2 },
        drop_last: false,
    };
    let current: Vec<Vec<ShardId>> = (0..2)
        .map(|r| {
            let plan =
                plan_rank(f.node.dataset(f.version).expect("dataset").plan_key, &shards, &params(r)).expect("plan");
            plan.shard_order().iter().map(|&i| shards[i as usize].shard).collect()
        })
        .collect();
    let both = (current[0].len() + current[1].len()) as u64;
    let node2 = guest_node(&f, (both + 2) * chunk).await;
    // Settled: every load started has ended, and nothing moved for 300 ms.
    let settle = || async {
        let (mut last, mut same) = (u64::MAX, 0);
        for _ in 0..400 {
            let s = node2.stats();
            let done = s.peer_fetched + s.peer_failures >= s.misses;
            same = if s.peer_fetched == last && done { same + 1 } else { 0 };
            if same == 6 {
                return s.peer_fetched;
            }
            last = s.peer_fetched;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("prefetch did not settle: {:?}", node2.stats());
    };
    // Rank 0 alone fills the whole area: its epoch, then later epochs'.
    let _rank0 = node2.follow(f.version, &granary_proto::Walk::Rank { params: params(0), start: 0 }).expect("follow");
    let fetched = settle().await;
    assert!(fetched > current[0].len() as u64, "rank 0 looked ahead: {:?}", node2.stats());
    // Rank 1's epoch then needs room.
    let _rank1 = node2.follow(f.version, &granary_proto::Walk::Rank { params: params(1), start: 0 }).expect("follow");
    let fetched = settle().await;
    for s in current.iter().flatten() {
        node2.chunk(f.version, *s).await.expect("chunk");
    }
    let s = node2.stats();
    assert_eq!(s.peer_fetched, fetched, "every shard of both epochs in progress was still held: {s:?}");
}

/// A load started for a later epoch that a current request joins while it
/// is in flight keeps a regular guest copy, not a low-priority one: a later
/// look-ahead copy gives way before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_ahead_load_joined_by_a_current_request_keeps_a_regular_copy() {
    let f = start_with(2_000, 250).await;
    let shards: Vec<ShardId> =
        f.node.dataset(f.version).expect("dataset").manifest.shards().iter().map(|s| s.shard).collect();
    let chunk = f.node.dataset(f.version).expect("dataset").chunk_len(shards[0]).expect("len") as u64;
    assert!(shards.iter().all(|s| f.node.dataset(f.version).expect("ds").chunk_len(*s) == Some(chunk as usize)));
    let node2 = guest_node(&f, 2 * chunk).await;
    let (a, later, b) = (shards[0], shards[1], shards[2]);
    // Polled in turn in one task: the look-ahead load of `a` is in flight
    // (a peer round trip) when the current request for it arrives.
    let (x, y) = futures::join!(node2.chunk_ahead(f.version, a), node2.chunk(f.version, a));
    x.expect("ahead");
    y.expect("now");
    assert_eq!(node2.stats().joined, 1, "the current request joined the load: {:?}", node2.stats());
    node2.chunk_ahead(f.version, later).await.expect("later");
    // Room for `b` is taken from the look-ahead copy, not from `a`.
    node2.chunk(f.version, b).await.expect("b");
    let before = node2.stats();
    node2.chunk(f.version, a).await.expect("a again");
    let after = node2.stats();
    assert_eq!(after.peer_fetched, before.peer_fetched, "a was still held: {after:?}");
    assert_eq!(after.guest_hits, before.guest_hits + 1);
}
