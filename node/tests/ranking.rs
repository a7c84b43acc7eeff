//! Issue 44: ranking features as tables store them. String and byte
//! columns hashed into ids at conversion (`hash = { buckets = N }`:
//! XXH3-64, seed 0, modulo N), scalar or as a list (a jagged tensor of
//! ids), a dictionary column read by its values; the ids are the frozen
//! function's, so a model trained on them reads the same ids from any
//! later build. Struct fields, id-score lists and maps by their paths
//! (`user.age`, `tags.id` and `tags.weight`, `features.key` and
//! `features.value`), the tensors of one list sharing its offsets.
//! Transforms (`log1p`, `clip`, `standardize`, `bucketize`) applied once,
//! at conversion.

use arrow::array::{
    Array, ArrayRef, DictionaryArray, Float32Array, Int32Array, ListBuilder, StringArray, StringBuilder,
};
use arrow::datatypes::{DataType, Field, Int32Type};
use granary_node::Node;
use granary_proto::chunk::Verify;
use granary_proto::view::hash_id;
use granary_proto::{ChunkView, View};
use std::sync::Arc;

mod common;
use common::{batch, config_with_view, le, start_refused, write_parquet};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strings_become_the_frozen_functions_ids_once_at_conversion() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path());
    let node = Node::start(&config_with_view(dir.path(), VIEW)).await.expect("node");
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
    let message = start_refused(config_with_view(dir.path(), view));
    assert!(
        message.contains("a.parquet") && message.contains("\"price\"") && message.contains("hash applies"),
        "{message}"
    );
}

const NESTED_VIEW: &str = r#"
[[tensor]]
name = "age"
dtype = "i64"
columns = ["user.age"]
fill = -1
[[tensor]]
name = "tag_ids"
dtype = "i64"
columns = ["tags.id"]
hash = { buckets = 1000 }
null = "empty"
[[tensor]]
name = "tag_weights"
dtype = "f32"
columns = ["tags.weight"]
null = "empty"
[[tensor]]
name = "feat_keys"
dtype = "i64"
columns = ["features.key"]
hash = { buckets = 1000 }
[[tensor]]
name = "feat_values"
dtype = "f32"
columns = ["features.value"]
"#;

