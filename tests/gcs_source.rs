//! A `gs://` source: object_store's Google Cloud Storage client, configured
//! through the node's `[remote]` options (a service-account file naming the
//! endpoint, OAuth off), against a storage server on loopback that speaks
//! the XML API object_store uses for GCS (list-type=2 listing, ranged GET,
//! HEAD; s3s-fs, in this test's process, without authentication). Every
//! tensor of every shard must equal what the same files give from
//! `file://`.

mod common;
mod sources;

use granary_node::Node;
use granary_testkit::datagen::{self, GenSpec};
use std::collections::BTreeMap;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gs_source_gives_the_same_tensors_as_the_same_files_on_disk() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("train/ads");
    let spec = GenSpec {
        seed: 12,
        rows: 3_000,
        files: 2,
        row_group_rows: 1_000,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    datagen::generate(&data, &spec, |_| {}).expect("generate");
    let addr = common::serve_object_store(tmp.path(), None).await;
    let key = tmp.path().join("service-account.json");
    let account = format!(
        r#"{{"private_key": "unused", "private_key_id": "unused", "client_email": "test@example.invalid", "disable_oauth": true, "gcs_base_url": "http://{addr}"}}"#
    );
    std::fs::write(&key, account).expect("write service account");
    let remote = BTreeMap::from([("google_service_account".to_string(), key.display().to_string())]);

    let gs = Node::start(&sources::node_config("gs://train/ads/".into(), remote)).await.expect("gs:// node");
    let disk =
        Node::start(&sources::node_config(format!("file://{}", data.display()), BTreeMap::new())).await.expect("node");
    let a = sources::assert_same_tensors(&gs, &disk).await;
    assert_eq!(a.files.len(), 2);
    let stats = gs.stats();
    assert!(stats.remote_bytes > 0 && stats.conversions == a.shards.len() as u64, "{stats:?}");
}
