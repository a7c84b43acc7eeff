//! The replicated cluster state and the pure function that applies a
//! command to it.
//!
//! [`ClusterState::apply`] reads no clock and does no I/O: every replica that
//! applies the same log reaches the same bytes.
//!
//! Placement is part of the state. A new dataset version is placed with
//! [`granary_proto::plan_placement`] over the live nodes; every later
//! membership event re-places it with [`granary_proto::placement::plan_rebalance`]
//! from the owners before the event. That is what lets a leave move only the
//! leaver's shards and a join move only shards to the joiner while every
//! node stays within 1.1x its weighted share: a function of membership alone
//! cannot do both (see the placement module). The owners are therefore a
//! function of the log, identical on every replica, and the placement epoch
//! numbers them.

use crate::staged::{self, Staging, StagingRefused};
use crate::types::{Command, CommandResult};
use granary_proto::placement::{NodeWeight, plan_placement, plan_rebalance, shard_key};
use granary_proto::{DatasetVersion, Manifest, NodeId, View};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A version being registered: already in the dataset's list (at this
/// index), or new.
enum Found {
    Seen(usize),
    Fresh(VersionRecord),
}

/// One registered version of a dataset.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct VersionRecord {
    /// Content hash of manifest and view.
    pub version: DatasetVersion,
    /// The view.
    pub view: View,
    /// The manifest (its compact form in base64 when serialized); shared,
    /// so that the copy of the state a re-placement works on
    /// (`crate::sm`) does not copy it.
    #[serde(with = "crate::staged::compact_manifest")]
    pub manifest: Arc<Manifest>,
    /// Nodes whose trainers use this version, by their latest
    /// [`Command::HoldVersions`] (live incarnations only: an expiry or a
    /// new registration drops a node's holds).
    #[serde(default)]
    pub held_by: BTreeSet<NodeId>,
    /// Owner of every shard, in manifest order, while this version is not
    /// the current one and a node holds it (empty otherwise: the current
    /// version's owners are [`ClusterState::owners`]).
    #[serde(default)]
    pub owners: Vec<NodeId>,
    /// When a [`Command::CollectVersions`] first found this version neither
    /// current nor held (the leader's clock, ms since the Unix epoch); it is
    /// collected once the retention has passed since.
    #[serde(default)]
    pub unused_since_ms: Option<u64>,
}

impl VersionRecord {
    /// Placement keys of this version's shards, in manifest order.
    pub fn shard_keys(&self) -> Vec<u64> {
        self.manifest.shards().iter().map(|s| shard_key(self.version, s.shard)).collect()
    }
}

/// A dataset: its versions, oldest first. The last one is current.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct DatasetRecord {
    /// Versions in registration order.
    pub versions: Vec<VersionRecord>,
}

impl DatasetRecord {
    /// The newest version.
    pub fn current(&self) -> Option<&VersionRecord> {
        self.versions.last()
    }

    /// The versions before the current one, oldest first.
    pub fn older(&self) -> &[VersionRecord] {
        let n = self.versions.len().saturating_sub(1);
        &self.versions[..n]
    }
}

/// What a version is to the cluster (see [`ClusterState::version_state`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum VersionState {
    /// The dataset's current version: placed over the live nodes.
    Current,
    /// An older version that trainers on some node still use: placed too.
    Held,
    /// An older version nobody uses: not placed, collected once the
    /// retention has passed since `since_ms` (None until the leader's next
    /// collection pass marks it).
    Unused {
        /// When it was first found unused.
        since_ms: Option<u64>,
    },
}

/// A data node as the cluster knows it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Peer address (`host:port`).
    pub addr: String,
    /// RAM tier capacity.
    pub ram_bytes: u64,
    /// SSD tier capacity.
    pub ssd_bytes: u64,
    /// Incarnation of its latest registration (unique across the cluster's
    /// history).
    pub incarnation: u64,
    /// False once the lease of `incarnation` expired.
    pub live: bool,
    /// The token of the registration that started `incarnation`.
    #[serde(default)]
    pub registration: u64,
    /// When a [`Command::CollectVersions`] first found this node not live
    /// (the leader's clock); its record is removed once the node retention
    /// has passed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_since_ms: Option<u64>,
}

/// The placement weight of a node no admin has weighed: every such node
/// takes an equal share. A node's reported capacity does not weigh it (a
/// node could claim any capacity and take every shard); an admin sets
/// weights with `granary nodes weight` (issue 29).
pub const DEFAULT_NODE_WEIGHT: u64 = 100;

/// Everything the coordinator replicates.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize)]
pub struct ClusterState {
    /// Datasets by name.
    pub datasets: BTreeMap<String, DatasetRecord>,
    /// Nodes by id, live or expired.
    pub nodes: BTreeMap<NodeId, NodeRecord>,
    /// Placement weights an admin set, by node (others weigh
    /// [`DEFAULT_NODE_WEIGHT`]).
    #[serde(default)]
    pub weights: BTreeMap<NodeId, u64>,
    /// Advances whenever the set of live nodes (or an incarnation, or a
    /// live node's weight) changes.
    pub placement_epoch: u64,
    /// The incarnation the next registration gets.
    pub next_incarnation: u64,
    /// Owner of every shard of each dataset's current version, in manifest
    /// order; empty while no node is live.
    pub owners: BTreeMap<String, Vec<NodeId>>,
    /// Per shard of each dataset's current version: the node that owned it
    /// before a placement moved it to its owner, kept until it moves again
    /// (also while that node is not live: it may come back holding what it
    /// held). While that node is live, the owner asks it for a copy it
    /// holds before reading remote storage (a handoff).
    #[serde(default)]
    pub handed_from: BTreeMap<String, Vec<Option<NodeId>>>,
    /// Manifest pieces staged for versions no entry has registered yet
    /// ([`crate::staged`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub staged: Staging,
    /// Whether a new version's shards start with the owners of the shards
    /// of the same content ([`Command::EnableContentOwners`],
    /// `crate::inherit`).
    #[serde(default)]
    pub content_owners: bool,
}

