//! The datasets' requests: add a dataset (a new version), list them,
//! describe one version, report a version's placement.

use super::{Answer, leading};
use crate::server::ctx::{COMPACT_CACHED, Compact, Ctx, failed, linearize, wall_ms, write};
use crate::staged::{Blob, MAX_LOG_ENTRY_BYTES};
use crate::state::{ClusterState, DatasetRecord, VersionRecord};
use crate::types::{Command, CommandResult};
use granary_net::api::{
    AddProgress, AddStage, ApiResponse, DatasetSummary, FailureKind, PlacementReport, VersionStatus, VersionSummary,
};
use granary_net::frame::MAX_FRAME_BYTES;
use granary_proto::DatasetVersion;
use granary_proto::manifest::ManifestPieces;
use granary_proto::view::View;
use granary_source::dataset::Dataset;
use granary_source::remote::{Remote, RemoteCounters};
use std::sync::Arc;
use tokio::sync::watch;

/// Registers dataset `name` read from `source` through `view`: the leader
/// reads the footers, stages the manifest's compact form in pieces (each
/// its own log entry, committed on a majority), then commits the small
/// entry that names them ([`crate::staged`]). No entry passes
/// [`MAX_LOG_ENTRY_BYTES`].
pub(in crate::server) async fn add(
    ctx: &Ctx,
    name: String,
    source: String,
    view: View,
    progress: &watch::Sender<AddProgress>,
) -> Answer {
    if !valid_name(&name) {
        return Err(failed(FailureKind::BadRequest, format!("dataset name {name:?}: use 1-128 of [A-Za-z0-9._-]")));
    }
    let view = view.validated().map_err(|e| failed(FailureKind::BadRequest, format!("dataset {name}: view: {e}")))?;
    leading(ctx)?;
    let remote = Remote::open(&source, &ctx.remote_options, None, Arc::new(RemoteCounters::default()))
        .map_err(|e| failed(FailureKind::BadRequest, e.to_string()))?;
    let footers_read = |done: u64, total: u64| {
        progress.send_replace(AddProgress { stage: AddStage::Footers, done, total });
    };
    let dataset = Dataset::open_manifest(&name, remote, view.clone(), &footers_read)
        .await
        .map_err(|e| failed(FailureKind::BadRequest, format!("dataset {name}: {e}")))?;
    if dataset.manifest.files.is_empty() {
        return Err(failed(FailureKind::BadRequest, format!("dataset {name}: {source} holds no .parquet files")));
    }
    let (version, pieces, add) =
        Command::registration(&name, &view, &dataset.manifest, ctx.manifest_piece_bytes, wall_ms());
    drop(dataset);
    let known = ctx
        .shared
        .read(|a| a.cluster.datasets.get(&name).is_some_and(|r| r.versions.iter().any(|v| v.version == version)));
    if !known {
        stage(ctx, &name, pieces, progress).await?;
    }
    fits_one_entry(&name, &add)?;
    progress.send_replace(AddProgress { stage: AddStage::Registering, done: 0, total: 1 });
    let cmd = add;
    let new = match write(ctx, cmd).await? {
        CommandResult::DatasetAdded { new, .. } => new,
        CommandResult::DatasetRefused { refused } => {
            return Err(failed(FailureKind::Unavailable, format!("dataset {name}: {refused}; add it again")));
        }
        other => return Err(failed(FailureKind::Internal, format!("add applied as {other:?}"))),
    };
    let summary = ctx
        .shared
        .read(|a| a.cluster.datasets.get(&name).and_then(|r| summary(&name, r, ctx.retention_ms())))
        .ok_or_else(|| failed(FailureKind::Internal, format!("dataset {name} missing after commit")))?;
    tracing::info!(dataset = %name, version = %summary.version, new, "dataset added");
    Ok(ApiResponse::DatasetAdded { summary, new })
}

