//! Placement as the watch delivers it to nodes: a whole [`Placement`] (the
//! cluster view and the owner table of every placed version) on a stream's
//! first message, then per change only what changed ([`PlacementUpdate`]):
//! node statuses that changed, and per version the shards whose owner (or
//! handed-over-from node) changed. A join or a leave moves about 1/N of the
//! shards, so a node receives that, not the whole placement again.
//!
//! Pure: the leader computes an update as the difference of two placements
//! ([`Placement::update_from`]), the node folds it into what it knew
//! ([`Placement::apply`]); `apply(a, a.update_to(b)) == b` is tested. An
//! update that does not fit what the node knows (no base, an index past a
//! table's end) is an error naming the version and the shard index, never a
//! wrong owner: the node then opens the watch again and starts from a whole
//! placement.

use crate::api::{NodeStatus, OwnersChange, PlacementUpdate, PlacementView, ShardChange};
use granary_proto::{DatasetVersion, NodeId};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The owners of one placed dataset version, in manifest order.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct OwnerTable {
    /// Owner of every shard (empty while no node is live).
    pub owners: Vec<NodeId>,
    /// Per shard, the live node it was handed over from (the coordinator's
    /// `handed_from`): empty when no shard was, else as long as `owners`.
    pub from: Vec<Option<NodeId>>,
}

impl OwnerTable {
    /// A table of `owners` and `from` (which is dropped when it names no
    /// node, so that an empty `from` means "none handed over").
    pub fn new(owners: Vec<NodeId>, from: Vec<Option<NodeId>>) -> Self {
        let from = if from.iter().all(Option::is_none) { Vec::new() } else { from };
        Self { owners, from }
    }

    /// Shards in the table.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    /// Whether no shard is owned (no node was live).
    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    /// The node shard `index` was handed over from, if any.
    pub fn from(&self, index: usize) -> Option<NodeId> {
        self.from.get(index).copied().flatten()
    }

    /// The shards whose owner or handed-over-from node differ between
    /// `base` and `self`; None when the tables are not of the same length
    /// (the whole table is sent instead).
    pub fn changes_from(&self, base: &OwnerTable) -> Option<Vec<ShardChange>> {
        if base.len() != self.len() {
            return None;
        }
        let mut out = Vec::new();
        for (i, (&owner, &was)) in self.owners.iter().zip(&base.owners).enumerate() {
            let from = self.from(i);
            if owner != was || from != base.from(i) {
                out.push(ShardChange(i as u32, owner, from));
            }
        }
        Some(out)
    }

    /// Applies `changes` to this table (of `version`, named in errors).
    pub fn apply(&mut self, version: DatasetVersion, changes: &[ShardChange]) -> Result<(), UpdateError> {
        let len = self.len();
        if let Some(bad) = changes.iter().find(|c| c.0 as usize >= len) {
            return Err(UpdateError::IndexPastEnd { version, index: bad.0, len });
        }
        for &ShardChange(i, owner, from) in changes {
            let i = i as usize;
            self.owners[i] = owner;
            if from.is_some() && self.from.is_empty() {
                self.from = vec![None; len];
            }
            if let Some(slot) = self.from.get_mut(i) {
                *slot = from;
            }
        }
        if self.from.iter().all(Option::is_none) {
            self.from = Vec::new();
        }
        Ok(())
    }

    fn whole(&self) -> OwnersChange {
        let handed = self.from.iter().enumerate().filter_map(|(i, f)| Some((i as u32, (*f)?))).collect();
        OwnersChange::Whole { owners: self.owners.clone(), handed }
    }

    fn from_whole(version: DatasetVersion, owners: Vec<NodeId>, handed: &[(u32, NodeId)]) -> Result<Self, UpdateError> {
        let len = owners.len();
        let mut from = Vec::new();
        if !handed.is_empty() {
            from = vec![None; len];
            for &(i, node) in handed {
                let slot = from.get_mut(i as usize).ok_or(UpdateError::IndexPastEnd { version, index: i, len })?;
                *slot = Some(node);
            }
        }
        Ok(Self::new(owners, from))
    }
}