impl ClusterState {
    /// Applies one command. Deterministic: same state and command, same
    /// result and same new state.
    pub fn apply(&mut self, cmd: &Command) -> CommandResult {
        match cmd {
            Command::AddDataset { name, view, manifest } => {
                let version = manifest.version(view);
                self.add_version(name, view, version, || Ok(manifest.clone()))
            }
            Command::StageManifestPiece { version, index, of, data, at_ms } => CommandResult::PieceStaged {
                refused: staged::stage(&mut self.staged, *version, *index, *of, data, *at_ms).err(),
            },
            Command::AddStagedDataset { name, view, version, pieces } => {
                let from = self.staged.remove(version);
                let result =
                    self.add_version(name, view, *version, || staged::assemble(from.as_ref(), *version, pieces, view));
                if let (CommandResult::DatasetRefused { .. }, Some(from)) = (&result, from) {
                    // Kept for a retry; collected with the others if none comes.
                    self.staged.insert(*version, from);
                }
                result
            }
            Command::HoldVersions { node, incarnation, versions } => {
                if !self.nodes.get(node).is_some_and(|r| r.live && r.incarnation == *incarnation) {
                    return CommandResult::VersionsHeld { unknown: Vec::new(), stale: true };
                }
                let wanted: BTreeSet<(&str, DatasetVersion)> = versions.iter().map(|(n, v)| (n.as_str(), *v)).collect();
                let mut found = BTreeSet::new();
                for (name, record) in &mut self.datasets {
                    for v in &mut record.versions {
                        if wanted.contains(&(name.as_str(), v.version)) {
                            found.insert((name.as_str(), v.version));
                            if v.held_by.insert(*node) {
                                v.unused_since_ms = None;
                            }
                        } else {
                            v.held_by.remove(node);
                        }
                    }
                }
                let unknown = wanted.difference(&found).map(|&(n, v)| (n.to_string(), v)).collect::<Vec<_>>();
                self.place_older();
                CommandResult::VersionsHeld { unknown, stale: false }
            }
            Command::EnableContentOwners => {
                CommandResult::ContentOwners { turned_on: !std::mem::replace(&mut self.content_owners, true) }
            }
            Command::CollectVersions { now_ms, retention_ms, node_retention_ms } => {
                let mut collected = Vec::new();
                for (name, record) in &mut self.datasets {
                    let current = record.current().map(|v| v.version);
                    record.versions.retain_mut(|v| {
                        if Some(v.version) == current || !v.held_by.is_empty() {
                            v.unused_since_ms = None;
                            return true;
                        }
                        match v.unused_since_ms {
                            None => {
                                v.unused_since_ms = Some(*now_ms);
                                true
                            }
                            Some(since) if now_ms.saturating_sub(since) >= *retention_ms => {
                                collected.push((name.clone(), v.version));
                                false
                            }
                            Some(_) => true,
                        }
                    });
                }
                staged::collect(&mut self.staged, *now_ms);
                let nodes = match node_retention_ms {
                    Some(keep) => self.collect_nodes(*now_ms, *keep),
                    None => Vec::new(),
                };
                CommandResult::VersionsCollected { collected, nodes }
            }
            Command::RegisterNode { node, addr, ram_bytes, ssd_bytes, registration } => {
                if let Some(r) = self.nodes.get(node)
                    && *registration != 0
                    && r.live
                    && r.registration == *registration
                {
                    // A retry of a registration that already committed.
                    return CommandResult::NodeRegistered {
                        incarnation: r.incarnation,
                        placement_epoch: self.placement_epoch,
                    };
                }
                self.next_incarnation += 1;
                let incarnation = self.next_incarnation;
                // A new incarnation is a new process: its trainers (and so
                // its holds) are gone with the old one.
                self.drop_holds(*node);
                self.nodes.insert(
                    *node,
                    NodeRecord {
                        addr: addr.clone(),
                        ram_bytes: *ram_bytes,
                        ssd_bytes: *ssd_bytes,
                        incarnation,
                        live: true,
                        registration: *registration,
                        down_since_ms: None,
                    },
                );
                self.placement_epoch += 1;
                self.replace_all();
                CommandResult::NodeRegistered { incarnation, placement_epoch: self.placement_epoch }
            }
            Command::SetNodeWeight { node, weight } => {
                let before = self.weight(*node);
                match weight {
                    Some(w) => self.weights.insert(*node, (*w).max(1)),
                    None => self.weights.remove(node),
                };
                if self.weight(*node) != before && self.nodes.get(node).is_some_and(|r| r.live) {
                    self.placement_epoch += 1;
                    self.replace_all();
                }
                CommandResult::WeightSet { placement_epoch: self.placement_epoch }
            }
            Command::ExpireNode { node, incarnation } => match self.nodes.get_mut(node) {
                Some(r) if r.live && r.incarnation == *incarnation => {
                    r.live = false;
                    self.drop_holds(*node);
                    self.placement_epoch += 1;
                    self.replace_all();
                    CommandResult::NodeExpired { placement_epoch: Some(self.placement_epoch) }
                }
                _ => CommandResult::NodeExpired { placement_epoch: None },
            },
            Command::ExpireNodes { nodes } => {
                let mut expired = Vec::new();
                for (node, incarnation) in nodes {
                    if let Some(r) = self.nodes.get_mut(node)
                        && r.live
                        && r.incarnation == *incarnation
                    {
                        r.live = false;
                        expired.push(*node);
                    }
                }
                for node in &expired {
                    self.drop_holds(*node);
                }
                if expired.is_empty() {
                    return CommandResult::NodesExpired { expired, placement_epoch: None };
                }
                self.placement_epoch += 1;
                self.replace_all();
                CommandResult::NodesExpired { expired, placement_epoch: Some(self.placement_epoch) }
            }
        }
    }

