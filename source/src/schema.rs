//! A view checked against one file's Arrow schema: [`resolve_view`] names
//! the file, tensor and column that do not fit, and works out every
//! tensor's shape and the columns to read. The node's converter builds
//! chunks from the [`Resolved`] view; the coordinator uses the same check
//! when a dataset is registered, so a view that does not fit is refused
//! before any node converts a shard of it.

use crate::error::SchemaError;
use arrow::datatypes::{DataType, SchemaRef};
use granary_proto::{DType, TensorLayout, View};

/// How a tensor is built.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// One scalar column.
    Scalar,
    /// Several scalar columns of one type.
    Stacked,
    /// One `FixedSizeList<T, k>` column.
    List(usize),
    /// One `List<T>` or `LargeList<T>` column (a variable number of values
    /// per row), or a `Binary`, `LargeBinary`, `Utf8` or `LargeUtf8` column
    /// (its bytes, a `u8` tensor): a jagged tensor.
    Jagged,
    /// A list or byte column padded to a dense `[n]` tensor (`pad_to`).
    Padded(usize),
    /// Each row's length of a padded list or byte column (the `<name>_len`
    /// tensor `pad_to` adds, i32), after truncation.
    Lengths,
    /// Two or more scalar columns crossed into one id per row (`cross`;
    /// its buckets in [`ResolvedTensor::hash`]).
    Crossed,
}

/// One tensor of a view, resolved against a schema.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedTensor {
    /// The tensor's name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// How it is built from its columns.
    pub kind: Kind,
    /// The columns, in view order.
    pub columns: Vec<String>,
    /// The value that replaces a null, if the view declares one (and pads
    /// a short row of a padded tensor).
    pub fill: Option<f64>,
    /// Of a list or byte column: the most values a row keeps (`max_len`,
    /// or `pad_to`).
    pub max_len: Option<u32>,
    /// Which values a longer row keeps; `None`: a longer row is an error.
    pub truncate: Option<granary_proto::Truncate>,
    /// Of a list or byte column: a null row is empty (else an error).
    pub null_empty: bool,
    /// Of a string or byte column, or a list of them: the buckets each
    /// value's id is hashed into ([`granary_proto::view::hash_id`]).
    pub hash: Option<u64>,
    /// Steps applied to each value at conversion ([`granary_proto::transform`]).
    pub transform: Vec<granary_proto::transform::Step>,
}

/// Whether values of `dt` are strings or bytes (what `hash` takes),
/// a dictionary of them included.
fn bytes_like(dt: &DataType) -> bool {
    match dt {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Binary | DataType::LargeBinary => true,
        DataType::Dictionary(_, v) => bytes_like(v),
        _ => false,
    }
}

/// A view resolved against one file's schema.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resolved {
    /// Tensor layouts, in view order (a `pad_to` tensor followed by its
    /// lengths).
    pub layouts: Vec<TensorLayout>,
    /// Root column indices to read (the projection).
    pub projection: Vec<usize>,
    /// How each tensor is built, one per layout.
    pub tensors: Vec<ResolvedTensor>,
    /// Columns the view names that this file lacks, each with the Arrow
    /// type that stands in for it: every row null, so the tensor's `fill`
    /// (or, of a list, `null = "empty"`) gives its rows (schema evolution:
    /// a column added after older files were written).
    pub absent: Vec<(String, DataType)>,
    /// Columns the view names that this file's Hive-style folders give
    /// (`date=2026-11-01/`, `hour=7/`): each row of the file holds the
    /// folder's value, an Int64 when it reads as one, else a Utf8 (which
    /// a tensor takes hashed) ([`partitions`]).
    pub partitions: Vec<(String, String)>,
}

