//! Issue 44: string and byte columns hashed into ids at conversion
//! (`hash = { buckets = N }`: XXH3-64, seed 0, modulo N), scalar or as a
//! list (a jagged tensor of ids), a dictionary column read by its values;
//! the ids are the frozen function's, so a model trained on them reads
//! the same ids from any later build.

use arrow::array::{
    Array, ArrayRef, DictionaryArray, Float32Array, Int32Array, ListBuilder, StringArray, StringBuilder,
};
use arrow::datatypes::{DataType, Field, Int32Type};
use granary_node::Node;
use granary_node::config::{DatasetConfig, NodeConfig, ViewRef};
use granary_proto::chunk::Verify;
use granary_proto::view::hash_id;
use granary_proto::{ChunkView, View};
use std::sync::Arc;

mod common;
use common::{batch, start_refused, write_parquet};

const VIEW: &str = r#"
[[tensor]]
name = "country"
dtype = "i64"
columns = ["country"]
hash = { buckets = 1000 }
fill = -1
[[tensor]]
name = "cats"
dtype = "i64"
columns = ["cats"]
hash = { buckets = 100 }
null = "empty"
[[tensor]]
name = "seg"
dtype = "i32"
columns = ["seg"]
hash = { buckets = 50 }
[[tensor]]
name = "price"
dtype = "f32"
columns = ["price"]
"#;

fn config(data: &std::path::Path, view: &str) -> NodeConfig {
    let view: View = toml::from_str::<View>(view).expect("view").validated().expect("valid");
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

fn write(dir: &std::path::Path) {
    let country: ArrayRef = Arc::new(StringArray::from(vec![Some("US"), None, Some("DE")]));
    let mut cats = ListBuilder::new(StringBuilder::new());
    cats.append_value([Some("shoes"), Some("red")]);
    cats.append_null();
    cats.append_value([Some("hats")]);
    let cats: ArrayRef = Arc::new(cats.finish());
    let seg: ArrayRef = Arc::new(
        DictionaryArray::<Int32Type>::try_new(
            Int32Array::from(vec![1, 0, 1]),
            Arc::new(StringArray::from(vec!["new", "returning"])),
        )
        .unwrap(),
    );
    let price: ArrayRef = Arc::new(
        DictionaryArray::<Int32Type>::try_new(
            Int32Array::from(vec![0, 0, 1]),
            Arc::new(Float32Array::from(vec![9.5, 20.0])),
        )
        .unwrap(),
    );
    let b = batch(
        vec![
            Field::new("country", DataType::Utf8, true),
            Field::new("cats", cats.data_type().clone(), true),
            Field::new("seg", seg.data_type().clone(), false),
            Field::new("price", price.data_type().clone(), false),
        ],
        vec![country, cats, seg, price],
    );
    write_parquet(&dir.join("a.parquet"), &[b]);
}

fn le<const E: usize, T>(bytes: &[u8], f: impl Fn([u8; E]) -> T) -> Vec<T> {
    bytes.chunks_exact(E).map(|c| f(c.try_into().expect("E bytes"))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strings_become_the_frozen_functions_ids_once_at_conversion() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path());
    let node = Node::start(&config(dir.path(), VIEW)).await.expect("node");
    let info = node.describe("ads", None).expect("describe");
    let chunk = node.chunk(info.version, info.shards[0].shard).await.expect("converted");
    let v = ChunkView::parse(chunk.bytes(), Verify::Full).expect("valid chunk");
    let id = |s: &str, n| hash_id(s.as_bytes(), n) as i64;
    assert_eq!(le(v.tensor_at(0).unwrap().1, i64::from_le_bytes), [id("US", 1000), -1, id("DE", 1000)]);
    let cats = v.jagged_at(1).expect("cats");
    let rows: Vec<Vec<i64>> = (0..cats.rows()).map(|r| le(cats.row(r), i64::from_le_bytes)).collect();
    assert_eq!(rows, [vec![id("shoes", 100), id("red", 100)], vec![], vec![id("hats", 100)]]);
    let seg = le(v.tensor_at(2).unwrap().1, i32::from_le_bytes);
    assert_eq!(seg, [id("returning", 50) as i32, id("new", 50) as i32, id("returning", 50) as i32]);
    assert_eq!(le(v.tensor_at(3).unwrap().1, f32::from_le_bytes), [9.5, 9.5, 20.0], "a dictionary read by its values");
}

#[test]
fn hash_on_a_numeric_column_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path());
    let view = "[[tensor]]\nname = \"p\"\ndtype = \"i64\"\ncolumns = [\"price\"]\nhash = { buckets = 10 }\n";
    let message = start_refused(config(dir.path(), view));
    assert!(
        message.contains("a.parquet") && message.contains("\"price\"") && message.contains("hash applies"),
        "{message}"
    );
}
