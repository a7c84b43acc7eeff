//! The chunk: one shard after conversion, as one self-describing blob.
//!
//! The same bytes sit in RAM, on SSD, on the wire and in the trainer's
//! memory, so this format is the whole contract between the converter and
//! every reader. Layout (all integers little-endian):
//!
//! ```text
//! 0   magic "GRNCHNK\0"
//! 8   format version (u32) = 3 (2 still read)
//! 12  header length H (u32)
//! 16  xxh3-64 of the header bytes (u64)
//! 24  total length of the chunk (u64)
//! 32  header: rkyv archive of ChunkHeader, H bytes
//! P = align64(32 + H): payload, one row-major tensor per view tensor, each
//!     starting at a multiple of 64 bytes, gaps zero-filled, payload length
//!     a multiple of 64; the header holds its xxh3-64 checksum.
//! ```
//!
//! A jagged tensor (a variable number of values per row: a list or byte
//! column) takes two ranges, each starting at a multiple of 64: its row
//! offsets, rows + 1 little-endian `u64`s (the first 0, none smaller than
//! the one before, the last the number of values), then its values,
//! contiguous: row `r`'s are values `offsets[r]..offsets[r + 1]`.
//! Format 1 had no jagged tensors; its chunks are refused
//! ([`ChunkError::UnsupportedFormat`]), so a node drops them from its SSD
//! tier and converts the shard again.
//!
//! Format 3 says which converter made the chunk: the header's first word,
//! a `u32` format in format 2, is two `u16`s in format 3, the format and
//! the [`CONVERTER_VERSION`]. The archive keeps its layout, so a chunk is
//! as long in either format and a manifest's lengths hold for both. This
//! build reads both (a format-2 chunk's converter is unknown: 0) and
//! writes 3; [`ChunkView::write_format`] gives a format-2 copy to a reader
//! of the build before (a peer speaking `granary-peer/4`, a trainer of
//! local protocol 2), and peer verification compares chunks of one
//! converter only.
//!
//! [`ChunkView::parse`] validates all of it before a single tensor byte is
//! read: a chunk that came from disk, a peer or shared memory is never used
//! unvalidated.

use crate::dtype::DType;
use crate::ids::{DatasetVersion, ShardId};
use crate::view::TensorLayout;
use thiserror::Error;
use xxhash_rust::xxh3::xxh3_64;

/// First eight bytes of every chunk.
pub const MAGIC: [u8; 8] = *b"GRNCHNK\0";
/// The chunk format this crate writes.
pub const FORMAT_VERSION: u32 = 3;
/// The oldest chunk format this crate reads (and writes for readers of
/// the build before: [`ChunkView::write_format`]).
pub const OLDEST_FORMAT: u32 = 2;
/// The rules this build's converter follows. It moves whenever the bytes
/// a conversion makes change for the same row group and view (a fix in a
/// cast, a new fill), so that two chunks are compared byte for byte only
/// when one set of rules made both. 0 means unknown (format 2).
pub const CONVERTER_VERSION: u16 = 1;
/// The converter rules a format-2 chunk is taken to follow where a rule
/// must be named (peer verification): the builds that wrote format 2 ran
/// the rules this build calls 1, so a chunk of the build before is
/// compared with this build's own, and a forger gains nothing by sending
/// format 2.
pub const FORMAT_2_CONVERTER: u16 = 1;
/// Bytes before the header.
pub const PREFIX_LEN: usize = 32;
/// Largest header accepted (bounds the work done on a hostile chunk).
pub const MAX_HEADER_LEN: usize = 1 << 20;
/// Tensor alignment inside a chunk.
pub const ALIGN: usize = 64;

/// One tensor's place in the payload.
#[derive(Clone, PartialEq, Eq, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct TensorMeta {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Per-row shape.
    pub shape: Vec<u32>,
    /// Offset from the start of the payload, a multiple of 64.
    pub offset: u64,
    /// Length in bytes: rows x per-row bytes; of a jagged tensor, its
    /// values x per-value bytes.
    pub len: u64,
    /// Of a jagged tensor: the payload offset of its row offsets (a
    /// multiple of 64, before its values; see the module doc). `None`: a
    /// dense tensor.
    pub row_offsets: Option<u64>,
}

impl TensorMeta {
    /// Bytes per row; of a jagged tensor, per value (saturating:
    /// validation rejects overflow first).
    pub fn row_bytes(&self) -> usize {
        self.shape.iter().fold(self.dtype.size_bytes(), |acc, &d| acc.saturating_mul(d as usize))
    }

    /// Whether rows hold a variable number of values.
    pub fn is_jagged(&self) -> bool {
        self.row_offsets.is_some()
    }
}

/// What a chunk says about itself.
#[derive(Clone, PartialEq, Eq, Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ChunkHeader {
    /// The chunk format: the prefix's (format 2 or 3). Format 2 had one
    /// `u32` here, so this and `converter` take its place.
    pub format: u16,
    /// The [`CONVERTER_VERSION`] of the build that converted the shard;
    /// 0 (unknown) in format 2.
    pub converter: u16,
    /// Dataset version the shard belongs to.
    pub dataset_version: DatasetVersion,
    /// The shard this chunk holds.
    pub shard: ShardId,
    /// Rows in the shard.
    pub rows: u64,
    /// Tensors in view order, with increasing offsets.
    pub tensors: Vec<TensorMeta>,
    /// Payload length in bytes, a multiple of 64.
    pub payload_len: u64,
    /// xxh3-64 of the payload.
    pub payload_checksum: u64,
}

