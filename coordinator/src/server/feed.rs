//! What the placement watch publishes to watchers that asked for deltas:
//! the [`Placement`] at the applied revision (the view and every placed
//! version's owner table), built once per revision and shared by every
//! watcher, and the encoded update from one revision to another, built
//! once and written to every watcher that stood at the first.
//!
//! A thousand nodes watch the leader. Per placement epoch each needs the
//! same bytes (the moved shards), so the leader copies the owners once per
//! revision (not once per watcher), compares two tables once per pair of
//! revisions, and encodes the result once. quinn sends slices of that one
//! encoding to every watcher (no copy per watcher), and it is charged once
//! to the byte budget until the last watcher has acknowledged it
//! ([`Responses::charged`]): after a leader change a thousand nodes fetch
//! the whole placement (4 MB at a million row groups) from one buffer.

use super::respond::{BUDGET_WAIT, Responses};
use crate::sm::Shared;
use crate::state::ClusterState;
use bytes::Bytes;
use granary_net::api::{ApiResponse, NodeStatus, PlacementView};
use granary_net::frame::{StreamError, encode_frame};
use granary_net::placement::{OwnerTable, Placement};
use granary_proto::DatasetVersion;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// How many encoded updates are kept: watchers stand at the last revision
/// or two, so a few pairs serve them all.
const FRAMES_KEPT: usize = 8;

/// An encoded update: from which revision (None: the whole placement) to
/// which, and its bytes (None: nothing changed), charged to the byte budget
/// while anyone holds them.
type Frame = ((Option<u64>, u64), Option<Bytes>);

/// What a watcher is sent next.
pub(super) enum Next {
    /// Nothing it sees changed.
    Nothing,
    /// This frame, shared with every watcher at the same revisions.
    Frame(Bytes),
    /// No room in the byte budget for the frame: the watch ends, and the
    /// watcher opens it again.
    NoRoom,
}

/// The updates encoded lately, and when building one last found no room.
#[derive(Default)]
struct Frames {
    kept: VecDeque<Frame>,
    starved_at: Option<Instant>,
}

/// The leader's shared watch feed.
#[derive(Default)]
pub(super) struct Feed {
    /// The last placement built, and the placement revision of its tables
    /// ([`crate::sm::Shared::read_placed`]).
    latest: Mutex<Option<(u64, Arc<Placement>)>>,
    /// Updates encoded lately, newest last.
    frames: Mutex<Frames>,
}

impl Feed {
    /// The placement at the applied revision (built under the state's read
    /// lock the first time; the owner tables are reused while no batch
    /// re-placed anything). Watchers that wake together wait, without
    /// holding a runtime thread, for the one that builds it.
    pub(super) async fn current(&self, shared: &Shared) -> Arc<Placement> {
        let mut latest = self.latest.lock().await;
        shared.read_placed(|a, placement_rev| {
            let revision = a.last_applied.map(|l| l.index).unwrap_or(0);
            if let Some((_, p)) = latest.as_ref().filter(|(_, p)| p.view.revision == revision) {
                return p.clone();
            }
            let before = latest.as_ref().map(|(rev, p)| (*rev == placement_rev, &p.tables));
            let p = Arc::new(build(&a.cluster, revision, before));
            *latest = Some((placement_rev, p.clone()));
            p
        })
    }

    /// The encoded update that takes a watcher from `from` (None: nothing)
    /// to `to`, charged once to `responses`' byte budget however many
    /// watchers it is written to.
    pub(super) async fn frame(
        &self,
        from: Option<&Arc<Placement>>,
        to: &Arc<Placement>,
        responses: &Responses,
    ) -> Result<Next, StreamError> {
        let key = (from.map(|f| f.view.revision), to.view.revision);
        // Held while the update is built: the watchers that wake together
        // wait (without holding a runtime thread) for the one that builds
        // it rather than each building it.
        let mut frames = self.frames.lock().await;
        if let Some((_, bytes)) = frames.kept.iter().find(|(k, _)| *k == key) {
            return Ok(bytes.clone().map_or(Next::Nothing, Next::Frame));
        }
        let Some(update) = to.update_from(from.map(|f| &**f)) else {
            keep(&mut frames.kept, (key, None));
            return Ok(Next::Nothing);
        };
        let encoded = encode_frame(&ApiResponse::PlacementUpdate(update))?;
        // Waiting for room holds the lock, so after one wait that found
        // none, the watchers queued behind it fail at once rather than
        // each waiting in turn.
        let wait = room_wait(frames.starved_at, Instant::now());
        let Some(bytes) = responses.charged(encoded, wait).await else {
            frames.starved_at = Some(Instant::now());
            return Ok(Next::NoRoom);
        };
        frames.starved_at = None;
        keep(&mut frames.kept, (key, Some(bytes.clone())));
        Ok(Next::Frame(bytes))
    }
}

/// How long building a frame at `now` waits for room in the answer budget:
/// [`BUDGET_WAIT`], or nothing while a build that found no room
/// (`starved_at`) is more recent than that.
fn room_wait(starved_at: Option<Instant>, now: Instant) -> Duration {
    match starved_at {
        Some(t) if now.saturating_duration_since(t) < BUDGET_WAIT => Duration::ZERO,
        _ => BUDGET_WAIT,
    }
}

