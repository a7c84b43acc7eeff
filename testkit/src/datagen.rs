//! A deterministic, recommendation-style Parquet dataset.
//!
//! Columns: `f0`..`f149` (f32 dense features), `emb` (`FixedSizeList<f32,
//! 32>`), `user_id` and `item_id` (i64), `label` (f32). Every value is a pure
//! function of (seed, global row, column, [`Values`]), so a test can
//! recompute any value without reading the files back. Files are written one
//! row group at a time (bounded memory) and the same arguments always give
//! the same bytes.
//!
//! With [`GenSpec::jagged`] the files also hold the variable-length
//! columns a ranking model's sparse features come as: `hist`
//! (`List<Int64>`, a user's recent item ids: power-law lengths, most rows a
//! few values and about one in a thousand over 500), `cats`
//! (`List<Int32>`, a multi-hot of 0 to 8 categories) and `blob` (`Binary`,
//! 1 to 4 KiB: an image or a serialized record). Their values are pure
//! functions too ([`hist_row`], [`cats_row`], [`blob_row`]).
//!
//! Two value profiles ([`Values`]): `uniform` (every feature a random float,
//! no dictionaries: the cheapest data to decode and the least compressible)
//! and `mixed` (continuous, count-like and bucketised features in equal
//! parts, dictionary-encoded as Parquet writers do by default: closer to
//! click logs, and dearer to decode).

use arrow::array::{
    ArrayRef, BinaryArray, FixedSizeListArray, Float32Array, Int32Array, Int64Array, ListArray, RecordBatch,
};
use arrow::buffer::OffsetBuffer;
use arrow::datatypes::{DataType, Field, Schema};
use granary_proto::rng::mix64;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Dense feature columns.
pub const DENSE: usize = 150;
/// Embedding width.
pub const EMB: usize = 32;

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenSpec {
    /// Seed of every value.
    pub seed: u64,
    /// Total rows.
    pub rows: u64,
    /// Number of files (rows are split evenly, the first files take the remainder).
    pub files: u32,
    /// Rows per row group.
    pub row_group_rows: u64,
    /// Compression: `none`, `snappy`, `zstd`, `lz4`, `gzip`.
    pub compression: String,
    /// How feature values are distributed and encoded.
    pub values: Values,
    /// Also write the variable-length columns `hist`, `cats` and `blob`
    /// (see the module doc).
    pub jagged: bool,
}

impl Default for GenSpec {
    fn default() -> Self {
        Self {
            seed: 0,
            rows: 100_000,
            files: 4,
            row_group_rows: 10_000,
            compression: "snappy".into(),
            values: Values::Uniform,
            jagged: false,
        }
    }
}

/// How the dense feature values are distributed, and whether the files use
/// dictionary encoding. The embedding, ids and label are the same in both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Values {
    /// Every dense feature uniform in [-1, 1); plain encoding. Incompressible
    /// and decoded at nearly memory speed: the case where caching converted
    /// chunks gains least over decoding every epoch.
    #[default]
    Uniform,
    /// Features `f{3k}` continuous (uniform in [-1, 1)), `f{3k+1}`
    /// count-like (`ln(1 + n)` with n geometric: half zeros, ~20 distinct
    /// values), `f{3k+2}` bucketised (64 levels in [0, 1]); dictionary
    /// encoding on, Parquet's default.
    Mixed,
}

impl std::str::FromStr for Values {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "uniform" => Ok(Self::Uniform),
            "mixed" => Ok(Self::Mixed),
            other => Err(format!("unknown value profile {other:?} (uniform, mixed)")),
        }
    }
}

impl std::fmt::Display for Values {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Uniform => "uniform",
            Self::Mixed => "mixed",
        })
    }
}

/// What was written.
#[derive(Clone, Debug)]
pub struct GenReport {
    /// Files written, in order.
    pub files: Vec<PathBuf>,
    /// Total bytes written.
    pub bytes: u64,
    /// Rows written.
    pub rows: u64,
}

/// Generation failed.
#[derive(Debug, thiserror::Error)]
pub enum GenError {
    /// Bad arguments.
    #[error("invalid dataset spec: {0}")]
    Spec(String),
    /// Writing a file failed.
    #[error("writing {path}: {reason}")]
    Write {
        /// File.
        path: PathBuf,
        /// Cause.
        reason: String,
    },
}

/// The Arrow schema of the generated files (without the variable-length
/// columns).
pub fn schema() -> Arc<Schema> {
    schema_for(false)
}