/// Why bytes are not a valid chunk.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChunkError {
    /// Fewer bytes than the fixed prefix.
    #[error("chunk is {0} bytes, shorter than its {PREFIX_LEN}-byte prefix")]
    TooShort(usize),
    /// The magic bytes are wrong: not a chunk at all.
    #[error("not a chunk (bad magic)")]
    BadMagic,
    /// Written by another format version.
    #[error("chunk format {0} is not supported (this build reads {OLDEST_FORMAT} to {FORMAT_VERSION})")]
    UnsupportedFormat(u32),
    /// The header length or total length disagrees with the bytes.
    #[error("chunk lengths are inconsistent: {0}")]
    Length(String),
    /// The header's checksum does not match.
    #[error("chunk header checksum mismatch")]
    HeaderChecksum,
    /// The header is not a valid archive.
    #[error("chunk header is not a valid archive: {0}")]
    HeaderInvalid(String),
    /// The header describes an impossible layout.
    #[error("chunk layout is invalid: {0}")]
    Layout(String),
    /// The payload's checksum does not match the header.
    #[error("chunk payload checksum mismatch (header {expected:016x}, payload {actual:016x})")]
    PayloadChecksum {
        /// Checksum recorded in the header.
        expected: u64,
        /// Checksum of the bytes present.
        actual: u64,
    },
    /// A valid chunk, but not the one asked for.
    #[error("chunk holds {got_version}/{got_shard}, expected {want_version}/{want_shard}")]
    WrongShard {
        /// Version found.
        got_version: DatasetVersion,
        /// Shard found.
        got_shard: ShardId,
        /// Version expected.
        want_version: DatasetVersion,
        /// Shard expected.
        want_shard: ShardId,
    },
}

const fn align_up(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// [`align_up`], or `None` where the result does not fit a `usize`.
fn checked_align_up(n: usize) -> Option<usize> {
    n.checked_next_multiple_of(ALIGN)
}

/// Where everything goes in a chunk about to be written.
///
/// The writer asks for the layout, fills each tensor's byte range of a
/// buffer of [`ChunkLayout::total_len`] bytes in place, then calls
impl ChunkHeader {
    /// Checks that this header holds `rows` rows of `tensors` (the same
    /// names, element types, shapes and jaggedness, in order), each dense
    /// tensor exactly its rows' bytes: the shard a manifest describes. The
    /// error says what differs.
    pub fn conforms(&self, rows: u64, tensors: &[TensorLayout]) -> Result<(), String> {
        if self.rows != rows {
            return Err(format!("it holds {} rows; the manifest gives {rows}", self.rows));
        }
        if self.tensors.len() != tensors.len() {
            return Err(format!("it holds {} tensors; the view has {}", self.tensors.len(), tensors.len()));
        }
        for (m, l) in self.tensors.iter().zip(tensors) {
            if m.name != l.name || m.dtype != l.dtype || m.shape != l.shape || m.is_jagged() != l.jagged {
                return Err(format!(
                    "its tensor {:?} ({} {:?}{}) is not the view's {:?} ({} {:?}{})",
                    m.name,
                    m.dtype.name(),
                    m.shape,
                    if m.is_jagged() { ", jagged" } else { "" },
                    l.name,
                    l.dtype.name(),
                    l.shape,
                    if l.jagged { ", jagged" } else { "" },
                ));
            }
            if !l.jagged && Some(m.len) != rows.checked_mul(l.row_bytes() as u64) {
                return Err(format!("its tensor {:?} holds {} bytes, not {} rows' worth", m.name, m.len, rows));
            }
        }
        Ok(())
    }
}

/// What a chunk of a shard must be, known before it arrives (from a peer,
/// say): its exact length where the manifest's layout fixes it, or, for a
/// chunk with jagged tensors (whose values are counted only in the decoded
/// row group), its rows and tensors, checked once it is parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    /// Exactly this many bytes.
    Len(u64),
    /// A header that [`ChunkHeader::conforms`] to these rows and tensors.
    Shape {
        /// Rows of the shard.
        rows: u64,
        /// The view's tensors.
        tensors: std::sync::Arc<[TensorLayout]>,
    },
}

/// [`ChunkLayout::seal`]: the converter writes straight into the final bytes.
#[derive(Clone, Debug)]
pub struct ChunkLayout {
    header: ChunkHeader,
    header_len: usize,
    payload_start: usize,
    total_len: usize,
}

impl ChunkLayout {
    /// Lays out a chunk of `rows` rows of dense `tensors` (a jagged one
    /// needs its value count: [`ChunkLayout::with_values`]).
    pub fn new(
        dataset_version: DatasetVersion,
        shard: ShardId,
        rows: u64,
        tensors: &[TensorLayout],
    ) -> Result<Self, ChunkError> {
        Self::with_values(dataset_version, shard, rows, tensors, &[])
    }

