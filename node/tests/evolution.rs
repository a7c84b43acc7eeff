//! Schema evolution (issue 43): a dataset whose older files were written
//! before a column was added, or with a narrower integer, is served: the
//! absent column's rows take the view's `fill` (of a list, `null =
//! "empty"` makes them empty), and the narrower integer is widened, each
//! file's rows exactly as its file holds them. Without a fill, the error
//! names the file that lacks the column and what to declare.

use arrow::array::{Array, ArrayRef, Float32Array, Int32Array, Int64Array, ListArray};
use arrow::datatypes::{DataType, Field, Int64Type};
use granary_node::Node;
use granary_proto::ChunkView;
use granary_proto::chunk::Verify;
use std::sync::Arc;

mod common;
use common::{batch, config_with_view, le, start_refused, write_parquet};

const VIEW: &str = r#"
[[tensor]]
name = "x"
dtype = "f32"
columns = ["x"]
[[tensor]]
name = "clicks"
dtype = "i64"
columns = ["clicks"]
[[tensor]]
name = "score"
dtype = "f32"
columns = ["score"]
fill = -1.0
[[tensor]]
name = "tags"
dtype = "i64"
columns = ["tags"]
null = "empty"
"#;

/// Day 1: `x` and `clicks` as int32. Day 2: `clicks` widened to int64,
/// `score` and `tags` added.
fn write_days(dir: &std::path::Path) {
    let day1 = batch(
        vec![Field::new("x", DataType::Float32, false), Field::new("clicks", DataType::Int32, false)],
        vec![Arc::new(Float32Array::from(vec![1.0, 2.0, 3.0])), Arc::new(Int32Array::from(vec![10, 20, 30]))],
    );
    let tags = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
        Some(vec![Some(7)]),
        Some(vec![]),
        Some(vec![Some(8), Some(9)]),
    ]);
    let day2 = batch(
        vec![
            Field::new("x", DataType::Float32, false),
            Field::new("clicks", DataType::Int64, false),
            Field::new("score", DataType::Float32, false),
            Field::new("tags", tags.data_type().clone(), true),
        ],
        vec![
            Arc::new(Float32Array::from(vec![4.0, 5.0, 6.0])),
            Arc::new(Int64Array::from(vec![1 << 40, 50, 60])),
            Arc::new(Float32Array::from(vec![0.5, 0.25, 0.125])),
            Arc::new(tags) as ArrayRef,
        ],
    );
    write_parquet(&dir.join("day=01.parquet"), &[day1]);
    write_parquet(&dir.join("day=02.parquet"), &[day2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_files_take_the_fill_and_empty_rows_and_a_narrower_integer_is_widened() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_days(dir.path());
    let node = Node::start(&config_with_view(dir.path(), VIEW)).await.expect("node");
    let info = node.describe("ads", None).expect("describe");
    assert_eq!(info.shards.len(), 2);
    let mut got = Vec::new();
    for s in &info.shards {
        let chunk = node.chunk(info.version, s.shard).await.expect("converted");
        let v = ChunkView::parse(chunk.bytes(), Verify::Full).expect("valid chunk");
        let tags = v.jagged_at(3).expect("tags");
        let tag_rows: Vec<Vec<i64>> = (0..tags.rows()).map(|r| le(tags.row(r), i64::from_le_bytes)).collect();
        got.push((
            le(v.tensor_at(0).expect("tensor").1, f32::from_le_bytes),
            le(v.tensor_at(1).expect("tensor").1, i64::from_le_bytes),
            le(v.tensor_at(2).expect("tensor").1, f32::from_le_bytes),
            tag_rows,
        ));
    }
    assert_eq!(got[0], (vec![1.0, 2.0, 3.0], vec![10, 20, 30], vec![-1.0; 3], vec![vec![]; 3]), "day 1");
    assert_eq!(
        got[1],
        (vec![4.0, 5.0, 6.0], vec![1 << 40, 50, 60], vec![0.5, 0.25, 0.125], vec![vec![7], vec![], vec![8, 9]]),
        "day 2"
    );
}

#[test]
fn without_a_fill_the_file_that_lacks_the_column_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_days(dir.path());
    let message = start_refused(config_with_view(dir.path(), &VIEW.replace("fill = -1.0\n", "")));
    assert!(
        message.contains("day=01.parquet") && message.contains("\"score\"") && message.contains("declare a fill"),
        "{message}"
    );
}

/// Hive-style folders are columns (issue 43): `hour=7/` gives every row
/// of the files below it an integer `hour`; `country=US/` a string, which
/// a tensor takes hashed; `__HIVE_DEFAULT_PARTITION__` (a null) takes the
/// fill. The files themselves hold neither column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_folders_are_columns_of_their_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = |xs: Vec<f32>| {
        batch(vec![Field::new("x", DataType::Float32, false)], vec![Arc::new(Float32Array::from(xs)) as ArrayRef])
    };
    for (folder, xs) in [
        ("country=US/hour=7", vec![1.0, 2.0]),
        ("country=DE/hour=13", vec![3.0]),
        ("country=__HIVE_DEFAULT_PARTITION__/hour=8", vec![4.0]),
    ] {
        std::fs::create_dir_all(dir.path().join(folder)).unwrap();
        write_parquet(&dir.path().join(folder).join("part-0.parquet"), &[rows(xs)]);
    }
    let view = r#"
