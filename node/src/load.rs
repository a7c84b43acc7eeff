//! One shard loaded here: its row group read from remote storage (footer
//! from memory, from the peer that reads it for the cluster, or from
//! remote storage), decoded and converted on the converter pool straight
//! into a sealed memory file. [`panicked`] is the one panic guard's error:
//! a decoder that panics on hostile pages (in the load task or on the
//! converter pool) becomes an error naming the file and row group, never a
//! lost task or a hung waiter.

use crate::convert::{Site, convert_into, jagged_values};
use crate::dataset::Dataset;
use crate::error::{FetchError, RemoteError};
use crate::shm::{ChunkWriter, SealedChunk};
use crate::tier::ChunkKey;
use arrow::array::RecordBatch;
use futures::future::BoxFuture;
use granary_proto::ChunkLayout;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The memory a load of one shard is admitted for: its column chunks as
/// read (`compressed` bytes), the decoded Arrow arrays (about the converted
/// size) and the memory file being filled (`chunk` bytes).
pub(crate) fn load_memory_estimate(compressed: u64, chunk: u64) -> u64 {
    compressed.saturating_add(chunk.saturating_mul(2))
}

/// Admission of a load estimated at `estimate` bytes against a budget of
/// `budget` bytes for all loads in progress: the KiB to reserve (waiting
/// until they are free), or None when the estimate alone is over the
/// budget (the load could never run).
pub(crate) fn memory_admission(estimate: u64, budget: u64) -> Option<u32> {
    if estimate > budget {
        return None;
    }
    Some(u32::try_from(estimate.div_ceil(1024).max(1)).unwrap_or(u32::MAX))
}

/// The smallest default budget for loads in progress.
const MIN_LOAD_BUDGET: u64 = 256 << 20;

/// The default budget for loads in progress: half of the memory left
/// beside the chunk tiers (`tiers_bytes`: the RAM tier and the guest
/// area), where the memory is the machine's (`mem_total`) or, when lower,
/// the limit of the node's cgroup (a container's `memory.max`): a node in
/// a 40 GiB container on a 512 GiB host must not budget 256 GiB. At least
/// [`MIN_LOAD_BUDGET`]; 4 GiB where neither the machine's memory nor a
/// cgroup limit is known (with only a limit, half of it).
pub(crate) fn load_budget(mem_total: Option<u64>, cgroup_limit: Option<u64>, tiers_bytes: u64) -> u64 {
    let memory = match (mem_total, cgroup_limit) {
        (Some(m), Some(c)) => m.min(c),
        (m, c) => match m.or(c) {
            Some(x) => x,
            None => return 4 << 30,
        },
    };
    (memory.saturating_sub(tiers_bytes) / 2).max(MIN_LOAD_BUDGET)
}

/// The load budget as the node runs (issue 42): [`load_budget`]'s half of
/// the memory beside the tiers, less what the node's own structures take
/// beyond the [`NODE_OVERHEAD`] reckoned at start (`overhead`:
/// [`measured_overhead`]), so a dataset of a million row groups, whose
/// manifests, owner maps and prefetch orders take hundreds of MB, shrinks
/// the loads in flight instead of pushing the node past its cgroup. At
/// least [`MIN_LOAD_BUDGET`].
pub(crate) fn load_budget_now(memory: u64, tiers_bytes: u64, overhead: u64) -> u64 {
    let grown = overhead.saturating_sub(NODE_OVERHEAD);
    (memory.saturating_sub(tiers_bytes).saturating_sub(grown) / 2).max(MIN_LOAD_BUDGET)
}

/// How a semaphore of `current` permits in all, `available` of them free,
/// moves to `target`: permits to add, or free ones to forget (permits in
/// use are forgotten on a later move, once given back). Permits are KiB:
/// a move of less than a sixteenth of `current` or 64 MiB, whichever is
/// less, is not made (the measure wobbles).
pub(crate) fn resize(current: u64, target: u64, available: u64) -> Resize {
    if target.abs_diff(current) < (current / 16).min(64 << 10) {
        return Resize { add: 0, forget: 0 };
    }
    if target >= current {
        Resize { add: target - current, forget: 0 }
    } else {
        Resize { add: 0, forget: (current - target).min(available) }
    }
}