    /// Registers `version` of dataset `name` (the manifest, built only if
    /// the version is new to the dataset, from `manifest`): it becomes
    /// current and is placed over the live nodes.
    fn add_version(
        &mut self,
        name: &str,
        view: &View,
        version: DatasetVersion,
        manifest: impl FnOnce() -> Result<Manifest, StagingRefused>,
    ) -> CommandResult {
        let known = self.datasets.get(name);
        if known.and_then(DatasetRecord::current).map(|v| v.version) == Some(version) {
            return CommandResult::DatasetAdded { version, new: false };
        }
        // A version seen before (an older one re-added) becomes current
        // again, from its owners if it was placed; only a version never
        // seen needs its manifest, and a refusal changes nothing.
        let found = match known.and_then(|r| r.versions.iter().position(|v| v.version == version)) {
            Some(i) => Found::Seen(i),
            None => match manifest() {
                Ok(manifest) => Found::Fresh(VersionRecord {
                    version,
                    view: view.clone(),
                    manifest: Arc::new(manifest),
                    held_by: BTreeSet::new(),
                    owners: Vec::new(),
                    unused_since_ms: None,
                }),
                Err(refused) => return CommandResult::DatasetRefused { refused },
            },
        };
        let live = self.live_nodes();
        let record = self.datasets.entry(name.to_string()).or_default();
        // The version that was current keeps its owners while a node holds
        // it: jobs pinned to it keep the fabric.
        let previous = self.owners.remove(name).unwrap_or_default();
        // A new version's shards of the same content start where the
        // chunks are.
        let seeded = match (&found, record.versions.last()) {
            (Found::Fresh(new), Some(old)) if self.content_owners => {
                crate::inherit::seed((&old.manifest, &old.view), &previous, (&new.manifest, &new.view), &live)
            }
            _ => None,
        };
        if let Some(old) = record.versions.last_mut() {
            old.owners = if old.held_by.is_empty() { Vec::new() } else { previous };
        }
        let mut v = match found {
            Found::Seen(i) => record.versions.remove(i),
            Found::Fresh(v) => v,
        };
        let before = std::mem::take(&mut v.owners);
        let keys = v.shard_keys();
        let mut owners = place(&keys, Some(&before).filter(|b| !b.is_empty()).map(|b| &b[..]), &live);
        if let Some(seed) = seeded {
            owners = crate::inherit::place(&keys, &seed, &owners, &live);
        }
        v.unused_since_ms = None;
        record.versions.push(v);
        self.owners.insert(name.to_string(), owners);
        self.handed_from.remove(name);
        CommandResult::DatasetAdded { version, new: true }
    }

    /// Live nodes with their weights, sorted by id.
    pub fn live_nodes(&self) -> Vec<NodeWeight> {
        self.nodes
            .iter()
            .filter(|(_, r)| r.live)
            .map(|(&node, _)| NodeWeight { node, weight: self.weight(node) })
            .collect()
    }

    /// A node's placement weight: what an admin set, else
    /// [`DEFAULT_NODE_WEIGHT`].
    pub fn weight(&self, node: NodeId) -> u64 {
        self.weights.get(&node).copied().unwrap_or(DEFAULT_NODE_WEIGHT)
    }

