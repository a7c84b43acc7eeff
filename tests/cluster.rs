//! The cluster as real processes, with trainer ranks: a coordinator voter,
//! three node daemons on loopback, two `granary trainer` ranks per node.

use granary_bench::local::DaemonSettings;
use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::{
    LocalCluster, LocalClusterSpec, NodeProcess, TrainerEvent, TrainerProcess, run_epoch, spawn_ranks,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_granary");
const TIMEOUT: Duration = Duration::from_secs(120);

fn dataset(dir: &Path) -> PathBuf {
    let data = dir.join("data");
    let spec = GenSpec {
        seed: 5,
        rows: 24_000,
        files: 4,
        row_group_rows: 1_500,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    datagen::generate(&data, &spec, |_| {}).expect("generate");
    data
}

/// A dataset registered on the coordinator while the nodes run is opened
/// by every node (none has it in node.toml), each of its shards is
/// converted once in the cluster, and every node hands out the same bytes.
#[test]
fn a_dataset_added_to_the_coordinator_is_served_by_every_node() {
    use granary_client::{ChunkSource, LocalSource};
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = dataset(tmp.path());
    let spec = LocalClusterSpec { nodes: 2, prefetch_bytes: 0, ..LocalClusterSpec::default() };
    let c = LocalCluster::start(Path::new(BIN), &tmp.path().join("cluster"), &data, spec).expect("cluster");
    let more = tmp.path().join("more");
    let spec2 = GenSpec {
        seed: 8,
        rows: 3_000,
        files: 2,
        row_group_rows: 500,
        compression: "zstd".into(),
        ..GenSpec::default()
    };
    datagen::generate(&more, &spec2, |_| {}).expect("generate");
    c.add_dataset("clicks", &more).expect("add");
    c.wait_placement(&[1, 2], 2, 2, TIMEOUT).expect("both nodes serve two versions");
    let fetched: Vec<Vec<Vec<u8>>> = [1u64, 2]
        .iter()
        .map(|&id| {
            let src = LocalSource::connect(c.socket(id)).expect("connect");
            let info = src.describe("clicks", None).expect("the coordinator's dataset is served");
            assert_eq!(info.shards.len(), 6);
            info.shards.iter().map(|s| src.fetch(info.version, s.shard).expect("fetch").bytes().to_vec()).collect()
        })
        .collect();
    assert_eq!(fetched[0], fetched[1], "both nodes hand out the same bytes");
    let (s1, s2) = (c.stats(1).expect("stats"), c.stats(2).expect("stats"));
    assert_eq!(s1.conversions + s2.conversions, 6, "each shard converted once in the cluster");
    // Each footer is read from remote storage once in the cluster, by the
    // owner of its file's first row group; the other node asks that owner.
    assert_eq!(s1.remote_footers + s2.remote_footers, 2, "{s1:?}\n{s2:?}");
    let source: u64 =
        std::fs::read_dir(&more).expect("ls").map(|e| e.expect("entry").metadata().expect("stat").len()).sum();
    let remote = s1.remote_bytes + s2.remote_bytes;
    assert!(
        remote <= source + 2 * (64 << 10),
        "the cluster read {remote} bytes of a {source}-byte dataset (at most each footer's 64 KiB read once more)"
    );
}

/// A node stopped and started again, with no `[[dataset]]` of its own,
/// serves the chunks it converted before from its SSD tier: the
/// coordinator's manifest names the same version, and nothing is converted
/// or read from remote storage again.
#[test]
fn a_restarted_node_serves_the_coordinators_dataset_from_its_ssd_tier() {
    use granary_client::{ChunkSource, LocalSource};
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = dataset(tmp.path());
    // A lease long enough that the restart moves no shard.
    let spec = LocalClusterSpec {
        nodes: 2,
        ssd_bytes: Some(64 << 20),
        prefetch_bytes: 0,
        lease_ms: 10_000,
        ..LocalClusterSpec::default()
    };
    let mut c = LocalCluster::start(Path::new(BIN), &tmp.path().join("cluster"), &data, spec).expect("cluster");
    let fetch_all = |c: &LocalCluster| -> Vec<Vec<u8>> {
        let src = LocalSource::connect(c.socket(1)).expect("connect");
        let info = src.describe("ads", None).expect("describe");
        info.shards.iter().map(|s| src.fetch(info.version, s.shard).expect("fetch").bytes().to_vec()).collect()
    };
    let before = fetch_all(&c);
    let owned = c.stats(1).expect("stats").conversions;
    assert!(owned > 0, "node 1 owns and converted some shards");
    c.terminate(1).expect("clean stop");
    c.start_node(1).expect("restart");
    c.wait_placement(&[1], 2, 1, TIMEOUT).expect("node 1 back");
    assert_eq!(fetch_all(&c), before, "the same bytes after the restart");
    let s = c.stats(1).expect("stats");
    assert_eq!((s.conversions, s.remote_bytes), (0, 0), "{s:?}");
    assert_eq!(s.ssd_hits, owned, "{s:?}");
}

fn trainer_args(dump: &Path) -> Vec<String> {
    ["--batch-size", "200", "--seed", "11", "--prefetch-batches", "2", "--dump", dump.to_str().expect("utf8")]
        .map(String::from)
        .into()
}

/// Epoch 0 of `world` ranks against one node daemon alone: the fault-free
/// reference, dumped to `dump`.
fn reference(dir: &Path, data: &Path, world: usize, dump: &Path) {
    std::fs::create_dir_all(dump).expect("dump dir");
    let socket = dir.join("ref.sock");
    let config = dir.join("ref.toml");
    let settings = DaemonSettings {
        socket: &socket,
        ssd_dir: None,
        ssd_bytes: 0,
        data_dir: data,
        ram_bytes: 256 << 20,
        prefetch_bytes: 32 << 20,
        loads: 2,
        convert_threads: 1,
        throttle: None,
        jagged: false,
        fixed_dir: None,
    };
    std::fs::write(&config, settings.toml()).expect("config");
    let node = NodeProcess::spawn(Path::new(BIN), &config, &socket, &dir.join("ref.log"), TIMEOUT).expect("node");
    let sockets = vec![socket; world];
    let (mut ranks, _) = spawn_ranks(Path::new(BIN), &sockets, &trainer_args(dump)).expect("ranks");
    run_epoch(&mut ranks, 0, TIMEOUT, |_, _| {}).unwrap_or_else(|e| panic!("{e:#}\n{}", node.log_tail()));
    for t in ranks {
        t.finish(Duration::from_secs(30)).expect("rank exit");
    }
}

/// Waits for rank `t`'s end of epoch, failing on anything else.
fn wait_epoch(t: &TrainerProcess, c: &LocalCluster) -> String {
    loop {
        match t.next_event(TIMEOUT) {
            Ok(TrainerEvent::Progress { .. }) => {}
            Ok(TrainerEvent::Epoch { digest, .. }) => return digest,
            other => panic!("rank {}: {other:?}\nnode 1:\n{}\nnode 3:\n{}", t.rank, c.log_tail(1), c.log_tail(3)),
        }
    }
}

/// Node 2 is SIGKILLed during an epoch: the ranks on nodes 1 and 3 finish it
/// without an error, and every batch they received is byte-identical to a
/// fault-free run of the same ranks against one node daemon.
#[test]
fn a_node_killed_during_an_epoch_leaves_the_other_ranks_byte_identical() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = dataset(tmp.path());
    let world = 6;
    let ref_dump = tmp.path().join("ref-dump");
    reference(tmp.path(), &data, world, &ref_dump);

    // Each node's remote link is slow enough that the epoch lasts seconds.
    let spec = LocalClusterSpec {
        nodes: 3,
        ram_bytes: 256 << 20,
        guest_bytes: 256 << 20,
        prefetch_bytes: 8 << 20,
        loads: 2,
        convert_threads: 1,
        throttle: Some((30, 1 << 20)),
        lease_ms: 1500,
        ..LocalClusterSpec::default()
    };
    let mut c = LocalCluster::start(Path::new(BIN), &tmp.path().join("cluster"), &data, spec).expect("cluster");
    let dump = tmp.path().join("dump");
    std::fs::create_dir_all(&dump).expect("dump dir");
    let sockets: Vec<PathBuf> = (0..world).map(|r| c.socket(r as u64 / 2 + 1)).collect();
    let (mut ranks, _) = spawn_ranks(Path::new(BIN), &sockets, &trainer_args(&dump)).expect("ranks");
    for t in &mut ranks {
        t.start_epoch(0).expect("start");
    }
    // The epoch is under way and node 2 has converted a first shard; its
    // slow link (1 MiB/s) leaves the rest of its shards to come.
    let deadline = std::time::Instant::now() + TIMEOUT;
    while c.stats(2).expect("node 2 stats").conversions == 0 {
        assert!(std::time::Instant::now() < deadline, "node 2 converted nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    c.kill(2);
    let survivors = [0usize, 1, 4, 5];
    for &r in &survivors {
        wait_epoch(&ranks[r], &c);
    }
    for &r in &survivors {
        let name = format!("rank-{r}-epoch-0.bin");
        let got = std::fs::read(dump.join(&name)).expect("dump");
        let want = std::fs::read(ref_dump.join(&name)).expect("reference dump");
        assert!(!want.is_empty());
        assert!(
            got == want,
            "rank {r}: {} bytes received, {} in the fault-free run, not identical",
            got.len(),
            want.len()
        );
    }
    // The survivors did lose a source: fetches from node 2 failed, and its
    // shards were read again by their new owners...
    let s1 = c.stats(1).expect("stats");
    let s3 = c.stats(3).expect("stats");
    assert!(s1.peer_failures + s3.peer_failures > 0, "nothing depended on node 2: {s1:?} {s3:?}");
    // ...by one new owner each: the survivors waited for the placement to
    // give each of node 2's shards one new owner instead of each reading
    // them itself (a dead owner is not taken for a stalled one). Between
    // them they convert at most as many shards as the dataset has (fewer
    // when a new owner already held a guest copy of one of node 2's
    // shards); each survivor reading node 2's shards itself went over
    // (19 of 16).
    let shards = 24_000 / 1_500;
    assert!(
        s1.conversions + s3.conversions <= shards,
        "the survivors converted {} times, the dataset has {shards} shards: some shard was read by both\n{s1:?}\n{s3:?}",
        s1.conversions + s3.conversions
    );
}

/// Issue 15: a job pins its dataset version. Rank 0 starts before a new
/// version of "ads" is registered (and reads after it); rank 1 starts
/// after it, given the job's version: both read the version their job
/// pinned, so between them they cover its rows exactly once, while a
/// loader that names no version reads the new one. Before pinning, rank 1
/// planned the new version's shards: rows lost and others read twice.
#[test]
fn ranks_started_before_and_after_a_new_version_read_the_version_their_job_pinned() {
    use granary_client::{ChunkSource, Loader, LoaderConfig, LocalSource};
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = dataset(tmp.path());
    let spec = LocalClusterSpec { nodes: 1, prefetch_bytes: 0, ..LocalClusterSpec::default() };
    let c = LocalCluster::start(Path::new(BIN), &tmp.path().join("cluster"), &data, spec).expect("cluster");
    let user_ids = |loader: &Loader| -> Vec<i64> {
        let mut out = Vec::new();
        for b in loader.epoch(0).expect("epoch") {
            let b = b.expect("batch");
            out.extend(b.tensor::<i64>("ids").expect("ids").data().iter().step_by(2));
        }
        out
    };
    let cfg = |rank, world| LoaderConfig { seed: 3, rank, world_size: world, ..LoaderConfig::new("ads", 500) };
    let mut whole = user_ids(&Loader::connect(c.socket(1), cfg(0, 1)).expect("loader"));
    whole.sort_unstable();
    assert_eq!(whole.len(), 24_000);
    let rank0 = Loader::connect(c.socket(1), cfg(0, 2)).expect("rank 0");
    let pinned = rank0.version();

    let more = tmp.path().join("more");
    let spec2 = GenSpec { seed: 8, rows: 3_000, files: 2, row_group_rows: 500, ..GenSpec::default() };
    datagen::generate(&more, &spec2, |_| {}).expect("generate");
    c.add_dataset("ads", &more).expect("register a new version of ads");
    let src = LocalSource::connect(c.socket(1)).expect("connect");
    let deadline = std::time::Instant::now() + TIMEOUT;
    let current = loop {
        let v = src.describe("ads", None).expect("describe").version;
        if v != pinned {
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "the node never served the new version");
        std::thread::sleep(Duration::from_millis(100));
    };

    let rank1 = Loader::connect(c.socket(1), LoaderConfig { version: Some(pinned), ..cfg(1, 2) }).expect("rank 1");
    assert_eq!(rank1.version(), pinned);
    let mut both = user_ids(&rank0);
    both.extend(user_ids(&rank1));
    both.sort_unstable();
    assert_eq!(both, whole, "the two ranks cover the pinned version's rows exactly once");
    let fresh = Loader::connect(c.socket(1), cfg(0, 1)).expect("a loader naming no version");
    assert_eq!((fresh.version(), user_ids(&fresh).len()), (current, 3_000), "it reads the current version");
    // Resuming rank 1's state in a loader of another world size is refused.
    let state = rank1.state_at(granary_client::Position { epoch: 0, batch: 1 });
    let other =
        Loader::connect(c.socket(1), LoaderConfig { world_size: 4, ..LoaderConfig::resuming(&state) }).expect("loader");
    let e = other.resume_from(&state).err().expect("a changed world size is refused");
    assert!(e.to_string().contains("world_size 2, this loader 4"), "{e}");
}

/// Issue 15: a node restarted after a new version was registered knows
/// only the current version from its placement; a trainer resuming a job
/// pinned to the older one makes the node open it from the coordinator,
/// which keeps every registered version's manifest. Before, the resume
/// failed: "version ... is not served here".
#[test]
fn a_restarted_node_opens_the_older_version_a_resumed_job_pinned() {
    use granary_client::{Loader, LoaderConfig, LocalSource, Position};
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = dataset(tmp.path());
    let spec = LocalClusterSpec { nodes: 1, prefetch_bytes: 0, ..LocalClusterSpec::default() };
    let mut c = LocalCluster::start(Path::new(BIN), &tmp.path().join("cluster"), &data, spec).expect("cluster");
    let cfg = LoaderConfig { seed: 3, ..LoaderConfig::new("ads", 500) };
    let first = Loader::connect(c.socket(1), cfg).expect("loader");
    let whole: Vec<Vec<u8>> =
        first.epoch(0).expect("epoch").map(|b| b.expect("batch").tensor_bytes(0).to_vec()).collect();
    let state = first.state_at(Position { epoch: 0, batch: 10 });
    drop(first);

    let more = tmp.path().join("more");
    let spec2 = GenSpec { seed: 8, rows: 3_000, files: 2, row_group_rows: 500, ..GenSpec::default() };
    datagen::generate(&more, &spec2, |_| {}).expect("generate");
    c.add_dataset("ads", &more).expect("register a new version of ads");
    c.terminate(1).expect("clean stop");
    c.start_node(1).expect("restart");
    c.wait_placement(&[1], 1, 1, TIMEOUT).expect("node 1 back");
    use granary_client::ChunkSource;
    let now = LocalSource::connect(c.socket(1)).expect("connect").describe("ads", None).expect("describe").version;
    assert_ne!(now, state.version, "the node's current version is the new one");

    let resumed = Loader::connect(c.socket(1), LoaderConfig::resuming(&state)).expect("the pinned version is served");
    let tail: Vec<Vec<u8>> =
        resumed.resume_from(&state).expect("resume").map(|b| b.expect("batch").tensor_bytes(0).to_vec()).collect();
    assert_eq!(tail, whole[10..], "the rest of the epoch, from the version the job pinned");

    // A version the coordinator never registered is refused as soon as it
    // says so (not after the describe's 10 s wait).
    let unknown = granary_proto::DatasetVersion([0xAB; 16]);
    let started = std::time::Instant::now();
    match Loader::connect(c.socket(1), LoaderConfig { version: Some(unknown), ..LoaderConfig::resuming(&state) }) {
        Err(granary_client::ClientError::VersionGone { version, current, .. }) => {
            assert_eq!((version, current), (unknown, Some(now)))
        }
        Err(e) => panic!("expected VersionGone, got {e}"),
        Ok(_) => panic!("a version nobody registered was served"),
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "refused after {:?}", started.elapsed());
}

/// Issue 15: a job pinned to an older version keeps the fabric after a
/// newer version is registered (the nodes whose trainers follow it hold
/// it at the coordinator, which keeps it placed), so each of its shards is
/// read from remote storage once per cluster, not once per node; once no
/// trainer has used it for the linger and the retention, it is collected
/// (coordinator state and nodes) and a resume on it is refused. Before,
/// the older version lost its owners at the new registration and each of
/// the three nodes read every shard itself (3x the dataset).
#[test]
fn a_job_pinned_to_an_older_version_reads_it_once_per_cluster_until_it_is_collected() {
    use granary_client::{ChunkSource, ClientError, Loader, LoaderConfig, LocalSource};
    use granary_net::api::VersionStatus;
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = dataset(tmp.path());
    let spec = LocalClusterSpec {
        nodes: 3,
        prefetch_bytes: 0,
        hold_linger_ms: Some(500),
        version_retention_s: Some(2),
        ..LocalClusterSpec::default()
    };
    let c = LocalCluster::start(Path::new(BIN), &tmp.path().join("cluster"), &data, spec).expect("cluster");
    let ids = c.node_ids();
    let cfg = |version| LoaderConfig { seed: 3, version, ..LoaderConfig::new("ads", 500) };
    // One trainer per node follows the current version (v1) without
    // reading anything yet: each node holds v1.
    let holders: Vec<LocalSource> = ids
        .iter()
        .map(|&id| {
            let src = LocalSource::connect(c.socket(id)).expect("connect");
            let v1 = src.describe("ads", None).expect("describe").version;
            src.follow(v1, &cfg(Some(v1)).walk(0, 0)).expect("follow");
            src
        })
        .collect();
    let v1 = holders[0].describe("ads", None).expect("describe").version;
    let wait = |what: &str, ok: &dyn Fn(&[granary_net::api::VersionSummary]) -> bool| {
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            let list = c.datasets().expect("dataset ls");
            if ok(&list[0].version_list) {
                return list;
            }
            assert!(std::time::Instant::now() < deadline, "{what}: {:?}", list[0].version_list);
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait("v1 held by the three nodes", &|l| l.len() == 1 && l[0].held_by.len() == 3);
    let more = tmp.path().join("more");
    let spec2 = GenSpec { seed: 8, rows: 3_000, files: 2, row_group_rows: 500, ..GenSpec::default() };
    datagen::generate(&more, &spec2, |_| {}).expect("generate");
    c.add_dataset("ads", &more).expect("register a new version of ads");
    let list = wait("v1 held and placed, v2 current", &|l| {
        l.len() == 2
            && l[0].version == v1
            && matches!(&l[0].state, VersionStatus::Held { nodes } if nodes.len() == 3)
            && l[1].state == VersionStatus::Current
    });
    let source_bytes_v1: u64 = std::fs::read_dir(&data)
        .expect("data")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "parquet"))
        .map(|e| e.metadata().expect("metadata").len())
        .sum();
    assert_eq!(list[0].version_list[0].rows, 24_000);
    // Every node knows the owners of both versions.
    c.wait_placement(&ids, 3, 2, TIMEOUT).expect("placement of v1 and v2");

    // Each node's rank reads the whole of v1.
    let before = c.total_stats().expect("stats");
    let mut whole: Option<Vec<Vec<u8>>> = None;
    for &id in &ids {
        let loader = Loader::connect(c.socket(id), cfg(Some(v1))).expect("loader on v1");
        assert_eq!(loader.version(), v1);
        let batches: Vec<Vec<u8>> =
            loader.epoch(0).expect("epoch").map(|b| b.expect("batch").tensor_bytes(0).to_vec()).collect();
        match &whole {
            None => whole = Some(batches),
            Some(w) => assert_eq!(&batches, w, "node {id} gave other batches"),
        }
    }
    let after = c.total_stats().expect("stats");
    let read = after.remote_bytes - before.remote_bytes;
    assert!(
        read as f64 <= 1.1 * source_bytes_v1 as f64,
        "three nodes read v1 {:.2}x its size from remote storage (once per cluster is ~1x)",
        read as f64 / source_bytes_v1 as f64
    );
    assert!(after.peer_fetched > before.peer_fetched, "v1's chunks moved between nodes");

    // Nobody uses v1 any more: after the linger and the retention it is
    // collected, and a job resuming on it is told it is gone.
    drop(holders);
    wait("v1 collected", &|l| l.len() == 1 && l[0].version != v1);
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        match Loader::connect(c.socket(1), cfg(Some(v1))) {
            Err(ClientError::VersionGone { version, .. }) => {
                assert_eq!(version, v1);
                break;
            }
            Err(e) => panic!("expected VersionGone, got {e}"),
            Ok(_) => {
                assert!(std::time::Instant::now() < deadline, "node 1 still serves the collected version");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// A trainer whose cluster node is killed and started again mid-epoch
/// reads on: its connection comes back as soon as the node takes
/// connections, and waits (within the reconnect time) until the node has
/// the coordinator's placement again and takes the rank's plan; the epoch
/// is byte for byte the epoch without the restart.
#[test]
fn a_trainer_reads_on_through_its_cluster_nodes_restart() {
    use granary_client::{Loader, LoaderConfig};
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = dataset(tmp.path());
    let spec = LocalClusterSpec { nodes: 1, prefetch_bytes: 0, ..LocalClusterSpec::default() };
    let mut c = LocalCluster::start(Path::new(BIN), &tmp.path().join("cluster"), &data, spec).expect("cluster");
    let cfg = LoaderConfig { seed: 4, mapping_cache_bytes: 0, prefetch_batches: 1, ..LoaderConfig::new("ads", 500) };
    let digest = |b: &granary_client::Batch| {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for i in 0..b.layouts().len() {
            h.update(b.tensor_bytes(i));
        }
        h.digest()
    };
    let reference: Vec<u64> = Loader::connect(c.socket(1), cfg.clone())
        .expect("loader")
        .epoch(0)
        .expect("epoch")
        .map(|b| digest(&b.expect("batch")))
        .collect();
    let loader = Loader::connect(c.socket(1), cfg).expect("loader");
    let mut epoch = loader.epoch(0).expect("epoch");
    let mut got: Vec<u64> = epoch.by_ref().take(4).map(|b| digest(&b.expect("batch"))).collect();
    // Killed with most of the epoch to come (48 batches; the loader holds
    // at most a few ahead), started again while the rank waits.
    c.kill(1);
    std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            for b in epoch {
                got.push(digest(&b.expect("the epoch goes on after its node restarts")));
            }
        });
        c.start_node(1).expect("restart node 1");
        reader.join().expect("reader");
    });
    assert_eq!(got, reference, "the same batches as without the restart");
}