/// user: Struct<age> (its second row null); tags: List<Struct<id: Utf8,
/// weight: f32>> (an id-score list, its second row null); features:
/// Map<Utf8, f32>.
fn write_nested(dir: &std::path::Path) {
    use arrow::array::{Float32Builder, Int64Array, MapBuilder, StructArray};
    use arrow::buffer::{NullBuffer, OffsetBuffer};
    use arrow::datatypes::Fields;
    let user_fields = Fields::from(vec![Field::new("age", DataType::Int64, false)]);
    let user = StructArray::new(
        user_fields,
        vec![Arc::new(Int64Array::from(vec![30, 0, 41])) as ArrayRef],
        Some(NullBuffer::from(vec![true, false, true])),
    );
    let tag_fields =
        Fields::from(vec![Field::new("id", DataType::Utf8, false), Field::new("weight", DataType::Float32, false)]);
    let entries = StructArray::new(
        tag_fields.clone(),
        vec![
            Arc::new(StringArray::from(vec!["a", "b", "c"])) as ArrayRef,
            Arc::new(Float32Array::from(vec![0.5, 0.25, 1.0])),
        ],
        None,
    );
    let item = Arc::new(Field::new("item", DataType::Struct(tag_fields), true));
    let tags = arrow::array::ListArray::new(
        item,
        OffsetBuffer::from_lengths([2, 0, 1]),
        Arc::new(entries),
        Some(NullBuffer::from(vec![true, false, true])),
    );
    let mut m = MapBuilder::new(None, StringBuilder::new(), Float32Builder::new());
    for row in [vec![("ctr", 0.1f32)], vec![], vec![("ctr", 0.3), ("cvr", 0.05)]] {
        for (k, v) in row {
            m.keys().append_value(k);
            m.values().append_value(v);
        }
        m.append(true).unwrap();
    }
    let features = m.finish();
    let b = batch(
        vec![
            Field::new("user", user.data_type().clone(), true),
            Field::new("tags", tags.data_type().clone(), true),
            Field::new("features", features.data_type().clone(), true),
        ],
        vec![Arc::new(user), Arc::new(tags), Arc::new(features)],
    );
    write_parquet(&dir.join("nested.parquet"), &[b]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn struct_fields_id_score_lists_and_maps_are_read_by_their_paths() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_nested(dir.path());
    let node = Node::start(&config_with_view(dir.path(), NESTED_VIEW)).await.expect("node");
    let info = node.describe("ads", None).expect("describe");
    let jagged: Vec<bool> = info.tensors.iter().map(|t| t.jagged).collect();
    assert_eq!(jagged, [false, true, true, true, true]);
    let chunk = node.chunk(info.version, info.shards[0].shard).await.expect("converted");
    let v = ChunkView::parse(chunk.bytes(), Verify::Full).expect("valid chunk");
    let id = |s: &str| hash_id(s.as_bytes(), 1000) as i64;
    assert_eq!(le(v.tensor_at(0).unwrap().1, i64::from_le_bytes), [30, -1, 41], "a null struct takes the fill");
    let rows = |i: usize| {
        let j = v.jagged_at(i).expect("jagged");
        (0..j.rows()).map(|r| j.row(r).to_vec()).collect::<Vec<_>>()
    };
    let ids: Vec<Vec<i64>> = rows(1).iter().map(|r| le(r, i64::from_le_bytes)).collect();
    let weights: Vec<Vec<f32>> = rows(2).iter().map(|r| le(r, f32::from_le_bytes)).collect();
    assert_eq!(ids, [vec![id("a"), id("b")], vec![], vec![id("c")]]);
    assert_eq!(weights, [vec![0.5, 0.25], vec![], vec![1.0]]);
    let (a, b) = (v.jagged_at(1).unwrap(), v.jagged_at(2).unwrap());
    assert!((0..=3).all(|r| a.offset(r) == b.offset(r)), "the ids and their weights share offsets");
    let keys: Vec<Vec<i64>> = rows(3).iter().map(|r| le(r, i64::from_le_bytes)).collect();
    let values: Vec<Vec<f32>> = rows(4).iter().map(|r| le(r, f32::from_le_bytes)).collect();
    assert_eq!(keys, [vec![id("ctr")], vec![], vec![id("ctr"), id("cvr")]]);
    assert_eq!(values, [vec![0.1], vec![], vec![0.3, 0.05]]);
}

#[test]
fn a_path_to_no_field_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_nested(dir.path());
    let view = "[[tensor]]\nname = \"h\"\ndtype = \"i64\"\ncolumns = [\"user.height\"]\n";
    let message = start_refused(config_with_view(dir.path(), view));
    assert!(
        message.contains("nested.parquet") && message.contains("\"user.height\"") && message.contains("no such column"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transforms_run_at_conversion_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = batch(
        vec![Field::new("price", DataType::Float32, true), Field::new("clicks", DataType::Int32, false)],
        vec![
            Arc::new(Float32Array::from(vec![Some(0.0), None, Some(9.0), Some(250.0)])) as ArrayRef,
            Arc::new(Int32Array::from(vec![0, 1, 10, 1000])),
        ],
    );
    write_parquet(&dir.path().join("t.parquet"), &[b]);
    let view = r#"
[[tensor]]
name = "price_log"
dtype = "f32"
columns = ["price"]
transform = ["log1p", "clip(0,3)"]
fill = -1
[[tensor]]
name = "price_std"
dtype = "f64"
columns = ["price"]
transform = ["standardize(10, 2)"]
fill = 0
[[tensor]]
name = "price_bucket"
dtype = "i64"
columns = ["price"]
transform = ["bucketize(1, 10, 100)"]
fill = -1
[[tensor]]
name = "clicks_log"
dtype = "f32"
columns = ["clicks"]
transform = ["log1p"]
"#;
    let node = Node::start(&config_with_view(dir.path(), view)).await.expect("node");
    let info = node.describe("ads", None).expect("describe");
    let chunk = node.chunk(info.version, info.shards[0].shard).await.expect("converted");
    let v = ChunkView::parse(chunk.bytes(), Verify::Full).expect("valid chunk");
    let f32s = |i: usize| le(v.tensor_at(i).unwrap().1, f32::from_le_bytes);
    let ln = |x: f64| x.ln() as f32;
    assert_eq!(f32s(0), [0.0, -1.0, ln(10.0), 3.0], "log1p then clip; a null takes the fill as it is");
    assert_eq!(le(v.tensor_at(1).unwrap().1, f64::from_le_bytes), [-5.0, 0.0, -0.5, 120.0]);
    assert_eq!(le(v.tensor_at(2).unwrap().1, i64::from_le_bytes), [0, -1, 1, 3]);
    assert_eq!(f32s(3), [0.0, ln(2.0), ln(11.0), ln(1001.0)], "an integer column read as numbers");
}

#[test]
fn a_transform_that_does_not_fit_its_dtype_is_refused_naming_the_tensor() {
    let view = "[[tensor]]\nname = \"b\"\ndtype = \"f32\"\ncolumns = [\"price\"]\ntransform = [\"bucketize(1, 10)\"]\n";
    let e = toml::from_str::<View>(view).unwrap().validated().unwrap_err().to_string();
    assert!(e.contains("\"b\"") && e.contains("must be an integer"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_is_one_id_per_row_of_the_values_text_joined() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = batch(
        vec![
            Field::new("country", DataType::Utf8, true),
            Field::new("device", DataType::Int32, false),
            Field::new("is_new", DataType::Boolean, false),
        ],
        vec![
            Arc::new(StringArray::from(vec![Some("US"), None, Some("DE")])) as ArrayRef,
            Arc::new(Int32Array::from(vec![7, 8, -9])),
            Arc::new(arrow::array::BooleanArray::from(vec![true, false, false])),
        ],
    );
    write_parquet(&dir.path().join("c.parquet"), &[b]);
    let view = r#"
[[tensor]]
name = "country_device"
dtype = "i64"
columns = ["country", "device"]
cross = { buckets = 1000 }
fill = -1
[[tensor]]
name = "device_new"
dtype = "i32"
columns = ["device", "is_new"]
cross = { buckets = 50 }
"#;
    let node = Node::start(&config_with_view(dir.path(), view)).await.expect("node");
    let info = node.describe("ads", None).expect("describe");
    let chunk = node.chunk(info.version, info.shards[0].shard).await.expect("converted");
    let v = ChunkView::parse(chunk.bytes(), Verify::Full).expect("valid chunk");
    let cross = |vals: &[&str], n| granary_proto::view::cross_id(vals.iter().map(|s| s.as_bytes()), n) as i64;
    assert_eq!(
        le(v.tensor_at(0).unwrap().1, i64::from_le_bytes),
        [cross(&["US", "7"], 1000), -1, cross(&["DE", "-9"], 1000)],
        "a row with a null takes the fill"
    );
    assert_eq!(
        le(v.tensor_at(1).unwrap().1, i32::from_le_bytes),
        [cross(&["7", "true"], 50) as i32, cross(&["8", "false"], 50) as i32, cross(&["-9", "false"], 50) as i32]
    );
}
