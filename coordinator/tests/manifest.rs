//! Issue 31: a manifest reaches the log as pieces (one entry each) and one
//! small entry naming them; the state it registers survives a restart
//! through a snapshot that keeps it compact; nodes fetch it in pieces.

use granary_net::api::{AddProgress, AddStage, ApiRequest, ApiResponse, FailureKind};
use granary_net::client::ClientError;
use granary_node::fabric::manifest::fetch_manifest;
use granary_proto::manifest::ManifestPieces;
use std::time::Duration;

mod common;
use common::*;

const PIECE_BYTES: usize = 2 << 10;

fn described(r: ApiResponse) -> (granary_net::api::DatasetSummary, granary_proto::Manifest, granary_proto::View) {
    match r {
        ApiResponse::Dataset { summary, manifest, view } => (summary, manifest, view),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_registered_in_pieces_is_whole_after_a_restart_from_a_snapshot() {
    let tune = |c: &mut granary_coordinator::CoordinatorConfig| {
        c.manifest_piece_bytes = PIECE_BYTES;
        c.snapshot_after_entries = 4;
        c.keep_log_entries = 1;
    };
    let f = start_tuned(tempfile::tempdir().expect("tempdir"), Duration::from_secs(30), false, tune).await;
    register(&f.client("node"), 1).await;
    let data = f.tmp.path().join("data-src");
    let spec = granary_testkit::datagen::GenSpec { rows: 40_000, row_group_rows: 25, ..Default::default() };
    granary_testkit::datagen::generate(&data, &spec, |_| {}).expect("generate");
    let add = ApiRequest::AddDataset {
        name: "ads".into(),
        source: format!("file://{}/", data.display()),
        view: granary_testkit::datagen::view(),
        progress: true,
    };
    let admin = f.client("admin");
    // Asked with progress: each step's first frame comes at once, then at
    // most four a second, then the answer on the same stream.
    let mut seen: Vec<AddProgress> = Vec::new();
    let (_, added) = admin.call_reporting(&add, |p| seen.push(*p)).await.expect("dataset added");
    let ApiResponse::DatasetAdded { summary, new: true } = added else { panic!("{added:?}") };
    assert_eq!(summary.shards, 1_600);
    assert!(
        seen.iter().any(|p| p.stage == AddStage::Footers && p.total == summary.files as u64),
        "the footers' step, of every file: {seen:?}"
    );
    assert!(seen.iter().all(|p| p.done <= p.total), "{seen:?}");
    assert!(seen.windows(2).all(|w| w[0].stage <= w[1].stage), "steps in order: {seen:?}");
    let describe = ApiRequest::DescribeDataset { name: "ads".into(), version: None };
    let (_, first) = admin.call(&describe).await.expect("describe");
    let (_, manifest, view) = described(first);
    assert_eq!(manifest.version(&view), summary.version);
    let pieces = ManifestPieces::cut(&manifest.to_compact(), PIECE_BYTES);
    assert!(pieces.count() >= 4, "{} pieces: the test needs several", pieces.count());
    // Registering the same version again stages nothing and changes nothing.
    let (_, again) = admin.call(&add).await.expect("dataset added again");
    assert!(matches!(again, ApiResponse::DatasetAdded { new: false, .. }), "{again:?}");
    // The entries passed the snapshot threshold: wait for the snapshot
    // holding the registered version.
    let path = f.tmp.path().join("data").join(granary_coordinator::sm::SNAPSHOT_FILE);
    let hex = summary.version.to_hex();
    let snapshot = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match std::fs::read_to_string(&path) {
                Ok(s) if s.contains(&hex) => return s,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("a snapshot with the version within 10 s");
    assert!(!snapshot.contains("part-"), "the snapshot keeps the manifest compact, not as JSON objects");
    let Fixture { tmp, coordinator, .. } = f;
    coordinator.shutdown().await;
    let f = start_tuned(tmp, Duration::from_secs(30), false, tune).await;
    let (_, after) = f.client("admin").call(&describe).await.expect("describe after the restart");
    let (summary2, manifest2, _) = described(after);
    assert_eq!((summary2.version, &manifest2), (summary.version, &manifest));
    // A node fetches it in pieces, each checked, and gets the same.
    let node = f.client("node");
    let (view2, fetched) =
        fetch_manifest(&node, "ads", summary.version).await.expect("the node fetches the manifest in pieces");
    assert_eq!((view2, fetched), (view, manifest));
    // A piece past the last, or of a version never registered, is not found, by name.
    let past = ApiRequest::ManifestPiece { name: "ads".into(), version: summary.version, index: pieces.count() };
    match node.call(&past).await {
        Err(ClientError::Failed { kind: FailureKind::NotFound, message, .. }) => {
            assert!(message.contains(&format!("no manifest piece {}", pieces.count())), "{message}")
        }
        other => panic!("{other:?}"),
    }
    let unknown = granary_proto::DatasetVersion([7; 16]);
    let err = fetch_manifest(&node, "ads", unknown).await.expect_err("an unknown version");
    assert!(err.not_found(), "{err}");
    assert!(err.to_string().contains(&unknown.to_string()), "{err}");
    f.coordinator.shutdown().await;
}
