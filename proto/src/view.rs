//! The view: which tensors to build from which Parquet columns.
//!
//! A view is declared by the user (TOML or JSON) and is part of the dataset
//! version, so changing it never serves bytes converted under the old one.
//! Each tensor is built from either
//! - one scalar column: a per-row scalar, shape `[]`;
//! - several scalar columns of one Arrow type, stacked: shape `[k]`;
//! - one `FixedSizeList<T, k>` column: shape `[k]`;
//! - one `List<T>`/`LargeList<T>` or byte column (`Binary`, `Utf8` and
//!   their large forms, as `u8`): a jagged tensor, a variable number of
//!   values per row. Options: `max_len` with `truncate`, `pad_to` (a dense
//!   `[N]` tensor and a `<name>_len` tensor of lengths), `null`.
//!
//! The shape is resolved against the Parquet schema by the node; this module
//! checks what can be checked without the schema.

use crate::dtype::DType;
use thiserror::Error;

/// A declared tensor.
#[derive(
    Clone, PartialEq, Debug, serde::Serialize, serde::Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    /// Tensor name, unique within the view.
    pub name: String,
    /// Element type of the tensor.
    pub dtype: DType,
    /// Source columns. A column written `prefix{a..b}` expands to
    /// `prefixa` .. `prefix(b-1)` (the end is left out); a start written
    /// with leading zeros pads every name to its width: `f{000..150}` is
    /// `f000` .. `f149`.
    pub columns: Vec<String>,
    /// Allow converting a column whose Arrow type differs from `dtype`,
    /// with Arrow's cast kernel: an integer that does not fit the target
    /// type is an error; float to integer truncates toward zero; narrowing a
    /// float rounds (and overflows to infinity); a non-zero number becomes
    /// `true`. Without it a type mismatch is an error.
    #[serde(default)]
    pub cast: bool,
    /// Value that replaces nulls. Without it a null is an error. With
    /// `pad_to`, also the value that pads a short row (0 without one).
    #[serde(default)]
    pub fill: Option<f64>,
    /// Of a list or byte column: the most values a row keeps. A longer row
    /// is an error naming it, unless `truncate` says which values to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_len: Option<u32>,
    /// Which values a row longer than `max_len` (or `pad_to`) keeps: its
    /// first (`"keep_first"`) or its last (`"keep_last"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate: Option<Truncate>,
    /// Of a list or byte column: a dense tensor of `pad_to` values per row
    /// instead of a jagged one, a shorter row padded with `fill` (0 without
    /// one), and beside it a tensor `<name>_len` (i32, one per row) of each
    /// row's length. A longer row is an error unless `truncate` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_to: Option<u32>,
    /// Of a list or byte column: what a null row is: an error naming it
    /// (`"error"`, the default) or a row of no values (`"empty"`).
    #[serde(default, rename = "null", skip_serializing_if = "NullRows::is_error")]
    pub null_rows: NullRows,
    /// Of a string or byte column, or a list of them: each value becomes
    /// an id, [`hash_id`] of its bytes into `buckets` (an `i64` or `i32`
    /// tensor), computed once at conversion: warm epochs hash nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<Hashing>,
    /// Steps applied to each value at conversion, in order
    /// ([`crate::transform`]): `log1p`, `clip(lo, hi)`,
    /// `standardize(mean, std)`, `bucketize(b0, b1, ...)`. Kept in their
    /// canonical spelling once validated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transform: Vec<String>,
    /// Of two or more scalar columns: one id per row for their values
    /// together, [`cross_id`] into `buckets` (an `i64` or `i32` tensor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross: Option<Hashing>,
}

/// How a tensor hashes its column's values into ids.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Debug,
    serde::Serialize,
    serde::Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[serde(deny_unknown_fields)]
pub struct Hashing {
    /// Ids run from 0 to `buckets - 1`.
    pub buckets: u64,
}

