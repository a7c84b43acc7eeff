//! Following the coordinator's placement: on every placement from the
//! watch, open the datasets the coordinator lists that this node does not
//! serve yet (current versions, and older ones trainers still hold), then
//! take the owners of each of those versions it serves from the watch's
//! owner tables (the watch sends the whole placement once, then only the
//! shards that moved: `granary_net::placement`), and replace what
//! [`Cluster`] knows. A version without a table (a coordinator that sends
//! whole views only) or whose table does not fit its manifest is asked for
//! with `DescribePlacement`.

use super::manifest::fetch_manifest;
use super::owners::{Cluster, PlacementMap};
use crate::service::Node;
use granary_net::api::{ApiRequest, ApiResponse, PlacementView};
use granary_net::client::CoordinatorClient;
use granary_net::placement::{OwnerTable, Placement};
use granary_proto::{DatasetVersion, ShardId};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::watch;

/// Serves, on `node`, the coordinator's current version of each dataset in
/// `view` that the node does not serve yet (manifest and view fetched in
/// pieces, [`super::manifest`]; footers are read when first needed). Returns
/// false if one could not be served, so the caller tries again later.
async fn open_listed_datasets(node: &Node, client: &CoordinatorClient, view: &PlacementView) -> bool {
    let mut all = true;
    for (name, version) in &view.datasets {
        if node.dataset(*version).is_ok() {
            continue;
        }
        match fetch_manifest(client, name, *version).await {
            Ok((dview, manifest)) => {
                let source = manifest.source.clone();
                if let Err(e) = node.serve_manifest(name, dview, manifest) {
                    tracing::warn!(dataset = %name, %source, "cannot serve the coordinator's dataset: {e}");
                    all = false;
                }
            }
            Err(e) if e.not_found() => {
                tracing::debug!(dataset = %name, "the listed version is gone; waiting for the next view: {e}");
            }
            Err(e) => {
                tracing::warn!(dataset = %name, "cannot fetch the dataset's manifest: {e}");
                all = false;
            }
        }
    }
    all
}

/// Keeps the owners last known for `version` (and their epoch, and what
/// was handed over) in `map`.
fn keep_owners(map: &mut PlacementMap, cluster: &Cluster, version: DatasetVersion) {
    if let Some((epoch, owners, former)) = cluster.owners_of(version) {
        map.owners.insert(version, owners);
        map.owner_epochs.insert(version, epoch);
        map.former.insert(version, former);
    }
}