/// The Arrow schema of files generated with `jagged` as [`GenSpec::jagged`].
pub fn schema_for(jagged: bool) -> Arc<Schema> {
    let mut fields = dense_fields();
    if jagged {
        fields.push(Field::new("hist", DataType::List(Arc::new(Field::new("item", DataType::Int64, false))), false));
        fields.push(Field::new("cats", DataType::List(Arc::new(Field::new("item", DataType::Int32, false))), false));
        fields.push(Field::new("blob", DataType::Binary, false));
    }
    Arc::new(Schema::new(fields))
}

fn dense_fields() -> Vec<Field> {
    let mut fields: Vec<Field> = (0..DENSE).map(|i| Field::new(format!("f{i}"), DataType::Float32, false)).collect();
    fields.push(Field::new(
        "emb",
        DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, false)), EMB as i32),
        false,
    ));
    fields.push(Field::new("user_id", DataType::Int64, false));
    fields.push(Field::new("item_id", DataType::Int64, false));
    fields.push(Field::new("label", DataType::Float32, false));
    fields
}

/// The view that turns the generated files into four tensors: `dense`
/// `[150]` f32, `emb` `[32]` f32, `ids` `[2]` i64, `label` f32.
pub const VIEW_TOML: &str = r#"[[tensor]]
name = "dense"
dtype = "f32"
columns = ["f{0..150}"]

[[tensor]]
name = "emb"
dtype = "f32"
columns = ["emb"]

[[tensor]]
name = "ids"
dtype = "i64"
columns = ["user_id", "item_id"]

[[tensor]]
name = "label"
dtype = "f32"
columns = ["label"]
"#;

/// The jagged tensors a view of data generated with [`GenSpec::jagged`]
/// adds to [`VIEW_TOML`]: `hist` (i64 per row, power-law lengths), `cats`
/// (i32, multi-hot) and `blob` (the bytes of a binary column).
pub const JAGGED_VIEW_TOML: &str = r#"
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

/// The view `granary dataset gen` writes: [`VIEW_TOML`], and with
/// `jagged` [`JAGGED_VIEW_TOML`] after it.
pub fn view_toml(jagged: bool) -> String {
    if jagged { format!("{VIEW_TOML}{JAGGED_VIEW_TOML}") } else { VIEW_TOML.to_string() }
}

/// [`VIEW_TOML`], parsed and validated.
pub fn view() -> granary_proto::View {
    // A constant of this module that its tests parse: it cannot fail.
    toml::from_str::<granary_proto::View>(VIEW_TOML)
        .ok()
        .and_then(|v| v.validated().ok())
        .unwrap_or_else(|| unreachable!("VIEW_TOML is a valid view"))
}

/// Column ids used to derive values (dense `0..150`, then these).
const EMB_COL: u64 = 1000;
const USER_COL: u64 = 2000;
const ITEM_COL: u64 = 2001;
const LABEL_COL: u64 = 2002;

fn bits(seed: u64, row: u64, col: u64) -> u64 {
    mix64(seed ^ mix64(row.wrapping_mul(0x1_0000_0001).wrapping_add(col)))
}

/// Dense feature `col` of global row `row` under [`Values::Uniform`]:
/// uniform in [-1, 1).
pub fn dense_value(seed: u64, row: u64, col: usize) -> f32 {
    ((bits(seed, row, col as u64) >> 40) as f32 / (1u64 << 23) as f32) - 1.0
}

/// Dense feature `col` of global row `row` under `values`.
pub fn dense_value_in(values: Values, seed: u64, row: u64, col: usize) -> f32 {
    match (values, col % 3) {
        (Values::Uniform, _) | (Values::Mixed, 0) => dense_value(seed, row, col),
        (Values::Mixed, 1) => {
            // n zero with probability 1/2, then 1 with 1/4, ...: a count.
            let n = bits(seed, row, col as u64).trailing_ones().min(24);
            (n as f32).ln_1p()
        }
        _ => (bits(seed, row, col as u64) % 64) as f32 / 63.0,
    }
}

/// Embedding element `k` of row `row`.
pub fn emb_value(seed: u64, row: u64, k: usize) -> f32 {
    ((bits(seed, row, EMB_COL + k as u64) >> 40) as f32 / (1u64 << 24) as f32) - 0.5
}

/// User id of row `row`.
pub fn user_id(seed: u64, row: u64) -> i64 {
    (bits(seed, row, USER_COL) % 1_000_000) as i64
}