/// The id of a row's values under `cross = { buckets = N }`: each value's
/// text (an integer in decimal, a bool as `true` or `false`, a string's
/// UTF-8, bytes as they are), joined by the byte 0x1F, as [`hash_id`].
/// Frozen, as `hash_id` is.
pub fn cross_id<'a>(values: impl IntoIterator<Item = &'a [u8]>, buckets: u64) -> u64 {
    let mut key = Vec::new();
    for (i, v) in values.into_iter().enumerate() {
        if i > 0 {
            key.push(0x1F);
        }
        key.extend_from_slice(v);
    }
    hash_id(&key, buckets)
}

/// The id of a string or byte value under `hash = { buckets = N }`:
/// XXH3-64 of its bytes (UTF-8 for a string), seed 0, modulo `buckets`.
/// Frozen: changing it would change every id a model was trained on
/// (Python's `xxhash.xxh3_64_intdigest(b) % N` gives the same).
pub fn hash_id(bytes: &[u8], buckets: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes) % buckets.max(1)
}

/// Which values a row longer than its tensor's limit keeps.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Debug,
    serde::Serialize,
    serde::Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Truncate {
    /// The row's first values.
    KeepFirst,
    /// The row's last values.
    KeepLast,
}

/// What a null row of a list or byte column is.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Debug,
    Default,
    serde::Serialize,
    serde::Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum NullRows {
    /// An error naming the file, row group, column and row.
    #[default]
    Error,
    /// A row of no values.
    Empty,
}

impl NullRows {
    fn is_error(&self) -> bool {
        *self == NullRows::Error
    }
}

/// The longest `pad_to` a view may declare: a padded row is dense, and a
/// row group of them must fit a chunk.
pub const MAX_PAD_TO: u32 = 1 << 20;

impl TensorSpec {
    /// A tensor of `dtype` from `columns`, with no cast, fill or option.
    pub fn new(name: impl Into<String>, dtype: DType, columns: &[&str]) -> Self {
        Self {
            name: name.into(),
            dtype,
            columns: columns.iter().map(|c| c.to_string()).collect(),
            cast: false,
            fill: None,
            max_len: None,
            truncate: None,
            pad_to: None,
            null_rows: NullRows::Error,
            hash: None,
            transform: Vec::new(),
            cross: None,
        }
    }

    /// Whether the tensor declares an option only a list or byte column
    /// can have (`max_len`, `truncate`, `pad_to`, `null`).
    pub fn has_jagged_options(&self) -> bool {
        self.max_len.is_some() || self.truncate.is_some() || self.pad_to.is_some() || !self.null_rows.is_error()
    }

    /// The name of the lengths tensor a `pad_to` tensor adds.
    pub fn lengths_name(&self) -> String {
        format!("{}_len", self.name)
    }
}

/// A dataset view: the tensors to build, in order.
#[derive(
    Clone, PartialEq, Debug, serde::Serialize, serde::Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[serde(deny_unknown_fields)]
pub struct View {
    /// The tensors, in the order they appear in chunks and batches.
    #[serde(rename = "tensor")]
    pub tensors: Vec<TensorSpec>,
}

/// A tensor resolved against a schema: what every row of it looks like.
#[derive(
    Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub struct TensorLayout {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Per-row shape: `[]` for a scalar, `[k]` for a vector; of a jagged
    /// tensor, the shape of each of a row's values.
    pub shape: Vec<u32>,
    /// Jagged: each row holds a variable number of values (from a list or
    /// byte column), stored as the values and each row's offsets into them
    /// (see `crate::chunk`). False for a dense tensor.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub jagged: bool,
}

impl TensorLayout {
    /// A dense tensor: `shape` per row.
    pub fn dense(name: impl Into<String>, dtype: DType, shape: Vec<u32>) -> Self {
        Self { name: name.into(), dtype, shape, jagged: false }
    }

    /// A jagged tensor: a variable number of values of `shape` per row.
    pub fn jagged(name: impl Into<String>, dtype: DType, shape: Vec<u32>) -> Self {
        Self { name: name.into(), dtype, shape, jagged: true }
    }

    /// Elements per row.
    pub fn row_elems(&self) -> usize {
        self.shape.iter().map(|&d| d as usize).product()
    }

    /// Bytes per row; of a jagged tensor, bytes per value.
    pub fn row_bytes(&self) -> usize {
        self.row_elems() * self.dtype.size_bytes()
    }
}

