//! A compact manifest cut into pieces of bounded size, and the digests that
//! check each piece wherever it travels.
//!
//! The coordinator's log carries a manifest as pieces of at most
//! [`MANIFEST_PIECE_BYTES`] (each its own entry) and then one small entry
//! naming them by [`ManifestPieces`]; nodes fetch the pieces one at a time.
//! Every piece is checked against its digest before it is used, so a piece
//! that was corrupted, truncated or mixed up with another is an error
//! naming its index, never part of a wrong manifest. The digest is XXH3-128:
//! it guards against accidents on disk and on the way; the pieces come from
//! voters over authenticated connections, and the assembled manifest must
//! still hash to its dataset version.

use xxhash_rust::xxh3::xxh3_128;

/// The most bytes of a compact manifest one piece holds. Base64 in a JSON
/// log entry makes a piece 4/3 its size, so an entry stays under 1 MiB.
pub const MANIFEST_PIECE_BYTES: usize = 512 << 10;

/// The digest of one piece (XXH3-128).
pub fn piece_digest(bytes: &[u8]) -> u128 {
    xxh3_128(bytes)
}

/// Bytes that serialize as one base64 string.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Blob(pub Vec<u8>);

impl serde::Serialize for Blob {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::Engine;
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> serde::Deserialize<'de> for Blob {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use base64::Engine;
        let s = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(s.as_bytes())
            .map(Blob)
            .map_err(|e| serde::de::Error::custom(format!("not base64: {e}")))
    }
}

/// How a compact manifest is cut: its length, the size of every piece but
/// the last, and each piece's digest, in order.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct ManifestPieces {
    /// Bytes of the whole compact manifest.
    pub bytes: u64,
    /// Bytes of every piece but the last (which holds the rest).
    pub piece_bytes: u32,
    /// Each piece's digest ([`piece_digest`]), as 32 hex digits.
    pub digests: Vec<String>,
}

/// Why a piece, or a set of pieces, is not the manifest it should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum PieceError {
    /// No piece `index` (of `of`) was given.
    #[error("manifest piece {index} of {of} is missing")]
    Missing {
        /// The piece.
        index: u32,
        /// How many the manifest has.
        of: u32,
    },
    /// Piece `index` has the wrong length.
    #[error("manifest piece {index} of {of} holds {got} bytes, not {expected}")]
    Length {
        /// The piece.
        index: u32,
        /// How many the manifest has.
        of: u32,
        /// Its length by the manifest's cut.
        expected: u64,
        /// What it holds.
        got: u64,
    },
    /// Piece `index` does not match its digest.
    #[error("manifest piece {index} of {of} does not match its digest")]
    Digest {
        /// The piece.
        index: u32,
        /// How many the manifest has.
        of: u32,
    },
    /// The cut itself is inconsistent (a piece count that does not fit
    /// the length, a piece size of 0).
    #[error("manifest pieces: {0}")]
    Cut(String),
}

impl ManifestPieces {
    /// Cuts `compact` into pieces of `piece_bytes` (the last holds the rest;
    /// an empty manifest is one empty piece).
    pub fn cut(compact: &[u8], piece_bytes: usize) -> Self {
        let piece_bytes = piece_bytes.clamp(1, u32::MAX as usize);
        let digests = if compact.is_empty() {
            vec![digest_hex(piece_digest(&[]))]
        } else {
            compact.chunks(piece_bytes).map(|p| digest_hex(piece_digest(p))).collect()
        };
        ManifestPieces { bytes: compact.len() as u64, piece_bytes: piece_bytes as u32, digests }
    }

    /// How many pieces.
    pub fn count(&self) -> u32 {
        u32::try_from(self.digests.len()).unwrap_or(u32::MAX)
    }