    /// Lays out a chunk of `rows` rows of `tensors`, jagged tensor `i`
    /// holding `values[i]` values in all (dense tensors' entries are not
    /// read; `values` may be shorter when no jagged tensor comes after).
    pub fn with_values(
        dataset_version: DatasetVersion,
        shard: ShardId,
        rows: u64,
        tensors: &[TensorLayout],
        values: &[u64],
    ) -> Result<Self, ChunkError> {
        let mut metas = Vec::with_capacity(tensors.len());
        let mut offset = 0usize;
        let too_large = |t: &TensorLayout| ChunkError::Layout(format!("tensor {:?} is too large", t.name));
        // Takes `len` bytes at the current offset; the next range starts
        // at the next multiple of 64.
        let mut take = |len: usize, t: &TensorLayout| -> Result<usize, ChunkError> {
            let at = offset;
            offset = offset.checked_add(len).and_then(checked_align_up).ok_or_else(|| too_large(t))?;
            Ok(at)
        };
        for (i, t) in tensors.iter().enumerate() {
            let (count, row_offsets) = if t.jagged {
                let Some(&count) = values.get(i) else {
                    return Err(ChunkError::Layout(format!("jagged tensor {:?} needs its value count", t.name)));
                };
                let offsets_len = usize::try_from(rows)
                    .ok()
                    .and_then(|r| r.checked_add(1))
                    .and_then(|n| n.checked_mul(8))
                    .ok_or_else(|| too_large(t))?;
                (count, Some(take(offsets_len, t)? as u64))
            } else {
                (rows, None)
            };
            let len =
                usize::try_from(count).ok().and_then(|n| n.checked_mul(t.row_bytes())).ok_or_else(|| too_large(t))?;
            let at = take(len, t)?;
            metas.push(TensorMeta {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                offset: at as u64,
                len: len as u64,
                row_offsets,
            });
        }
        let header = ChunkHeader {
            format: FORMAT_VERSION as u16,
            converter: CONVERTER_VERSION,
            dataset_version,
            shard,
            rows,
            tensors: metas,
            payload_len: offset as u64,
            payload_checksum: 0,
        };
        let header_len = encode_header(&header)?.len();
        let payload_start = align_up(PREFIX_LEN + header_len);
        let total_len = payload_start
            .checked_add(offset)
            .ok_or_else(|| ChunkError::Layout(format!("a payload of {offset} bytes is too large")))?;
        Ok(Self { header, header_len, payload_start, total_len })
    }

    /// Length of the whole chunk in bytes.
    pub fn total_len(&self) -> usize {
        self.total_len
    }

    /// Number of tensors.
    pub fn tensor_count(&self) -> usize {
        self.header.tensors.len()
    }

    /// Absolute byte range of tensor `i` within the chunk (of a jagged
    /// tensor, its values).
    pub fn tensor_range(&self, i: usize) -> std::ops::Range<usize> {
        let t = &self.header.tensors[i];
        let start = self.payload_start + t.offset as usize;
        start..start + t.len as usize
    }

    /// Absolute byte range of jagged tensor `i`'s row offsets (rows + 1
    /// little-endian `u64`s, written by the converter); `None` for a dense
    /// tensor.
    pub fn offsets_range(&self, i: usize) -> Option<std::ops::Range<usize>> {
        let t = &self.header.tensors[i];
        let start = self.payload_start + t.row_offsets? as usize;
        Some(start..start + (self.header.rows as usize + 1) * 8)
    }

    /// Every tensor's ranges in payload order: a jagged tensor's offsets,
    /// then its values.
    fn ranges(&self) -> Vec<std::ops::Range<usize>> {
        (0..self.header.tensors.len())
            .flat_map(|i| self.offsets_range(i).into_iter().chain(std::iter::once(self.tensor_range(i))))
            .collect()
    }

    /// Zeroes the gaps, checksums the payload and writes prefix and header.
    /// `buf` must be [`ChunkLayout::total_len`] bytes with every tensor range
    /// filled.
    pub fn seal(&self, buf: &mut [u8]) -> Result<(), ChunkError> {
        if buf.len() != self.total_len {
            return Err(ChunkError::Length(format!("buffer is {} bytes, layout needs {}", buf.len(), self.total_len)));
        }
        // Zero the padding so the checksum covers deterministic bytes.
        let mut cursor = self.payload_start;
        for r in self.ranges() {
            buf[cursor..r.start].fill(0);
            cursor = r.end;
        }
        buf[cursor..].fill(0);
        buf[PREFIX_LEN..self.payload_start].fill(0);
        let mut header = self.header.clone();
        header.payload_checksum = xxh3_64(&buf[self.payload_start..]);
        let encoded = encode_header(&header)?;
        if encoded.len() != self.header_len {
            return Err(ChunkError::Length("header length changed while sealing".into()));
        }
        buf[0..8].copy_from_slice(&MAGIC);
        buf[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        buf[12..16].copy_from_slice(&(self.header_len as u32).to_le_bytes());
        buf[16..24].copy_from_slice(&xxh3_64(&encoded).to_le_bytes());
        buf[24..32].copy_from_slice(&(self.total_len as u64).to_le_bytes());
        buf[PREFIX_LEN..PREFIX_LEN + self.header_len].copy_from_slice(&encoded);
        Ok(())
    }
}

fn encode_header(h: &ChunkHeader) -> Result<rkyv::util::AlignedVec, ChunkError> {
    rkyv::to_bytes::<rkyv::rancor::Error>(h).map_err(|e| ChunkError::HeaderInvalid(e.to_string()))
}

/// The format a chunk's prefix names, read without parsing it (`None`:
/// shorter than the prefix); what decides, on every hand-out, whether a
/// reader of an older format needs a copy ([`ChunkView::write_format`]).
pub fn format_of(bytes: &[u8]) -> Option<u32> {
    bytes.get(8..12).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes)
}

/// Whether [`ChunkView::parse`] also checksums the payload.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verify {
    /// Header, layout and payload checksum: for bytes whose payload has not
    /// been verified by this process (disk, network).
    Full,
    /// Header and layout only: for bytes whose payload was verified when they
    /// entered a store that cannot change them (a sealed memory file).
    HeaderOnly,
}

/// A validated chunk borrowed from its bytes.
#[derive(Debug)]
pub struct ChunkView<'a> {
    bytes: &'a [u8],
    header: ChunkHeader,
    payload_start: usize,
}

