//! The job every seed runs ([`Job`]): what `prepare` made of the run's
//! configuration, data only, so the pure verdict reads it without the
//! shell that prepared it.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// The job every seed runs, with its fault-free reference.
#[derive(Clone, Debug)]
pub struct Job {
    /// The store's folder (buckets are its sub-folders).
    pub store_root: PathBuf,
    /// The dataset's folder.
    pub data: PathBuf,
    /// Parquet bytes of the dataset.
    pub source_bytes: u64,
    /// (rank, epoch) -> digest of the batch checksums, from one node
    /// alone without faults.
    pub reference: BTreeMap<(u32, u64), String>,
    /// Seconds the reference took for all epochs.
    pub reference_secs: f64,
    /// Bytes of the converted dataset (the reference node's chunk memory
    /// at the end, every chunk in RAM).
    pub converted_bytes: u64,
    /// Shards (row groups) of the dataset.
    pub shards: u64,
}