/// Keeps `cluster` current: on every view from the placement watch, opens
/// the datasets the coordinator lists that `node` does not serve yet, then
/// asks the coordinator for the owners of each dataset version it serves.
pub async fn follow_placement(
    cluster: Arc<Cluster>,
    node: Node,
    client: CoordinatorClient,
    mut views: watch::Receiver<Option<Arc<Placement>>>,
) {
    loop {
        let placement = views.borrow_and_update().clone();
        let mut retry = false;
        if let Some(placement) = placement {
            let view = &placement.view;
            retry = !open_listed_datasets(&node, &client, view).await;
            // Older versions trainers somewhere still use: this node may own
            // some of their shards, so it opens them too.
            let unopened: Vec<_> = view.held.iter().filter(|(_, v)| node.dataset(*v).is_err()).cloned().collect();
            if !unopened.is_empty() {
                open_pinned(&node, &client, unopened).await;
            }
            if let Some(older) = &view.older {
                for (name, version) in node.served_versions() {
                    let known = |l: &[(String, DatasetVersion)]| l.iter().any(|(n, v)| *n == name && *v == version);
                    if !known(&view.datasets) && !known(older) {
                        node.close_version(&name, version);
                    }
                }
            }
            if !retry {
                node.datasets_opened();
            }
            let mut map = PlacementMap { epoch: view.placement_epoch, ..Default::default() };
            for n in view.nodes.iter().filter(|n| n.live) {
                match n.addr.parse::<SocketAddr>() {
                    Ok(a) => {
                        map.addrs.insert(n.node, a);
                    }
                    Err(e) => tracing::warn!(node = %n.node, addr = %n.addr, "unusable peer address: {e}"),
                }
            }
            let current = view.datasets.iter().map(|d| (d, false));
            for ((name, version), held) in current.chain(view.held.iter().map(|d| (d, true))) {
                if node.dataset(*version).is_err() {
                    continue; // not a version this node serves
                }
                if let Some(table) = placement.tables.get(version) {
                    match owners_from_table(&node, *version, table) {
                        Ok((owners, handed)) => {
                            map.owners.insert(*version, owners);
                            map.owner_epochs.insert(*version, view.placement_epoch);
                            map.former.insert(*version, handed);
                            continue;
                        }
                        Err(e) => tracing::warn!(dataset = %name, "{e}; asking for the owners instead"),
                    }
                }
                // The current version is asked for by name, so that an
                // answer for a newer one is noticed; a held one by version.
                let ask = ApiRequest::DescribePlacement { name: name.clone(), version: held.then_some(*version) };
                match client.call(&ask).await {
                    Ok((_, ApiResponse::Placement(report))) if report.version == *version => {
                        let owners = report
                            .owners
                            .iter()
                            .map(|&(file, row_group, owner)| (ShardId { file, row_group }, owner))
                            .collect();
                        map.owners.insert(*version, owners);
                        map.owner_epochs.insert(*version, report.placement_epoch);
                        let handed = report
                            .handed_from
                            .iter()
                            .map(|&(file, row_group, from)| (ShardId { file, row_group }, from))
                            .collect();
                        map.former.insert(*version, handed);
                    }
                    // Keep what was known for this version (a slightly old
                    // owner still serves; no owner at all would make this
                    // node read every shard itself) and ask again soon.
                    Ok((_, other)) => {
                        tracing::debug!(dataset = %name, "placement not current yet: {other:?}");
                        keep_owners(&mut map, &cluster, *version);
                        retry = true;
                    }
                    Err(e) => {
                        tracing::warn!(dataset = %name, "cannot read placement; keeping the last known owners: {e}");
                        keep_owners(&mut map, &cluster, *version);
                        retry = true;
                    }
                }
            }
            tracing::info!(
                placement_epoch = map.epoch,
                peers = map.addrs.len(),
                versions = map.owners.len(),
                "placement known"
            );
            cluster.replace(map);
            node.placement_changed();
        }
        // Until the next view (or the retry): open the versions trainers
        // pinned that this node does not serve.
        let retry_at = tokio::time::Instant::now() + cluster.config().open_retry;
        loop {
            tokio::select! {
                changed = views.changed() => if changed.is_err() { return } else { break },
                _ = tokio::time::sleep_until(retry_at), if retry => break,
                wanted = node.wanted_versions() => {
                    let gone = open_pinned(&node, &client, wanted).await;
                    node.wanted_answered(gone);
                }
            }
        }
    }
}

/// A node per shard.
type Owners = HashMap<ShardId, granary_proto::NodeId>;

/// Per shard of `version` (which `node` serves), its owner and the node
/// it was handed over from, from the watch's owner table (in manifest
/// order); an error naming the version when the table does not fit the
/// manifest.
fn owners_from_table(node: &Node, version: DatasetVersion, table: &OwnerTable) -> Result<(Owners, Owners), String> {
    let dataset = node.dataset(version).map_err(|e| e.to_string())?;
    let files = &dataset.manifest.files;
    let count: usize = files.iter().map(|f| f.row_groups.len()).sum();
    if !table.is_empty() && table.len() != count {
        return Err(format!(
            "the watch's owner table of version {version} has {} shards, its manifest {count}",
            table.len()
        ));
    }
    let shards = files
        .iter()
        .enumerate()
        .flat_map(|(f, file)| (0..file.row_groups.len()).map(move |g| ShardId { file: f as u32, row_group: g as u32 }));
    let owners = shards.clone().zip(&table.owners).map(|(s, &o)| (s, o)).collect();
    let handed = shards.enumerate().filter_map(|(i, s)| Some((s, table.from(i)?))).collect();
    Ok((owners, handed))
}

/// Opens each (name, version) from the coordinator's record of it (every
/// registered version's manifest is kept), for trainers that pinned it.
/// Returns those the coordinator does not know.
async fn open_pinned(
    node: &Node,
    client: &CoordinatorClient,
    wanted: Vec<(String, DatasetVersion)>,
) -> Vec<(String, DatasetVersion)> {
    let mut gone = Vec::new();
    for (name, version) in wanted {
        if node.dataset(version).is_ok() {
            continue;
        }
        match fetch_manifest(client, &name, version).await {
            Ok((view, manifest)) => {
                if let Err(e) = node.open_version(&name, view, manifest) {
                    tracing::warn!(dataset = %name, %version, "cannot serve the pinned version: {e}");
                }
            }
            Err(e) if e.not_found() => {
                tracing::info!(dataset = %name, %version, "the coordinator has no such version: {e}");
                gone.push((name, version));
            }
            Err(e) => tracing::warn!(dataset = %name, %version, "cannot fetch the pinned version's manifest: {e}"),
        }
    }
    gone
}