/// Commits every piece of a version's compact manifest, one entry each,
/// in order.
async fn stage(
    ctx: &Ctx,
    name: &str,
    pieces: Vec<Command>,
    progress: &watch::Sender<AddProgress>,
) -> Result<(), ApiResponse> {
    let total = pieces.len() as u64;
    for (done, cmd) in pieces.into_iter().enumerate() {
        progress.send_replace(AddProgress { stage: AddStage::Staging, done: done as u64, total });
        fits_one_entry(name, &cmd)?;
        match write(ctx, cmd).await? {
            CommandResult::PieceStaged { refused: None } => {}
            CommandResult::PieceStaged { refused: Some(why) } => {
                return Err(failed(FailureKind::Unavailable, format!("dataset {name}: {why}")));
            }
            other => return Err(failed(FailureKind::Internal, format!("a manifest piece applied as {other:?}"))),
        }
    }
    Ok(())
}

/// Refuses a command whose log entry would pass [`MAX_LOG_ENTRY_BYTES`].
fn fits_one_entry(name: &str, cmd: &Command) -> Result<(), ApiResponse> {
    let size = serde_json::to_vec(cmd).map(|b| b.len()).unwrap_or(usize::MAX);
    if size > MAX_LOG_ENTRY_BYTES {
        return Err(failed(
            FailureKind::BadRequest,
            format!("dataset {name}: a log entry of {size} bytes, over the {MAX_LOG_ENTRY_BYTES}-byte limit"),
        ));
    }
    Ok(())
}

/// Every dataset, on linearized state.
pub(in crate::server) async fn list(ctx: &Ctx) -> Answer {
    linearize(ctx).await?;
    Ok(ApiResponse::Datasets(ctx.shared.read(|a| summaries(&a.cluster, ctx.retention_ms()))))
}

/// One version of a dataset (its current one without `version`): its
/// summary, manifest and view.
pub(in crate::server) async fn describe(ctx: &Ctx, name: String, version: Option<DatasetVersion>) -> Answer {
    linearize(ctx).await?;
    ctx.shared.read(|a| {
        let r = a.cluster.datasets.get(&name);
        let v = r.and_then(|r| version_of(r, version));
        match (r.and_then(|r| summary(&name, r, ctx.retention_ms())), v) {
            (Some(summary), Some(v)) => {
                // Every row group takes at least this much JSON
                // (`{"rows":0,"compressed_bytes":0},`): past the frame cap
                // for certain, refused before the manifest is copied.
                const MIN_JSON_PER_ROW_GROUP: usize = 32;
                let row_groups: usize = v.manifest.files.iter().map(|f| f.row_groups.len()).sum();
                let at_least = row_groups.saturating_mul(MIN_JSON_PER_ROW_GROUP);
                if at_least > MAX_FRAME_BYTES {
                    let message = crate::server::respond::too_large("describe-dataset", at_least, MAX_FRAME_BYTES);
                    return Err(failed(FailureKind::BadRequest, message));
                }
                Ok(ApiResponse::Dataset { summary, manifest: (*v.manifest).clone(), view: v.view.clone() })
            }
            (Some(_), None) => Err(no_version(&name, version)),
            _ => Err(failed(FailureKind::NotFound, format!("no dataset named {name:?}"))),
        }
    })
}

/// Piece `index` of `version`'s compact manifest, with the view and the
/// cut, on linearized state (a node that saw the version anywhere finds it).
pub(in crate::server) async fn manifest_piece(ctx: &Ctx, name: String, version: DatasetVersion, index: u32) -> Answer {
    linearize(ctx).await?;
    let cached = {
        let cache = ctx.compact.lock().unwrap_or_else(|p| p.into_inner());
        cache.iter().find(|c| c.version == version).map(|c| (c.bytes.clone(), c.pieces.clone()))
    };
    let (view, cut) = ctx.shared.read(|a| {
        let r = a
            .cluster
            .datasets
            .get(&name)
            .ok_or_else(|| failed(FailureKind::NotFound, format!("no dataset named {name:?}")))?;
        let v = version_of(r, Some(version)).ok_or_else(|| no_version(&name, Some(version)))?;
        // Encoded under the state's lock only when no cached copy exists.
        let cut = match cached {
            Some(c) => c,
            None => {
                let bytes = v.manifest.to_compact();
                let pieces = ManifestPieces::cut(&bytes, ctx.manifest_piece_bytes);
                (Arc::new(bytes), Arc::new(pieces))
            }
        };
        Ok::<_, ApiResponse>((v.view.clone(), cut))
    })?;
    let (bytes, pieces) = cut;
    {
        let mut cache = ctx.compact.lock().unwrap_or_else(|p| p.into_inner());
        if !cache.iter().any(|c| c.version == version) {
            if cache.len() >= COMPACT_CACHED {
                cache.remove(0);
            }
            cache.push(Compact { version, bytes: bytes.clone(), pieces: pieces.clone() });
        }
    }
    let range = pieces.range(index).ok_or_else(|| {
        failed(
            FailureKind::NotFound,
            format!("dataset {name:?} version {version}: no manifest piece {index} (it has {})", pieces.count()),
        )
    })?;
    let data = Blob(bytes[range.start as usize..range.end as usize].to_vec());
    Ok(ApiResponse::ManifestPiece { version, view, pieces: (*pieces).clone(), index, data })
}

