//! Where chunks come from.
//!
//! [`ChunkSource`] is the one trait between the loader and a node: the real
//! implementation is [`crate::LocalSource`] (a node over a Unix socket), the
//! node crate's in-process mode is another, and [`MemorySource`] holds
//! converted chunks in this process (tests, and the in-RAM ceiling that
//! benchmarks compare against).

use crate::error::ClientError;
use granary_proto::chunk::Verify;
use granary_proto::wire::DatasetInfo;
use granary_proto::{AlignedBuf, ChunkHeader, ChunkView, DatasetVersion, ShardId, Walk};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Something that owns chunk bytes (a mapped memory file, an aligned buffer).
pub trait ChunkBytes: Send + Sync {
    /// The chunk bytes, starting 64-byte aligned.
    fn bytes(&self) -> &[u8];

    /// True when the bytes are registered with a CUDA context as page-locked
    /// memory (feature `cuda`), so a device copy can read them directly.
    fn page_locked(&self) -> bool {
        false
    }
}

impl ChunkBytes for AlignedBuf {
    fn bytes(&self) -> &[u8] {
        self.as_slice()
    }
}

/// A validated chunk: its bytes and its parsed header.
#[derive(Clone)]
pub struct Chunk {
    owner: Arc<dyn ChunkBytes>,
    header: Arc<ChunkHeader>,
    payload_start: usize,
}

impl std::fmt::Debug for Chunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunk").field("shard", &self.header.shard).field("rows", &self.header.rows).finish()
    }
}

impl Chunk {
    /// Validates `owner`'s bytes as chunk `shard` of `version`.
    pub fn new(
        owner: Arc<dyn ChunkBytes>,
        version: DatasetVersion,
        shard: ShardId,
        verify: Verify,
    ) -> Result<Self, ClientError> {
        let bytes = owner.bytes();
        let view = ChunkView::parse(bytes, verify).map_err(|source| ClientError::Chunk { shard, source })?;
        view.expect_identity(version, shard).map_err(|source| ClientError::Chunk { shard, source })?;
        let payload_start = bytes.len() - view.header().payload_len as usize;
        let header = Arc::new(view.header().clone());
        let chunk = Self { owner, header, payload_start };
        // Row offsets are read as `u64`s in place: parse checked their
        // values; their alignment depends on where the bytes start.
        for (i, t) in chunk.header.tensors.iter().enumerate() {
            if t.is_jagged() && chunk.offset_bytes(i).is_some_and(|b| bytemuck::try_cast_slice::<u8, u64>(b).is_err()) {
                return Err(ClientError::Chunk {
                    shard,
                    source: granary_proto::ChunkError::Layout(format!(
                        "the row offsets of tensor {:?} are not 8-byte aligned in memory",
                        t.name
                    )),
                });
            }
        }
        Ok(chunk)
    }

    /// The header.
    pub fn header(&self) -> &ChunkHeader {
        &self.header
    }

    /// Bytes of tensor `i` (view order); of a jagged tensor, its values.
    pub fn tensor_bytes(&self, i: usize) -> &[u8] {
        let t = &self.header.tensors[i];
        let start = self.payload_start + t.offset as usize;
        &self.owner.bytes()[start..start + t.len as usize]
    }

    /// The row offsets' bytes of jagged tensor `i` (rows + 1 little-endian
    /// `u64`s); `None` for a dense tensor.
    fn offset_bytes(&self, i: usize) -> Option<&[u8]> {
        let start = self.payload_start + self.header.tensors[i].row_offsets? as usize;
        Some(&self.owner.bytes()[start..start + (self.header.rows as usize + 1) * 8])
    }

    /// The row offsets of jagged tensor `i` (view order): rows + 1 values,
    /// row `r` holding values `offsets[r]..offsets[r + 1]` of
    /// [`Chunk::tensor_bytes`] (checked when the chunk was validated:
    /// starting at 0, never decreasing, ending at the value count). `None`
    /// for a dense tensor.
    pub fn row_offsets(&self, i: usize) -> Option<&[u64]> {
        // Alignment was checked in `new`, so the cast cannot fail; were it
        // to, no offsets is an error upstream, not a wrong tensor.
        self.offset_bytes(i).map(|b| bytemuck::try_cast_slice(b).unwrap_or(&[]))
    }

