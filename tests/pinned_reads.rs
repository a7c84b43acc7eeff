//! Issue 15, reads pinned to the registered object: every ranged read of a
//! row group carries the ETag the manifest recorded (`If-Match`, and the
//! answer's own ETag is checked too), so a file overwritten after the
//! dataset version was registered is an error naming the file and both
//! tags, never its new bytes decoded with the old footer. Tried against a
//! real S3-compatible server (s3s-fs, in this test's process) and the
//! local filesystem, with the worst kind of overwrite: the same size, one
//! byte of row group 0's data changed, so every offset of the old footer
//! still points inside the file.

mod common;

use granary_node::Node;
use granary_node::config::{DatasetConfig, NodeConfig, ViewRef};
use granary_proto::ShardId;
use granary_testkit::datagen::{self, GenSpec};
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Flips one byte a quarter into `path` (inside row group 0's pages),
/// keeping its size.
fn overwrite_in_place(path: &Path) {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).expect("open");
    let at = f.metadata().expect("stat").len() / 4;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).expect("read");
    f.write_all_at(&[b[0] ^ 0x5a], at).expect("write");
}

async fn check(node: &Node, local: &Path) {
    let info = node.describe("ads", None).expect("describe");
    let (f0, f1) = (ShardId { file: 0, row_group: 0 }, ShardId { file: 1, row_group: 0 });
    let name = Path::new(&info.files[0]).file_name().expect("file name").to_owned();
    overwrite_in_place(&local.join(&name));
    let Err(e) = node.chunk(info.version, f0).await else { panic!("a changed file was converted") };
    let text = e.to_string();
    assert!(text.contains(&info.files[0]), "names the file: {text}");
    assert!(text.contains("changed since the dataset version was registered ("), "{text}");
    assert!(!text.contains("unknown now"), "names the store's tag now: {text}");
    // The other file is untouched and served.
    node.chunk(info.version, f1).await.expect("an unchanged file is served");
}

/// "ads" at `source`, no prefetch: nothing is read before the overwrite
/// but the footers.
fn node_config(source: String, remote: BTreeMap<String, String>) -> NodeConfig {
    NodeConfig {
        datasets: vec![DatasetConfig { name: "ads".into(), source, view: ViewRef::Inline(datagen::view()) }],
        remote,
        ram_bytes: 64 << 20,
        prefetch_bytes: 0,
        ..NodeConfig::default()
    }
}

fn generate(dir: &Path) {
    let spec = GenSpec {
        seed: 31,
        rows: 2_000,
        files: 2,
        row_group_rows: 1_000,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    datagen::generate(dir, &spec, |_| {}).expect("generate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_overwritten_after_registration_is_an_error_naming_both_etags_on_s3() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("train/ads");
    generate(&data);
    let addr = common::serve_object_store(tmp.path(), Some(("AKTEST", "SKTEST"))).await;
    let remote = common::s3_options(addr);
    let node = Node::start(&node_config("s3://train/ads/".into(), remote)).await.expect("s3:// node");
    // s3s-fs lists no ETags (S3 itself does), so the manifest records each
    // file's modification time, which answers carry in whole seconds: the
    // overwrite comes in a later second than the registration.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    check(&node, &data).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_overwritten_after_registration_is_an_error_naming_both_etags_on_the_local_filesystem() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("ads");
    generate(&data);
    let node = Node::start(&node_config(format!("file://{}", data.display()), BTreeMap::new())).await.expect("node");
    check(&node, &data).await;
}
