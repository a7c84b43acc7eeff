//! Issue 31, item 4: the placement watch sends a watcher that asks for
//! deltas the whole placement once (every placed version's owners), then
//! per placement epoch only the shards whose owner changed, and the node
//! whose status changed; folded, they are exactly what `DescribePlacement`
//! answers.

use granary_net::api::{ApiRequest, ApiResponse, OwnersChange, PlacementReport, PlacementUpdate};
use granary_net::frame;
use granary_net::placement::Placement;
use granary_net::tls::ALPN_API;
use granary_proto::NodeId;
use std::time::Duration;

mod common;
use common::*;

async fn next_update(recv: &mut quinn::RecvStream) -> PlacementUpdate {
    let read = frame::read_frame::<ApiResponse>(recv, frame::MAX_FRAME_BYTES);
    match tokio::time::timeout(Duration::from_secs(10), read).await.expect("an update within 10 s") {
        Ok(Some(ApiResponse::PlacementUpdate(u))) => u,
        other => panic!("{other:?}"),
    }
}

/// `(file, row_group, owner)` per shard, from a folded placement's table.
fn owners_of(p: &Placement, report: &PlacementReport) -> Vec<(u32, u32, NodeId)> {
    let table = &p.tables[&report.version];
    report.owners.iter().zip(&table.owners).map(|(&(f, g, _), &o)| (f, g, o)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leave_sends_watchers_only_the_moved_shards() {
    let f = start(Duration::from_millis(1500)).await;
    let node = f.client("node");
    let mut incarnations = Vec::new();
    for n in 1..=4 {
        incarnations.push(register(&node, n).await);
    }
    let data = f.tmp.path().join("data-src");
    let spec = granary_testkit::datagen::GenSpec { rows: 8_000, row_group_rows: 25, ..Default::default() };
    granary_testkit::datagen::generate(&data, &spec, |_| {}).expect("generate");
    let add = ApiRequest::AddDataset {
        name: "ads".into(),
        source: format!("file://{}/", data.display()),
        view: granary_testkit::datagen::view(),
        progress: false,
    };
    let admin = f.client("admin");
    admin.call(&add).await.expect("dataset added");
    let describe = ApiRequest::DescribePlacement { name: "ads".into(), version: None };
    let placement = |r: ApiResponse| match r {
        ApiResponse::Placement(p) => p,
        other => panic!("{other:?}"),
    };
    let before = placement(admin.call(&describe).await.expect("placement").1);
    assert_eq!(before.owners.len(), 320);

    let conn = f.connect("node", ALPN_API).await.expect("connect");
    let (mut send, mut recv) = conn.open_bi().await.expect("stream");
    frame::write_frame(&mut send, &ApiRequest::WatchPlacement { after_revision: 0, deltas: true }).await.expect("ask");
    let _ = send.finish();
    let whole = next_update(&mut recv).await;
    assert!(whole.full);
    assert_eq!(whole.nodes.len(), 4);
    let mut known = Placement::apply(None, whole).expect("the whole placement");
    assert_eq!(owners_of(&known, &before), before.owners, "the watch's table is DescribePlacement's");

    // Nodes 1-3 heartbeat; node 4 stays silent and expires.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(4500);
    while tokio::time::Instant::now() < deadline {
        for (n, &inc) in incarnations.iter().enumerate().take(3) {
            let hb = ApiRequest::Heartbeat { node: NodeId(n as u64 + 1), incarnation: inc };
            node.call(&hb).await.expect("heartbeat");
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let after = placement(admin.call(&describe).await.expect("placement").1);
    assert!(after.placement_epoch > before.placement_epoch, "node 4 expired");
    let moved = before.owners.iter().filter(|o| o.2 == NodeId(4)).count();
    assert!(moved > 0);
    // Updates until the watcher stands at the epoch of the leave.
    let mut changed = 0;
    while known.view.placement_epoch < after.placement_epoch {
        let update = next_update(&mut recv).await;
        assert!(!update.full);
        for (_, change) in &update.owners {
            match change {
                OwnersChange::Changed(c) => changed += c.len(),
                OwnersChange::Whole { .. } => panic!("a whole table for a leave"),
            }
        }
        if !update.nodes.is_empty() {
            assert_eq!(update.nodes.iter().map(|n| (n.node, n.live)).collect::<Vec<_>>(), [(NodeId(4), false)]);
        }
        known = Placement::apply(Some(&known), update).expect("the update fits");
    }
    assert_eq!(changed, moved, "exactly the leaver's shards were sent");
    assert_eq!(owners_of(&known, &after), after.owners, "folded, the watch agrees with DescribePlacement");
    f.coordinator.shutdown().await;
}