    /// The owner of every shard of a dataset's current version, in manifest
    /// order (empty while no node is live).
    pub fn owners(&self, dataset: &str) -> &[NodeId] {
        self.owners.get(dataset).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The owner of every shard of `version` of `dataset`, in manifest
    /// order: the current version's, or a held older version's (empty for
    /// an unknown or unused version, or while no node is live).
    pub fn owners_of(&self, dataset: &str, version: DatasetVersion) -> &[NodeId] {
        let Some(record) = self.datasets.get(dataset) else { return &[] };
        match record.current() {
            Some(c) if c.version == version => self.owners(dataset),
            _ => record.older().iter().find(|v| v.version == version).map(|v| &v.owners[..]).unwrap_or(&[]),
        }
    }

    /// What `version` of `dataset` is to the cluster; None if unknown.
    pub fn version_state(&self, dataset: &str, version: DatasetVersion) -> Option<VersionState> {
        let record = self.datasets.get(dataset)?;
        if record.current()?.version == version {
            return Some(VersionState::Current);
        }
        let v = record.older().iter().find(|v| v.version == version)?;
        Some(if v.held_by.is_empty() {
            VersionState::Unused { since_ms: v.unused_since_ms }
        } else {
            VersionState::Held
        })
    }

    /// Every older version a node holds, as (dataset, version): placed like
    /// the current ones.
    pub fn held_versions(&self) -> Vec<(String, DatasetVersion)> {
        let mut out = Vec::new();
        for (name, record) in &self.datasets {
            out.extend(record.older().iter().filter(|v| !v.held_by.is_empty()).map(|v| (name.clone(), v.version)));
        }
        out
    }

    /// Whether [`Command::CollectVersions`] at `now_ms` would change
    /// anything: a version to mark unused, or one whose retention has
    /// passed. The leader proposes the command only then.
    pub fn collection_due(&self, now_ms: u64, retention_ms: u64, node_retention_ms: Option<u64>) -> bool {
        let node_due = |r: &NodeRecord, keep: u64| {
            !r.live && r.down_since_ms.is_none_or(|since| now_ms.saturating_sub(since) >= keep)
        };
        if let Some(keep) = node_retention_ms
            && self.nodes.values().any(|r| node_due(r, keep))
        {
            return true;
        }
        self.datasets.values().any(|r| {
            r.older().iter().any(|v| {
                v.held_by.is_empty()
                    && v.unused_since_ms.is_none_or(|since| now_ms.saturating_sub(since) >= retention_ms)
            })
        }) || staged::expired(&self.staged, now_ms)
    }

    /// Marks the nodes that are not live as down since `now_ms` (those not
    /// marked yet), and removes the records of those down for `keep_ms`,
    /// with every hand-over naming them (a node that comes back registers
    /// as new, holding nothing the owners would ask it for). Returns the
    /// nodes removed. Changes no owner: a node that is not live owns
    /// nothing, and is named as handed over from only while live.
    fn collect_nodes(&mut self, now_ms: u64, keep_ms: u64) -> Vec<NodeId> {
        let mut removed = Vec::new();
        self.nodes.retain(|&node, r| {
            if r.live {
                r.down_since_ms = None;
                return true;
            }
            match r.down_since_ms {
                None => {
                    r.down_since_ms = Some(now_ms);
                    true
                }
                Some(since) if now_ms.saturating_sub(since) >= keep_ms => {
                    removed.push(node);
                    false
                }
                Some(_) => true,
            }
        });
        if !removed.is_empty() {
            self.handed_from.retain(|_, from| {
                for f in from.iter_mut() {
                    if f.is_some_and(|n| removed.contains(&n)) {
                        *f = None;
                    }
                }
                from.iter().any(Option::is_some)
            });
        }
        removed
    }

    /// Drops every hold of `node`.
    fn drop_holds(&mut self, node: NodeId) {
        for record in self.datasets.values_mut() {
            for v in &mut record.versions {
                v.held_by.remove(&node);
            }
        }
    }

    /// Places every held older version that is not placed yet, and unplaces
    /// those nobody holds any more.
    fn place_older(&mut self) {
        let live = self.live_nodes();
        for record in self.datasets.values_mut() {
            let n = record.versions.len().saturating_sub(1);
            for v in &mut record.versions[..n] {
                if v.held_by.is_empty() {
                    v.owners.clear();
                } else if v.owners.is_empty() {
                    v.owners = place(&v.shard_keys(), None, &live);
                }
            }
        }
    }

    /// Per shard of a dataset's current version, the node it was handed
    /// over from when that node is live now (see
    /// [`ClusterState::handed_from`]), in manifest order (empty when none).
    pub fn handed_from(&self, dataset: &str) -> Vec<Option<NodeId>> {
        let is_live = |n: NodeId| self.nodes.get(&n).is_some_and(|r| r.live);
        let Some(from) = self.handed_from.get(dataset) else { return Vec::new() };
        from.iter().map(|f| f.filter(|&f| is_live(f))).collect()
    }

    /// Shards owned per live node, summed over every dataset's current
    /// version.
    pub fn shards_per_node(&self) -> BTreeMap<NodeId, u64> {
        let mut out: BTreeMap<NodeId, u64> = self.live_nodes().iter().map(|n| (n.node, 0)).collect();
        for owner in self.owners.values().flatten() {
            *out.entry(*owner).or_default() += 1;
        }
        out
    }

    /// Re-places every dataset after a membership change (current
    /// versions and held older ones).
    fn replace_all(&mut self) {
        let live = self.live_nodes();
        for record in self.datasets.values_mut() {
            let n = record.versions.len().saturating_sub(1);
            for v in &mut record.versions[..n] {
                v.owners = if v.held_by.is_empty() {
                    Vec::new()
                } else {
                    let prev = std::mem::take(&mut v.owners);
                    place(&v.shard_keys(), Some(&prev).filter(|p| !p.is_empty()).map(|p| &p[..]), &live)
                };
            }
        }
        for (name, record) in &self.datasets {
            let Some(v) = record.current() else { continue };
            let previous = self.owners.get(name).map(Vec::as_slice);
            let owners = place(&v.shard_keys(), previous, &live);
            let before = self.handed_from.get(name).map(Vec::as_slice).unwrap_or(&[]);
            // Kept while the node is not live too: a node that comes back
            // (it was stopped or cut off) still holds what it held, and
            // the shards moved away from it may never have been read.
            let handed: Vec<Option<NodeId>> = owners
                .iter()
                .enumerate()
                .map(|(i, &owner)| {
                    let prev = previous.and_then(|p| p.get(i)).copied();
                    let from = match prev {
                        Some(p) if p != owner => Some(p),
                        _ => before.get(i).copied().flatten(),
                    };
                    from.filter(|&f| f != owner)
                })
                .collect();
            if handed.iter().any(Option::is_some) {
                self.handed_from.insert(name.clone(), handed);
            } else {
                self.handed_from.remove(name);
            }
            self.owners.insert(name.clone(), owners);
        }
    }
}

/// Owners for `keys` over `live`, incrementally from `previous` when there
/// is one. No live node (or no weight) leaves the shards unowned; inputs a
/// placement cannot index (over 2^32 shards) do too, rather than failing
/// the replicated apply.
fn place(keys: &[u64], previous: Option<&[NodeId]>, live: &[NodeWeight]) -> Vec<NodeId> {
    let planned = match previous {
        Some(prev) if prev.len() == keys.len() && !prev.is_empty() => plan_rebalance(keys, prev, live),
        // A fresh placement, settled by one re-placement over the same nodes:
        // plan_placement can leave a node of tiny share empty, which
        // plan_rebalance would take for a newcomer on the next event.
        _ => plan_placement(keys, live).and_then(|p| {
            let owners: Vec<NodeId> = p.owners().collect();
            plan_rebalance(keys, &owners, live)
        }),
    };
    planned.map(|p| p.owners().collect()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_proto::{FileEntry, RowGroupEntry};

    fn manifest(files: usize) -> Manifest {
        Manifest {
            source: "file:///data".into(),
            files: (0..files)
                .map(|i| FileEntry {
                    path: format!("part-{i}.parquet"),
                    size_bytes: 100,
                    version_tag: "t".into(),
                    row_groups: vec![RowGroupEntry { rows: 10, compressed_bytes: 50, values_bytes: None }; 4],
                    footer_sha256: None,
                })
                .collect(),
            tensors: vec![],
        }
    }

    fn view() -> View {
        View { tensors: vec![] }
    }

    fn register(s: &mut ClusterState, id: u64) -> u64 {
        match s.apply(&Command::RegisterNode {
            node: NodeId(id),
            addr: format!("127.0.0.1:{id}"),
            ram_bytes: 1 << 30,
            ssd_bytes: 0,
            registration: 0,
        }) {
            CommandResult::NodeRegistered { incarnation, .. } => incarnation,
            other => panic!("{other:?}"),
        }
    }

    /// Days `from..to` as files of 4 row groups each (`day-N.parquet`).
    fn days(from: usize, to: usize) -> Manifest {
        let mut m = manifest(0);
        m.files = (from..to)
            .map(|i| FileEntry {
                path: format!("day-{i}.parquet"),
                size_bytes: 100 + i as u64,
                version_tag: format!("t{i}"),
                row_groups: vec![RowGroupEntry { rows: 10, compressed_bytes: 50, values_bytes: None }; 4],
                footer_sha256: None,
            })
            .collect();
        m
    }

    /// The owner of each shard of `name`'s current version, by (file path,
    /// row group).
    fn owner_by_content(s: &ClusterState, name: &str) -> BTreeMap<(String, usize), NodeId> {
        let v = s.datasets[name].current().expect("a version");
        let keys = v.manifest.files.iter().flat_map(|f| (0..f.row_groups.len()).map(move |g| (f.path.clone(), g)));
        keys.zip(s.owners(name).iter().copied()).collect()
    }

    /// Issue 43: with owners that follow content, a window of days moved
    /// by one keeps every day it shares on the node that holds its chunks
    /// (within each node's share); without, a fresh placement keyed by
    /// version scatters them.
    #[test]
    fn a_new_day_keeps_the_owners_of_the_days_it_shares_once_content_owners_are_on() {
        let kept = |on: bool| {
            let mut s = ClusterState::default();
            (1..=4).for_each(|n| {
                register(&mut s, n);
            });
            if on {
                assert_eq!(s.apply(&Command::EnableContentOwners), CommandResult::ContentOwners { turned_on: true });
                assert_eq!(s.apply(&Command::EnableContentOwners), CommandResult::ContentOwners { turned_on: false });
            }
            s.apply(&Command::AddDataset { name: "d".into(), view: view(), manifest: days(0, 30) });
            let before = owner_by_content(&s, "d");
            s.apply(&Command::AddDataset { name: "d".into(), view: view(), manifest: days(1, 31) });
            let after = owner_by_content(&s, "d");
            let shared: Vec<_> = after.keys().filter(|k| before.contains_key(*k)).collect();
            assert_eq!(shared.len(), 29 * 4);
            let same = shared.iter().filter(|k| before[**k] == after[**k]).count();
            // Every node stays within its share either way.
            let mut loads = BTreeMap::new();
            after.values().for_each(|n| *loads.entry(*n).or_insert(0usize) += 1);
            assert!(loads.values().all(|&l| l <= 120 * 11 / 10 / 4 + 1), "{loads:?}");
            same as f64 / shared.len() as f64
        };
        let (on, off) = (kept(true), kept(false));
        assert_eq!(on, 1.0, "{on:.3} of the shared shards kept their owner with content owners on");
        assert!(off < 0.5, "{off:.3} kept by a placement keyed by version (about a quarter on 4 nodes)");
    }

    /// Over 2 to 6 nodes and windows moved by 1 to 3 days (or grown by
    /// them), every shared shard keeps its owner and every node stays
    /// within its share.
    #[test]
    fn shared_days_keep_their_owners_over_node_counts_and_moves() {
        for nodes in 2..=6u64 {
            for moved in 1..=3usize {
                for grows in [false, true] {
                    let mut s = ClusterState::default();
                    (1..=nodes).for_each(|n| {
                        register(&mut s, n);
                    });
                    s.apply(&Command::EnableContentOwners);
                    s.apply(&Command::AddDataset { name: "d".into(), view: view(), manifest: days(0, 12) });
                    let before = owner_by_content(&s, "d");
                    let first = if grows { 0 } else { moved };
                    s.apply(&Command::AddDataset { name: "d".into(), view: view(), manifest: days(first, 12 + moved) });
                    let after = owner_by_content(&s, "d");
                    let moved_away = after.iter().filter(|(k, n)| before.get(*k).is_some_and(|b| b != *n)).count();
                    assert_eq!(moved_away, 0, "{nodes} nodes, {moved} days moved (grown: {grows})");
                    let mut loads = BTreeMap::new();
                    after.values().for_each(|n| *loads.entry(*n).or_insert(0usize) += 1);
                    let share = after.len().div_ceil(nodes as usize);
                    assert!(loads.values().all(|&l| l <= share * 11 / 10 + 1), "{nodes} nodes: {loads:?}");
                }
            }
        }
    }

    /// The seed is all or nothing per version pair: another view or source
    /// shares no chunk, so nothing is inherited.
    #[test]
    fn another_view_or_source_inherits_nothing() {
        let live = [NodeWeight { node: NodeId(1), weight: 1 }];
        let a = days(0, 3);
        let owners = vec![NodeId(1); 12];
        let v = view();
        assert!(crate::inherit::seed((&a, &v), &owners, (&days(1, 4), &v), &live).is_some());
        let mut elsewhere = days(1, 4);
        elsewhere.source = "s3://other".into();
        assert!(crate::inherit::seed((&a, &v), &owners, (&elsewhere, &v), &live).is_none());
        let other_view: View =
            serde_json::from_str(r#"{"tensor": [{"name": "x", "dtype": "f32", "columns": ["x"]}]}"#).unwrap();
        assert!(crate::inherit::seed((&a, &v), &owners, (&days(1, 4), &other_view), &live).is_none());
        let seeded = crate::inherit::seed((&a, &v), &owners, (&days(1, 4), &v), &live).unwrap();
        assert_eq!(seeded.iter().filter(|s| s.is_some()).count(), 8, "days 1 and 2 are shared");
        let gone = [NodeWeight { node: NodeId(2), weight: 1 }];
        assert!(crate::inherit::seed((&a, &v), &owners, (&days(1, 4), &v), &gone).is_none(), "its owner is not live");
    }

    #[test]
    fn a_node_down_for_the_node_retention_is_collected_with_the_hand_overs_naming_it() {
        let mut s = ClusterState::default();
        let inc: Vec<u64> = (1..=3).map(|n| register(&mut s, n)).collect();
        s.apply(&Command::AddDataset { name: "d".into(), view: view(), manifest: manifest(40) });
        s.apply(&Command::ExpireNode { node: NodeId(3), incarnation: inc[2] });
        assert!(s.handed_from.get("d").is_some_and(|f| f.contains(&Some(NodeId(3)))), "kept while node 3 is down");
        let owners = s.owners("d").to_vec();
        let epoch = s.placement_epoch;
        let collect = |s: &mut ClusterState, now_ms, keep: Option<u64>| match s.apply(&Command::CollectVersions {
            now_ms,
            retention_ms: 1 << 40,
            node_retention_ms: keep,
        }) {
            CommandResult::VersionsCollected { nodes, .. } => nodes,
            other => panic!("{other:?}"),
        };
        // Entries of older leaders carry no node retention: nothing changes.
        assert!(!s.collection_due(5000, 1 << 40, None));
        assert!(collect(&mut s, 5000, None).is_empty());
        assert_eq!(s.nodes[&NodeId(3)].down_since_ms, None);
        // The first pass marks it, the one after the retention removes it.
        assert!(s.collection_due(5000, 1 << 40, Some(1000)));
        assert!(collect(&mut s, 5000, Some(1000)).is_empty());
        assert_eq!(s.nodes[&NodeId(3)].down_since_ms, Some(5000));
        assert_eq!(s.nodes[&NodeId(1)].down_since_ms, None, "live nodes are not marked");
        assert!(!s.collection_due(5999, 1 << 40, Some(1000)));
        assert!(s.collection_due(6000, 1 << 40, Some(1000)));
        assert_eq!(collect(&mut s, 6000, Some(1000)), [NodeId(3)]);
        assert!(!s.nodes.contains_key(&NodeId(3)));
        assert!(s.handed_from.get("d").is_none_or(|f| !f.contains(&Some(NodeId(3)))), "no hand-over names it");
        assert_eq!((s.owners("d"), s.placement_epoch), (&owners[..], epoch), "no owner moved");
        assert!(!s.collection_due(1 << 40, 1 << 40, Some(1000)), "nothing left to collect");
        // It comes back as a new registration.
        assert!(register(&mut s, 3) > inc[2]);
        assert!(s.nodes[&NodeId(3)].live);
    }

    #[test]
    fn a_shard_moved_from_a_node_remembers_it_until_it_moves_again_and_names_it_while_live() {
        let mut s = ClusterState::default();
        let inc: Vec<u64> = (1..=3).map(|n| register(&mut s, n)).collect();
        s.apply(&Command::AddDataset { name: "d".into(), view: view(), manifest: manifest(40) });
        assert!(s.handed_from("d").is_empty(), "a fresh placement hands nothing");
        let before = s.owners("d").to_vec();
        // Node 3 expires: its shards go to live nodes; node 3 is not live,
        // so nothing is named as handed over from it.
        s.apply(&Command::ExpireNode { node: NodeId(3), incarnation: inc[2] });
        assert!(s.handed_from("d").iter().all(Option::is_none));
        // Node 3 comes back: shards it takes were handed over from their
        // owners of the moment; those that stay where they went while it
        // was away were handed over from node 3 (it may still hold them).
        let during = s.owners("d").to_vec();
        register(&mut s, 3);
        let after = s.owners("d").to_vec();
        let handed = s.handed_from("d").to_vec();
        assert_eq!(handed.len(), after.len());
        let mut stayed_away = 0;
        for i in 0..after.len() {
            if after[i] != during[i] {
                assert_eq!(handed[i], Some(during[i]), "shard {i}");
            } else if before[i] == NodeId(3) {
                assert_eq!(handed[i], Some(NodeId(3)), "shard {i} moved away from node 3 and stayed");
                stayed_away += 1;
            } else {
                assert_eq!(handed[i], None, "shard {i} never moved");
            }
        }
        // Placement is a pure function of its inputs: with these forty
        // shards some of node 3's stay away when it comes back.
        assert!(stayed_away > 0, "the case above was not exercised");
        assert!(after.iter().zip(&before).any(|(a, b)| a == b), "some shards went back");
        // Replicas agree: the field survives the snapshot encoding.
        let again: ClusterState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(again, s);
    }

    #[test]
    fn the_expiries_of_one_tick_move_the_epoch_once() {
        let mut s = ClusterState::default();
        let inc: Vec<u64> = (1..=4).map(|n| register(&mut s, n)).collect();
        s.apply(&Command::AddDataset { name: "d".into(), view: view(), manifest: manifest(40) });
        let epoch = s.placement_epoch;
        // Nodes 1 and 2 lapse; node 3's expiry names a stale incarnation.
        let nodes = vec![(NodeId(1), inc[0]), (NodeId(2), inc[1]), (NodeId(3), inc[2] + 100)];
        assert_eq!(
            s.apply(&Command::ExpireNodes { nodes: nodes.clone() }),
            CommandResult::NodesExpired { expired: vec![NodeId(1), NodeId(2)], placement_epoch: Some(epoch + 1) }
        );
        let live: Vec<NodeId> = s.live_nodes().iter().map(|n| n.node).collect();
        assert_eq!(live, [NodeId(3), NodeId(4)]);
        assert!(s.owners("d").iter().all(|o| live.contains(o)), "re-placed over the nodes left");
        // One after the other gives the same state, one epoch further.
        let mut one_by_one = ClusterState::default();
        for n in 1..=4 {
            register(&mut one_by_one, n);
        }
        one_by_one.apply(&Command::AddDataset { name: "d".into(), view: view(), manifest: manifest(40) });
        for (node, incarnation) in &nodes {
            one_by_one.apply(&Command::ExpireNode { node: *node, incarnation: *incarnation });
        }
        assert_eq!(one_by_one.owners("d"), s.owners("d"));
        assert_eq!(one_by_one.placement_epoch, s.placement_epoch + 1);
        // A repeat changes nothing.
        assert_eq!(
            s.apply(&Command::ExpireNodes { nodes }),
            CommandResult::NodesExpired { expired: vec![], placement_epoch: None }
        );
    }

    #[test]
    fn registration_and_expiry_advance_the_epoch_and_incarnations() {
        let mut s = ClusterState::default();
        let a = register(&mut s, 1);
        let b = register(&mut s, 2);
        assert_eq!((a, b, s.placement_epoch), (1, 2, 2));
        // A stale incarnation's expiry changes nothing.
        assert_eq!(
            s.apply(&Command::ExpireNode { node: NodeId(1), incarnation: 7 }),
            CommandResult::NodeExpired { placement_epoch: None }
        );
        assert_eq!(
            s.apply(&Command::ExpireNode { node: NodeId(1), incarnation: a }),
            CommandResult::NodeExpired { placement_epoch: Some(3) }
        );
        assert_eq!(s.live_nodes().len(), 1);
        // Returning gets a new incarnation.
        assert_eq!(register(&mut s, 1), 3);
        assert_eq!(s.live_nodes().len(), 2);
    }

    #[test]
    fn datasets_keep_versions_and_adding_the_same_one_is_a_no_op() {
        let mut s = ClusterState::default();
        let add = |s: &mut ClusterState, files| {
            s.apply(&Command::AddDataset { name: "d".into(), view: view(), manifest: manifest(files) })
        };
        let CommandResult::DatasetAdded { version: v1, new: true } = add(&mut s, 2) else { panic!() };
        assert_eq!(add(&mut s, 2), CommandResult::DatasetAdded { version: v1, new: false });
        let CommandResult::DatasetAdded { version: v2, new: true } = add(&mut s, 3) else { panic!() };
        assert_ne!(v1, v2);
        assert_eq!(s.datasets["d"].versions.len(), 2);
        assert_eq!(s.datasets["d"].current().map(|v| v.version), Some(v2));
    }

    fn hold(s: &mut ClusterState, node: u64, versions: &[DatasetVersion]) -> CommandResult {
        let incarnation = s.nodes[&NodeId(node)].incarnation;
        let versions = versions.iter().map(|&v| ("d".to_string(), v)).collect();
        s.apply(&Command::HoldVersions { node: NodeId(node), incarnation, versions })
    }

    fn add(s: &mut ClusterState, files: usize) -> DatasetVersion {
        match s.apply(&Command::AddDataset { name: "d".into(), view: view(), manifest: manifest(files) }) {
            CommandResult::DatasetAdded { version, .. } => version,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_held_version_keeps_its_owners_when_a_newer_one_is_added_and_an_unheld_one_loses_them() {
        let mut s = ClusterState::default();
        for id in 1..=3 {
            register(&mut s, id);
        }
        let v1 = add(&mut s, 10);
        let owners_v1 = s.owners("d").to_vec();
        assert_eq!(hold(&mut s, 2, &[v1]), CommandResult::VersionsHeld { unknown: vec![], stale: false });
        let v2 = add(&mut s, 12);
        assert_eq!(s.owners_of("d", v1), &owners_v1[..], "the held version kept its placement, unmoved");
        assert_eq!(s.owners_of("d", v2).len(), 48);
        assert_eq!(s.version_state("d", v1), Some(VersionState::Held));
        assert_eq!(s.held_versions(), vec![("d".to_string(), v1)]);
        // Node 2 stops holding it (its trainers are gone): unplaced.
        hold(&mut s, 2, &[v2]);
        assert!(s.owners_of("d", v1).is_empty());
        assert_eq!(s.version_state("d", v1), Some(VersionState::Unused { since_ms: None }));
        // Held again by another node: placed afresh over the live nodes.
        hold(&mut s, 3, &[v1]);
        assert_eq!(s.owners_of("d", v1).len(), 40);
        // Node 2 holds v2 when v3 comes: v2 keeps its owners; once nobody
        // holds it, it has none.
        let owners_v2 = s.owners("d").to_vec();
        let v3 = add(&mut s, 14);
        assert_eq!(s.owners_of("d", v2), &owners_v2[..]);
        hold(&mut s, 2, &[]);
        assert!(s.owners_of("d", v2).is_empty());
        assert_eq!(s.version_state("d", v3), Some(VersionState::Current));
        let v4 = add(&mut s, 16);
        assert!(s.owners_of("d", v3).is_empty(), "an unheld current version replaced by a newer one is unplaced");
        assert_eq!(s.owners_of("d", v4).len(), 64);
        // Replicas agree, and a state from before these fields decodes.
        let again: ClusterState = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(again, s);
    }

    #[test]
    fn holds_end_with_the_incarnation_and_a_held_version_moves_only_the_leavers_shards() {
        let mut s = ClusterState::default();
        for id in 1..=4 {
            register(&mut s, id);
        }
        let v1 = add(&mut s, 50);
        hold(&mut s, 1, &[v1]);
        hold(&mut s, 4, &[v1]);
        add(&mut s, 51);
        let before = s.owners_of("d", v1).to_vec();
        let inc = s.nodes[&NodeId(3)].incarnation;
        s.apply(&Command::ExpireNode { node: NodeId(3), incarnation: inc });
        let after = s.owners_of("d", v1).to_vec();
        assert_eq!(after.len(), 200);
        for (&b, &a) in before.iter().zip(&after) {
            if b != NodeId(3) {
                assert_eq!(a, b, "a shard of a surviving node moved");
            } else {
                assert_ne!(a, NodeId(3));
            }
        }
        // Node 4 expires: its hold goes with it; node 1 still holds.
        let inc = s.nodes[&NodeId(4)].incarnation;
        s.apply(&Command::ExpireNode { node: NodeId(4), incarnation: inc });
        assert_eq!(s.datasets["d"].versions[0].held_by, BTreeSet::from([NodeId(1)]));
        // Node 1 registers again (a restart): its old process's holds end.
        register(&mut s, 1);
        assert_eq!(s.version_state("d", v1), Some(VersionState::Unused { since_ms: None }));
        assert!(s.owners_of("d", v1).is_empty());
        // A hold from an incarnation that is not live changes nothing.
        let inc = s.nodes[&NodeId(1)].incarnation;
        assert_eq!(
            s.apply(&Command::HoldVersions { node: NodeId(1), incarnation: inc - 1, versions: vec![("d".into(), v1)] }),
            CommandResult::VersionsHeld { unknown: vec![], stale: true }
        );
        assert_eq!(s.version_state("d", v1), Some(VersionState::Unused { since_ms: None }));
    }

    #[test]
    fn an_unused_version_is_collected_after_the_retention_and_a_held_or_current_one_never() {
        let mut s = ClusterState::default();
        register(&mut s, 1);
        let v1 = add(&mut s, 2);
        let v2 = add(&mut s, 3);
        let v3 = add(&mut s, 4);
        hold(&mut s, 1, &[v2]);
        let collect = |s: &mut ClusterState, now_ms| match s.apply(&Command::CollectVersions {
            now_ms,
            retention_ms: 1000,
            node_retention_ms: None,
        }) {
            CommandResult::VersionsCollected { collected, .. } => collected,
            other => panic!("{other:?}"),
        };
        assert!(s.collection_due(0, 1000, None), "v1 is not marked yet");
        assert!(collect(&mut s, 5000).is_empty(), "the first pass only marks");
        assert_eq!(s.version_state("d", v1), Some(VersionState::Unused { since_ms: Some(5000) }));
        assert!(!s.collection_due(5999, 1000, None));
        assert!(s.collection_due(6000, 1000, None));
        // Used again before its retention ends: the mark is cleared.
        hold(&mut s, 1, &[v1, v2]);
        assert_eq!(s.version_state("d", v1), Some(VersionState::Held));
        assert!(!s.collection_due(1 << 40, 1000, None), "nothing unused");
        hold(&mut s, 1, &[v2]);
        assert!(collect(&mut s, 7000).is_empty());
        assert_eq!(collect(&mut s, 8000), vec![("d".to_string(), v1)]);
        assert_eq!(s.version_state("d", v1), None);
        assert_eq!(s.version_state("d", v2), Some(VersionState::Held));
        assert_eq!(s.version_state("d", v3), Some(VersionState::Current));
        assert_eq!(s.datasets["d"].versions.len(), 2);
        // Holding a collected version names it as unknown.
        assert_eq!(
            hold(&mut s, 1, &[v1, v2]),
            CommandResult::VersionsHeld { unknown: vec![("d".to_string(), v1)], stale: false }
        );
    }

    #[test]
    fn a_state_written_before_holds_existed_decodes_with_none() {
        let mut s = ClusterState::default();
        register(&mut s, 1);
        add(&mut s, 2);
        let mut json: serde_json::Value = serde_json::to_value(&s).unwrap();
        for v in json["datasets"]["d"]["versions"].as_array_mut().unwrap() {
            let o = v.as_object_mut().unwrap();
            o.remove("held_by");
            o.remove("owners");
            o.remove("unused_since_ms");
        }
        let old: ClusterState = serde_json::from_value(json).unwrap();
        assert_eq!(old, s);
    }

    #[test]
    fn expiry_moves_only_the_expired_nodes_shards() {
        let mut s = ClusterState::default();
        for id in 1..=4 {
            register(&mut s, id);
        }
        s.apply(&Command::AddDataset { name: "d".into(), view: view(), manifest: manifest(50) });
        let before = s.owners("d").to_vec();
        assert_eq!(before.len(), 200);
        let inc = s.nodes[&NodeId(3)].incarnation;
        s.apply(&Command::ExpireNode { node: NodeId(3), incarnation: inc });
        let after = s.owners("d").to_vec();
        for (&b, &a) in before.iter().zip(&after) {
            if b != NodeId(3) {
                assert_eq!(a, b, "a shard of a surviving node moved");
            } else {
                assert_ne!(a, NodeId(3));
            }
        }
        let per = s.shards_per_node();
        assert_eq!(per.values().sum::<u64>(), 200);
        assert!(!per.contains_key(&NodeId(3)));
    }

    #[test]
    fn a_join_moves_shards_only_to_the_joiner() {
        let mut s = ClusterState::default();
        s.apply(&Command::AddDataset { name: "d".into(), view: view(), manifest: manifest(50) });
        assert!(s.owners("d").is_empty(), "no live node: nothing owned");
        for id in 1..=3 {
            register(&mut s, id);
        }
        let before = s.owners("d").to_vec();
        assert_eq!(before.len(), 200);
        register(&mut s, 4);
        let after = s.owners("d").to_vec();
        let mut moved = 0;
        for (&b, &a) in before.iter().zip(&after) {
            if a != b {
                assert_eq!(a, NodeId(4), "a shard moved between surviving nodes");
                moved += 1;
            }
        }
        assert!((40..=60).contains(&moved), "about a quarter moves to the joiner: {moved}");
    }

    /// Issue 29: what a node reports of its capacity does not weigh it (a
    /// node claiming a thousand times the others' takes an equal share);
    /// an admin's weight does, and changing a live node's weight starts a
    /// placement epoch, where a weight set ahead of a node's joining
    /// starts none.
    #[test]
    fn weights_are_the_admins_not_what_a_node_claims() {
        let mut s = ClusterState::default();
        s.apply(&Command::AddDataset { name: "d".into(), view: view(), manifest: manifest(100) });
        for (id, ram) in [(1u64, 1u64 << 30), (2, 1 << 40)] {
            s.apply(&Command::RegisterNode {
                node: NodeId(id),
                addr: String::new(),
                ram_bytes: ram,
                ssd_bytes: 0,
                registration: id,
            });
        }
        let share = |s: &ClusterState, id| s.shards_per_node().get(&NodeId(id)).copied().unwrap_or(0);
        assert!((180..=220).contains(&share(&s, 1)), "equal shares: {:?}", s.shards_per_node());
        let epoch = s.placement_epoch;
        assert_eq!(
            s.apply(&Command::SetNodeWeight { node: NodeId(1), weight: Some(300) }),
            CommandResult::WeightSet { placement_epoch: epoch + 1 }
        );
        assert!((280..=320).contains(&share(&s, 1)), "three quarters: {:?}", s.shards_per_node());
        assert_eq!(s.live_nodes()[0].weight, 300);
        // A node not registered yet: its weight waits for it, no new epoch.
        assert_eq!(
            s.apply(&Command::SetNodeWeight { node: NodeId(9), weight: Some(50) }),
            CommandResult::WeightSet { placement_epoch: epoch + 1 }
        );
        assert_eq!(s.weight(NodeId(9)), 50);
        // Back to the default.
        s.apply(&Command::SetNodeWeight { node: NodeId(1), weight: None });
        assert_eq!(s.weight(NodeId(1)), DEFAULT_NODE_WEIGHT);
        assert!((180..=220).contains(&share(&s, 1)));
    }

    #[test]
    fn replicas_applying_the_same_log_agree_byte_for_byte() {
        let log: Vec<Command> = (1..=5)
            .map(|id| Command::RegisterNode {
                node: NodeId(id),
                addr: String::new(),
                ram_bytes: id << 30,
                ssd_bytes: 0,
                registration: id,
            })
            .chain([Command::AddDataset { name: "d".into(), view: view(), manifest: manifest(30) }])
            .chain([Command::ExpireNode { node: NodeId(2), incarnation: 2 }])
            .chain([Command::SetNodeWeight { node: NodeId(3), weight: Some(250) }])
            .chain([Command::RegisterNode {
                node: NodeId(2),
                addr: String::new(),
                ram_bytes: 1 << 30,
                ssd_bytes: 0,
                registration: 7,
            }])
            .collect();
        let replay = || {
            let mut s = ClusterState::default();
            let results: Vec<CommandResult> = log.iter().map(|c| s.apply(c)).collect();
            (serde_json::to_vec(&s).expect("encode"), results)
        };
        assert_eq!(replay(), replay());
    }

    #[test]
    fn a_retried_registration_returns_the_same_incarnation() {
        let mut s = ClusterState::default();
        let reg = |token| Command::RegisterNode {
            node: NodeId(1),
            addr: String::new(),
            ram_bytes: 1,
            ssd_bytes: 0,
            registration: token,
        };
        let first = s.apply(&reg(42));
        assert_eq!(s.apply(&reg(42)), first, "a retry changes nothing");
        assert_eq!(s.placement_epoch, 1);
        let CommandResult::NodeRegistered { incarnation, .. } = s.apply(&reg(43)) else { panic!() };
        assert_eq!(incarnation, 2, "a new registration gets a new incarnation");
        // After an expiry the same token is a new registration too.
        s.apply(&Command::ExpireNode { node: NodeId(1), incarnation: 2 });
        let CommandResult::NodeRegistered { incarnation, .. } = s.apply(&reg(43)) else { panic!() };
        assert_eq!(incarnation, 3);
    }

    #[test]
    fn state_round_trips_through_json() {
        let mut s = ClusterState::default();
        register(&mut s, 9);
        s.apply(&Command::AddDataset { name: "d".into(), view: view(), manifest: manifest(1) });
        let bytes = serde_json::to_vec(&s).expect("encode");
        let back: ClusterState = serde_json::from_slice(&bytes).expect("decode");
        assert_eq!(back, s);
    }
}
