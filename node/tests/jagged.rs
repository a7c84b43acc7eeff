//! Issue 30: a node converts list and byte columns into jagged tensors:
//! each chunk holds every row's values, as the generator wrote them, and a
//! loader hands every row out in plan order.

use granary_node::config::{DatasetConfig, NodeConfig, ViewRef};
use granary_node::{EmbeddedNode, Node};
use granary_proto::chunk::Verify;
use granary_proto::{ChunkView, View};
use granary_testkit::datagen::{self, GenSpec};
use std::sync::Arc;

const SEED: u64 = 30;

/// `label`, and the three variable-length columns as jagged tensors.
const VIEW: &str = r#"
[[tensor]]
name = "label"
dtype = "f32"
columns = ["label"]

[[tensor]]
name = "hist"
dtype = "i64"
columns = ["hist"]

[[tensor]]
name = "cats"
dtype = "i32"
columns = ["cats"]

[[tensor]]
name = "blob"
dtype = "u8"
columns = ["blob"]
"#;

fn config(data: &std::path::Path) -> NodeConfig {
    let view: View = toml::from_str::<View>(VIEW).expect("view").validated().expect("valid");
    NodeConfig {
        datasets: vec![DatasetConfig {
            name: "ads".into(),
            source: format!("file://{}", data.display()),
            view: ViewRef::Inline(view),
        }],
        ram_bytes: 64 << 20,
        prefetch_bytes: 0,
        ..NodeConfig::default()
    }
}

fn generate(data: &std::path::Path) {
    let spec = GenSpec { seed: SEED, rows: 3_000, files: 2, row_group_rows: 500, jagged: true, ..GenSpec::default() };
    datagen::generate(data, &spec, |_| {}).expect("generate");
}

fn le<const E: usize, T>(bytes: &[u8], f: impl Fn([u8; E]) -> T) -> Vec<T> {
    bytes.chunks_exact(E).map(|c| f(c.try_into().expect("E bytes"))).collect()
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