[[tensor]]
name = "x"
dtype = "f32"
columns = ["x"]
[[tensor]]
name = "hour"
dtype = "i64"
columns = ["hour"]
[[tensor]]
name = "country"
dtype = "i64"
columns = ["country"]
hash = { buckets = 1000 }
fill = -1
"#;
    let node = Node::start(&config_with_view(dir.path(), view)).await.expect("node");
    let info = node.describe("ads", None).expect("describe");
    let mut got: Vec<(Vec<f32>, Vec<i64>, Vec<i64>)> = Vec::new();
    for s in &info.shards {
        let chunk = node.chunk(info.version, s.shard).await.expect("converted");
        let v = ChunkView::parse(chunk.bytes(), Verify::Full).expect("valid chunk");
        got.push((
            le(v.tensor_at(0).expect("x").1, f32::from_le_bytes),
            le(v.tensor_at(1).expect("hour").1, i64::from_le_bytes),
            le(v.tensor_at(2).expect("country").1, i64::from_le_bytes),
        ));
    }
    got.sort_by(|a, b| a.0[0].total_cmp(&b.0[0]));
    let id = |s: &str| granary_proto::view::hash_id(s.as_bytes(), 1000) as i64;
    assert_eq!(
        got,
        [
            (vec![1.0, 2.0], vec![7, 7], vec![id("US"), id("US")]),
            (vec![3.0], vec![13], vec![id("DE")]),
            (vec![4.0], vec![8], vec![-1]),
        ]
    );
}

/// Issue 43, item 3: a source names a window of days with a brace range
/// (`day={2..4}/`); only those folders' files are served, each with its
/// partition, and the window moved by a day names the days it keeps by
/// the same content, so their chunks are reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brace_range_serves_a_window_of_days() {
    let dir = tempfile::tempdir().expect("tempdir");
    for day in 1..=5 {
        let folder = dir.path().join(format!("day={day}"));
        std::fs::create_dir_all(&folder).unwrap();
        let xs = Float32Array::from(vec![day as f32, day as f32 + 0.5]);
        let rows = batch(vec![Field::new("x", DataType::Float32, false)], vec![Arc::new(xs) as ArrayRef]);
        write_parquet(&folder.join("part-0.parquet"), &[rows]);
    }
    let view = "[[tensor]]\nname = \"x\"\ndtype = \"f32\"\ncolumns = [\"x\"]\n\
                [[tensor]]\nname = \"day\"\ndtype = \"i64\"\ncolumns = [\"day\"]\n";
    let window = |days: &str| {
        let mut cfg = config_with_view(dir.path(), view);
        cfg.datasets[0].source = format!("file://{}/day={days}/", dir.path().display());
        cfg
    };
    let node = Node::start(&window("{2..4}")).await.expect("node");
    let info = node.describe("ads", None).expect("describe");
    let mut got = Vec::new();
    for s in &info.shards {
        let chunk = node.chunk(info.version, s.shard).await.expect("converted");
        let v = ChunkView::parse(chunk.bytes(), Verify::Full).expect("valid chunk");
        got.push((
            le(v.tensor_at(0).expect("x").1, f32::from_le_bytes),
            le(v.tensor_at(1).expect("day").1, i64::from_le_bytes),
        ));
    }
    got.sort_by(|a, b| a.0[0].total_cmp(&b.0[0]));
    assert_eq!(got, [(vec![2.0, 2.5], vec![2, 2]), (vec![3.0, 3.5], vec![3, 3]), (vec![4.0, 4.5], vec![4, 4])]);
    let a = node.dataset(info.version).expect("dataset");
    node.close().await;

    let moved = Node::start(&window("{3..5}")).await.expect("node");
    let b = moved.dataset(moved.describe("ads", None).expect("describe").version).expect("dataset");
    assert_ne!(a.version, b.version);
    let key = |d: &granary_source::Dataset, day: &str| {
        let file = d.manifest.files.iter().position(|f| f.path.contains(day)).expect("the day's file") as u32;
        d.manifest.content_key(&d.view, file, 0).expect("a key")
    };
    assert_eq!(key(&a, "day=3/"), key(&b, "day=3/"), "a day both windows hold is the same content");
    assert_eq!(key(&a, "day=4/"), key(&b, "day=4/"));
    assert!(b.manifest.files.iter().all(|f| !f.path.contains("day=2/")), "day 2 left the window");

    // A window that selects nothing says so, naming the whole source.
    let err = Node::start(&window("{7..9}")).await.err().expect("refused").to_string();
    assert!(err.contains("day={7..9}/") && err.contains("no .parquet file"), "{err}");
}
