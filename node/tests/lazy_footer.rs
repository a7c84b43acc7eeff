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
    let raw0 = reader.footer_bytes(0).await.expect("footer");
    let raw1 = reader.footer_bytes(1).await.expect("footer");

    let (ds, counters) = open();
    let peer = async move { Ok(raw0) }.boxed();
    let f = ds.footer_via(0, Some(("node-2".into(), peer))).await.expect("peer footer");
    assert_eq!(f.row_group_count(), manifest.files[0].row_groups.len());
    assert_eq!(read(&counters), (0, 1), "no remote read");

    // Garbage, a cut footer, and file 1's footer (same rows and schema,
    // other compressed sizes).
    for bad in [bytes::Bytes::from_static(b"garbage, not a footer"), raw1.slice(1..), raw1] {
        let (ds, counters) = open();
        ds.footer_via(0, Some(("node-2".into(), async move { Ok(bad) }.boxed())))
            .await
            .expect("footer from remote storage");
        assert_eq!(read(&counters), (1, 0), "read from remote storage after refusing the peer's bytes");
    }
    let (ds, counters) = open();
    ds.footer_via(0, Some(("node-2".into(), async { Err("peer unreachable".to_string()) }.boxed())))
        .await
        .expect("footer");
    assert_eq!(read(&counters), (1, 0));
}

/// Writes `columns` (name, values) as one Parquet file of row groups of
/// `rows_per_group`, uncompressed, plain, without statistics: two files of
/// the same columns in another order then have column chunks of the same
/// sizes, so one's footer passes a check of rows and sizes against the
/// other's bytes.
fn write_plain(path: &std::path::Path, columns: &[(&str, Vec<i64>)], rows_per_group: usize) {
    use arrow::array::{ArrayRef, Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    use parquet::file::properties::{EnabledStatistics, WriterProperties};
    let fields: Vec<Field> = columns.iter().map(|(n, _)| Field::new(*n, DataType::Int64, false)).collect();
    let arrays: Vec<ArrayRef> =
        columns.iter().map(|(_, v)| Arc::new(Int64Array::from(v.clone())) as ArrayRef).collect();
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).expect("batch");
    let props = WriterProperties::builder()
        .set_dictionary_enabled(false)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_max_row_group_row_count(Some(rows_per_group))
        .build();
    let file = std::fs::File::create(path).expect("create");
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props)).expect("writer");
    w.write(&batch).expect("write");
    w.close().expect("close");
}

/// Issue 29: a peer with a valid certificate serves a crafted footer: the
/// file's own columns with their column chunks swapped (its row groups'
/// rows and compressed sizes are the registered ones, so the row-group
/// check passes). Used, it would make this node convert column `y`'s
/// values as tensor `x`. The manifest's footer SHA-256 refuses it, the
/// refusal is counted, and the true footer is read from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_footer_with_swapped_column_offsets_is_refused() {
    use futures::FutureExt;
    let (data, other) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let x: Vec<i64> = (0..2_000).collect();
    let y: Vec<i64> = (0..2_000).map(|v| 1_000_000 + v).collect();
    write_plain(&data.path().join("part-0.parquet"), &[("x", x.clone()), ("y", y.clone())], 500);
    // The crafted footer: the same data written with the columns in the
    // other order, so its footer points `x` at the second column chunk.
    write_plain(&other.path().join("part-0.parquet"), &[("y", y), ("x", x)], 500);
    let view: granary_proto::View = toml::from_str(
        "[[tensor]]\nname = \"x\"\ndtype = \"i64\"\ncolumns = [\"x\"]\n\n[[tensor]]\nname = \"y\"\ndtype = \"i64\"\ncolumns = [\"y\"]\n",
    )
    .expect("view");
    let open = |dir: &std::path::Path| {
        let counters = Arc::new(RemoteCounters::default());
        let remote = Remote::open(&format!("file://{}", dir.display()), &BTreeMap::new(), None, counters.clone())
            .expect("remote");
        (remote, counters)
    };
    let manifest = Dataset::open("xy", open(data.path()).0, view.clone()).await.expect("open").manifest;
    let crafted = Dataset::open("xy", open(other.path()).0, view.clone()).await.expect("open crafted");
    // What the old check compared is equal: the crafted footer passed it.
    assert_eq!(crafted.manifest.files[0].row_groups, manifest.files[0].row_groups);
    assert_eq!(crafted.manifest.files[0].size_bytes, manifest.files[0].size_bytes);
    let crafted_raw = crafted.footer_bytes(0).await.expect("footer");
    assert_ne!(Some(granary_source::dataset::footer_sha256(&crafted_raw)), manifest.files[0].footer_sha256);

    let (remote, counters) = open(data.path());
    let ds = Dataset::from_manifest("xy", remote, view, manifest.clone()).expect("dataset");
    let footer = ds
        .footer_via(0, Some(("node-2 at 10.0.0.2:7100".into(), async move { Ok(crafted_raw) }.boxed())))
        .await
        .expect("the true footer, from the store");
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(counters.peer_footers_refused.load(Relaxed), 1, "the crafted footer was refused");
    assert_eq!((counters.footers.load(Relaxed), counters.peer_footers.load(Relaxed)), (1, 0));
    assert_eq!(
        Some(granary_source::dataset::footer_sha256(footer.raw.as_deref().expect("a cluster node keeps the bytes"))),
        manifest.files[0].footer_sha256,
        "the footer used is the one registered"
    );
}

/// What a registration reads (`Dataset::open_manifest`, the coordinator's)
/// is the manifest `open` gives, with no footer kept in memory; each is
/// read again when first needed, and reported as read meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_keeps_no_footer_and_reports_each_read() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let spec = GenSpec { seed: 5, rows: 3_000, files: 3, row_group_rows: 500, ..GenSpec::default() };
    datagen::generate(tmp.path(), &spec, |_| {}).expect("generate");
    let remote = || {
        Remote::open(
            &format!("file://{}", tmp.path().display()),
            &BTreeMap::new(),
            None,
            Arc::new(RemoteCounters::default()),
        )
        .expect("remote")
    };
    let kept = Dataset::open("ads", remote(), datagen::view()).await.expect("open");
    let seen = std::sync::Mutex::new(Vec::new());
    let report = |done, total| seen.lock().unwrap().push((done, total));
    let listed = Dataset::open_manifest("ads", remote(), datagen::view(), &report).await.expect("open_manifest");
    assert_eq!(listed.manifest, kept.manifest);
    assert_eq!(*seen.lock().unwrap(), [(0, 3), (1, 3), (2, 3), (3, 3)], "listed, then each footer");
    assert!((0..3).all(|i| kept.held_footer(i).is_some()), "open keeps every footer");
    assert!((0..3).all(|i| listed.held_footer(i).is_none()), "a registration keeps none");
    listed.footer(1).await.expect("read again when needed");
    assert!(listed.held_footer(1).is_some());
}
