//! Issue 30: a node converts list and byte columns into jagged tensors:
//! each chunk holds every row's values, as the generator wrote them, and a
//! loader hands every row out in plan order. Jagged chunks travel over the
//! peer fabric like any other, checked against the manifest's rows and
//! tensors (their length is known only once converted).

use granary_node::config::NodeConfig;
use granary_node::{EmbeddedNode, Node};
use granary_proto::ChunkView;
use granary_proto::chunk::Verify;
use granary_testkit::datagen::{self, GenSpec};
use std::sync::Arc;

mod common;
use common::{fabric, le};

const SEED: u64 = 30;

/// `label`, and the three variable-length columns as jagged tensors (the
/// generator's [`datagen::JAGGED_VIEW_TOML`]).
fn view_toml() -> String {
    format!("[[tensor]]\nname = \"label\"\ndtype = \"f32\"\ncolumns = [\"label\"]\n{}", datagen::JAGGED_VIEW_TOML)
}

fn config(data: &std::path::Path) -> NodeConfig {
    common::config_with_view(data, &view_toml())
}

fn generate(data: &std::path::Path) {
    let spec = GenSpec { seed: SEED, rows: 3_000, files: 2, row_group_rows: 500, jagged: true, ..GenSpec::default() };
    datagen::generate(data, &spec, |_| {}).expect("generate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_of_every_jagged_tensor_is_what_the_generator_wrote() {
    let tmp = tempfile::tempdir().expect("tempdir");
    generate(tmp.path());
    let node = Node::start(&config(tmp.path())).await.expect("node");
    let info = node.describe("ads", None).expect("describe");
    let jagged: Vec<(&str, bool)> = info.tensors.iter().map(|t| (t.name.as_str(), t.jagged)).collect();
    assert_eq!(jagged, [("label", false), ("hist", true), ("cats", true), ("blob", true)]);
    let mut row = 0u64;
    for s in &info.shards {
        let chunk = node.chunk(info.version, s.shard).await.expect("converted");
        let v = ChunkView::parse(chunk.bytes(), Verify::Full).expect("valid chunk");
        let (hist, cats, blob) =
            (v.jagged_at(1).expect("hist"), v.jagged_at(2).expect("cats"), v.jagged_at(3).expect("blob"));
        assert_eq!(hist.rows() as u64, s.rows);
        for r in 0..s.rows as usize {
            let g = row + r as u64;
            assert_eq!(le(hist.row(r), i64::from_le_bytes), datagen::hist_row(SEED, g), "hist row {g}");
            assert_eq!(le(cats.row(r), i32::from_le_bytes), datagen::cats_row(SEED, g), "cats row {g}");
            assert_eq!(blob.row(r), &datagen::blob_row(SEED, g)[..], "blob row {g}");
        }
        row += s.rows;
    }
    assert_eq!(row, 3_000);
}

#[test]
fn a_loader_hands_out_every_row_of_every_jagged_tensor_in_plan_order() {
    let tmp = tempfile::tempdir().expect("tempdir");
    generate(tmp.path());
    let node = Arc::new(EmbeddedNode::start(&config(tmp.path()), 2).expect("node"));
    let cfg =
        granary_client::LoaderConfig { seed: 3, assembly_threads: 2, ..granary_client::LoaderConfig::new("ads", 64) };
    let loader = granary_client::Loader::new(node, cfg).expect("loader");
    let info = loader.info().clone();
    // Global row index of a shard's first row.
    let starts: Vec<u64> = info.shards.iter().scan(0, |acc, s| Some(std::mem::replace(acc, *acc + s.rows))).collect();
    let plan = loader.plan(0).expect("plan");
    let mut rows = 0;
    for (i, batch) in loader.epoch(0).expect("epoch").enumerate() {
        let batch = batch.expect("batch");
        let (hist, cats, blob) = (
            batch.jagged::<i64>("hist").expect("hist"),
            batch.jagged::<i32>("cats").expect("cats"),
            batch.bytes("blob").expect("blob"),
        );
        for (k, r) in plan.batch(i).iter().enumerate() {
            let g = starts[r.shard_index as usize] + u64::from(r.row);
            assert_eq!(hist.row(k).expect("row"), datagen::hist_row(SEED, g), "hist row {g}");
            assert_eq!(cats.row(k).expect("row"), datagen::cats_row(SEED, g), "cats row {g}");
            assert_eq!(blob.row(k).expect("row"), &datagen::blob_row(SEED, g)[..], "blob row {g}");
        }
        rows += batch.rows();
    }
    assert_eq!(rows, 3_000);
}

/// A jagged chunk from a peer: the owner's bytes, checked by rows and
/// tensors; one that is not the shard the manifest describes is refused,
/// saying what differs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jagged_chunk_travels_between_peers_checked_by_its_rows_and_tensors() {
    use granary_proto::chunk::Expected;
    let f = fabric::start_spec(1_000, 500, true).await;
    let Expected::Shape { rows, tensors } = f.expected.clone() else { panic!("a jagged view has no fixed length") };
    let got = fabric::link(&f, "node")
        .fetch(f.addr, 0, f.version, f.shard, &f.expected, std::time::Duration::from_secs(10))
        .await
        .expect("fetched");
    let local = f.node.chunk(f.version, f.shard).await.expect("local");
    assert_eq!(got.bytes(), local.bytes(), "the owner's bytes");
    for (wrong, says) in [
        (Expected::Shape { rows: rows + 1, tensors: tensors.clone() }, "rows"),
        (
            Expected::Shape {
                rows,
                tensors: tensors.iter().map(|t| granary_proto::TensorLayout { jagged: false, ..t.clone() }).collect(),
            },
            "is not the view's",
        ),
    ] {
        match fabric::link(&f, "node")
            .fetch(f.addr, 0, f.version, f.shard, &wrong, std::time::Duration::from_secs(10))
            .await
        {
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("not the shard the manifest describes") && msg.contains(says), "{msg}");
            }
            Ok(_) => panic!("a chunk other than the manifest's was taken"),
        }
    }
}

