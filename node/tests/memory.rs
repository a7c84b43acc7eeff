//! What a node's memory is shared by (issues 29 and 42): the mapping
//! advice it sends trainers with every description, shared among the
//! loaders connected, and the budget of loads in progress, which gives way
//! as the node's own memory grows. The socket's other bounds: `socket.rs`.

use granary_client::ChunkSource;
use granary_proto::wire::{LocalRequest, LocalResponse};
use granary_proto::{PlanParams, Shuffle};
use granary_testkit::datagen;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

mod common;
use common::daemon::{call, daemon_over};
use common::*;

/// The plan of the one rank of a world of one, unshuffled, 10 rows a batch.
fn one_rank() -> PlanParams {
    PlanParams { seed: 1, epoch: 0, world_size: 1, rank: 0, batch_size: 10, shuffle: Shuffle::Off, drop_last: false }
}

/// Issue 29: a trainer's kept chunk mappings are charged to its node's
/// memory (the node filled those pages), so the node sends the most each
/// trainer should keep with every description, and the client's mapping
/// cache takes the lower of that and its own setting.
#[test]
fn a_trainer_keeps_no_more_mappings_than_its_node_advises() {
    let (_data, _run, daemon) = daemon_over(1, 600, 300, |c| c.trainer_mapping_bytes = Some(3 << 20));
    let source = granary_client::LocalSource::connect(&daemon.socket).expect("connect");
    assert_eq!(source.mapping_budget(), granary_client::local::DEFAULT_MAPPING_CACHE_BYTES);
    let info = source.describe("ads", None).expect("describe");
    assert_eq!(info.mapping_budget_bytes, 3 << 20);
    assert_eq!(source.mapping_budget(), 3 << 20, "lowered to the node's advice");
    // A trainer's own lower setting stands.
    let own = granary_client::LocalSource::connect(&daemon.socket).expect("connect").mapping_cache(1 << 20);
    own.describe("ads", None).expect("describe");
    assert_eq!(own.mapping_budget(), 1 << 20);
}

/// The mapping advice as the node runs (issue 42): shared among the ranks
/// the node expects or, when more loaders follow a plan, among those; a
/// loader that goes away gives its share back.
#[test]
fn the_mapping_advice_is_shared_among_the_loaders_connected() {
    let (_data, _run, d) = daemon_over(1, 600, 300, |c| c.max_ranks = 1);
    let advice = |s: &mut UnixStream| match call(s, &LocalRequest::Describe { dataset: "ads".into(), version: None }) {
        Some(LocalResponse::Described(info)) => info.mapping_budget_bytes,
        other => panic!("describe: {other:?}"),
    };
    let follow = |s: &mut UnixStream, version| {
        let params = one_rank();
        assert!(matches!(call(s, &LocalRequest::Follow { version, params }), Some(LocalResponse::Following)));
    };
    let mut a = d.connect();
    let alone = advice(&mut a);
    assert!(alone > 0 && alone < u64::MAX, "the machine's memory is known here: {alone}");
    let version = match call(&mut a, &LocalRequest::Describe { dataset: "ads".into(), version: None }) {
        Some(LocalResponse::Described(info)) => info.version,
        other => panic!("{other:?}"),
    };
    follow(&mut a, version);
    let mut b = d.connect();
    follow(&mut b, version);
    let shared = advice(&mut b);
    // Two loaders on a node expecting one: half each (the node's own
    // memory, measured, moves a little between the calls).
    assert!(shared < alone * 6 / 10 && shared > alone * 4 / 10, "{shared} against {alone} alone");
    drop((a, b));
    let start = Instant::now();
    let mut c = d.connect();
    while advice(&mut c) < alone * 9 / 10 {
        assert!(start.elapsed() < WAIT, "the loaders' shares came back");
        std::thread::sleep(Duration::from_millis(20));
    }
    d.stop();
}

/// Issue 42: a trainer already connected takes the node's advice again
/// each time it announces a plan (an epoch's start): a second loader
/// halves it, and it comes back once that loader has gone. The trainer's
/// own setting stays the ceiling.
#[test]
fn a_connected_trainer_takes_the_advice_again_at_each_plan() {
    let (_data, _run, d) = daemon_over(1, 600, 300, |c| c.max_ranks = 1);
    let a = granary_client::LocalSource::connect(&d.socket).expect("connect").mapping_cache(u64::MAX);
    let info = a.describe("ads", None).expect("describe");
    let alone = a.mapping_budget();
    assert!(alone > 0 && alone < u64::MAX, "the machine's memory is known here: {alone}");
    let params = one_rank();
    let walk = granary_proto::Walk::Rank { params, start: 0 };
    a.follow(info.version, &walk).expect("follow");
    let b = granary_client::LocalSource::connect(&d.socket).expect("connect");
    b.describe("ads", None).expect("describe");
    b.follow(info.version, &walk).expect("follow");
    a.follow(info.version, &walk).expect("the next epoch");
    let shared = a.mapping_budget();
    // The node's own memory, measured, moves a little between the calls.
    assert!(shared < alone * 6 / 10 && shared > alone * 4 / 10, "{shared} against {alone} alone");
    drop(b);
    let start = Instant::now();
    loop {
        a.follow(info.version, &walk).expect("another epoch");
        if a.mapping_budget() >= alone * 9 / 10 {
            break;
        }
        assert!(start.elapsed() < WAIT, "the second loader's share came back: {}", a.mapping_budget());
        std::thread::sleep(Duration::from_millis(20));
    }
    let capped = granary_client::LocalSource::connect(&d.socket).expect("connect").mapping_cache(1 << 20);
    capped.describe("ads", None).expect("describe");
    capped.follow(info.version, &walk).expect("follow");
    assert_eq!(capped.mapping_budget(), 1 << 20, "the trainer's own setting is the ceiling");
    d.stop();
}

/// Issue 42: the budget of loads in progress follows the node's own
/// memory. Here the node's process grows by 1 GiB of its own (what the
/// manifests and orders of a million row groups take): the budget gives
/// half of it up; once it is freed, the budget comes back.
#[test]
fn the_load_budget_gives_way_as_the_nodes_own_memory_grows() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let data = tempfile::tempdir().unwrap();
        datagen::generate(
            data.path(),
            &datagen::GenSpec { rows: 600, row_group_rows: 300, ..Default::default() },
            |_| {},
        )
        .unwrap();
        let node = granary_node::Node::start(&config_with_view(data.path(), datagen::VIEW_TOML)).await.unwrap();
        let before = node.follow_own_memory();
        let grown: Vec<u8> = vec![1u8; 1 << 30];
        std::hint::black_box(&grown);
        let during = node.follow_own_memory();
        assert!(
            // Half of it, give or take what tests beside this one allocate.
            during + (300 << 20) <= before && during + (700 << 20) >= before,
            "1 GiB more of the node's own memory moved the budget from {before} to {during}"
        );
        drop(grown);
        let after = node.follow_own_memory();
        assert!(after + (256 << 20) >= before, "freed, the budget came back: {after} of {before}");
        node.close().await;
    });
}