/// Item id of row `row`.
pub fn item_id(seed: u64, row: u64) -> i64 {
    (bits(seed, row, ITEM_COL) % 10_000_000) as i64
}

/// Label of row `row`: 0 or 1.
pub fn label(seed: u64, row: u64) -> f32 {
    (bits(seed, row, LABEL_COL) & 1) as f32
}

/// Longest `hist` row.
pub const MAX_HIST: usize = 4096;
/// Most `cats` values in a row.
pub const MAX_CATS: usize = 8;
/// `blob` rows are this long at least, and at most 4 KiB.
pub const MIN_BLOB: usize = 1024;
/// `blob` rows are at most this long.
pub const MAX_BLOB: usize = 4096;

/// Column ids of the variable-length columns' draws (their values draw
/// from `n << 32 | j`, apart from every column id above).
const HIST_LEN_COL: u64 = 3000;
const CATS_LEN_COL: u64 = 3001;
const BLOB_LEN_COL: u64 = 3002;

/// Row `row`'s `hist`: a power law of lengths (P(len >= k) = (k+1)^-1.1:
/// half the rows 0 or 1 values, about one in a thousand over 500, at most
/// [`MAX_HIST`]), item ids below 10,000,000.
pub fn hist_row(seed: u64, row: u64) -> Vec<i64> {
    // u in (0, 1]: never 0, so the power is finite.
    let u = ((bits(seed, row, HIST_LEN_COL) >> 11) + 1) as f64 / (1u64 << 53) as f64;
    let len = (u.powf(-1.0 / 1.1) - 1.0).floor().min(MAX_HIST as f64) as usize;
    (0..len as u64).map(|j| (bits(seed, row, 1 << 32 | j) % 10_000_000) as i64).collect()
}

/// Row `row`'s `cats`: 0 to [`MAX_CATS`] category ids below 1,000.
pub fn cats_row(seed: u64, row: u64) -> Vec<i32> {
    let len = bits(seed, row, CATS_LEN_COL) % (MAX_CATS as u64 + 1);
    (0..len).map(|j| (bits(seed, row, 2 << 32 | j) % 1_000) as i32).collect()
}

/// Row `row`'s `blob`: [`MIN_BLOB`] to [`MAX_BLOB`] bytes.
pub fn blob_row(seed: u64, row: u64) -> Vec<u8> {
    let len = MIN_BLOB + (bits(seed, row, BLOB_LEN_COL) % (MAX_BLOB - MIN_BLOB + 1) as u64) as usize;
    (0..len.div_ceil(8) as u64).flat_map(|k| bits(seed, row, 3 << 32 | k).to_le_bytes()).take(len).collect()
}

/// One record batch of rows `start..start + n` ([`Values::Uniform`]).
pub fn batch(seed: u64, start: u64, n: usize) -> RecordBatch {
    batch_in(Values::Uniform, seed, start, n)
}

/// One record batch of rows `start..start + n` under `values`.
pub fn batch_in(values: Values, seed: u64, start: u64, n: usize) -> RecordBatch {
    batch_of(values, false, seed, start, n)
}

/// One record batch of rows `start..start + n` under `values`, with the
/// variable-length columns when `jagged`.
pub fn batch_of(values: Values, jagged: bool, seed: u64, start: u64, n: usize) -> RecordBatch {
    let rows = start..start + n as u64;
    let mut cols: Vec<ArrayRef> = (0..DENSE)
        .map(|c| {
            Arc::new(Float32Array::from_iter_values(rows.clone().map(|r| dense_value_in(values, seed, r, c))))
                as ArrayRef
        })
        .collect();
    let emb = Float32Array::from_iter_values(rows.clone().flat_map(|r| (0..EMB).map(move |k| emb_value(seed, r, k))));
    let item = Arc::new(Field::new("item", DataType::Float32, false));
    // The child has exactly n * EMB values and no nulls: construction cannot fail.
    cols.push(Arc::new(FixedSizeListArray::new(item, EMB as i32, Arc::new(emb), None)));
    cols.push(Arc::new(Int64Array::from_iter_values(rows.clone().map(|r| user_id(seed, r)))));
    cols.push(Arc::new(Int64Array::from_iter_values(rows.clone().map(|r| item_id(seed, r)))));
    cols.push(Arc::new(Float32Array::from_iter_values(rows.clone().map(|r| label(seed, r)))));
    if jagged {
        let hist: Vec<Vec<i64>> = rows.clone().map(|r| hist_row(seed, r)).collect();
        let cats: Vec<Vec<i32>> = rows.clone().map(|r| cats_row(seed, r)).collect();
        let item = |t: DataType| Arc::new(Field::new("item", t, false));
        let values = Int64Array::from_iter_values(hist.iter().flatten().copied());
        let offsets = OffsetBuffer::from_lengths(hist.iter().map(Vec::len));
        cols.push(Arc::new(ListArray::new(item(DataType::Int64), offsets, Arc::new(values), None)));
        let values = Int32Array::from_iter_values(cats.iter().flatten().copied());
        let offsets = OffsetBuffer::from_lengths(cats.iter().map(Vec::len));
        cols.push(Arc::new(ListArray::new(item(DataType::Int32), offsets, Arc::new(values), None)));
        cols.push(Arc::new(BinaryArray::from_iter_values(rows.map(|r| blob_row(seed, r)))));
    }
    // Columns match the schema by construction.
    RecordBatch::try_new(schema_for(jagged), cols)
        .unwrap_or_else(|e| unreachable!("generated batch fits its schema: {e}"))
}

