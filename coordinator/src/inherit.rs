//! Owners that follow content (issue 43): where a new version of a
//! dataset holds what the version it replaces held, its shards start with
//! the old owners, whose tiers hold the chunks (a node restamps a chunk
//! of the same content instead of reading and converting the row group
//! again: `granary_node`'s content index). A fresh placement keyed by
//! (version, shard) would scatter them.
//!
//! Two shards hold the same content when the two versions share the
//! source, the view and the resolved tensors, and the shards are the same
//! row group (index, rows, compressed bytes) of the same object (path,
//! size, store tag): what `Manifest::content_key` hashes, compared here
//! field by field. Pure, and part of `ClusterState::apply`, so every
//! voter must run it: the leader turns it on with
//! `Command::EnableContentOwners` once every voter speaks
//! `granary-raft/2` (`crate::switch`).

use granary_proto::placement::{NodeWeight, plan_rebalance};
use granary_proto::{Manifest, NodeId, View};
use std::collections::HashMap;

/// Per shard of the new version (manifest `b` and its view), the owner
/// under the old one (`a`, whose owners are `old_owners` in manifest
/// order) of the shard holding the same
/// content, if that node is live; `None` for the whole version when the
/// two share no content (another source, view or tensors, or no owners).
pub fn seed(
    (a, old_view): (&Manifest, &View),
    old_owners: &[NodeId],
    (b, new_view): (&Manifest, &View),
    live: &[NodeWeight],
) -> Option<Vec<Option<NodeId>>> {
    if a.source != b.source || a.tensors != b.tensors || old_view != new_view {
        return None;
    }
    let mut first = Vec::with_capacity(a.files.len());
    let mut shards = 0usize;
    for f in &a.files {
        first.push(shards);
        shards += f.row_groups.len();
    }
    if old_owners.len() != shards || shards == 0 {
        return None;
    }
    let files: HashMap<(&str, u64, &str), usize> =
        a.files.iter().enumerate().map(|(i, f)| ((f.path.as_str(), f.size_bytes, f.version_tag.as_str()), i)).collect();
    let is_live = |n: NodeId| live.iter().any(|w| w.node == n);
    let mut seeded = Vec::new();
    for f in &b.files {
        let old_file = files.get(&(f.path.as_str(), f.size_bytes, f.version_tag.as_str()));
        for (g, rg) in f.row_groups.iter().enumerate() {
            let owner = old_file.and_then(|&i| {
                let same = a.files[i].row_groups.get(g)?;
                let owner = old_owners[first[i] + g];
                (same.rows == rg.rows && same.compressed_bytes == rg.compressed_bytes && is_live(owner))
                    .then_some(owner)
            });
            seeded.push(owner);
        }
    }
    seeded.iter().any(Option::is_some).then_some(seeded)
}

/// Owners for shards keyed `keys` over `live`: each seeded shard starts
/// with its seed, and every other goes, in manifest order, to the node
/// least loaded for its weight so far (the room the days that left the
/// window freed; ties to `fresh`'s choice, a fresh placement of the same
/// keys, then the lower id). A re-placement from there keeps every node
/// within its share, moving as few as it must: none when the start is
/// already within them.
pub fn place(keys: &[u64], seed: &[Option<NodeId>], fresh: &[NodeId], live: &[NodeWeight]) -> Vec<NodeId> {
    if fresh.len() != keys.len() || seed.len() != keys.len() || live.is_empty() {
        return fresh.to_vec();
    }
    let mut load: Vec<u64> = live.iter().map(|w| seed.iter().filter(|s| **s == Some(w.node)).count() as u64).collect();
    let mut start = Vec::with_capacity(keys.len());
    for (s, f) in seed.iter().zip(fresh) {
        let owner = match s {
            Some(n) => *n,
            None => {
                // The lightest for its weight: load_a / w_a < load_b / w_b.
                let lighter = |a: usize, b: usize| {
                    let (x, y) = (
                        u128::from(load[a]) * u128::from(live[b].weight),
                        u128::from(load[b]) * u128::from(live[a].weight),
                    );
                    x.cmp(&y)
                        .then_with(|| (live[b].node == *f).cmp(&(live[a].node == *f)))
                        .then(live[a].node.cmp(&live[b].node))
                };
                let best = (0..live.len()).min_by(|&a, &b| lighter(a, b)).unwrap_or(0);
                load[best] += 1;
                live[best].node
            }
        };
        start.push(owner);
    }
    plan_rebalance(keys, &start, live).map(|p| p.owners().collect()).unwrap_or_else(|_| fresh.to_vec())
}
