//! Identifier newtypes. Bare integers are never identifiers.

use std::fmt;

/// The content hash of a dataset's manifest and view. A version never
/// changes, so bytes cached under it can never be stale.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(PartialEq, Eq, Debug))]
pub struct DatasetVersion(pub [u8; 16]);

impl DatasetVersion {
    /// Lower-case hex, 32 characters.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The first 8 bytes as a number, for seeding and short display.
    pub fn prefix_u64(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(b)
    }
}

impl DatasetVersion {
    /// Parses 32 hex characters (either case).
    pub fn from_hex(s: &str) -> Option<Self> {
        let b = s.as_bytes();
        if b.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, pair) in b.chunks_exact(2).enumerate() {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            out[i] = (hi * 16 + lo) as u8;
        }
        Some(Self(out))
    }
}

/// Serialized as its 32-character hex form, so JSON stays readable.
impl serde::Serialize for DatasetVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for DatasetVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::from_hex(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("not a dataset version (32 hex digits): {s:?}")))
    }
}

impl fmt::Debug for DatasetVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatasetVersion({})", self.to_hex())
    }
}

impl fmt::Display for DatasetVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex()[..12])
    }
}

/// What seeds a job's batch order: a hash of what gives the dataset its
/// shape (file names relative to the folder that holds them all, rows per
/// row group, the view), not of where the files live or their store tags
/// ([`crate::Manifest::plan_key`]). The same files copied to another
/// bucket, or mirrored to a local folder, give the same key and so the
/// same order; the [`DatasetVersion`] still names the exact bytes.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Debug,
    serde::Serialize,
    serde::Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(PartialEq, Eq, Debug))]
pub struct PlanKey(pub u64);

/// One Parquet row group of one file of one dataset version: the unit of
/// remote reading, conversion, caching, placement and transfer.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Debug,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
    serde::Serialize,
    serde::Deserialize,
)]
#[rkyv(derive(PartialEq, Eq, Debug))]
pub struct ShardId {
    /// Index of the file in the manifest (files are sorted by path).
    pub file: u32,
    /// Index of the row group within the file.
    pub row_group: u32,
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "file#{}/rg{}", self.file, self.row_group)
    }
}

/// A node of the cluster.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Debug,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct NodeId(pub u64);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node-{}", self.0)
    }
}