fn compression(name: &str) -> Result<Compression, GenError> {
    Ok(match name {
        "none" | "uncompressed" => Compression::UNCOMPRESSED,
        "snappy" => Compression::SNAPPY,
        "zstd" => Compression::ZSTD(ZstdLevel::default()),
        "lz4" => Compression::LZ4_RAW,
        "gzip" => Compression::GZIP(Default::default()),
        other => return Err(GenError::Spec(format!("unknown compression {other:?} (none, snappy, zstd, lz4, gzip)"))),
    })
}

/// Writes the dataset into `dir` as `part-00000.parquet`, ...; calls
/// `progress(rows_done)` after every row group.
pub fn generate(dir: &Path, spec: &GenSpec, mut progress: impl FnMut(u64)) -> Result<GenReport, GenError> {
    if spec.files == 0 || spec.row_group_rows == 0 {
        return Err(GenError::Spec("files and row_group_rows must be at least 1".into()));
    }
    let codec = compression(&spec.compression)?;
    std::fs::create_dir_all(dir).map_err(|e| GenError::Write { path: dir.to_path_buf(), reason: e.to_string() })?;
    let props = WriterProperties::builder()
        .set_compression(codec)
        .set_dictionary_enabled(spec.values == Values::Mixed)
        .set_max_row_group_row_count(Some(spec.row_group_rows as usize))
        .build();
    let per_file = spec.rows / u64::from(spec.files);
    let extra = spec.rows % u64::from(spec.files);
    let mut report = GenReport { files: Vec::new(), bytes: 0, rows: 0 };
    let mut row = 0u64;
    for f in 0..u64::from(spec.files) {
        let n = per_file + u64::from(f < extra);
        let path = dir.join(format!("part-{f:05}.parquet"));
        let werr = |e: &dyn std::fmt::Display| GenError::Write { path: path.clone(), reason: e.to_string() };
        let file = std::fs::File::create(&path).map_err(|e| werr(&e))?;
        let mut w = ArrowWriter::try_new(file, schema_for(spec.jagged), Some(props.clone())).map_err(|e| werr(&e))?;
        let end = row + n;
        while row < end {
            let take = (end - row).min(spec.row_group_rows) as usize;
            w.write(&batch_of(spec.values, spec.jagged, spec.seed, row, take)).map_err(|e| werr(&e))?;
            w.flush().map_err(|e| werr(&e))?;
            row += take as u64;
            report.rows += take as u64;
            progress(report.rows);
        }
        w.close().map_err(|e| werr(&e))?;
        report.bytes += std::fs::metadata(&path).map_err(|e| werr(&e))?.len();
        report.files.push(path);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variable_length_columns_hold_their_rows_with_power_law_lengths() {
        let lens: Vec<usize> = (0..100_000).map(|r| hist_row(5, r).len()).collect();
        let mut sorted = lens.clone();
        sorted.sort_unstable();
        assert!(sorted[50_000] <= 1, "most rows short: median {}", sorted[50_000]);
        let long = lens.iter().filter(|&&n| n > 500).count();
        assert!((20..300).contains(&long), "about one in a thousand over 500: {long}");
        assert!(sorted[99_999] >= 1_000 && sorted[99_999] <= MAX_HIST, "a few in the thousands: {}", sorted[99_999]);
        assert!((0..1_000).all(|r| cats_row(5, r).len() <= MAX_CATS && cats_row(5, r).iter().all(|&c| c < 1_000)));
        assert!((0..1_000).all(|r| (MIN_BLOB..=MAX_BLOB).contains(&blob_row(5, r).len())));
        assert_eq!(hist_row(5, 77), hist_row(5, 77), "pure");
        assert_ne!(blob_row(5, 1), blob_row(5, 2));

        // Written and read back: the columns hold those rows.
        use arrow::array::{Array, AsArray};
        let dir = tempfile::tempdir().unwrap();
        let spec = GenSpec { seed: 5, rows: 2_000, files: 2, row_group_rows: 500, jagged: true, ..GenSpec::default() };
        let report = generate(dir.path(), &spec, |_| {}).unwrap();
        let mut row = 0u64;
        for path in &report.files {
            let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
                std::fs::File::open(path).unwrap(),
            )
            .unwrap()
            .build()
            .unwrap();
            for b in reader {
                let b = b.unwrap();
                assert_eq!(b.schema(), schema_for(true));
                let (hist, cats) = (b.column(DENSE + 4).as_list::<i32>(), b.column(DENSE + 5).as_list::<i32>());
                let blob = b.column(DENSE + 6).as_binary::<i32>();
                for i in 0..b.num_rows() {
                    let r = row + i as u64;
                    assert_eq!(
                        hist.value(i).as_primitive::<arrow::datatypes::Int64Type>().values(),
                        &hist_row(5, r)[..]
                    );
                    assert_eq!(
                        cats.value(i).as_primitive::<arrow::datatypes::Int32Type>().values(),
                        &cats_row(5, r)[..]
                    );
                    assert_eq!(blob.value(i), &blob_row(5, r)[..]);
                }
                assert_eq!(hist.null_count() + cats.null_count() + blob.null_count(), 0);
                row += b.num_rows() as u64;
            }
        }
        assert_eq!(row, 2_000);
    }

    #[test]
    fn the_mixed_profile_has_its_three_kinds_of_features() {
        let distinct = |col: usize| {
            let mut v: Vec<u32> = (0..10_000).map(|r| dense_value_in(Values::Mixed, 3, r, col).to_bits()).collect();
            v.sort_unstable();
            v.dedup();
            v.len()
        };
        assert!(distinct(0) > 9_000, "continuous");
        assert!((10..=25).contains(&distinct(1)), "count-like: {}", distinct(1));
        assert_eq!(distinct(2), 64, "bucketised");
        let zeros = (0..10_000).filter(|&r| dense_value_in(Values::Mixed, 3, r, 4) == 0.0).count();
        assert!((4_500..5_500).contains(&zeros), "half the counts are zero: {zeros}");
        assert_eq!(dense_value_in(Values::Uniform, 3, 17, 4), dense_value(3, 17, 4));
        assert_eq!("mixed".parse::<Values>(), Ok(Values::Mixed));
        assert!("gauss".parse::<Values>().is_err());
    }

    #[test]
    fn mixed_files_use_dictionaries_and_hold_the_generated_values() {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let dir = tempfile::tempdir().unwrap();
        let spec =
            GenSpec { rows: 3_000, files: 1, row_group_rows: 1_000, values: Values::Mixed, ..GenSpec::default() };
        let report = generate(dir.path(), &spec, |_| {}).unwrap();
        let file = std::fs::File::open(&report.files[0]).unwrap();
        let reader = SerializedFileReader::new(file).unwrap();
        let rg = reader.metadata().row_group(0);
        assert!(rg.column(2).dictionary_page_offset().is_some(), "bucketised feature dictionary-encoded");
        let arrow = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            std::fs::File::open(&report.files[0]).unwrap(),
        )
        .unwrap()
        .build()
        .unwrap();
        let mut row = 0u64;
        for b in arrow {
            let b = b.unwrap();
            for col in [0usize, 1, 2, 149] {
                let a = b.column(col).as_any().downcast_ref::<Float32Array>().unwrap();
                for i in 0..b.num_rows() {
                    assert_eq!(a.value(i), dense_value_in(Values::Mixed, 0, row + i as u64, col));
                }
            }
            row += b.num_rows() as u64;
        }
        assert_eq!(row, 3_000);
    }

    #[test]
    fn the_view_resolves_against_the_generated_schema() {
        let v = super::view();
        assert_eq!(v.tensors.len(), 4);
        assert_eq!(v.tensors[0].columns.len(), super::DENSE);
        let resolved = granary_source::schema::resolve_view(&v, &super::schema(), "gen").unwrap();
        assert_eq!(resolved.layouts[1].shape, vec![super::EMB as u32]);
    }
}