/// Who owns each shard of a version (and, for the current one, the nodes
/// shards were handed over from).
pub(in crate::server) async fn placement(ctx: &Ctx, name: String, version: Option<DatasetVersion>) -> Answer {
    linearize(ctx).await?;
    ctx.shared.read(|a| {
        let r = a
            .cluster
            .datasets
            .get(&name)
            .ok_or_else(|| failed(FailureKind::NotFound, format!("no dataset named {name:?}")))?;
        let v = version_of(r, version).ok_or_else(|| no_version(&name, version))?;
        let current = r.current().is_some_and(|c| c.version == v.version);
        let owners = v
            .manifest
            .shards()
            .iter()
            .zip(a.cluster.owners_of(&name, v.version))
            .map(|(s, &o)| (s.shard.file, s.shard.row_group, o))
            .collect();
        let handed = if current { a.cluster.handed_from(&name) } else { Vec::new() };
        let handed_from = v
            .manifest
            .shards()
            .iter()
            .zip(handed)
            .filter_map(|(s, from)| Some((s.shard.file, s.shard.row_group, from?)))
            .collect();
        Ok(ApiResponse::Placement(PlacementReport {
            name: name.clone(),
            version: v.version,
            placement_epoch: a.cluster.placement_epoch,
            owners,
            handed_from,
        }))
    })
}

/// `version` of `record`, or its current version without one.
fn version_of(record: &DatasetRecord, version: Option<DatasetVersion>) -> Option<&VersionRecord> {
    match version {
        None => record.current(),
        Some(want) => record.versions.iter().find(|v| v.version == want),
    }
}

fn no_version(name: &str, version: Option<DatasetVersion>) -> ApiResponse {
    failed(
        FailureKind::NotFound,
        format!("dataset {name:?} has no version {}", version.map(|v| v.to_hex()).unwrap_or_default()),
    )
}

fn summary(name: &str, record: &DatasetRecord, retention_ms: u64) -> Option<DatasetSummary> {
    let v = record.current()?;
    let version_list = record
        .versions
        .iter()
        .map(|r| VersionSummary {
            version: r.version,
            state: if r.version == v.version {
                VersionStatus::Current
            } else if !r.held_by.is_empty() {
                VersionStatus::Held { nodes: r.held_by.iter().copied().collect() }
            } else {
                VersionStatus::Unused { collect_at_ms: r.unused_since_ms.map(|s| s.saturating_add(retention_ms)) }
            },
            held_by: r.held_by.iter().copied().collect(),
            rows: r.manifest.total_rows(),
            files: r.manifest.files.len(),
        })
        .collect();
    Some(DatasetSummary {
        name: name.to_string(),
        version: v.version,
        versions: record.versions.len(),
        source: v.manifest.source.clone(),
        files: v.manifest.files.len(),
        shards: v.manifest.files.iter().map(|f| f.row_groups.len()).sum(),
        rows: v.manifest.total_rows(),
        source_bytes: v.manifest.total_file_bytes(),
        version_list,
    })
}

/// Every dataset's summary in `state`.
pub(super) fn summaries(state: &ClusterState, retention_ms: u64) -> Vec<DatasetSummary> {
    state.datasets.iter().filter_map(|(n, r)| summary(n, r, retention_ms)).collect()
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}