impl<'a> ChunkView<'a> {
    /// Validates `bytes` as a chunk. Never panics, whatever the bytes.
    pub fn parse(bytes: &'a [u8], verify: Verify) -> Result<Self, ChunkError> {
        if bytes.len() < PREFIX_LEN {
            return Err(ChunkError::TooShort(bytes.len()));
        }
        if bytes[0..8] != MAGIC {
            return Err(ChunkError::BadMagic);
        }
        let format = u32::from_le_bytes(bytes[8..12].try_into().unwrap_or_default());
        if !(OLDEST_FORMAT..=FORMAT_VERSION).contains(&format) {
            return Err(ChunkError::UnsupportedFormat(format));
        }
        let header_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap_or_default()) as usize;
        let header_sum = u64::from_le_bytes(bytes[16..24].try_into().unwrap_or_default());
        let total_len = u64::from_le_bytes(bytes[24..32].try_into().unwrap_or_default());
        if total_len != bytes.len() as u64 {
            return Err(ChunkError::Length(format!("prefix says {total_len} bytes, have {}", bytes.len())));
        }
        if header_len > MAX_HEADER_LEN || PREFIX_LEN + header_len > bytes.len() {
            return Err(ChunkError::Length(format!("header length {header_len} does not fit")));
        }
        let raw = &bytes[PREFIX_LEN..PREFIX_LEN + header_len];
        if xxh3_64(raw) != header_sum {
            return Err(ChunkError::HeaderChecksum);
        }
        let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(header_len);
        aligned.extend_from_slice(raw);
        let header = rkyv::from_bytes::<ChunkHeader, rkyv::rancor::Error>(&aligned)
            .map_err(|e| ChunkError::HeaderInvalid(e.to_string()))?;
        let payload_start = align_up(PREFIX_LEN + header_len);
        if u32::from(header.format) != format || (format == 2 && header.converter != 0) {
            return Err(ChunkError::Layout(format!(
                "the prefix says format {format}, the header format {} by converter {}",
                header.format, header.converter
            )));
        }
        check_layout(&header, payload_start, bytes)?;
        if verify == Verify::Full {
            let actual = xxh3_64(&bytes[payload_start..]);
            if actual != header.payload_checksum {
                return Err(ChunkError::PayloadChecksum { expected: header.payload_checksum, actual });
            }
        }
        Ok(Self { bytes, header, payload_start })
    }

    /// Writes into `dst` (as long as this chunk) this chunk's bytes as
    /// `shard` of `version`: the same payload, and the header saying so,
    /// its checksum written anew (the payload's checksum stays: it covers
    /// the payload only). How one version's chunk serves another version
    /// whose shard holds the same content
    /// ([`crate::manifest::Manifest::content_key`]).
    pub fn restamp_into(&self, version: DatasetVersion, shard: ShardId, dst: &mut [u8]) -> Result<(), ChunkError> {
        let mut header = self.header.clone();
        header.dataset_version = version;
        header.shard = shard;
        self.rewrite_into(&header, dst)
    }

    /// Writes into `dst` (as long as this chunk) this chunk in `format`
    /// ([`OLDEST_FORMAT`] or [`FORMAT_VERSION`]): the same payload, the
    /// header saying the format. In format 2 the converter is not written
    /// (unknown to its readers); a format-2 chunk written as format 3
    /// keeps its converter unknown (0).
    pub fn write_format(&self, format: u32, dst: &mut [u8]) -> Result<(), ChunkError> {
        if !(OLDEST_FORMAT..=FORMAT_VERSION).contains(&format) {
            return Err(ChunkError::UnsupportedFormat(format));
        }
        let mut header = self.header.clone();
        header.format = format as u16;
        if format == 2 {
            header.converter = 0;
        }
        self.rewrite_into(&header, dst)
    }

    /// The chunk format these bytes are in (2 or 3).
    pub fn format(&self) -> u32 {
        u32::from(self.header.format)
    }

    /// The [`CONVERTER_VERSION`] that made this chunk; `None` when unknown
    /// (format 2).
    pub fn converter(&self) -> Option<u16> {
        (self.header.converter != 0).then_some(self.header.converter)
    }

    /// Writes this chunk into `dst` with `header` (whose encoding must be
    /// as long as this chunk's header): the payload and its checksum stay.
    fn rewrite_into(&self, header: &ChunkHeader, dst: &mut [u8]) -> Result<(), ChunkError> {
        if dst.len() != self.bytes.len() {
            return Err(ChunkError::Length(format!("rewriting {} bytes into {}", self.bytes.len(), dst.len())));
        }
        let encoded = encode_header(header)?;
        let header_len = u32::from_le_bytes(self.bytes[12..16].try_into().unwrap_or_default()) as usize;
        if encoded.len() != header_len {
            return Err(ChunkError::Length(format!("a rewritten header of {} bytes, not {header_len}", encoded.len())));
        }
        dst.copy_from_slice(self.bytes);
        dst[8..12].copy_from_slice(&u32::from(header.format).to_le_bytes());
        dst[16..24].copy_from_slice(&xxh3_64(&encoded).to_le_bytes());
        dst[PREFIX_LEN..PREFIX_LEN + header_len].copy_from_slice(&encoded);
        Ok(())
    }

    /// Fails unless this chunk is `shard` of `version`.
    pub fn expect_identity(&self, version: DatasetVersion, shard: ShardId) -> Result<(), ChunkError> {
        if self.header.dataset_version == version && self.header.shard == shard {
            Ok(())
        } else {
            Err(ChunkError::WrongShard {
                got_version: self.header.dataset_version,
                got_shard: self.header.shard,
                want_version: version,
                want_shard: shard,
            })
        }
    }

    /// The validated header.
    pub fn header(&self) -> &ChunkHeader {
        &self.header
    }

    /// Rows in the chunk.
    pub fn rows(&self) -> u64 {
        self.header.rows
    }

    /// The whole chunk.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Tensor `i` (view order): its metadata and bytes.
    pub fn tensor_at(&self, i: usize) -> Option<(&TensorMeta, &'a [u8])> {
        let t = self.header.tensors.get(i)?;
        let start = self.payload_start + t.offset as usize;
        Some((t, &self.bytes[start..start + t.len as usize]))
    }

    /// Tensor by name.
    pub fn tensor(&self, name: &str) -> Option<(&TensorMeta, &'a [u8])> {
        let i = self.header.tensors.iter().position(|t| t.name == name)?;
        self.tensor_at(i)
    }

    /// Jagged tensor `i`: its row offsets and values (validated on parse);
    /// `None` for a dense tensor or no such tensor.
    pub fn jagged_at(&self, i: usize) -> Option<Jagged<'a>> {
        let t = self.header.tensors.get(i)?;
        let start = self.payload_start + t.row_offsets? as usize;
        let offsets = &self.bytes[start..start + (self.header.rows as usize + 1) * 8];
        let (_, values) = self.tensor_at(i)?;
        Some(Jagged { offsets, values, value_bytes: t.row_bytes() })
    }
}