/// What [`resize`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resize {
    /// Permits to add.
    pub add: u64,
    /// Free permits to forget.
    pub forget: u64,
}

/// This process's memory: `MemTotal` from /proc/meminfo and its cgroup's
/// memory limit ([`cgroup_memory_limit`]), each if known.
pub(crate) fn process_memory() -> (Option<u64>, Option<u64>) {
    let mem_total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| {
        let line = t.lines().find(|l| l.starts_with("MemTotal:"))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib.saturating_mul(1024))
    });
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok().and_then(|own| {
        cgroup_memory_limit(&own, |path| std::fs::read_to_string(Path::new("/sys/fs/cgroup").join(path)).ok())
    });
    (mem_total, cgroup)
}

/// [`load_budget`] for this process ([`process_memory`]).
pub(crate) fn default_load_memory(tiers_bytes: u64) -> u64 {
    let (mem_total, cgroup) = process_memory();
    load_budget(mem_total, cgroup, tiers_bytes)
}

/// What a node keeps for itself beside its tiers and loads: the binary,
/// the runtime, footers, plans and buffers in flight.
pub(crate) const NODE_OVERHEAD: u64 = 64 << 20;

/// What [`mapping_advice_now`] reads while the node runs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budgeted {
    /// The node's own memory beside its tiers and loads as measured now
    /// (manifests, owner maps, prefetch orders, replies in flight:
    /// [`measured_overhead`]); below [`NODE_OVERHEAD`] counts as it.
    pub overhead: u64,
    /// The trainers the node expects (`max_ranks`).
    pub ranks: u32,
    /// The loaders following a plan on this node now.
    pub loaders: u32,
}

/// The most bytes of chunk mappings one trainer should keep beyond the
/// chunks the node holds (sent with every dataset description; the
/// client's mapping cache takes the lower of it and its own setting).
///
/// The pages of a memory file are charged to the node that filled it, in
/// its cgroup, for as long as anyone maps them: a chunk the node evicted
/// but a trainer keeps mapped still counts against the node's limit. So
/// the memory left beside the tiers, the load budget and the node's own
/// structures is shared among the trainers. `memory` is the machine's
/// memory or, when lower, the node's cgroup limit; `u64::MAX` (no advice)
/// when neither is known.
///
/// As the node runs: what its own structures take as measured (at least
/// [`NODE_OVERHEAD`]) is set aside, and the rest is shared among the ranks
/// it expects or, when more are connected, among those: a dataset of a
/// million row groups, or a ninth rank on a host sized for eight, shrinks
/// every trainer's share instead of pushing the node past its cgroup.
pub(crate) fn mapping_advice_now(memory: Option<u64>, tiers_bytes: u64, load_bytes: u64, now: Budgeted) -> u64 {
    let Some(memory) = memory else { return u64::MAX };
    let overhead = now.overhead.max(NODE_OVERHEAD);
    let committed = tiers_bytes.saturating_add(load_bytes).saturating_add(overhead);
    memory.saturating_sub(committed) / u64::from(now.ranks.max(now.loaders).max(1))
}

/// The node's own memory beside its chunk tiers and the loads in progress
/// (`loads_in_use` bytes of the load budget taken): the process's
/// anonymous resident memory (`RssAnon` in `status`, the text of
/// /proc/self/status), which holds its manifests, owner maps, prefetch
/// orders and buffers, less what the loads in progress hold. Chunks live
/// in memory files (shared memory, not anonymous), so the tiers are not
/// in it. `None` when `status` does not say.
pub(crate) fn measured_overhead(status: &str, loads_in_use: u64) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024).saturating_sub(loads_in_use))
}

