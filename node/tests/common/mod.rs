//! Helpers of the node's end-to-end test files (`bad_input.rs`, `view_fit.rs`,
//! `socket.rs`, `memory.rs`; `peer.rs` and `verify.rs` use `fabric`): a generated
//! dataset, a node's config over it, bounded
//! waits, and value-by-value checks of served chunks. Each file uses a part.
#![allow(dead_code)]

pub(crate) mod daemon;
pub(crate) mod fabric;

use granary_client::{Chunk, ChunkSource, ClientError};
use granary_node::EmbeddedNode;
use granary_node::config::{DatasetConfig, NodeConfig, ViewRef};
use granary_proto::wire::{DatasetInfo, ErrorKind};
use granary_proto::{DatasetVersion, ShardId, View};
use granary_testkit::datagen::{self, GenSpec};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

/// Seed of every generated dataset.
pub(crate) const SEED: u64 = 11;
/// Bound on any single blocking step (start, fetch, socket read).
pub(crate) const WAIT: Duration = Duration::from_secs(60);

/// Runs `f` on its own thread and waits at most [`WAIT`] for it.
pub(crate) fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(WAIT) {
        Ok(v) => v,
        Err(RecvTimeoutError::Timeout) => panic!("{what} did not finish within {WAIT:?}"),
        Err(RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

pub(crate) fn parse_view(text: &str) -> View {
    toml::from_str::<View>(text).expect("test view parses").validated().expect("test view is valid")
}

pub(crate) fn config(dir: &Path, view: View) -> NodeConfig {
    NodeConfig {
        datasets: vec![DatasetConfig {
            name: "ads".into(),
            source: format!("file://{}", dir.display()),
            view: ViewRef::Inline(view),
        }],
        ram_bytes: 64 << 20,
        // No prefetch: every load in these tests is one the test asked for.
        prefetch_bytes: 0,
        max_concurrent_loads: 2,
        convert_threads: Some(1),
        ..NodeConfig::default()
    }
}

pub(crate) fn generate(dir: &Path, files: u32, rows: u64, row_group_rows: u64, compression: &str) -> Vec<PathBuf> {
    let spec =
        GenSpec { seed: SEED, rows, files, row_group_rows, compression: compression.into(), ..GenSpec::default() };
    datagen::generate(dir, &spec, |_| {}).expect("generate dataset").files
}

pub(crate) fn start(cfg: NodeConfig) -> Arc<EmbeddedNode> {
    within("node start", move || match EmbeddedNode::start(&cfg, 2) {
        Ok(n) => Arc::new(n),
        Err(e) => panic!("node did not start: {e}"),
    })
}

/// Starts a node that must refuse to start; returns the error's text.
pub(crate) fn start_refused(cfg: NodeConfig) -> String {
    within("node start", move || match EmbeddedNode::start(&cfg, 2) {
        Ok(_) => panic!("the node started despite the bad input"),
        Err(e) => e.to_string(),
    })
}

pub(crate) fn describe(node: &Arc<EmbeddedNode>) -> DatasetInfo {
    let node = node.clone();
    within("describe", move || node.describe("ads", None).expect("describe ads"))
}

pub(crate) fn fetch(node: &Arc<EmbeddedNode>, version: DatasetVersion, shard: ShardId) -> Result<Chunk, ClientError> {
    let node = node.clone();
    within("fetch", move || node.fetch(version, shard))
}

/// Fetches a shard that must fail with a node error; returns kind and message.
pub(crate) fn fetch_refused(node: &Arc<EmbeddedNode>, version: DatasetVersion, shard: ShardId) -> (ErrorKind, String) {
    match fetch(node, version, shard) {
        Ok(c) => panic!("shard {shard} was served ({c:?}) despite the bad input"),
        Err(ClientError::Node { kind, message }) => (kind, message),
        Err(other) => panic!("shard {shard}: expected a node error, got {other}"),
    }
}

pub(crate) fn assert_names(message: &str, parts: &[&str]) {
    for p in parts {
        assert!(message.contains(p), "error message does not name {p:?}: {message}");
    }
}

/// Global row of each shard's first row, in manifest order.
pub(crate) fn first_rows(info: &DatasetInfo) -> Vec<(ShardId, u64)> {
    let mut acc = 0;
    info.shards
        .iter()
        .map(|s| {
            let first = acc;
            acc += s.rows;
            (s.shard, first)
        })
        .collect()
}

pub(crate) fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

pub(crate) fn i64s(b: &[u8]) -> Vec<i64> {
    b.chunks_exact(8).map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect()
}

/// The first value of a datagen chunk that differs from the generator's
/// formula (compared bit for bit), if any.
pub(crate) fn datagen_mismatch(chunk: &Chunk, first_row: u64) -> Option<String> {
    let h = chunk.header();
    let rows = h.rows as usize;
    let names: Vec<&str> = h.tensors.iter().map(|t| t.name.as_str()).collect();
    if names != ["dense", "emb", "ids", "label"] {
        return Some(format!("tensors {names:?}"));
    }
    let dense = f32s(chunk.tensor_bytes(0));
    let emb = f32s(chunk.tensor_bytes(1));
    let ids = i64s(chunk.tensor_bytes(2));
    let label = f32s(chunk.tensor_bytes(3));
    if dense.len() != rows * datagen::DENSE
        || emb.len() != rows * datagen::EMB
        || ids.len() != rows * 2
        || label.len() != rows
    {
        return Some(format!("tensor lengths do not match {rows} rows"));
    }
    for r in 0..rows {
        let g = first_row + r as u64;
        for c in 0..datagen::DENSE {
            if dense[r * datagen::DENSE + c].to_bits() != datagen::dense_value(SEED, g, c).to_bits() {
                return Some(format!("row {g} dense column {c}"));
            }
        }
        for k in 0..datagen::EMB {
            if emb[r * datagen::EMB + k].to_bits() != datagen::emb_value(SEED, g, k).to_bits() {
                return Some(format!("row {g} emb element {k}"));
            }
        }
        if ids[2 * r] != datagen::user_id(SEED, g) || ids[2 * r + 1] != datagen::item_id(SEED, g) {
            return Some(format!("row {g} ids"));
        }
        if label[r].to_bits() != datagen::label(SEED, g).to_bits() {
            return Some(format!("row {g} label"));
        }
    }
    None
}

/// Writes `batches` to a Parquet file at `path`, one row group each.
pub(crate) fn write_parquet(path: &Path, batches: &[arrow::array::RecordBatch]) {
    let file = std::fs::File::create(path).expect("create parquet");
    let mut w = parquet::arrow::ArrowWriter::try_new(file, batches[0].schema(), None).expect("parquet writer");
    for b in batches {
        w.write(b).expect("write batch");
        w.flush().expect("close row group");
    }
    w.close().expect("close parquet");
}

/// A record batch of `cols` under a schema of `fields`.
pub(crate) fn batch(
    fields: Vec<arrow::datatypes::Field>,
    cols: Vec<arrow::array::ArrayRef>,
) -> arrow::array::RecordBatch {
    arrow::array::RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(fields)), cols)
        .expect("test batch fits its schema")
}

/// A node's config serving `data` as dataset "ads" with the view in
/// `view_toml`: a 64 MiB RAM tier, no prefetch.
pub(crate) fn config_with_view(data: &Path, view_toml: &str) -> NodeConfig {
    let view: View = toml::from_str::<View>(view_toml).expect("view").validated().expect("valid");
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

/// `bytes` as little-endian values of `E` bytes each.
pub(crate) fn le<const E: usize, T>(bytes: &[u8], f: impl Fn([u8; E]) -> T) -> Vec<T> {
    bytes.chunks_exact(E).map(|c| f(c.try_into().expect("E bytes"))).collect()
}