/// Keeps `frame`, dropping the oldest beyond [`FRAMES_KEPT`].
fn keep(kept: &mut VecDeque<Frame>, frame: Frame) {
    if kept.len() >= FRAMES_KEPT {
        kept.pop_front();
    }
    kept.push_back(frame);
}

/// The placement of `state` at `revision`. `before` is the last placement's
/// tables, and whether the owners are unchanged since (then they are
/// reused as they are); a table rebuilt equal to the one before is replaced
/// by it, so that watchers find it unchanged without comparing.
fn build(
    state: &ClusterState,
    revision: u64,
    before: Option<(bool, &BTreeMap<DatasetVersion, Arc<OwnerTable>>)>,
) -> Placement {
    let datasets: Vec<_> =
        state.datasets.iter().filter_map(|(n, r)| r.current().map(|v| (n.clone(), v.version))).collect();
    let held = state.held_versions();
    let older =
        state.datasets.iter().flat_map(|(n, r)| r.older().iter().map(move |v| (n.clone(), v.version))).collect();
    let mut tables = BTreeMap::new();
    let placed = datasets.iter().map(|d| (d, true)).chain(held.iter().map(|d| (d, false)));
    for ((name, version), current) in placed {
        let old = before.and_then(|(_, t)| t.get(version));
        let table = match (before, old) {
            (Some((true, _)), Some(old)) => old.clone(),
            _ => {
                let from = if current { state.handed_from(name) } else { Vec::new() };
                let table = OwnerTable::new(state.owners_of(name, *version).to_vec(), from);
                match old {
                    Some(old) if **old == table => old.clone(),
                    _ => Arc::new(table),
                }
            }
        };
        tables.insert(*version, table);
    }
    // Statuses without leases (they change on every heartbeat) or shard
    // counts (every node's changes on every epoch): `Status` has both.
    let nodes = state
        .nodes
        .iter()
        .map(|(&node, r)| NodeStatus {
            node,
            addr: r.addr.clone(),
            incarnation: r.incarnation,
            live: r.live,
            ram_bytes: r.ram_bytes,
            ssd_bytes: r.ssd_bytes,
            weight: state.weight(node),
            lease_left_ms: None,
            shards: 0,
        })
        .collect();
    let view =
        PlacementView { revision, placement_epoch: state.placement_epoch, nodes, datasets, held, older: Some(older) };
    Placement { view, tables }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Command;
    use granary_proto::{FileEntry, Manifest, NodeId, RowGroupEntry, View};

    fn manifest(files: usize) -> Manifest {
        Manifest {
            source: "file:///d".into(),
            files: (0..files)
                .map(|i| FileEntry {
                    path: format!("part-{i}.parquet"),
                    size_bytes: 100,
                    version_tag: "t".into(),
                    row_groups: vec![RowGroupEntry { rows: 10, compressed_bytes: 50, values_bytes: None }; 10],
                    footer_sha256: None,
                })
                .collect(),
            tensors: vec![],
        }
    }

    fn register(s: &mut ClusterState, n: u64) {
        s.apply(&Command::RegisterNode {
            node: NodeId(n),
            addr: format!("10.0.0.{n}:7000"),
            ram_bytes: 1,
            ssd_bytes: 0,
            registration: 0,
        });
    }

    #[test]
    fn after_a_build_found_no_room_the_next_ones_wait_for_none_until_the_wait_has_passed() {
        let t = Instant::now();
        assert_eq!(room_wait(None, t), BUDGET_WAIT);
        assert_eq!(room_wait(Some(t), t), Duration::ZERO);
        assert_eq!(room_wait(Some(t), t + BUDGET_WAIT - Duration::from_millis(1)), Duration::ZERO);
        assert_eq!(room_wait(Some(t), t + BUDGET_WAIT), BUDGET_WAIT, "the budget may have room again");
    }

    #[test]
    fn a_leave_publishes_the_moved_shards_and_one_node() {
        let mut s = ClusterState::default();
        for n in 1..=10 {
            register(&mut s, n);
        }
        s.apply(&Command::AddDataset { name: "d".into(), view: View { tensors: vec![] }, manifest: manifest(100) });
        let before = Arc::new(build(&s, 1, None));
        let version = before.view.datasets[0].1;
        assert_eq!(before.tables[&version].len(), 1000);

        let incarnation = s.nodes[&NodeId(3)].incarnation;
        s.apply(&Command::ExpireNode { node: NodeId(3), incarnation });
        let after = build(&s, 2, Some((false, &before.tables)));
        let moved = before.tables[&version].owners.iter().filter(|&&o| o == NodeId(3)).count();
        let update = after.update_from(Some(&before)).expect("a leave changes the placement");
        assert_eq!(update.nodes.len(), 1, "only the node that left: {:?}", update.nodes);
        let [(_, granary_net::api::OwnersChange::Changed(changes))] = &update.owners[..] else {
            panic!("{:?}", update.owners)
        };
        assert_eq!(changes.len(), moved, "exactly the leaver's shards");
        assert_eq!(Placement::apply(Some(&before), update).unwrap(), after);

        // Nothing re-placed: the same tables, shared.
        let again = build(&s, 3, Some((true, &after.tables)));
        assert!(Arc::ptr_eq(&again.tables[&version], &after.tables[&version]));
        // Re-placed to the same owners: the table before is kept.
        let rebuilt = build(&s, 4, Some((false, &after.tables)));
        assert!(Arc::ptr_eq(&rebuilt.tables[&version], &after.tables[&version]));
    }
}