/// The memory limit of the cgroup that `/proc/self/cgroup` (`own`) names,
/// read through `read` (a path under /sys/fs/cgroup): cgroup v2's
/// `memory.max` or v1's `memory.limit_in_bytes`, in the process's own
/// group or, inside a container whose namespace shows it as `/`, at the
/// mount's root. None when unlimited (`max`, or v1's huge sentinel) or
/// not readable.
pub(crate) fn cgroup_memory_limit(own: &str, read: impl Fn(&str) -> Option<String>) -> Option<u64> {
    let mut candidates = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            candidates.push(format!("{path}/memory.max"));
        } else if controllers.split(',').any(|c| c == "memory") {
            candidates.push(format!("memory/{path}/memory.limit_in_bytes"));
        }
    }
    candidates.extend(["memory.max".to_string(), "memory/memory.limit_in_bytes".to_string()]);
    candidates.iter().find_map(|c| {
        let text = read(c.trim_start_matches('/'))?;
        let limit = text.trim().parse::<u64>().ok()?;
        // cgroup v1 writes "unlimited" as a page-rounded i64::MAX.
        (limit < (1u64 << 62)).then_some(limit)
    })
}

/// Reads the row group of `key` and converts it into a sealed chunk, under
/// one of `loads` (reads at once) and one of `converts` (decode and
/// convert on the blocking pool). `footer_from_peer` fetches the file's
/// footer from the node that reads it for the cluster, if any.
pub(crate) async fn read_and_convert(
    ds: &Dataset,
    key: ChunkKey,
    footer_from_peer: Option<(String, BoxFuture<'static, Result<bytes::Bytes, String>>)>,
    _load_permit: tokio::sync::SemaphorePermit<'_>,
    converts: &Arc<Semaphore>,
    clock: &crate::timings::StageClock,
) -> Result<SealedChunk, FetchError> {
    let started = std::time::Instant::now();
    let (file, rg) = ds.locate(key.shard)?;
    let footer = ds.footer_via(key.shard.file as usize, footer_from_peer).await?;
    let path = file.path.to_string();
    let rows = ds.manifest.files[key.shard.file as usize].row_groups[rg].rows;
    // Errors name the file and the row group.
    let site = format!("{path} row group {rg}");
    let parquet_err = |source| FetchError::Remote(RemoteError::Parquet { path: site.clone(), source });
    let reader = file.reader(&ds.remote);
    // The row group's own footer: it is row group 0 there.
    let metadata = footer.row_group(&path, rg)?;
    let builder = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, metadata);
    let mask = ProjectionMask::roots(builder.parquet_schema(), footer.resolved.projection.iter().copied());
    let mut stream = builder
        .with_row_groups(vec![0])
        .with_projection(mask)
        .with_batch_size(rows.clamp(1, 1 << 24) as usize)
        .build()
        .map_err(parquet_err)?;
    // The row group's column chunks are fetched here, on the runtime;
    // decoding them is CPU work and runs with the conversion on the
    // converter pool, so a long decode never holds up the node's other
    // requests (its trainers', its peers', the progress frames it owes
    // them). The reader gives no decoder for a row group without rows
    // (the manifest keeps it as a shard, converted to an empty chunk).
    let decoder = stream.next_row_group().await.map_err(|e| unwrap_store_error(e, &site))?;
    if decoder.is_none() && rows != 0 {
        return Err(parquet_err(parquet::errors::ParquetError::General(format!(
            "the reader returned no rows; the footer says {rows}"
        ))));
    }
    // The layout comes after decoding: a jagged tensor's values are
    // counted in the decoded row group.
    let tensors = ds.manifest.tensors.clone();
    let version = key.version;
    let resolved = footer.resolved.clone();
    let schema = footer.schema.clone();
    let read = started.elapsed();
    let permit = converts.clone().acquire_owned().await.map_err(FetchError::ShuttingDown)?;
    let waited = started.elapsed() - read;
    let shard = key.shard;
    let chunk = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let parquet_err = |source| FetchError::Remote(RemoteError::Parquet { path: site.clone(), source });
        // Decoding can panic on hostile pages: an error naming the file
        // and the row group, not a lost task.
        let decode = || -> Result<RecordBatch, parquet::errors::ParquetError> {
            let batches = match decoder {
                Some(d) => d.collect::<Result<Vec<RecordBatch>, _>>().map_err(|e| match e {
                    arrow::error::ArrowError::ParquetError(m) => parquet::errors::ParquetError::General(m),
                    other => parquet::errors::ParquetError::ArrowError(other.to_string()),
                })?,
                None => Vec::new(),
            };
            let schema = batches.first().map(|b| b.schema()).unwrap_or(schema);
            match batches.len() {
                0 => Ok(RecordBatch::new_empty(schema)),
                1 => Ok(batches.into_iter().next().unwrap_or_else(|| RecordBatch::new_empty(schema))),
                _ => arrow::compute::concat_batches(&schema, &batches)
                    .map_err(|e| parquet::errors::ParquetError::General(format!("cannot join decoded batches: {e}"))),
            }
        };
        let batch = std::panic::catch_unwind(AssertUnwindSafe(decode))
            .map_err(|panic| panicked(&site, &*panic))?
            .map_err(parquet_err)?;
        if batch.num_rows() as u64 != rows {
            return Err(parquet_err(parquet::errors::ParquetError::General(format!(
                "decoded to {} rows, the footer says {rows}",
                batch.num_rows()
            ))));
        }
        let site = Site { file: &path, row_group: rg };
        let values = jagged_values(&batch, &resolved, site)?;
        let layout = ChunkLayout::with_values(version, shard, rows, &tensors, &values)
            .map_err(|source| FetchError::Layout { shard, source })?;
        let mut w = ChunkWriter::new(layout.total_len()).map_err(|source| FetchError::Memory { shard, source })?;
        convert_into(&batch, &resolved, &layout, w.as_mut_slice(), site)?;
        layout.seal(w.as_mut_slice()).map_err(|source| FetchError::Layout { shard, source })?;
        w.seal().map_err(|source| FetchError::Memory { shard, source })
    })
    .await
    .map_err(|source| FetchError::Task { what: "converting", source })??;
    clock.load(read, waited, started.elapsed().saturating_sub(read + waited));
    Ok(chunk)
}