/// The Hive-style partitions of the object at `path`: each folder named
/// `key=value` (the file's own name is not one), the value
/// percent-decoded; Hive's `__HIVE_DEFAULT_PARTITION__` (a null) is left
/// out, so a tensor over it takes its fill as for a column the file lacks.
pub fn partitions(path: &str) -> Vec<(String, String)> {
    let folders = path.rsplit_once('/').map_or("", |(f, _)| f);
    folders
        .split('/')
        .filter_map(|seg| seg.split_once('='))
        .filter(|(k, v)| !k.is_empty() && *v != "__HIVE_DEFAULT_PARTITION__")
        .map(|(k, v)| (k.to_string(), percent_decoded(v)))
        .collect()
}

fn percent_decoded(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The Arrow type a partition value stands as.
pub fn partition_type(value: &str) -> DataType {
    if value.parse::<i64>().is_ok() { DataType::Int64 } else { DataType::Utf8 }
}

/// Whether a file's `from` type converts to `to` without loss, so files
/// written before a column was widened need no `cast = true`: a narrower
/// signed or unsigned integer to a wider signed one, a narrower float to a
/// wider one.
pub fn widens(from: &DataType, to: DType) -> bool {
    use DataType as A;
    matches!(
        (from, to),
        (A::Int8, DType::I16 | DType::I32 | DType::I64)
            | (A::Int16, DType::I32 | DType::I64)
            | (A::Int32, DType::I64)
            | (A::UInt8, DType::I16 | DType::I32 | DType::I64)
            | (A::UInt16, DType::I32 | DType::I64)
            | (A::UInt32, DType::I64)
            | (A::Float16, DType::F32 | DType::F64)
            | (A::Float32, DType::F64)
    )
}

/// The Arrow type that stands in for a column `spec` names and a file
/// lacks, or `None` when its rows cannot be given without it: a dense
/// tensor needs a `fill`, a list (a tensor with list options) `null =
/// "empty"`; a `FixedSizeList`'s width no absent column can say.
fn stand_in(spec: &granary_proto::TensorSpec) -> Option<DataType> {
    let elem = arrow_type(spec.dtype).unwrap_or(DataType::Float32);
    if spec.has_jagged_options() {
        let empty = spec.null_rows == granary_proto::NullRows::Empty;
        empty.then(|| DataType::List(std::sync::Arc::new(arrow::datatypes::Field::new_list_field(elem, true))))
    } else {
        spec.fill.map(|_| elem)
    }
}

/// The Arrow type a dtype is stored as without a cast (`None` for bf16,
/// which Arrow has no type for).
pub fn arrow_type(dtype: DType) -> Option<DataType> {
    Some(match dtype {
        DType::F32 => DataType::Float32,
        DType::F64 => DataType::Float64,
        DType::F16 => DataType::Float16,
        DType::BF16 => return None,
        DType::I64 => DataType::Int64,
        DType::I32 => DataType::Int32,
        DType::I16 => DataType::Int16,
        DType::I8 => DataType::Int8,
        DType::U8 => DataType::UInt8,
        DType::Bool => DataType::Boolean,
    })
}

fn castable(dt: &DataType) -> bool {
    dt.is_numeric() || *dt == DataType::Boolean
}

/// What may help when the view names `col` and the file has no such
/// column: the zero-padded column of the same number (a pattern pads when
/// its start does), the range of the file's columns with the same prefix
/// (a pattern stops before its end), or the file's first columns.
fn missing_hint(col: &str, schema: &SchemaRef) -> String {
    let split = |name: &str| {
        let digits = name.len() - name.bytes().rev().take_while(u8::is_ascii_digit).count();
        (name[..digits].to_string(), name[digits..].to_string())
    };
    let (prefix, digits) = split(col);
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    if !digits.is_empty() {
        let number: Option<u64> = digits.parse().ok();
        let same_prefix: Vec<(&str, u64)> = names
            .iter()
            .filter_map(|n| {
                let (p, d) = split(n);
                (p == prefix && !d.is_empty()).then(|| d.parse().ok().map(|v| (*n, v))).flatten()
            })
            .collect();
        if let Some((found, _)) = same_prefix.iter().find(|(_, v)| Some(*v) == number) {
            let end = same_prefix.iter().map(|x| x.1).max().unwrap_or(0) + 1;
            let width = found.len() - prefix.len();
            if width > 1 && found.as_bytes()[prefix.len()] == b'0' {
                let zeros = "0".repeat(width);
                return format!(
                    " (the file has {found}: its names are zero-padded; a pattern pads when its start does, as \
                     in {prefix}{{{zeros}..{end}}})"
                );
            }
            return format!(
                " (the file has {found}: its names are not zero-padded, so neither may a pattern's start be, as \
                 in {prefix}{{0..{end}}})"
            );
        }
        if let (Some(lo), Some(hi)) = (same_prefix.iter().map(|x| x.1).min(), same_prefix.iter().map(|x| x.1).max()) {
            return format!(
                " (the file's {prefix}N columns run from {prefix}{lo} to {prefix}{hi}; a pattern {prefix}{{a..b}} \
                 names {prefix}a up to {prefix}(b-1))"
            );
        }
    }
    let shown: Vec<&str> = names.iter().take(8).copied().collect();
    let more = if names.len() > shown.len() { format!(", … {} in all", names.len()) } else { String::new() };
    format!(" (the file's columns: {}{more})", shown.join(", "))
}

/// Checks `view` against `schema` and works out every tensor's shape.
pub fn resolve_view(view: &View, schema: &SchemaRef, file: &str) -> Result<Resolved, SchemaError> {
    let mut layouts = Vec::new();
    let mut tensors = Vec::new();
    let mut projection = Vec::new();
    let mut absent: Vec<(String, DataType)> = Vec::new();
    let folders = partitions(file);
    let mut from_folders: Vec<(String, String)> = Vec::new();
    for spec in &view.tensors {
        let err = |column: &str, problem: String| SchemaError {
            file: file.to_string(),
            tensor: spec.name.clone(),
            column: column.to_string(),
            problem,
        };
        let mut elem: Option<DataType> = None;
        let mut kind = Kind::Scalar;
        for col in &spec.columns {
            let partition = folders.iter().find(|(k, _)| k == col).filter(|_| crate::path::find(schema, col).is_none());
            let found = match partition {
                Some((_, value)) => {
                    if !from_folders.iter().any(|(n, _)| n == col) {
                        from_folders.push((col.clone(), value.clone()));
                    }
                    Some((None, partition_type(value)))
                }
                None => crate::path::find(schema, col).map(|(i, dt)| (Some(i), dt)),
            };
            let Some((idx, data_type)) = found else {
                let Some(standin) = stand_in(spec) else {
                    let declare = if spec.has_jagged_options() {
                        "null = \"empty\" (its rows empty)"
                    } else {
                        "a fill (its rows take it)"
                    };
                    return Err(err(
                        col,
                        format!(
                            "no such column in the file{}; if the files written before it was added lack it, \
                             declare {declare} where a file lacks it",
                            missing_hint(col, schema)
                        ),
                    ));
                };
                kind = match &standin {
                    _ if spec.cross.is_some() => Kind::Crossed,
                    DataType::List(_) => Kind::Jagged,
                    _ if spec.columns.len() > 1 => Kind::Stacked,
                    _ => Kind::Scalar,
                };
                if !absent.iter().any(|(n, _)| n == col) {
                    absent.push((col.clone(), standin));
                }
                continue;
            };
            if let Some(idx) = idx
                && !projection.contains(&idx)
            {
                projection.push(idx);
            }
            let hashed = spec.hash.is_some();
            let (this_elem, this_kind) = match &data_type {
                // Crossed: each value's text, the row's joined and hashed.
                dt if spec.cross.is_some() => {
                    let scalar = |d: &DataType| bytes_like(d) || d.is_integer() || *d == DataType::Boolean;
                    let ok = match dt {
                        DataType::Dictionary(_, v) => scalar(v),
                        d => scalar(d),
                    };
                    if !ok {
                        return Err(err(
                            col,
                            format!("has Arrow type {dt}: cross takes string, byte, integer or bool columns"),
                        ));
                    }
                    (DataType::Int64, Kind::Crossed)
                }
                // Hashed: each string (or bytes) an id; a list of them a
                // jagged tensor of ids.
                dt if hashed && bytes_like(dt) => {
                    (DataType::Int64, if spec.columns.len() > 1 { Kind::Stacked } else { Kind::Scalar })
                }
                DataType::List(child) | DataType::LargeList(child) if hashed && bytes_like(child.data_type()) => {
                    if spec.columns.len() > 1 {
                        return Err(err(col, "a list column cannot be stacked with other columns".into()));
                    }
                    (DataType::Int64, Kind::Jagged)
                }
                dt if hashed => {
                    return Err(err(col, format!("has Arrow type {dt}: hash applies to string or byte values")));
                }
                // A dictionary is its values.
                DataType::Dictionary(_, v) if castable(v) => {
                    (v.as_ref().clone(), if spec.columns.len() > 1 { Kind::Stacked } else { Kind::Scalar })
                }
                DataType::FixedSizeList(child, k) => {
                    if spec.columns.len() > 1 {
                        return Err(err(col, "a FixedSizeList column cannot be stacked with other columns".into()));
                    }
                    // The width comes from the file's schema: refuse what
                    // no tensor row can be (negative, zero, over u32).
                    let width = u32::try_from(*k).ok().filter(|&w| w > 0).ok_or_else(|| {
                        err(col, format!("is a FixedSizeList of width {k}, which no tensor can have"))
                    })?;
                    (child.data_type().clone(), Kind::List(width as usize))
                }
                DataType::List(child) | DataType::LargeList(child) => {
                    if spec.columns.len() > 1 {
                        return Err(err(col, "a list column cannot be stacked with other columns".into()));
                    }
                    (child.data_type().clone(), Kind::Jagged)
                }
                DataType::Binary | DataType::LargeBinary | DataType::Utf8 | DataType::LargeUtf8 => {
                    if spec.columns.len() > 1 {
                        return Err(err(col, "a byte column cannot be stacked with other columns".into()));
                    }
                    if spec.dtype != DType::U8 {
                        return Err(err(
                            col,
                            format!(
                                "has Arrow type {}, whose rows are bytes: its tensor's dtype must be u8, not {}",
                                &data_type, spec.dtype
                            ),
                        ));
                    }
                    (DataType::UInt8, Kind::Jagged)
                }
                dt if castable(dt) => (dt.clone(), if spec.columns.len() > 1 { Kind::Stacked } else { Kind::Scalar }),
                dt => return Err(err(col, format!("has Arrow type {dt}, which no tensor can be built from"))),
            };
            if let Some(prev) = &elem
                && *prev != this_elem
            {
                return Err(err(col, format!("has Arrow type {this_elem}, but the tensor's other columns are {prev}")));
            }
            elem = Some(this_elem);
            kind = this_kind;
        }
        if spec.columns.is_empty() {
            return Err(err("", "the tensor names no column".into()));
        }
        // Every column absent from this file: the stand-in's own type.
        let elem = elem.unwrap_or_else(|| arrow_type(spec.dtype).unwrap_or(DataType::Float32));
        if !castable(&elem) {
            return Err(err(&spec.columns[0], format!("has element type {elem}, which no tensor can be built from")));
        }
        // A hashed tensor's ids are computed; a transformed one's values
        // are read as f64 and stored as its dtype after the steps.
        let computed = spec.hash.is_some() || spec.cross.is_some() || !spec.transform.is_empty();
        let exact = arrow_type(spec.dtype).as_ref() == Some(&elem) || computed;
        if !exact && !spec.cast && !widens(&elem, spec.dtype) {
            return Err(err(
                &spec.columns[0],
                format!("has Arrow type {elem}; the view asks for {} (declare cast = true to convert)", spec.dtype),
            ));
        }
        if kind != Kind::Jagged && spec.has_jagged_options() {
            return Err(err(
                &spec.columns[0],
                format!(
                    "max_len, truncate, pad_to and null apply to a list or byte column; this tensor's column is {}",
                    crate::path::find(schema, &spec.columns[0])
                        .map_or_else(|| "not one".into(), |(_, dt)| dt.to_string())
                ),
            ));
        }
        if let (Kind::Jagged, Some(n)) = (&kind, spec.pad_to) {
            kind = Kind::Padded(n as usize);
        }
        let shape = match kind {
            Kind::Scalar | Kind::Jagged | Kind::Lengths | Kind::Crossed => vec![],
            Kind::Stacked => vec![spec.columns.len() as u32],
            Kind::List(k) => vec![k as u32],
            Kind::Padded(n) => vec![n as u32],
        };
        let jagged = kind == Kind::Jagged;
        layouts.push(TensorLayout { name: spec.name.clone(), dtype: spec.dtype, shape, jagged });
        let resolved = ResolvedTensor {
            name: spec.name.clone(),
            dtype: spec.dtype,
            kind,
            columns: spec.columns.clone(),
            fill: spec.fill,
            max_len: spec.max_len.or(spec.pad_to),
            truncate: spec.truncate,
            null_empty: spec.null_rows == granary_proto::NullRows::Empty,
            hash: spec.hash.or(spec.cross).map(|h| h.buckets),
            transform: granary_proto::transform::parse(&spec.transform, spec.dtype)
                .map_err(|problem| err(&spec.columns[0], problem))?,
        };
        if spec.pad_to.is_some() {
            // Its lengths, right after it.
            let name = spec.lengths_name();
            layouts.push(TensorLayout::dense(name.clone(), DType::I32, vec![]));
            tensors.push(resolved.clone());
            tensors.push(ResolvedTensor {
                name,
                dtype: DType::I32,
                kind: Kind::Lengths,
                fill: None,
                hash: None,
                transform: Vec::new(),
                ..resolved
            });
        } else {
            tensors.push(resolved);
        }
    }
    projection.sort_unstable();
    Ok(Resolved { layouts, projection, tensors, absent, partitions: from_folders })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{Field, Schema};
    use std::sync::Arc;

    fn schema(names: &[&str]) -> SchemaRef {
        Arc::new(Schema::new(names.iter().map(|n| Field::new(*n, DataType::Float32, false)).collect::<Vec<_>>()))
    }

    #[test]
    fn a_missing_column_says_what_the_file_has_instead() {
        let padded = schema(&["f000", "f001", "f149", "label"]);
        assert_eq!(
            missing_hint("f0", &padded),
            " (the file has f000: its names are zero-padded; a pattern pads when its start does, as in f{000..150})"
        );
        let plain = schema(&["f0", "f1", "f149"]);
        assert_eq!(
            missing_hint("f00", &plain),
            " (the file has f0: its names are not zero-padded, so neither may a pattern's start be, as in f{0..150})"
        );
        assert_eq!(
            missing_hint("f150", &plain),
            " (the file's fN columns run from f0 to f149; a pattern f{a..b} names fa up to f(b-1))"
        );
        let other: Vec<String> = (0..10).map(|i| format!("c{i}x")).collect();
        let other: Vec<&str> = other.iter().map(String::as_str).collect();
        assert_eq!(
            missing_hint("label", &schema(&other)),
            " (the file's columns: c0x, c1x, c2x, c3x, c4x, c5x, c6x, c7x, … 10 in all)"
        );
    }
}

#[cfg(test)]
mod evolution {
    use super::*;
    use arrow::datatypes::{Field, Schema};
    use granary_proto::{NullRows, TensorSpec};
    use std::sync::Arc;

    fn view(tensors: Vec<TensorSpec>) -> View {
        View { tensors }
    }

    /// An older file: `clicks` (int32, later widened to int64) and no
    /// `score` or `tags` (added later).
    fn older() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("clicks", DataType::Int32, false),
            Field::new("a", DataType::Float32, false),
        ]))
    }

    #[test]
    fn a_column_older_files_lack_takes_its_fill_or_its_empty_rows() {
        let score = TensorSpec { fill: Some(0.5), ..TensorSpec::new("score", DType::F32, &["score"]) };
        let pair = TensorSpec { fill: Some(0.0), ..TensorSpec::new("pair", DType::F32, &["a", "score"]) };
        let tags = TensorSpec { null_rows: NullRows::Empty, ..TensorSpec::new("tags", DType::I64, &["tags"]) };
        let r = resolve_view(&view(vec![score, pair, tags]), &older(), "day-01.parquet").expect("resolves");
        assert_eq!(r.layouts[0], TensorLayout::dense("score", DType::F32, vec![]));
        assert_eq!(r.layouts[1], TensorLayout::dense("pair", DType::F32, vec![2]));
        assert!(r.layouts[2].jagged);
        assert_eq!(r.tensors[1].kind, Kind::Stacked);
        let names: Vec<&str> = r.absent.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["score", "tags"], "each absent column once");
        assert!(matches!(r.absent[1].1, DataType::List(_)));
        assert_eq!(r.projection, [1], "only the columns the file has are read");
    }

    #[test]
    fn without_a_fill_an_absent_column_names_the_file_and_what_to_declare() {
        let dense = TensorSpec::new("score", DType::F32, &["score"]);
        let e = resolve_view(&view(vec![dense]), &older(), "day-01.parquet").unwrap_err().to_string();
        assert!(e.contains("day-01.parquet") && e.contains("score") && e.contains("declare a fill"), "{e}");
        let list = TensorSpec { max_len: Some(4), ..TensorSpec::new("tags", DType::I64, &["tags"]) };
        let e = resolve_view(&view(vec![list]), &older(), "day-01.parquet").unwrap_err().to_string();
        assert!(e.contains("null = \"empty\""), "{e}");
    }

    #[test]
    fn hive_folders_are_partitions_and_the_file_name_is_not() {
        let p =
            partitions("s3://b/ads/date=2026-11-01/city=S%C3%A3o%20Paulo/hour=__HIVE_DEFAULT_PARTITION__/x=1.parquet");
        assert_eq!(p, [("date".into(), "2026-11-01".into()), ("city".into(), "São Paulo".into())]);
        assert!(partitions("file:///data/part-0.parquet").is_empty());
        assert!(partitions("=x/part.parquet").is_empty(), "a folder without a key is not one");
        assert_eq!(partition_type("7"), DataType::Int64);
        assert_eq!(partition_type("-12"), DataType::Int64);
        assert_eq!(partition_type("2026-11-01"), DataType::Utf8);
        assert_eq!(partitions("k=%zz/f.parquet"), [("k".into(), "%zz".into())], "a bad escape is kept as written");
    }

    #[test]
    fn a_widened_integer_or_float_needs_no_cast_and_a_narrowed_one_does() {
        let clicks = TensorSpec::new("clicks", DType::I64, &["clicks"]);
        assert!(resolve_view(&view(vec![clicks]), &older(), "day-01.parquet").is_ok());
        let narrow = TensorSpec::new("clicks", DType::I16, &["clicks"]);
        let e = resolve_view(&view(vec![narrow]), &older(), "day-01.parquet").unwrap_err().to_string();
        assert!(e.contains("cast = true"), "{e}");
        assert!(widens(&DataType::Float32, DType::F64) && widens(&DataType::UInt32, DType::I64));
        assert!(!widens(&DataType::Int64, DType::I32) && !widens(&DataType::Int32, DType::F32));
    }
}