/// A view that cannot be used, whatever the data.
#[derive(Debug, Error, PartialEq)]
#[non_exhaustive]
pub enum ViewError {
    /// The view declares no tensor.
    #[error("the view declares no tensor")]
    Empty,
    /// Two tensors share a name.
    #[error("tensor {0:?} is declared twice")]
    DuplicateTensor(String),
    /// A tensor has no source column.
    #[error("tensor {0:?} names no column")]
    NoColumns(String),
    /// A column pattern `prefix{a..b}` is malformed.
    #[error("tensor {tensor:?}: column pattern {pattern:?} is malformed (expected prefix{{a..b}} with a < b)")]
    BadPattern {
        /// The tensor.
        tensor: String,
        /// The pattern as written.
        pattern: String,
    },
    /// A column pattern names more than [`MAX_PATTERN_COLUMNS`] columns.
    #[error("tensor {tensor:?}: column pattern {pattern:?} names more than {MAX_PATTERN_COLUMNS} columns")]
    TooManyColumns {
        /// The tensor.
        tensor: String,
        /// The pattern.
        pattern: String,
    },
    /// The view's tensors name more than [`MAX_VIEW_COLUMNS`] columns in
    /// all (counted with each pattern expanded).
    #[error("the view names {columns} columns by tensor {tensor:?}, over the {MAX_VIEW_COLUMNS} a view may name")]
    ViewTooWide {
        /// The tensor at which the count went over.
        tensor: String,
        /// Columns counted up to and including it.
        columns: usize,
    },
    /// A fill value does not fit the tensor's dtype.
    #[error("tensor {tensor:?}: fill value {fill} does not fit dtype {dtype}")]
    BadFill {
        /// The tensor.
        tensor: String,
        /// The fill value.
        fill: f64,
        /// The tensor's dtype.
        dtype: DType,
    },
    /// A list option (`max_len`, `truncate`, `pad_to`) that cannot hold.
    #[error("tensor {tensor:?}: {problem}")]
    BadOption {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        problem: String,
    },
    /// The view text does not parse.
    #[error("view does not parse: {0}")]
    Parse(String),
}

impl View {
    /// Expands column patterns and checks names and fill values.
    pub fn validated(mut self) -> Result<View, ViewError> {
        if self.tensors.is_empty() {
            return Err(ViewError::Empty);
        }
        let mut names = std::collections::BTreeSet::new();
        let mut total = 0usize;
        for t in &mut self.tensors {
            if !names.insert(t.name.clone()) {
                return Err(ViewError::DuplicateTensor(t.name.clone()));
            }
            let mut cols = Vec::with_capacity(t.columns.len());
            for c in &t.columns {
                expand_pattern(&t.name, c, &mut cols)?;
            }
            if cols.is_empty() {
                return Err(ViewError::NoColumns(t.name.clone()));
            }
            total += cols.len();
            if total > MAX_VIEW_COLUMNS as usize {
                return Err(ViewError::ViewTooWide { tensor: t.name.clone(), columns: total });
            }
            t.columns = cols;
            if let Some(fill) = t.fill
                && !fill_fits(fill, t.dtype)
            {
                return Err(ViewError::BadFill { tensor: t.name.clone(), fill, dtype: t.dtype });
            }
            check_options(t)?;
            if !t.transform.is_empty() {
                let bad = |problem: String| ViewError::BadOption { tensor: t.name.clone(), problem };
                if t.hash.is_some() {
                    return Err(bad("transform and hash do not go together: hash makes ids of strings".into()));
                }
                let steps = crate::transform::parse(&t.transform, t.dtype).map_err(bad)?;
                t.transform = steps.iter().map(|s| s.to_string()).collect();
            }
        }
        // A padded tensor's lengths take a name no other tensor may have.
        for t in self.tensors.iter().filter(|t| t.pad_to.is_some()) {
            let len = t.lengths_name();
            if self.tensors.iter().any(|o| o.name == len) {
                return Err(ViewError::BadOption {
                    tensor: t.name.clone(),
                    problem: format!("pad_to adds a tensor {len:?} of lengths, and another tensor has that name"),
                });
            }
        }
        Ok(self)
    }
}