/// Why an update could not be folded into what a node knew.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpdateError {
    /// A change to nothing: the stream's first message was not whole.
    #[error("a placement update (revision {revision}) that changes a placement, on a watch that has none")]
    NoBase {
        /// The update's revision.
        revision: u64,
    },
    /// Changes to the table of a version the node has no table for.
    #[error("a placement update changes the owners of version {version}, of which no table is known")]
    NoTable {
        /// The version.
        version: DatasetVersion,
    },
    /// A shard index past the end of a version's table.
    #[error("a placement update names shard {index} of version {version}, whose table has {len} shards")]
    IndexPastEnd {
        /// The version.
        version: DatasetVersion,
        /// The index named.
        index: u32,
        /// The table's length.
        len: usize,
    },
}

/// The placement as a watcher knows it: the cluster view, and the owner
/// table of every placed version (current or held). From a coordinator that
/// sends whole views only, `tables` is empty (the node then asks for each
/// version's owners).
#[derive(Clone, PartialEq, Debug)]
pub struct Placement {
    /// The view (every node; `older` always given).
    pub view: PlacementView,
    /// Owner tables by version.
    pub tables: BTreeMap<DatasetVersion, Arc<OwnerTable>>,
}

impl Placement {
    /// A placement known from a whole view, without owner tables.
    pub fn from_view(view: PlacementView) -> Self {
        Self { view, tables: BTreeMap::new() }
    }

    /// The update that takes a watcher from `base` (None: nothing, so the
    /// whole placement) to this placement; None when the watcher would see
    /// no change (no node, owner, epoch or version list changed). Tables
    /// shared with `base` (the same `Arc`) are not compared.
    pub fn update_from(&self, base: Option<&Placement>) -> Option<PlacementUpdate> {
        let v = &self.view;
        let mut update = PlacementUpdate {
            revision: v.revision,
            placement_epoch: v.placement_epoch,
            full: base.is_none(),
            nodes: Vec::new(),
            nodes_gone: Vec::new(),
            datasets: v.datasets.clone(),
            held: v.held.clone(),
            older: v.older.clone().unwrap_or_default(),
            owners: Vec::new(),
        };
        let Some(base) = base else {
            update.nodes = v.nodes.clone();
            update.owners = self.tables.iter().map(|(&ver, t)| (ver, t.whole())).collect();
            return Some(update);
        };
        let before: BTreeMap<NodeId, &NodeStatus> = base.view.nodes.iter().map(|n| (n.node, n)).collect();
        let after: BTreeMap<NodeId, &NodeStatus> = v.nodes.iter().map(|n| (n.node, n)).collect();
        update.nodes = v.nodes.iter().filter(|n| before.get(&n.node) != Some(n)).cloned().collect();
        update.nodes_gone = before.keys().filter(|n| !after.contains_key(n)).copied().collect();
        for (&ver, table) in &self.tables {
            let change = match base.tables.get(&ver) {
                Some(old) if Arc::ptr_eq(old, table) => continue,
                Some(old) => match table.changes_from(old) {
                    Some(c) if c.is_empty() => continue,
                    Some(c) => OwnersChange::Changed(c),
                    None => table.whole(),
                },
                None => table.whole(),
            };
            update.owners.push((ver, change));
        }
        let b = &base.view;
        let same = update.nodes.is_empty()
            && update.nodes_gone.is_empty()
            && update.owners.is_empty()
            && v.placement_epoch == b.placement_epoch
            && v.datasets == b.datasets
            && v.held == b.held
            && v.older.as_deref().unwrap_or_default() == b.older.as_deref().unwrap_or_default();
        (!same).then_some(update)
    }

