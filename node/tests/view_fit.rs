//! Schema and values that do not fit the view, end to end: a column a
//! file lacks, of the wrong type, or with nulls; a value that does not fit
//! its cast. Each gets a clear error naming the file, row group, tensor and
//! column, or, where the view declares what to do (`cast`, `fill`), the
//! values it says (split from `bad_input.rs`).

use arrow::array::{ArrayRef, FixedSizeListArray, Float32Array, Int32Array, Int64Array, StringArray};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field};
use granary_proto::wire::ErrorKind;
use granary_testkit::datagen;
use std::sync::Arc;

mod common;
use common::*;

#[test]
fn column_missing_from_a_file_is_refused_naming_file_tensor_and_column() {
    // One file has the column, the other does not.
    let dir = tempfile::tempdir().unwrap();
    let both = batch(
        vec![Field::new("x", DataType::Float32, false), Field::new("y", DataType::Int64, false)],
        vec![Arc::new(Float32Array::from(vec![1.0, 2.0])), Arc::new(Int64Array::from(vec![1, 2]))],
    );
    let only_x =
        batch(vec![Field::new("x", DataType::Float32, false)], vec![Arc::new(Float32Array::from(vec![3.0, 4.0]))]);
    write_parquet(&dir.path().join("a.parquet"), &[both]);
    write_parquet(&dir.path().join("b.parquet"), &[only_x]);
    let view = parse_view(
        r#"
        [[tensor]]
        name = "x"
        dtype = "f32"
        columns = ["x"]
        [[tensor]]
        name = "why"
        dtype = "i64"
        columns = ["y"]
        "#,
    );
    let message = start_refused(config(dir.path(), view));
    assert_names(&message, &["b.parquet", "\"why\"", "\"y\"", "no such column"]);

    // A view asking datagen files for a column they do not have.
    let dir = tempfile::tempdir().unwrap();
    generate(dir.path(), 1, 300, 300, "snappy");
    let view = parse_view(&format!(
        "{}\n[[tensor]]\nname = \"w\"\ndtype = \"f32\"\ncolumns = [\"weight\"]\n",
        datagen::VIEW_TOML
    ));
    let message = start_refused(config(dir.path(), view));
    assert_names(&message, &["part-00000.parquet", "\"w\"", "\"weight\"", "no such column"]);
}

#[test]
fn column_of_the_wrong_type_is_refused_naming_file_tensor_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let b = batch(
        vec![Field::new("name", DataType::Utf8, false), Field::new("count", DataType::Int32, false)],
        vec![Arc::new(StringArray::from(vec!["a", "b"])), Arc::new(Int32Array::from(vec![1, 2]))],
    );
    write_parquet(&dir.path().join("t.parquet"), &[b]);

    // Strings cannot become a tensor at all.
    let view = parse_view("[[tensor]]\nname = \"n\"\ndtype = \"f32\"\ncast = true\ncolumns = [\"name\"]\n");
    let message = start_refused(config(dir.path(), view));
    assert_names(&message, &["t.parquet", "\"n\"", "\"name\"", "Utf8"]);

    // An i32 column for an i16 tensor needs an explicit cast (it may not
    // fit).
    let view = parse_view("[[tensor]]\nname = \"c\"\ndtype = \"i16\"\ncolumns = [\"count\"]\n");
    let message = start_refused(config(dir.path(), view));
    assert_names(&message, &["t.parquet", "\"c\"", "\"count\"", "Int32", "cast"]);

    // For an i64 tensor it widens without one (issue 43: a column widened
    // across files).
    let view = parse_view("[[tensor]]\nname = \"c\"\ndtype = \"i64\"\ncolumns = [\"count\"]\n");
    let node = start(config(dir.path(), view));
    let info = describe(&node);
    let chunk = fetch(&node, info.version, info.shards[0].shard).unwrap();
    assert_eq!(i64s(chunk.tensor_bytes(0)), vec![1, 2]);
}

#[test]
fn value_that_does_not_fit_the_cast_is_an_error_naming_file_row_group_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let fields = || vec![Field::new("v", DataType::Int64, false)];
    let rg0 = batch(fields(), vec![Arc::new(Int64Array::from(vec![1, -2, 127]))]);
    let rg1 = batch(fields(), vec![Arc::new(Int64Array::from(vec![5, 300, 7]))]);
    write_parquet(&dir.path().join("v.parquet"), &[rg0, rg1]);
    let view = parse_view("[[tensor]]\nname = \"small\"\ndtype = \"i8\"\ncast = true\ncolumns = [\"v\"]\n");
    let node = start(config(dir.path(), view));
    let info = describe(&node);
    assert_eq!(info.shards.len(), 2);
    let chunk = fetch(&node, info.version, info.shards[0].shard).unwrap();
    assert_eq!(chunk.tensor_bytes(0), &[1u8, (-2i8) as u8, 127]);
    let (kind, message) = fetch_refused(&node, info.version, info.shards[1].shard);
    assert_eq!(kind, ErrorKind::BadInput, "{message}");
    assert_names(&message, &["v.parquet", "row group 1", "\"v\""]);
}