/// The list options of `t` hold together.
fn check_options(t: &TensorSpec) -> Result<(), ViewError> {
    let bad = |problem: String| Err(ViewError::BadOption { tensor: t.name.clone(), problem });
    if let Some(c) = t.cross {
        if t.columns.len() < 2 {
            return bad("cross combines two or more columns: name them in columns".into());
        }
        if t.hash.is_some() || !t.transform.is_empty() || t.cast || t.has_jagged_options() {
            return bad("cross makes one id per row: it goes with no hash, transform, cast or list option".into());
        }
        let most = match t.dtype {
            DType::I64 => i64::MAX as u64,
            DType::I32 => i32::MAX as u64 + 1,
            other => return bad(format!("cross makes ids: its dtype must be i64 or i32, not {other}")),
        };
        if c.buckets == 0 || c.buckets > most {
            return bad(format!("cross buckets must be from 1 to {most} for dtype {}, not {}", t.dtype, c.buckets));
        }
    }
    if let Some(h) = t.hash {
        let most = match t.dtype {
            DType::I64 => i64::MAX as u64,
            DType::I32 => i32::MAX as u64 + 1,
            other => return bad(format!("hash makes ids: its dtype must be i64 or i32, not {other}")),
        };
        if h.buckets == 0 || h.buckets > most {
            return bad(format!("hash buckets must be from 1 to {most} for dtype {}, not {}", t.dtype, h.buckets));
        }
        if t.cast {
            return bad("cast does not apply to a hashed tensor (its ids are computed, not converted)".into());
        }
    }
    match (t.max_len, t.pad_to) {
        (Some(_), Some(_)) => {
            return bad("declare max_len or pad_to, not both (pad_to is the padded tensor's limit)".into());
        }
        (Some(0), _) => return bad("max_len must be at least 1".into()),
        (_, Some(0)) => return bad("pad_to must be at least 1".into()),
        (_, Some(n)) if n > MAX_PAD_TO => {
            return bad(format!("pad_to {n} is over the {MAX_PAD_TO} a view may declare"));
        }
        (None, None) if t.truncate.is_some() => {
            return bad("truncate needs max_len or pad_to: the limit it applies at".into());
        }
        _ => {}
    }
    Ok(())
}

/// True when `fill` is exactly representable as a value of `dtype` (or, for
/// floats, is finite or NaN/inf which floats hold).
pub fn fill_fits(fill: f64, dtype: DType) -> bool {
    let int_range = |lo: f64, hi: f64| fill.fract() == 0.0 && fill >= lo && fill <= hi;
    match dtype {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => true,
        DType::I64 => int_range(-9_223_372_036_854_775_808.0, 9_223_372_036_854_774_784.0),
        DType::I32 => int_range(i32::MIN as f64, i32::MAX as f64),
        DType::I16 => int_range(i16::MIN as f64, i16::MAX as f64),
        DType::I8 => int_range(i8::MIN as f64, i8::MAX as f64),
        DType::U8 => int_range(0.0, 255.0),
        DType::Bool => fill == 0.0 || fill == 1.0,
    }
}

/// Columns one `prefix{a..b}` pattern may name: views come from other
/// processes (an admin's `dataset add`), and an unbounded range would
/// exhaust the memory of whoever expands it.
pub const MAX_PATTERN_COLUMNS: u32 = 1 << 16;

/// Columns a whole view may name, every pattern expanded: one pattern's
/// cap alone would let a view of many patterns name billions.
pub const MAX_VIEW_COLUMNS: u32 = 1 << 18;