/// A jagged tensor of a validated chunk: row `r` holds values
/// `offset(r)..offset(r + 1)`.
#[derive(Clone, Copy, Debug)]
pub struct Jagged<'a> {
    /// Rows + 1 little-endian `u64`s.
    offsets: &'a [u8],
    /// Every row's values, contiguous.
    values: &'a [u8],
    value_bytes: usize,
}

impl<'a> Jagged<'a> {
    /// Rows.
    pub fn rows(&self) -> usize {
        self.offsets.len() / 8 - 1
    }

    /// Row `r`'s first value's index (`r == rows` gives the value count).
    pub fn offset(&self, r: usize) -> u64 {
        read_u64(self.offsets, r)
    }

    /// The row offsets' bytes (rows + 1 little-endian `u64`s).
    pub fn offset_bytes(&self) -> &'a [u8] {
        self.offsets
    }

    /// Every value's bytes.
    pub fn values(&self) -> &'a [u8] {
        self.values
    }

    /// Row `r`'s values' bytes.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let (a, b) = (self.offset(r) as usize, self.offset(r + 1) as usize);
        &self.values[a * self.value_bytes..b * self.value_bytes]
    }
}

/// The `i`-th little-endian `u64` of `bytes` (0 past the end; callers index
/// validated offsets).
fn read_u64(bytes: &[u8], i: usize) -> u64 {
    bytes.get(i * 8..i * 8 + 8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes)
}

