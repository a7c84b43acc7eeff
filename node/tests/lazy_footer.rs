//! A dataset served from a manifest built elsewhere (the coordinator's):
//! nothing is read until a shard is converted, then only that file's
//! footer; a file that changed since registration is refused by name.

use granary_node::Node;
use granary_node::config::NodeConfig;
use granary_proto::{Manifest, ShardId};
use granary_source::dataset::Dataset;
use granary_source::remote::{Remote, RemoteCounters};
use granary_testkit::datagen::{self, GenSpec};
use std::collections::BTreeMap;
use std::sync::Arc;

async fn registered(dir: &std::path::Path) -> Manifest {
    let remote =
        Remote::open(&format!("file://{}", dir.display()), &BTreeMap::new(), None, Arc::new(RemoteCounters::default()))
            .expect("remote");
    Dataset::open("ads", remote, datagen::view()).await.expect("open").manifest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_footer_of_a_converted_shards_file_is_read() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let spec = GenSpec {
        seed: 4,
        rows: 4_000,
        files: 4,
        row_group_rows: 500,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    let files = datagen::generate(tmp.path(), &spec, |_| {}).expect("generate").files;
    // A name the store must escape survives the manifest round trip.
    std::fs::rename(&files[2], tmp.path().join("part-00002 [copy #2].parquet")).expect("rename");
    let manifest = registered(tmp.path()).await;
    assert!(manifest.files[2].path.ends_with("[copy #2].parquet"), "{:?}", manifest.files[2].path);
    let node = Node::start(&NodeConfig { ram_bytes: 64 << 20, ..NodeConfig::default() }).await.expect("node");
    let version = node.serve_manifest("ads", datagen::view(), manifest.clone()).expect("serve");
    assert_eq!(node.describe("ads", None).expect("describe").version, version);
    assert_eq!(node.stats().remote_bytes, 0, "serving a manifest reads nothing");

    let shard = ShardId { file: 2, row_group: 1 };
    let chunk = node.chunk(version, shard).await.expect("chunk");
    let file = &manifest.files[2];
    let read = node.stats().remote_bytes;
    assert!(
        read > 0 && read < file.size_bytes,
        "read {read} bytes: one row group and one footer of a {}-byte file",
        file.size_bytes
    );

    // The same bytes as a node that opened the dataset itself.
    let eager = Node::start(&NodeConfig {
        datasets: vec![granary_node::config::DatasetConfig {
            name: "ads".into(),
            source: format!("file://{}", tmp.path().display()),
            view: granary_node::config::ViewRef::Inline(datagen::view()),
        }],
        ram_bytes: 64 << 20,
        ..NodeConfig::default()
    })
    .await
    .expect("eager node");
    assert_eq!(eager.describe("ads", None).expect("describe").version, version, "same version");
    assert_eq!(eager.chunk(version, shard).await.expect("chunk").bytes(), chunk.bytes());

    // A second shard of the same file reads no footer again.
    let before = node.stats().remote_bytes;
    node.chunk(version, ShardId { file: 2, row_group: 0 }).await.expect("chunk");
    let second = node.stats().remote_bytes - before;
    assert!(second < read, "no second footer read: {second} vs {read}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_changed_since_registration_is_refused_by_name() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let spec = GenSpec {
        seed: 4,
        rows: 2_000,
        files: 2,
        row_group_rows: 500,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    datagen::generate(tmp.path(), &spec, |_| {}).expect("generate");
    let manifest = registered(tmp.path()).await;
    // The files are rewritten with other row groups after registration.
    let other = GenSpec { row_group_rows: 400, ..spec };
    datagen::generate(tmp.path(), &other, |_| {}).expect("regenerate");
    let node = Node::start(&NodeConfig { ram_bytes: 64 << 20, ..NodeConfig::default() }).await.expect("node");
    let version = node.serve_manifest("ads", datagen::view(), manifest.clone()).expect("serve");
    let err = node.chunk(version, ShardId { file: 0, row_group: 0 }).await.expect_err("changed file");
    let msg = err.to_string();
    assert!(msg.contains(&manifest.files[0].path) && msg.contains("changed since"), "{msg}");
}

/// A footer from a peer is used as is (no remote read); one that does not
/// decode, or belongs to another file, is refused and the footer is read
/// from remote storage instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_footer_is_used_when_it_fits_and_refused_when_it_does_not() {
    use futures::FutureExt;
    let tmp = tempfile::tempdir().expect("tempdir");
    let spec = GenSpec {
        seed: 5,
        rows: 2_000,
        files: 2,
        row_group_rows: 500,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    datagen::generate(tmp.path(), &spec, |_| {}).expect("generate");
    let manifest = registered(tmp.path()).await;
    let open = || {
        let counters = Arc::new(RemoteCounters::default());
        let remote =
            Remote::open(&format!("file://{}", tmp.path().display()), &BTreeMap::new(), None, counters.clone())
                .expect("remote");
        (Dataset::from_manifest("ads", remote, datagen::view(), manifest.clone()).expect("dataset"), counters)
    };
    let read = |c: &RemoteCounters| {
        use std::sync::atomic::Ordering::Relaxed;
        (c.footers.load(Relaxed), c.peer_footers.load(Relaxed))
    };
    // The bytes a peer would send: file 0's footer as this node reads it.
    let (reader, _) = open();
    let raw0 = reader.footer(0).await.expect("footer").raw.clone();
    let raw1 = reader.footer(1).await.expect("footer").raw.clone();

    let (ds, counters) = open();
    let peer = async move { Ok(raw0) }.boxed();
    let f = ds.footer_via(0, Some(peer)).await.expect("peer footer");
    assert_eq!(f.metadata.metadata().num_row_groups(), manifest.files[0].row_groups.len());
    assert_eq!(read(&counters), (0, 1), "no remote read");

    // Garbage, a cut footer, and file 1's footer (same rows and schema,
    // other compressed sizes).
    for bad in [bytes::Bytes::from_static(b"garbage, not a footer"), raw1.slice(1..), raw1] {
        let (ds, counters) = open();
        ds.footer_via(0, Some(async move { Ok(bad) }.boxed())).await.expect("footer from remote storage");
        assert_eq!(read(&counters), (1, 0), "read from remote storage after refusing the peer's bytes");
    }
    let (ds, counters) = open();
    ds.footer_via(0, Some(async { Err("peer unreachable".to_string()) }.boxed())).await.expect("footer");
    assert_eq!(read(&counters), (1, 0));
}