/// The error for a panic of the decoder while loading "FILE row group N"
/// (`site`): the message it carried, if it is text.
pub(crate) fn panicked(site: &str, panic: &(dyn std::any::Any + Send)) -> FetchError {
    let what = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic");
    FetchError::Remote(RemoteError::Parquet {
        path: site.to_string(),
        source: parquet::errors::ParquetError::General(format!("the decoder panicked: {what}")),
    })
}

/// Turns a store error wrapped by the Parquet reader back into a clear
/// remote error (missing object, network), keeping decode errors as such.
/// `site` is "FILE row group N".
fn unwrap_store_error(e: parquet::errors::ParquetError, site: &str) -> FetchError {
    if let parquet::errors::ParquetError::External(inner) = e {
        return match inner.downcast::<RemoteError>() {
            Ok(remote) => match *remote {
                RemoteError::Store { error, .. } => {
                    FetchError::Remote(RemoteError::Store { path: site.to_string(), error })
                }
                RemoteError::Changed { registered, now, .. } => {
                    FetchError::Remote(RemoteError::Changed { path: site.to_string(), registered, now })
                }
                other => FetchError::Remote(other),
            },
            Err(other) => FetchError::Remote(RemoteError::Parquet {
                path: site.to_string(),
                source: parquet::errors::ParquetError::External(other),
            }),
        };
    }
    FetchError::Remote(RemoteError::Parquet { path: site.to_string(), source: e })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_left_beside_tiers_and_loads_is_shared_by_the_ranks() {
        const MIB: u64 = 1 << 20;
        let mapping_advice = |memory, tiers, loads, ranks| {
            mapping_advice_now(memory, tiers, loads, Budgeted { overhead: 0, ranks, loaders: 0 })
        };
        // A 512 MiB pod: tiers of 40 MiB and a 256 MiB load budget leave
        // 152 MiB past the overhead, 19 MiB for each of 8 ranks.
        assert_eq!(mapping_advice(Some(512 * MIB), 40 * MIB, 256 * MIB, 8), 19 * MIB);
        assert_eq!(mapping_advice(Some(512 * MIB), 40 * MIB, 256 * MIB, 4), 38 * MIB);
        // Nothing left: trainers keep no mapping beyond what the node holds.
        assert_eq!(mapping_advice(Some(256 * MIB), 40 * MIB, 256 * MIB, 8), 0);
        assert_eq!(mapping_advice(None, 0, 0, 8), u64::MAX, "no advice when the memory is not known");
        assert_eq!(mapping_advice(Some(MIB << 10), 0, 0, 0), (MIB << 10) - NODE_OVERHEAD, "0 ranks read as 1");
    }

    #[test]
    fn the_advice_shrinks_with_what_the_node_holds_and_the_loaders_connected() {
        const MIB: u64 = 1 << 20;
        let now = |overhead, loaders| Budgeted { overhead, ranks: 8, loaders };
        let advice = |n| mapping_advice_now(Some(512 * MIB), 40 * MIB, 256 * MIB, n);
        assert_eq!(advice(now(0, 0)), 19 * MIB, "as at start: the fixed overhead, the expected ranks");
        assert_eq!(advice(now(32 * MIB, 3)), 19 * MIB, "less than the fixed overhead, fewer loaders: the same");
        // Manifests of a million row groups: 144 MiB of the node's own.
        assert_eq!(advice(now(144 * MIB, 0)), 9 * MIB);
        // Sixteen loaders on a host sized for eight: each gets half.
        assert_eq!(advice(now(0, 16)), 9 * MIB + MIB / 2);
        assert_eq!(advice(now(u64::MAX, 16)), 0, "nothing left");
    }

    #[test]
    fn the_overhead_is_the_anonymous_memory_less_the_loads() {
        let status = "Name:\tgranary\nVmRSS:\t  900000 kB\nRssAnon:\t  300000 kB\nRssFile:\t 10000 kB\n";
        assert_eq!(measured_overhead(status, 0), Some(300_000 * 1024));
        assert_eq!(measured_overhead(status, 100_000 * 1024), Some(200_000 * 1024));
        assert_eq!(measured_overhead(status, u64::MAX), Some(0));
        assert_eq!(measured_overhead("Name:\tx\n", 0), None);
        let own = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        assert!(measured_overhead(&own, 0).is_some_and(|b| b > 0), "this process has anonymous memory");
    }

    #[test]
    fn a_load_is_admitted_by_its_estimate_and_one_over_the_whole_budget_never() {
        assert_eq!(load_memory_estimate(10 << 20, 40 << 20), 90 << 20);
        assert_eq!(memory_admission(90 << 20, 1 << 30), Some(90 * 1024));
        assert_eq!(memory_admission(1, 1 << 30), Some(1), "at least one KiB");
        assert_eq!(memory_admission(1 << 30, 1 << 30), Some(1 << 20));
        assert_eq!(memory_admission((1 << 30) + 1, 1 << 30), None);
        assert!(default_load_memory(0) >= MIN_LOAD_BUDGET);
    }

    #[test]
    fn the_load_budget_gives_way_to_the_nodes_own_memory_as_it_grows() {
        let (memory, tiers) = (16u64 << 30, 4u64 << 30);
        let at_start = load_budget(Some(memory), None, tiers);
        assert_eq!(load_budget_now(memory, tiers, 0), at_start, "below the overhead reckoned at start");
        assert_eq!(load_budget_now(memory, tiers, NODE_OVERHEAD), at_start);
        // Manifests and orders of a million row groups: 2 GiB more.
        assert_eq!(load_budget_now(memory, tiers, NODE_OVERHEAD + (2 << 30)), at_start - (1 << 30));
        assert_eq!(load_budget_now(memory, tiers, 64 << 30), MIN_LOAD_BUDGET, "never below the floor");
    }

    #[test]
    fn a_shrinking_budget_forgets_only_free_permits_and_a_growing_one_adds() {
        assert_eq!(resize(100, 150, 10), Resize { add: 50, forget: 0 });
        assert_eq!(resize(100, 60, 100), Resize { add: 0, forget: 40 });
        assert_eq!(resize(100, 60, 15), Resize { add: 0, forget: 15 }, "the rest once loads give theirs back");
        assert_eq!(resize(100, 100, 0), Resize { add: 0, forget: 0 });
        assert_eq!(resize(1600, 1650, 1600), Resize { add: 0, forget: 0 }, "a wobble is no move");
        assert_eq!(resize(1600, 1550, 1600), Resize { add: 0, forget: 0 });
        let big = 12 << 20; // a 12 GiB budget
        assert_eq!(resize(big, big - (512 << 10), big).forget, 512 << 10, "half a GiB is a move however large");
    }

    /// Issue 29: the default load budget is half of what is left beside
    /// the tiers, of the machine's memory or the cgroup's limit if lower.
    #[test]
    fn the_load_budget_follows_the_cgroup_limit_and_leaves_the_tiers_room() {
        const GIB: u64 = 1 << 30;
        assert_eq!(load_budget(Some(512 * GIB), Some(40 * GIB), 36 * GIB), 2 * GIB, "a 40 GiB container");
        assert_eq!(load_budget(Some(24 * GIB), None, 5 * GIB), 19 * GIB / 2, "no limit: the machine");
        assert_eq!(load_budget(Some(24 * GIB), Some(512 * GIB), 0), 12 * GIB, "a limit above the machine");
        assert_eq!(load_budget(Some(GIB), None, 4 * GIB), MIN_LOAD_BUDGET, "tiers larger than memory");
        assert_eq!(load_budget(None, None, 0), 4 * GIB);
        assert_eq!(load_budget(None, Some(8 * GIB), 0), 4 * GIB, "half of the limit alone");
    }

    #[test]
    fn the_cgroup_limit_is_read_for_v2_and_v1_in_the_own_group_or_at_the_root() {
        let files = |entries: &'static [(&'static str, &'static str)]| {
            move |path: &str| entries.iter().find(|(p, _)| *p == path).map(|(_, t)| t.to_string())
        };
        // v2, the process's own group.
        let own = "0::/kubepods/pod1/c1\n";
        assert_eq!(cgroup_memory_limit(own, files(&[("kubepods/pod1/c1/memory.max", "536870912\n")])), Some(512 << 20));
        // v2 unlimited; v2 inside a container namespace (group "/").
        assert_eq!(cgroup_memory_limit(own, files(&[("kubepods/pod1/c1/memory.max", "max\n")])), None);
        assert_eq!(cgroup_memory_limit("0::/\n", files(&[("memory.max", "1073741824")])), Some(1 << 30));
        // v1, with the memory controller on its own line, and its unlimited sentinel.
        let v1 = "5:devices:/\n4:memory:/process_api/abc\n0::/\n";
        const LIMIT: &[(&str, &str)] = &[("memory/process_api/abc/memory.limit_in_bytes", "2147483648\n")];
        assert_eq!(cgroup_memory_limit(v1, files(LIMIT)), Some(2 << 30));
        const UNLIMITED: &[(&str, &str)] = &[("memory/process_api/abc/memory.limit_in_bytes", "9223372036854771712\n")];
        assert_eq!(cgroup_memory_limit(v1, files(UNLIMITED)), None);
        assert_eq!(cgroup_memory_limit(v1, files(&[])), None, "nothing readable");
    }
}