/// A node in a cluster takes the jagged chunks another node owns from it,
/// reading nothing from remote storage itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_takes_a_jagged_shard_from_its_owner_without_reading_it() {
    use granary_node::fabric::{Cluster, FabricConfig};
    use granary_proto::NodeId;
    let f = fabric::start_spec(1_000, 500, true).await;
    let node2 = Node::start(&f.node_config()).await.expect("node 2");
    let shards = f.node.dataset(f.version).expect("dataset").manifest.shards();
    let cluster = Cluster::new(NodeId(2), fabric::link(&f, "node"), FabricConfig::default());
    let owners = std::iter::once((f.version, shards.iter().map(|s| (s.shard, NodeId(1))).collect())).collect();
    cluster.apply_placement(1, std::iter::once((NodeId(1), f.addr)).collect(), owners);
    assert!(node2.join_cluster(Arc::new(cluster)));
    // Starting read the file's footer; the shards come from the owner.
    let read_at_start = node2.stats().remote_bytes;
    for s in &shards {
        let theirs = f.node.chunk(f.version, s.shard).await.expect("owner's");
        let mine = node2.chunk(f.version, s.shard).await.expect("from the owner");
        assert_eq!(mine.bytes(), theirs.bytes(), "shard {}", s.shard);
    }
    let stats = node2.stats();
    assert_eq!((stats.remote_bytes, stats.conversions), (read_at_start, 0), "node 2 read nothing: {stats:?}");
    assert_eq!(stats.peer_fetched, shards.len() as u64, "{stats:?}");
}

/// A chunk of jagged tensors takes about the bytes Arrow decodes the same
/// columns into: the values once, offsets 8 bytes a row (Arrow's are 4 for
/// `List` and `Binary`), each tensor padded to 64 bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jagged_chunk_is_about_the_size_of_arrows_decoded_columns() {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let tmp = tempfile::tempdir().expect("tempdir");
    generate(tmp.path());
    let node = Node::start(&config(tmp.path())).await.expect("node");
    let info = node.describe("ads", None).expect("describe");
    let file = std::fs::read_dir(tmp.path())
        .expect("data")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .min()
        .expect("a parquet file");
    let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&file).expect("open"))
        .expect("reader")
        .with_row_groups(vec![0])
        .with_batch_size(1 << 20)
        .build()
        .expect("build");
    let mut decoded = 0usize;
    for batch in reader {
        let batch = batch.expect("decode");
        for name in ["label", "hist", "cats", "blob"] {
            decoded += batch.column_by_name(name).expect("column").to_data().get_slice_memory_size().expect("size");
        }
    }
    let shard = info.shards.iter().find(|s| {
        s.shard.row_group == 0
            && info.files[s.shard.file as usize].ends_with(file.file_name().and_then(|n| n.to_str()).expect("name"))
    });
    let chunk = node.chunk(info.version, shard.expect("the file's first shard").shard).await.expect("chunk");
    let ratio = chunk.bytes().len() as f64 / decoded as f64;
    assert!((0.95..=1.1).contains(&ratio), "chunk {} bytes, Arrow {decoded}: {ratio:.3}", chunk.bytes().len());
    // Memory and prefetch budgets estimate every chunk from the footer's
    // column chunk metadata: never below it, and close.
    let ds = node.dataset(info.version).expect("dataset");
    for s in &info.shards {
        let len = node.chunk(info.version, s.shard).await.expect("chunk").bytes().len() as f64;
        let estimate = ds.chunk_len_estimate(s.shard) as f64 / len;
        assert!((1.0..=1.2).contains(&estimate), "shard {}: estimate / chunk {estimate:.3}", s.shard);
    }
}