fn expand_pattern(tensor: &str, pattern: &str, out: &mut Vec<String>) -> Result<(), ViewError> {
    let Some(open) = pattern.find('{') else {
        out.push(pattern.to_string());
        return Ok(());
    };
    let bad = || ViewError::BadPattern { tensor: tensor.to_string(), pattern: pattern.to_string() };
    let close = pattern[open..].find('}').map(|i| i + open).ok_or_else(bad)?;
    let (prefix, body, suffix) = (&pattern[..open], &pattern[open + 1..close], &pattern[close + 1..]);
    let (a_text, b_text) = body.split_once("..").ok_or_else(bad)?;
    let (a_text, b_text) = (a_text.trim(), b_text.trim());
    let a: u32 = a_text.parse().map_err(|_| bad())?;
    let b: u32 = b_text.parse().map_err(|_| bad())?;
    // A start written with leading zeros pads every name to its width.
    let width = if a_text.len() > 1 && a_text.starts_with('0') { a_text.len() } else { 0 };
    if a >= b || suffix.contains('{') {
        return Err(bad());
    }
    if b - a > MAX_PATTERN_COLUMNS {
        return Err(ViewError::TooManyColumns { tensor: tensor.to_string(), pattern: pattern.to_string() });
    }
    out.extend((a..b).map(|i| format!("{prefix}{i:0width$}{suffix}")));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_leaves_out_its_end_and_pads_when_its_start_does() {
        let names = |p: &str| {
            let mut out = Vec::new();
            expand_pattern("t", p, &mut out).expect("pattern");
            out
        };
        assert_eq!(names("f{0..3}"), ["f0", "f1", "f2"]);
        assert_eq!(names("f{000..3}"), ["f000", "f001", "f002"]);
        assert_eq!(names("c{08..11}_x"), ["c08_x", "c09_x", "c10_x"]);
        assert_eq!(names("f{98..101}"), ["f98", "f99", "f100"]);
        assert_eq!(names("f{0..150}").len(), 150);
    }

    #[test]
    fn a_pattern_naming_too_many_columns_is_refused() {
        let mut out = Vec::new();
        let e = expand_pattern("dense", "f{0..4000000000}", &mut out).unwrap_err();
        assert!(matches!(e, ViewError::TooManyColumns { .. }), "{e}");
        assert!(out.is_empty());
        expand_pattern("dense", "f{0..65536}", &mut out).unwrap();
        assert_eq!(out.len(), 65536);
    }

    #[test]
    fn a_view_naming_too_many_columns_in_all_is_refused() {
        let wide: Vec<TensorSpec> = (0..5).map(|i| spec(&format!("t{i}"), &["f{0..65536}"])).collect();
        match (View { tensors: wide }).validated() {
            Err(ViewError::ViewTooWide { tensor, columns }) => assert_eq!((tensor.as_str(), columns), ("t4", 5 << 16)),
            other => panic!("expected ViewTooWide, got {other:?}"),
        }
        let fits: Vec<TensorSpec> = (0..4).map(|i| spec(&format!("t{i}"), &["f{0..65536}"])).collect();
        assert!((View { tensors: fits }).validated().is_ok());
    }

    fn spec(name: &str, cols: &[&str]) -> TensorSpec {
        TensorSpec::new(name, DType::F32, cols)
    }

    #[test]
    fn the_hash_of_an_id_is_frozen_and_its_options_checked() {
        // Pinned: the ids every model trained on a hashed view holds.
        assert_eq!(xxhash_rust::xxh3::xxh3_64(b""), 0x2d06_8005_38d3_94c2);
        assert_eq!(hash_id(b"", u64::MAX), 0x2d06_8005_38d3_94c2);
        assert_eq!(hash_id(b"granary", 1_000_003), xxhash_rust::xxh3::xxh3_64(b"granary") % 1_000_003);
        assert!(hash_id(b"granary", 10) < 10);
        let v: View = toml::from_str(
            "[[tensor]]\nname = \"c\"\ndtype = \"i64\"\ncolumns = [\"country\"]\nhash = { buckets = 1000 }\n",
        )
        .unwrap();
        assert_eq!(v.tensors[0].hash, Some(Hashing { buckets: 1000 }));
        assert!(v.clone().validated().is_ok());
        let with = |dtype, buckets, cast| {
            let t = TensorSpec { hash: Some(Hashing { buckets }), cast, ..TensorSpec::new("c", dtype, &["c"]) };
            View { tensors: vec![t] }.validated().map_err(|e| e.to_string())
        };
        assert!(with(DType::F32, 10, false).unwrap_err().contains("i64 or i32"));
        assert!(with(DType::I64, 0, false).unwrap_err().contains("from 1"));
        assert!(with(DType::I32, 1 << 32, false).unwrap_err().contains("from 1 to 2147483648"));
        assert!(with(DType::I32, 1 << 31, false).is_ok());
        assert!(with(DType::I64, 10, true).unwrap_err().contains("cast does not apply"));
    }

    #[test]
    fn a_cross_is_the_hash_of_the_values_joined_and_its_options_checked() {
        assert_eq!(cross_id([&b"US"[..], b"7"], 1000), hash_id(b"US\x1f7", 1000));
        assert_eq!(cross_id([&b"a"[..]], 10), hash_id(b"a", 10));
        let with = |cols: &[&str], dtype, hash: bool| {
            let t = TensorSpec {
                cross: Some(Hashing { buckets: 100 }),
                hash: hash.then_some(Hashing { buckets: 5 }),
                ..TensorSpec::new("x", dtype, cols)
            };
            View { tensors: vec![t] }.validated().map_err(|e| e.to_string())
        };
        assert!(with(&["a", "b"], DType::I64, false).is_ok());
        assert!(with(&["a"], DType::I64, false).unwrap_err().contains("two or more"));
        assert!(with(&["a", "b"], DType::F32, false).unwrap_err().contains("i64 or i32"));
        assert!(with(&["a", "b"], DType::I64, true).unwrap_err().contains("no hash"));
    }

    #[test]
    fn list_options_are_read_and_checked() {
        let v: View = toml::from_str(
            "[[tensor]]\nname = \"hist\"\ndtype = \"i64\"\ncolumns = [\"hist\"]\nmax_len = 50\ntruncate = \"keep_last\"\nnull = \"empty\"\n",
        )
        .unwrap();
        let t = &v.tensors[0];
        assert_eq!((t.max_len, t.truncate, t.null_rows), (Some(50), Some(Truncate::KeepLast), NullRows::Empty));
        assert!(v.clone().validated().is_ok());
        let problem = |t: TensorSpec| match (View { tensors: vec![t] }).validated() {
            Err(ViewError::BadOption { problem, .. }) => problem,
            other => panic!("expected BadOption, got {other:?}"),
        };
        let base = TensorSpec::new("h", DType::I64, &["h"]);
        assert!(problem(TensorSpec { max_len: Some(3), pad_to: Some(4), ..base.clone() }).contains("not both"));
        assert!(problem(TensorSpec { truncate: Some(Truncate::KeepFirst), ..base.clone() }).contains("needs max_len"));
        assert!(problem(TensorSpec { pad_to: Some(0), ..base.clone() }).contains("at least 1"));
        assert!(problem(TensorSpec { pad_to: Some(MAX_PAD_TO + 1), ..base.clone() }).contains("over"));
        let clash = View { tensors: vec![TensorSpec { pad_to: Some(8), ..base.clone() }, spec("h_len", &["x"])] };
        assert!(matches!(clash.validated(), Err(ViewError::BadOption { .. })));
        // Without options a view serializes as it always did.
        let json = serde_json::to_string(&base).unwrap();
        assert!(!json.contains("max_len") && !json.contains("\"null\""), "{json}");
    }

    #[test]
    fn patterns_expand_in_order() {
        let v = View { tensors: vec![spec("dense", &["f{0..3}", "extra"])] }.validated().unwrap();
        assert_eq!(v.tensors[0].columns, ["f0", "f1", "f2", "extra"]);
    }

    #[test]
    fn bad_views_are_refused_with_the_tensor_named() {
        assert_eq!(View { tensors: vec![] }.validated(), Err(ViewError::Empty));
        let dup = View { tensors: vec![spec("a", &["x"]), spec("a", &["y"])] }.validated();
        assert_eq!(dup, Err(ViewError::DuplicateTensor("a".into())));
        let pat = View { tensors: vec![spec("a", &["f{3..1}"])] }.validated();
        assert!(matches!(pat, Err(ViewError::BadPattern { .. })));
        let mut s = spec("ids", &["id"]);
        s.dtype = DType::U8;
        s.fill = Some(-1.0);
        assert!(matches!(View { tensors: vec![s] }.validated(), Err(ViewError::BadFill { .. })));
    }
}