fn check_layout(h: &ChunkHeader, payload_start: usize, bytes: &[u8]) -> Result<(), ChunkError> {
    let total = bytes.len();
    let bad = |m: String| Err(ChunkError::Layout(m));
    if (payload_start as u64).checked_add(h.payload_len) != Some(total as u64)
        || !h.payload_len.is_multiple_of(ALIGN as u64)
    {
        return bad(format!("payload of {} bytes does not end the {total}-byte chunk", h.payload_len));
    }
    let mut end = 0u64;
    // Takes the range `at..at + len` after the ones before it, aligned.
    let mut place = |t: &TensorMeta, what: &str, at: u64, len: u64| -> Result<(), ChunkError> {
        if !at.is_multiple_of(ALIGN as u64) || at < end {
            return bad(format!("tensor {:?}'s {what} at offset {at} is misaligned or overlaps", t.name));
        }
        end = match at.checked_add(len) {
            Some(e) if e <= h.payload_len => e,
            _ => return bad(format!("tensor {:?}'s {what} runs past the payload", t.name)),
        };
        Ok(())
    };
    for (i, t) in h.tensors.iter().enumerate() {
        if h.tensors[..i].iter().any(|o| o.name == t.name) {
            return bad(format!("tensor {:?} appears twice", t.name));
        }
        let row_bytes = t.shape.iter().try_fold(t.dtype.size_bytes() as u64, |acc, &d| acc.checked_mul(u64::from(d)));
        let Some(offsets_at) = t.row_offsets else {
            let want = row_bytes.and_then(|rb| rb.checked_mul(h.rows));
            if want != Some(t.len) {
                return bad(format!(
                    "tensor {:?} has {} bytes, {} rows of shape {:?} need {want:?}",
                    t.name, t.len, h.rows, t.shape
                ));
            }
            place(t, "values", t.offset, t.len)?;
            continue;
        };
        // Jagged: rows + 1 offsets, then the values they index.
        let Some(offsets_len) = h.rows.checked_add(1).and_then(|n| n.checked_mul(8)) else {
            return bad(format!("tensor {:?}: {} rows cannot be offset", t.name, h.rows));
        };
        place(t, "row offsets", offsets_at, offsets_len)?;
        place(t, "values", t.offset, t.len)?;
        let value_bytes = match row_bytes {
            Some(b) if b > 0 && t.len.is_multiple_of(b) => b,
            _ => {
                return bad(format!(
                    "tensor {:?} has {} bytes, not whole values of shape {:?}",
                    t.name, t.len, t.shape
                ));
            }
        };
        // Within the payload (checked just above), so within `bytes`.
        let start = payload_start + offsets_at as usize;
        let offsets = &bytes[start..start + offsets_len as usize];
        let values = t.len / value_bytes;
        let mut last = 0u64;
        for r in 0..=h.rows as usize {
            let o = read_u64(offsets, r);
            if (r == 0 && o != 0) || o < last || o > values {
                return bad(format!("tensor {:?}: row offset {r} is {o} (after {last}, of {values} values)", t.name));
            }
            last = o;
        }
        if last != values {
            return bad(format!("tensor {:?}: its row offsets end at {last} of {values} values", t.name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layouts() -> Vec<TensorLayout> {
        vec![
            TensorLayout { name: "dense".into(), dtype: DType::F32, shape: vec![3], jagged: false },
            TensorLayout { name: "id".into(), dtype: DType::I64, shape: vec![], jagged: false },
            TensorLayout { name: "flag".into(), dtype: DType::Bool, shape: vec![], jagged: false },
        ]
    }

    fn build(rows: u64, seed: u8) -> Vec<u8> {
        let l =
            ChunkLayout::new(DatasetVersion([seed; 16]), ShardId { file: 1, row_group: 2 }, rows, &layouts()).unwrap();
        let mut buf = vec![0xAAu8; l.total_len()];
        for i in 0..l.tensor_count() {
            for (j, b) in buf[l.tensor_range(i)].iter_mut().enumerate() {
                *b = (j as u8).wrapping_mul(seed).wrapping_add(i as u8);
            }
        }
        l.seal(&mut buf).unwrap();
        buf
    }

    #[test]
    fn a_restamped_chunk_is_the_same_payload_as_another_shard_of_another_version() {
        let buf = build(5, 3);
        let v = ChunkView::parse(&buf, Verify::Full).unwrap();
        let (version, shard) = (DatasetVersion([9; 16]), ShardId { file: 7, row_group: 2 });
        let mut out = vec![0u8; buf.len()];
        v.restamp_into(version, shard, &mut out).unwrap();
        let r = ChunkView::parse(&out, Verify::Full).expect("a valid chunk, checksums and all");
        r.expect_identity(version, shard).unwrap();
        assert!(r.expect_identity(DatasetVersion([3; 16]), ShardId { file: 1, row_group: 2 }).is_err());
        assert_eq!(r.payload_start, v.payload_start);
        assert_eq!(&out[r.payload_start..], &buf[v.payload_start..], "the payload is untouched");
        assert_eq!(r.header().payload_checksum, v.header().payload_checksum);
        assert!(v.restamp_into(version, shard, &mut [0u8; 3]).is_err(), "a buffer of another length");
    }

    #[test]
    fn tensors_are_64_byte_aligned_and_round_trip() {
        let buf = build(5, 3);
        let v = ChunkView::parse(&buf, Verify::Full).unwrap();
        assert_eq!(v.rows(), 5);
        let (meta, dense) = v.tensor("dense").unwrap();
        assert_eq!(meta.shape, vec![3]);
        assert_eq!(dense.len(), 5 * 3 * 4);
        assert_eq!(dense[7], 7u8.wrapping_mul(3));
        for i in 0..3 {
            let (m, _) = v.tensor_at(i).unwrap();
            assert_eq!(m.offset % 64, 0);
        }
        v.expect_identity(DatasetVersion([3; 16]), ShardId { file: 1, row_group: 2 }).unwrap();
        assert!(v.expect_identity(DatasetVersion([4; 16]), ShardId { file: 1, row_group: 2 }).is_err());
    }

    #[test]
    fn a_flipped_payload_byte_fails_the_checksum() {
        let mut buf = build(10, 5);
        let last = buf.len() - 70;
        buf[last] ^= 1;
        assert!(matches!(ChunkView::parse(&buf, Verify::Full), Err(ChunkError::PayloadChecksum { .. })));
        assert!(ChunkView::parse(&buf, Verify::HeaderOnly).is_ok());
    }

    #[test]
    fn truncation_is_refused() {
        let buf = build(10, 5);
        for cut in [0, 10, 31, 32, 100, buf.len() - 1] {
            assert!(ChunkView::parse(&buf[..cut], Verify::Full).is_err(), "cut at {cut}");
        }
    }

    /// A chunk with header `h` (its checksum correct) and `payload`: what
    /// a hostile peer or a corrupted-then-rewritten disk entry can send.
    fn with_header(h: &ChunkHeader, payload: &[u8]) -> Vec<u8> {
        let enc = encode_header(h).unwrap();
        let start = align_up(PREFIX_LEN + enc.len());
        let mut buf = vec![0u8; start + payload.len()];
        let total = buf.len() as u64;
        buf[0..8].copy_from_slice(&MAGIC);
        buf[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        buf[12..16].copy_from_slice(&(enc.len() as u32).to_le_bytes());
        buf[16..24].copy_from_slice(&xxh3_64(&enc).to_le_bytes());
        buf[24..32].copy_from_slice(&total.to_le_bytes());
        buf[PREFIX_LEN..PREFIX_LEN + enc.len()].copy_from_slice(&enc);
        buf[start..].copy_from_slice(payload);
        buf
    }

    #[test]
    fn extreme_header_values_are_refused_not_overflowed() {
        let good = build(5, 1);
        let h = ChunkView::parse(&good, Verify::Full).unwrap().header().clone();
        for payload_len in [u64::MAX, u64::MAX - 63, u64::MAX - 127] {
            let buf = with_header(&ChunkHeader { payload_len, ..h.clone() }, &[0u8; 128]);
            assert!(ChunkView::parse(&buf, Verify::Full).is_err(), "payload_len {payload_len}");
        }
        let mut huge = h.clone();
        huge.tensors[0].offset = u64::MAX - 63;
        huge.tensors[0].len = 128;
        assert!(ChunkView::parse(&with_header(&huge, &[0u8; 128]), Verify::Full).is_err());
    }

    #[test]
    fn a_layout_too_large_to_address_is_an_error() {
        let wide = vec![
            TensorLayout { name: "a".into(), dtype: DType::F64, shape: vec![u32::MAX], jagged: false },
            TensorLayout { name: "b".into(), dtype: DType::F64, shape: vec![u32::MAX], jagged: false },
        ];
        for rows in [u64::from(u32::MAX), 1 << 30, u64::MAX] {
            let r = ChunkLayout::new(DatasetVersion([0; 16]), ShardId { file: 0, row_group: 0 }, rows, &wide);
            assert!(matches!(r, Err(ChunkError::Layout(_))), "rows {rows}");
        }
    }

    /// A chunk of `lens.len()` rows: a dense `id` (i64, the row number)
    /// and a jagged `hist` (i32), row `r` holding `lens[r]` values `r*1000 +
    /// j`.
    fn build_jagged(lens: &[u64]) -> Vec<u8> {
        let tensors =
            vec![TensorLayout::dense("id", DType::I64, vec![]), TensorLayout::jagged("hist", DType::I32, vec![])];
        let rows = lens.len() as u64;
        let values = [0, lens.iter().sum()];
        let l = ChunkLayout::with_values(
            DatasetVersion([7; 16]),
            ShardId { file: 0, row_group: 1 },
            rows,
            &tensors,
            &values,
        )
        .unwrap();
        let mut buf = vec![0xAAu8; l.total_len()];
        for (r, c) in buf[l.tensor_range(0)].chunks_exact_mut(8).enumerate() {
            c.copy_from_slice(&(r as i64).to_le_bytes());
        }
        let offsets = l.offsets_range(1).unwrap();
        let mut at = 0u64;
        for r in 0..=lens.len() {
            buf[offsets.start + r * 8..offsets.start + r * 8 + 8].copy_from_slice(&at.to_le_bytes());
            at += lens.get(r).copied().unwrap_or(0);
        }
        let mut vals = Vec::new();
        for (r, &n) in lens.iter().enumerate() {
            vals.extend((0..n).flat_map(|j| ((r as i32) * 1000 + j as i32).to_le_bytes()));
        }
        buf[l.tensor_range(1)].copy_from_slice(&vals);
        l.seal(&mut buf).unwrap();
        buf
    }

    #[test]
    fn a_jagged_tensor_is_its_row_offsets_then_its_values_each_aligned() {
        let lens = [3, 0, 1, 5];
        let buf = build_jagged(&lens);
        let v = ChunkView::parse(&buf, Verify::Full).unwrap();
        let (meta, values) = v.tensor("hist").unwrap();
        assert!(meta.is_jagged() && !v.header().tensors[0].is_jagged());
        assert_eq!((meta.row_offsets.unwrap() % 64, meta.offset % 64), (0, 0));
        assert!(meta.row_offsets.unwrap() < meta.offset, "offsets first");
        assert_eq!(values.len(), 9 * 4);
        let j = v.jagged_at(1).unwrap();
        assert_eq!(j.rows(), 4);
        assert_eq!((j.offset(0), j.offset(4)), (0, 9));
        for (r, &n) in lens.iter().enumerate() {
            let row: Vec<i32> = j.row(r).chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect();
            assert_eq!(row, (0..n as i32).map(|k| r as i32 * 1000 + k).collect::<Vec<_>>());
        }
        assert!(v.jagged_at(0).is_none(), "a dense tensor is not jagged");
        // A layout without the value count of its jagged tensor is refused.
        let tensors = [TensorLayout::jagged("hist", DType::I32, vec![])];
        assert!(ChunkLayout::new(DatasetVersion([0; 16]), ShardId { file: 0, row_group: 0 }, 2, &tensors).is_err());
    }

    #[test]
    fn row_offsets_that_do_not_index_the_values_are_refused_even_unverified() {
        let good = build_jagged(&[2, 2]);
        let v = ChunkView::parse(&good, Verify::Full).unwrap();
        let at = v.payload_start + v.header().tensors[1].row_offsets.unwrap() as usize;
        for (r, value, why) in [
            (0usize, 1u64, "row offset 0 is 1"),
            (2, 1, "row offset 2 is 1 (after 2"),
            (1, 9, "row offset 1 is 9"),
            (2, 3, "end at 3 of 4 values"),
        ] {
            let mut bad = good.clone();
            bad[at + r * 8..at + r * 8 + 8].copy_from_slice(&value.to_le_bytes());
            let err = ChunkView::parse(&bad, Verify::HeaderOnly).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
    }

    #[test]
    fn a_chunk_of_format_1_is_refused_never_misread() {
        let mut old = build(3, 1);
        old[8..12].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(ChunkView::parse(&old, Verify::Full).unwrap_err(), ChunkError::UnsupportedFormat(1));
    }

    /// The header as the build before this one wrote it (format 2): one
    /// `u32` format word where format 3 has the format and the converter.
    #[derive(rkyv::Archive, rkyv::Serialize)]
    struct HeaderOfFormat2 {
        format_version: u32,
        dataset_version: DatasetVersion,
        shard: ShardId,
        rows: u64,
        tensors: Vec<TensorMeta>,
        payload_len: u64,
        payload_checksum: u64,
    }

    /// `chunk`'s bytes as the build before wrote them.
    fn as_format_2(chunk: &[u8]) -> Vec<u8> {
        let h = ChunkView::parse(chunk, Verify::Full).unwrap().header().clone();
        let old = HeaderOfFormat2 {
            format_version: 2,
            dataset_version: h.dataset_version,
            shard: h.shard,
            rows: h.rows,
            tensors: h.tensors,
            payload_len: h.payload_len,
            payload_checksum: h.payload_checksum,
        };
        let enc = rkyv::to_bytes::<rkyv::rancor::Error>(&old).unwrap();
        let header_len = u32::from_le_bytes(chunk[12..16].try_into().unwrap()) as usize;
        assert_eq!(enc.len(), header_len, "format 2's header is as long as format 3's");
        let mut out = chunk.to_vec();
        out[8..12].copy_from_slice(&2u32.to_le_bytes());
        out[16..24].copy_from_slice(&xxh3_64(&enc).to_le_bytes());
        out[PREFIX_LEN..PREFIX_LEN + header_len].copy_from_slice(&enc);
        out
    }

    #[test]
    fn a_chunk_says_its_converter_and_reads_in_the_format_before() {
        for chunk in [build(5, 3), build_jagged(&[1, 2, 0, 3])] {
            let v = ChunkView::parse(&chunk, Verify::Full).unwrap();
            assert_eq!((v.format(), v.converter()), (3, Some(CONVERTER_VERSION)));
            // What the build before wrote is read, its converter unknown.
            let before = as_format_2(&chunk);
            let b = ChunkView::parse(&before, Verify::Full).expect("format 2 is read");
            assert_eq!((b.format(), b.converter()), (2, None));
            assert_eq!(b.header().tensors, v.header().tensors);
            assert_eq!(b.header().payload_checksum, v.header().payload_checksum);
            // And written for it byte for byte: same length, same payload.
            let mut out = vec![0u8; chunk.len()];
            v.write_format(2, &mut out).unwrap();
            assert_eq!(out, before, "format 2 as the build before wrote it");
            // Back to format 3, the converter stays unknown.
            b.write_format(3, &mut out).unwrap();
            let again = ChunkView::parse(&out, Verify::Full).unwrap();
            assert_eq!((again.format(), again.converter()), (3, None));
            assert_eq!(v.write_format(4, &mut out).unwrap_err(), ChunkError::UnsupportedFormat(4));
        }
    }

    #[test]
    fn a_prefix_and_header_that_disagree_on_the_format_are_refused() {
        let chunk = build(4, 2);
        let h = ChunkView::parse(&chunk, Verify::Full).unwrap().header().clone();
        let payload = &chunk[chunk.len() - h.payload_len as usize..];
        // A format-2 prefix over a format-3 header, and a format-2 header
        // naming a converter.
        let mut two = with_header(&h, payload);
        two[8..12].copy_from_slice(&2u32.to_le_bytes());
        let mut with_converter = with_header(&ChunkHeader { format: 2, ..h.clone() }, payload);
        with_converter[8..12].copy_from_slice(&2u32.to_le_bytes());
        for bad in [two, with_converter] {
            let err = ChunkView::parse(&bad, Verify::Full).unwrap_err().to_string();
            assert!(err.contains("format"), "{err}");
        }
    }

    proptest! {
        #[test]
        fn hostile_row_offsets_never_panic(offsets in proptest::collection::vec(any::<u64>(), 5)) {
            let good = build_jagged(&[1, 2, 0, 3]);
            let v = ChunkView::parse(&good, Verify::Full).unwrap();
            let at = v.payload_start + v.header().tensors[1].row_offsets.unwrap() as usize;
            let mut bad = good.clone();
            for (r, o) in offsets.iter().enumerate() {
                bad[at + r * 8..at + r * 8 + 8].copy_from_slice(&o.to_le_bytes());
            }
            if let Ok(v) = ChunkView::parse(&bad, Verify::HeaderOnly) {
                let j = v.jagged_at(1).unwrap();
                for r in 0..j.rows() {
                    let _ = j.row(r);
                }
            }
        }

        #[test]
        fn jagged_round_trip(lens in proptest::collection::vec(0u64..50, 0..40)) {
            let buf = build_jagged(&lens);
            let v = ChunkView::parse(&buf, Verify::Full).unwrap();
            let j = v.jagged_at(1).unwrap();
            prop_assert_eq!(j.rows(), lens.len());
            for (r, &n) in lens.iter().enumerate() {
                prop_assert_eq!(j.row(r).len() as u64, n * 4);
            }
        }

        #[test]
        fn hostile_headers_with_valid_checksums_never_panic(
            payload_len in any::<u64>(),
            rows in any::<u64>(),
            offset in any::<u64>(),
            len in any::<u64>(),
            dim in any::<u32>(),
            payload_lines in 0usize..4,
        ) {
            let good = build(5, 1);
            let mut h = ChunkView::parse(&good, Verify::Full).unwrap().header().clone();
            h.payload_len = payload_len;
            h.rows = rows;
            h.tensors[0].offset = offset;
            h.tensors[0].len = len;
            h.tensors[0].shape = vec![dim];
            let buf = with_header(&h, &vec![0u8; payload_lines * 64]);
            let _ = ChunkView::parse(&buf, Verify::Full);
        }

        #[test]
        fn round_trip(rows in 0u64..300, seed in any::<u8>()) {
            let buf = build(rows, seed);
            let v = ChunkView::parse(&buf, Verify::Full).unwrap();
            prop_assert_eq!(v.rows(), rows);
            prop_assert_eq!(v.header().dataset_version, DatasetVersion([seed; 16]));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = ChunkView::parse(&bytes, Verify::Full);
        }

        #[test]
        fn any_single_flip_is_caught_or_harmless(pos in any::<prop::sample::Index>(), bit in 0u8..8) {
            let mut buf = build(7, 9);
            let i = pos.index(buf.len());
            buf[i] ^= 1 << bit;
            // A flip anywhere is detected: in the prefix by magic/length
            // checks, in the header by its checksum, in the payload (padding
            // included) by the payload checksum. Only the zero gap between
            // the header's end and the 64-byte-aligned payload is not read.
            if ChunkView::parse(&buf, Verify::Full).is_ok() {
                let orig = build(7, 9);
                let header_len = u32::from_le_bytes(orig[12..16].try_into().unwrap()) as usize;
                let v = ChunkView::parse(&orig, Verify::Full).unwrap();
                let payload_start = orig.len() - v.header().payload_len as usize;
                prop_assert!(i >= PREFIX_LEN + header_len && i < payload_start, "undetected flip at {}", i);
            }
        }
    }
}