    /// The byte range of piece `index` in the whole, or `None` past the
    /// last piece or where the cut is inconsistent.
    pub fn range(&self, index: u32) -> Option<std::ops::Range<u64>> {
        self.check().ok()?;
        if index >= self.count() {
            return None;
        }
        let start = u64::from(index) * u64::from(self.piece_bytes);
        Some(start..(start + u64::from(self.piece_bytes)).min(self.bytes))
    }

    /// Checks that the piece count fits the length and the piece size.
    pub fn check(&self) -> Result<(), PieceError> {
        if self.piece_bytes == 0 {
            return Err(PieceError::Cut("a piece size of 0".into()));
        }
        let expected = self.bytes.div_ceil(u64::from(self.piece_bytes)).max(1);
        if self.digests.len() as u64 != expected {
            return Err(PieceError::Cut(format!(
                "{} digests for {} bytes in pieces of {} (expected {expected})",
                self.digests.len(),
                self.bytes,
                self.piece_bytes
            )));
        }
        Ok(())
    }

    /// Checks piece `index`: its length and its digest.
    pub fn verify(&self, index: u32, piece: &[u8]) -> Result<(), PieceError> {
        let of = self.count();
        let range = self.range(index).ok_or_else(|| {
            self.check().err().unwrap_or(PieceError::Cut(format!("no piece {index}: the manifest has {of}")))
        })?;
        let expected = range.end - range.start;
        if piece.len() as u64 != expected {
            return Err(PieceError::Length { index, of, expected, got: piece.len() as u64 });
        }
        if self.digests[index as usize] != digest_hex(piece_digest(piece)) {
            return Err(PieceError::Digest { index, of });
        }
        Ok(())
    }

    /// The whole compact manifest from its pieces, each verified;
    /// `piece(i)` gives piece `i` or `None` where it is missing.
    pub fn assemble<'a>(&self, mut piece: impl FnMut(u32) -> Option<&'a [u8]>) -> Result<Vec<u8>, PieceError> {
        self.check()?;
        let mut out = Vec::with_capacity(usize::try_from(self.bytes).unwrap_or(0));
        for index in 0..self.count() {
            let p = piece(index).ok_or(PieceError::Missing { index, of: self.count() })?;
            self.verify(index, p)?;
            out.extend_from_slice(p);
        }
        Ok(out)
    }
}

fn digest_hex(d: u128) -> String {
    format!("{d:032x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_whole_and_assemble_back() {
        let whole: Vec<u8> = (0..2_500u32).map(|i| (i * 7) as u8).collect();
        let cut = ManifestPieces::cut(&whole, 1_000);
        assert_eq!(cut.count(), 3);
        assert_eq!(cut.range(2), Some(2_000..2_500));
        assert_eq!(cut.range(3), None);
        let piece = |i: u32| cut.range(i).map(|r| &whole[r.start as usize..r.end as usize]);
        assert_eq!(cut.assemble(piece).unwrap(), whole);
        let empty = ManifestPieces::cut(&[], 1_000);
        assert_eq!(empty.count(), 1);
        assert_eq!(empty.assemble(|_| Some(&[][..])).unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn a_missing_short_or_altered_piece_is_named() {
        let whole = vec![5u8; 2_500];
        let cut = ManifestPieces::cut(&whole, 1_000);
        assert_eq!(
            cut.assemble(|i| (i != 1).then_some(&whole[..1_000])).unwrap_err(),
            PieceError::Missing { index: 1, of: 3 }
        );
        assert_eq!(
            cut.verify(2, &whole[..499]).unwrap_err(),
            PieceError::Length { index: 2, of: 3, expected: 500, got: 499 }
        );
        let mut bad = whole[..1_000].to_vec();
        bad[10] = 6;
        assert_eq!(cut.verify(0, &bad).unwrap_err(), PieceError::Digest { index: 0, of: 3 });
        let mut wrong = cut.clone();
        wrong.digests.pop();
        assert!(matches!(wrong.check(), Err(PieceError::Cut(_))));
        assert!(matches!(wrong.verify(0, &whole[..1_000]), Err(PieceError::Cut(_))));
    }
}
