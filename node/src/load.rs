//! One shard loaded here: its row group read from remote storage (footer
//! from memory, from the peer that reads it for the cluster, or from
//! remote storage), decoded and converted on the converter pool straight
//! into a sealed memory file. [`panicked`] is the one panic guard's error:
//! a decoder that panics on hostile pages (in the load task or on the
//! converter pool) becomes an error naming the file and row group, never a
//! lost task or a hung waiter.

use crate::convert::{Site, convert_into};
use crate::dataset::Dataset;
use crate::error::{FetchError, RemoteError};
use crate::shm::{ChunkWriter, SealedChunk};
use crate::tier::ChunkKey;
use arrow::array::RecordBatch;
use futures::future::BoxFuture;
use granary_proto::ChunkLayout;
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use std::panic::AssertUnwindSafe;
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

/// The default budget for loads in progress: half the machine's memory
/// (`MemTotal` in /proc/meminfo), or 4 GiB where that cannot be read.
pub(crate) fn default_load_memory() -> u64 {
    let total_kib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| {
        let line = t.lines().find(|l| l.starts_with("MemTotal:"))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok()
    });
    total_kib.map_or(4 << 30, |kib| kib.saturating_mul(1024) / 2)
}

/// Reads the row group of `key` and converts it into a sealed chunk, under
/// one of `loads` (reads at once) and one of `converts` (decode and
/// convert on the blocking pool). `footer_from_peer` fetches the file's
/// footer from the node that reads it for the cluster, if any.
pub(crate) async fn read_and_convert(
    ds: &Dataset,
    key: ChunkKey,
    footer_from_peer: Option<BoxFuture<'static, Result<bytes::Bytes, String>>>,
    _load_permit: tokio::sync::SemaphorePermit<'_>,
    converts: &Arc<Semaphore>,
    clock: &crate::metrics::StageClock,
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
    let builder = ParquetRecordBatchStreamBuilder::new_with_metadata(reader, footer.metadata.clone());
    let mask = ProjectionMask::roots(builder.parquet_schema(), footer.resolved.projection.iter().copied());
    let mut stream = builder
        .with_row_groups(vec![rg])
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
    let layout = ChunkLayout::new(key.version, key.shard, rows, &ds.manifest.tensors)
        .map_err(|source| FetchError::Layout { shard: key.shard, source })?;
    let resolved = footer.resolved.clone();
    let schema = footer.metadata.schema().clone();
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
        let mut w = ChunkWriter::new(layout.total_len()).map_err(|source| FetchError::Memory { shard, source })?;
        convert_into(&batch, &resolved, &layout, w.as_mut_slice(), Site { file: &path, row_group: rg })?;
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
    fn a_load_is_admitted_by_its_estimate_and_one_over_the_whole_budget_never() {
        assert_eq!(load_memory_estimate(10 << 20, 40 << 20), 90 << 20);
        assert_eq!(memory_admission(90 << 20, 1 << 30), Some(90 * 1024));
        assert_eq!(memory_admission(1, 1 << 30), Some(1), "at least one KiB");
        assert_eq!(memory_admission(1 << 30, 1 << 30), Some(1 << 20));
        assert_eq!(memory_admission((1 << 30) + 1, 1 << 30), None);
        assert!(default_load_memory() > 0);
    }
}