    /// The whole chunk.
    pub fn bytes(&self) -> &[u8] {
        self.owner.bytes()
    }

    /// True when the chunk's memory is page-locked for a CUDA context (see
    /// [`crate::LocalSource`]'s `page_lock_for`, feature `cuda`).
    pub fn is_page_locked(&self) -> bool {
        self.owner.page_locked()
    }
}

/// How often, and how long in all, a source waited for its node to come
/// back (issue 48: a node restart, a reconnect), since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stalls {
    /// Times the connection was lost and made again (or given up on).
    pub reconnects: u64,
    /// Time spent waiting for the node in those reconnects.
    pub waited: std::time::Duration,
}

/// Where a loader gets dataset descriptions and chunks.
pub trait ChunkSource: Send + Sync {
    /// Describes `version` of `dataset`, or its current version when
    /// `version` is `None`; [`ClientError::UnknownDataset`] or
    /// [`ClientError::VersionGone`] when not served.
    fn describe(&self, dataset: &str, version: Option<DatasetVersion>) -> Result<DatasetInfo, ClientError>;

    /// Announces the plan a rank is about to walk and where it starts in
    /// it, so the source can prefetch along it from there. Sources without
    /// prefetch ignore it.
    fn follow(&self, version: DatasetVersion, walk: &Walk) -> Result<(), ClientError> {
        let _ = (version, walk);
        Ok(())
    }

    /// Returns chunk `shard` of `version`, validated.
    fn fetch(&self, version: DatasetVersion, shard: ShardId) -> Result<Chunk, ClientError>;

    /// Hands a rank's loader clocks to the node (for `granary doctor`),
    /// without waiting behind another request; false when it could not
    /// be sent now (the loader tries again at its next batch). Sources
    /// that keep no reports take it as sent.
    fn report(&self, _report: &granary_proto::doctor::RankReport) -> Result<bool, ClientError> {
        Ok(true)
    }

    /// How often and how long this source waited for its node to come
    /// back; none for sources without a node.
    fn stalls(&self) -> Stalls {
        Stalls::default()
    }
}

/// Converted chunks held in this process.
pub struct MemorySource {
    info: DatasetInfo,
    chunks: BTreeMap<ShardId, Chunk>,
}

impl MemorySource {
    /// A source serving `chunks` (each validated here, once) for `info`.
    pub fn new(info: DatasetInfo, chunks: Vec<(ShardId, AlignedBuf)>) -> Result<Self, ClientError> {
        let mut map = BTreeMap::new();
        for (shard, buf) in chunks {
            map.insert(shard, Chunk::new(Arc::new(buf), info.version, shard, Verify::Full)?);
        }
        Ok(Self { info, chunks: map })
    }

    fn gone(&self, version: DatasetVersion) -> ClientError {
        ClientError::VersionGone { dataset: self.info.name.clone(), version, current: Some(self.info.version) }
    }

    /// Total chunk bytes held.
    pub fn bytes_held(&self) -> usize {
        self.chunks.values().map(|c| c.bytes().len()).sum()
    }
}

impl ChunkSource for MemorySource {
    fn describe(&self, dataset: &str, version: Option<DatasetVersion>) -> Result<DatasetInfo, ClientError> {
        if dataset != self.info.name {
            return Err(ClientError::UnknownDataset {
                dataset: dataset.to_string(),
                served: vec![self.info.name.clone()],
            });
        }
        match version {
            Some(v) if v != self.info.version => Err(self.gone(v)),
            _ => Ok(self.info.clone()),
        }
    }

    fn fetch(&self, version: DatasetVersion, shard: ShardId) -> Result<Chunk, ClientError> {
        if version != self.info.version {
            return Err(self.gone(version));
        }
        self.chunks.get(&shard).cloned().ok_or_else(|| ClientError::Node {
            kind: granary_proto::wire::ErrorKind::BadRequest,
            message: format!("shard {shard} is not held"),
        })
    }
}