/// One nullable-column case: a file of two row groups (nulls only in the
/// second), the columns of an f32 tensor `t`, the column the error must
/// name, and the tensor's values for row group 0, and for row group 1 once
/// the view declares `fill = -1`.
struct NullCase {
    file: &'static str,
    fields: Vec<Field>,
    rg0: Vec<ArrayRef>,
    rg1: Vec<ArrayRef>,
    columns: &'static str,
    culprit: &'static str,
    rg0_values: Vec<f32>,
    filled_rg1: Vec<f32>,
}

fn null_cases() -> Vec<NullCase> {
    let list_field = |nullable_child: bool| {
        Field::new(
            "v",
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, nullable_child)), 2),
            true,
        )
    };
    let list = |values: Vec<Option<f32>>, valid: Option<Vec<bool>>, nullable_child: bool| -> ArrayRef {
        let item = Arc::new(Field::new("item", DataType::Float32, nullable_child));
        Arc::new(FixedSizeListArray::new(item, 2, Arc::new(Float32Array::from(values)), valid.map(NullBuffer::from)))
    };
    vec![
        // A scalar column.
        NullCase {
            file: "scalar.parquet",
            fields: vec![Field::new("x", DataType::Float32, true)],
            rg0: vec![Arc::new(Float32Array::from(vec![Some(0.5), Some(1.5), Some(2.5)]))],
            rg1: vec![Arc::new(Float32Array::from(vec![Some(3.5), None, Some(5.5)]))],
            columns: r#"["x"]"#,
            culprit: "\"x\"",
            rg0_values: vec![0.5, 1.5, 2.5],
            filled_rg1: vec![3.5, -1.0, 5.5],
        },
        // Stacked columns, the null in the second one.
        NullCase {
            file: "stacked.parquet",
            fields: vec![Field::new("a", DataType::Float32, true), Field::new("b", DataType::Float32, true)],
            rg0: vec![
                Arc::new(Float32Array::from(vec![Some(1.0), Some(2.0)])),
                Arc::new(Float32Array::from(vec![Some(10.0), Some(20.0)])),
            ],
            rg1: vec![
                Arc::new(Float32Array::from(vec![Some(3.0), Some(4.0)])),
                Arc::new(Float32Array::from(vec![None, Some(40.0)])),
            ],
            columns: r#"["a", "b"]"#,
            culprit: "\"b\"",
            rg0_values: vec![1.0, 10.0, 2.0, 20.0],
            filled_rg1: vec![3.0, -1.0, 4.0, 40.0],
        },
        // A FixedSizeList whose second row is null.
        NullCase {
            file: "list.parquet",
            fields: vec![list_field(false)],
            rg0: vec![list(vec![Some(1.0), Some(2.0), Some(3.0), Some(4.0)], None, false)],
            rg1: vec![list(vec![Some(5.0), Some(6.0), Some(0.0), Some(0.0)], Some(vec![true, false]), false)],
            columns: r#"["v"]"#,
            culprit: "\"v\"",
            rg0_values: vec![1.0, 2.0, 3.0, 4.0],
            filled_rg1: vec![5.0, 6.0, -1.0, -1.0],
        },
        // A FixedSizeList with one null element inside a valid row.
        NullCase {
            file: "element.parquet",
            fields: vec![list_field(true)],
            rg0: vec![list(vec![Some(1.0), Some(2.0), Some(3.0), Some(4.0)], None, true)],
            rg1: vec![list(vec![Some(5.0), None, Some(7.0), Some(8.0)], None, true)],
            columns: r#"["v"]"#,
            culprit: "\"v\"",
            rg0_values: vec![1.0, 2.0, 3.0, 4.0],
            filled_rg1: vec![5.0, -1.0, 7.0, 8.0],
        },
    ]
}

#[test]
fn nulls_without_a_fill_value_are_an_error_naming_file_row_group_and_column() {
    for case in null_cases() {
        let dir = tempfile::tempdir().unwrap();
        let rg0 = batch(case.fields.clone(), case.rg0.clone());
        let rg1 = batch(case.fields.clone(), case.rg1.clone());
        write_parquet(&dir.path().join(case.file), &[rg0, rg1]);
        let tensor = format!("[[tensor]]\nname = \"t\"\ndtype = \"f32\"\ncolumns = {}\n", case.columns);

        // Without a fill value: row group 0 (no nulls) is served, row group 1 is refused.
        let node = start(config(dir.path(), parse_view(&tensor)));
        let info = describe(&node);
        assert_eq!(info.shards.len(), 2, "{}", case.file);
        let chunk = fetch(&node, info.version, info.shards[0].shard).unwrap();
        assert_eq!(f32s(chunk.tensor_bytes(0)), case.rg0_values, "{}", case.file);
        let (kind, message) = fetch_refused(&node, info.version, info.shards[1].shard);
        assert_eq!(kind, ErrorKind::BadInput, "{message}");
        assert_names(&message, &[case.file, "row group 1", case.culprit, "null", "fill"]);
        drop(node);

        // With one, the nulls become the fill value and nothing else changes.
        let node = start(config(dir.path(), parse_view(&format!("{tensor}fill = -1.0\n"))));
        let info = describe(&node);
        let chunk = fetch(&node, info.version, info.shards[1].shard).unwrap();
        assert_eq!(f32s(chunk.tensor_bytes(0)), case.filled_rg1, "{}", case.file);
    }
}