    /// Folds `update` into `base` (what the watcher knew; None before the
    /// stream's first message).
    pub fn apply(base: Option<&Placement>, update: PlacementUpdate) -> Result<Placement, UpdateError> {
        let (mut nodes, mut tables) = match (base, update.full) {
            (_, true) => (BTreeMap::new(), BTreeMap::new()),
            (Some(b), false) => (b.view.nodes.iter().map(|n| (n.node, n.clone())).collect(), b.tables.clone()),
            (None, false) => return Err(UpdateError::NoBase { revision: update.revision }),
        };
        for gone in &update.nodes_gone {
            nodes.remove(gone);
        }
        for n in update.nodes {
            nodes.insert(n.node, n);
        }
        for (version, change) in update.owners {
            let table = match change {
                OwnersChange::Whole { owners, handed } => OwnerTable::from_whole(version, owners, &handed)?,
                OwnersChange::Changed(changes) => {
                    let Some(old) = tables.get(&version) else { return Err(UpdateError::NoTable { version }) };
                    let mut t = OwnerTable::clone(old);
                    t.apply(version, &changes)?;
                    t
                }
            };
            tables.insert(version, Arc::new(table));
        }
        let placed = |v: &DatasetVersion| update.datasets.iter().chain(&update.held).any(|(_, p)| p == v);
        tables.retain(|v, _| placed(v));
        let view = PlacementView {
            revision: update.revision,
            placement_epoch: update.placement_epoch,
            nodes: nodes.into_values().collect(),
            datasets: update.datasets,
            held: update.held,
            older: Some(update.older),
        };
        Ok(Placement { view, tables })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ver(n: u8) -> DatasetVersion {
        DatasetVersion([n; 16])
    }

    fn status(node: u64, live: bool) -> NodeStatus {
        NodeStatus {
            node: NodeId(node),
            addr: format!("10.0.0.{node}:7000"),
            incarnation: 1,
            live,
            ram_bytes: 1,
            ssd_bytes: 0,
            weight: 100,
            lease_left_ms: None,
            shards: 0,
        }
    }

    fn placement(nodes: Vec<NodeStatus>, tables: Vec<(DatasetVersion, OwnerTable)>) -> Placement {
        let datasets = tables.iter().enumerate().map(|(i, (v, _))| (format!("d{i}"), *v)).collect();
        Placement {
            view: PlacementView {
                revision: 7,
                placement_epoch: 3,
                nodes,
                datasets,
                held: Vec::new(),
                older: Some(Vec::new()),
            },
            tables: tables.into_iter().map(|(v, t)| (v, Arc::new(t))).collect(),
        }
    }

    #[test]
    fn a_leave_sends_the_moved_shards_and_the_one_node_that_changed() {
        let owners: Vec<NodeId> = (0..1000).map(|i| NodeId(i % 4)).collect();
        let before = placement(
            (0..4).map(|n| status(n, true)).collect(),
            vec![(ver(1), OwnerTable::new(owners.clone(), vec![]))],
        );
        // Node 3 leaves: its shards move to node 0, handed over from 3.
        let moved: Vec<NodeId> = owners.iter().map(|&o| if o == NodeId(3) { NodeId(0) } else { o }).collect();
        let from: Vec<Option<NodeId>> = owners.iter().map(|&o| (o == NodeId(3)).then_some(NodeId(3))).collect();
        let mut nodes: Vec<_> = (0..4).map(|n| status(n, true)).collect();
        nodes[3].live = false;
        let after = placement(nodes, vec![(ver(1), OwnerTable::new(moved, from))]);

        let update = after.update_from(Some(&before)).expect("a change");
        assert!(!update.full);
        assert_eq!(update.nodes, vec![status(3, false)], "only the node that changed");
        let [(v, OwnersChange::Changed(changes))] = &update.owners[..] else { panic!("{:?}", update.owners) };
        assert_eq!((*v, changes.len()), (ver(1), 250), "only the moved quarter");
        assert_eq!(Placement::apply(Some(&before), update).unwrap(), after);

        let whole = after.update_from(None).expect("whole");
        assert!(whole.full);
        assert_eq!(Placement::apply(None, whole).unwrap(), after);
    }

    #[test]
    fn an_update_that_does_not_fit_is_an_error_naming_the_version_and_shard() {
        let before = placement(vec![status(1, true)], vec![(ver(1), OwnerTable::new(vec![NodeId(1); 4], vec![]))]);
        let mut after = before.clone();
        after.view.revision = 8;
        after
            .tables
            .insert(ver(1), Arc::new(OwnerTable::new(vec![NodeId(1), NodeId(1), NodeId(1), NodeId(2)], vec![])));
        let update = after.update_from(Some(&before)).expect("a change");
        assert_eq!(Placement::apply(None, update.clone()), Err(UpdateError::NoBase { revision: 8 }));

        let mut past = update.clone();
        past.owners[0].1 = OwnersChange::Changed(vec![ShardChange(4, NodeId(2), None)]);
        let err = Placement::apply(Some(&before), past).unwrap_err();
        assert_eq!(err, UpdateError::IndexPastEnd { version: ver(1), index: 4, len: 4 });
        assert!(err.to_string().contains("shard 4 of version"), "{err}");

        let mut unknown = update;
        unknown.owners[0].0 = ver(9);
        unknown.datasets[0].1 = ver(9);
        assert_eq!(Placement::apply(Some(&before), unknown), Err(UpdateError::NoTable { version: ver(9) }));
    }

    #[test]
    fn a_version_no_longer_placed_loses_its_table_and_an_unchanged_one_is_not_sent() {
        let t = OwnerTable::new(vec![NodeId(1); 3], vec![]);
        let before = placement(vec![status(1, true)], vec![(ver(1), t.clone()), (ver(2), t.clone())]);
        let mut after = before.clone();
        after.view.revision = 8;
        assert_eq!(after.update_from(Some(&before)), None, "a new revision that changes nothing a watcher sees");
        after.view.datasets.remove(0);
        after.tables.remove(&ver(1));
        let update = after.update_from(Some(&before)).expect("the lists changed");
        assert!(update.owners.is_empty() && update.nodes.is_empty(), "{update:?}");
        assert_eq!(Placement::apply(Some(&before), update).unwrap(), after);
    }

    /// A version collected changes only the list of older versions: the
    /// watcher is told, so that its node drops the version.
    #[test]
    fn a_change_to_the_version_lists_alone_is_sent() {
        let t = OwnerTable::new(vec![NodeId(1); 3], vec![]);
        let mut before = placement(vec![status(1, true)], vec![(ver(1), t)]);
        before.view.older = Some(vec![("d0".into(), ver(5))]);
        let mut after = before.clone();
        after.view.revision = 8;
        after.view.older = Some(Vec::new());
        let update = after.update_from(Some(&before)).expect("the older list changed");
        let folded = Placement::apply(Some(&before), update).unwrap();
        assert_eq!(folded.view.older, Some(Vec::new()));
        assert_eq!(folded, after);
    }

    fn table(len: usize, nodes: u64) -> impl Strategy<Value = OwnerTable> {
        (
            proptest::collection::vec(0..nodes, len),
            proptest::collection::vec(proptest::option::weighted(0.2, 0..nodes), len),
        )
            .prop_map(|(o, f)| {
                OwnerTable::new(o.into_iter().map(NodeId).collect(), f.into_iter().map(|f| f.map(NodeId)).collect())
            })
    }

    proptest! {
        /// Whatever the two placements, folding the update from one into
        /// the other gives the other; a whole update gives it from nothing.
        #[test]
        fn folding_the_update_gives_the_next_placement(
            (a, b) in (0usize..40).prop_flat_map(|len| (table(len, 5), table(len, 5))),
            c in (0usize..40).prop_flat_map(|len| table(len, 5)),
            live in proptest::collection::vec(any::<bool>(), 6),
            keep_first in any::<bool>(),
        ) {
            let before = placement((0..5).map(|n| status(n, true)).collect(), vec![(ver(1), a), (ver(2), c.clone())]);
            let nodes: Vec<_> = (0..6).filter(|&n| n != 2).map(|n| status(n as u64, live[n])).collect();
            let mut tables = vec![(ver(1), b), (ver(3), c)];
            if !keep_first { tables.remove(0); }
            let after = placement(nodes, tables);
            let update = after.update_from(Some(&before)).expect("a change");
            prop_assert_eq!(Placement::apply(Some(&before), update).unwrap(), after.clone());
            prop_assert_eq!(Placement::apply(None, after.update_from(None).expect("whole")).unwrap(), after);
        }
    }
}
