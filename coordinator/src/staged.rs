//! Manifests in the log as pieces: the staging area in the replicated
//! state, and the compact encodings the state and its snapshots use.
//!
//! A manifest of a million row groups does not fit one log entry (every
//! entry stays under [`MAX_LOG_ENTRY_BYTES`]). The leader cuts the
//! manifest's compact form ([`Manifest::to_compact`]) into pieces of
//! [`MANIFEST_PIECE_BYTES`] and proposes each as a
//! [`Command::StageManifestPiece`](crate::types::Command::StageManifestPiece);
//! applying one stores it here under its version. A piece commits like any
//! entry, on a majority, so the manifest is durable on a majority before
//! the small [`Command::AddStagedDataset`](crate::types::Command::AddStagedDataset)
//! that names it by [`ManifestPieces`] can commit. Applying that entry
//! assembles the pieces, checks each against its digest and the whole
//! against the dataset version, and registers the version as a whole
//! manifest did. Pieces a leader staged but never named (it lost its term)
//! are dropped by the collection pass after [`STAGED_TTL_MS`].
//!
//! In the state and its snapshots a manifest is its compact form in base64
//! (about 11 bytes per row group instead of ~45 as JSON objects); a
//! snapshot of the old form (format 1) still loads.

pub use granary_proto::manifest::Blob;
use granary_proto::manifest::{MANIFEST_PIECE_BYTES, ManifestPieces, PieceError};
use granary_proto::{DatasetVersion, Manifest};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;

/// The most bytes one log entry may take (JSON of the entry).
pub const MAX_LOG_ENTRY_BYTES: usize = 1 << 20;

/// The most bytes staged pieces may hold across all versions; a piece
/// past it is refused (the leader's registration fails and says so).
pub const MAX_STAGED_BYTES: u64 = 1 << 30;

/// The most pieces one manifest may have (512 MiB of compact manifest,
/// about 60 million row groups).
pub const MAX_MANIFEST_PIECES: u32 = 1024;

/// How long pieces of a manifest no entry named are kept (ms), counted
/// from the first piece's leader clock.
pub const STAGED_TTL_MS: u64 = 60 * 60 * 1000;

const _: () = assert!(MANIFEST_PIECE_BYTES / 3 * 4 + 4096 < MAX_LOG_ENTRY_BYTES);

/// The pieces of one manifest staged so far.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct StagedManifest {
    /// How many pieces the manifest has.
    pub of: u32,
    /// The leader's clock at the first piece (ms since the Unix epoch).
    pub since_ms: u64,
    /// The pieces staged, by index.
    pub pieces: BTreeMap<u32, Blob>,
}

impl StagedManifest {
    fn expired(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.since_ms) >= STAGED_TTL_MS
    }

    fn bytes(&self) -> u64 {
        self.pieces.values().map(|p| p.0.len() as u64).sum()
    }
}

/// Why a registration from staged pieces was refused; every replica
/// refuses alike.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum StagingRefused {
    /// The staged pieces of all versions would pass [`MAX_STAGED_BYTES`].
    #[error("staging piece {index} of version {version} would hold {staged_bytes} bytes of pieces, over {cap}")]
    Full {
        /// The version.
        version: DatasetVersion,
        /// The piece.
        index: u32,
        /// Staged bytes with the piece.
        staged_bytes: u64,
        /// [`MAX_STAGED_BYTES`].
        cap: u64,
    },
    /// A piece index at or past the count, or a count over
    /// [`MAX_MANIFEST_PIECES`].
    #[error("version {version}: piece {index} of {of} (at most {MAX_MANIFEST_PIECES} pieces)")]
    Index {
        /// The version.
        version: DatasetVersion,
        /// The piece.
        index: u32,
        /// The count given.
        of: u32,
    },
    /// A piece is missing, or does not match its digest.
    #[error("version {version}: {error}")]
    Piece {
        /// The version.
        version: DatasetVersion,
        /// What is wrong with which piece.
        error: PieceError,
    },
    /// The assembled bytes are not a compact manifest.
    #[error("version {version}: the assembled manifest does not decode: {reason}")]
    Undecodable {
        /// The version.
        version: DatasetVersion,
        /// The decoder's error.
        reason: String,
    },
    /// The assembled manifest hashes, under the view, to another version.
    #[error("the staged manifest hashes to version {got}, not {version}")]
    Version {
        /// The version the entry named.
        version: DatasetVersion,
        /// The version the manifest and view give.
        got: DatasetVersion,
    },
}

/// The staging area: pieces by version.
pub type Staging = BTreeMap<DatasetVersion, StagedManifest>;

/// Stores piece `index` of `of` of `version`'s manifest (applying
/// [`Command::StageManifestPiece`](crate::types::Command::StageManifestPiece)).
/// A piece for a version staged with another count starts the version over.
pub fn stage(
    staging: &mut Staging,
    version: DatasetVersion,
    index: u32,
    of: u32,
    data: &Blob,
    at_ms: u64,
) -> Result<(), StagingRefused> {
    stage_within(staging, version, index, of, data, at_ms, MAX_STAGED_BYTES)
}

fn stage_within(
    staging: &mut Staging,
    version: DatasetVersion,
    index: u32,
    of: u32,
    data: &Blob,
    at_ms: u64,
    cap: u64,
) -> Result<(), StagingRefused> {
    if index >= of || of > MAX_MANIFEST_PIECES {
        return Err(StagingRefused::Index { version, index, of });
    }
    let total: u64 = staging.iter().filter(|(v, _)| **v != version).map(|(_, s)| s.bytes()).sum();
    let mine = staging.get(&version).filter(|s| s.of == of);
    let mine_bytes = mine.map_or(0, |s| s.bytes() - s.pieces.get(&index).map_or(0, |p| p.0.len() as u64));
    let staged_bytes = total + mine_bytes + data.0.len() as u64;
    if staged_bytes > cap {
        return Err(StagingRefused::Full { version, index, staged_bytes, cap });
    }
    let entry = staging.entry(version).or_insert(StagedManifest { of, since_ms: at_ms, pieces: BTreeMap::new() });
    if entry.of != of {
        *entry = StagedManifest { of, since_ms: at_ms, pieces: BTreeMap::new() };
    }
    entry.pieces.insert(index, data.clone());
    Ok(())
}

/// The manifest `pieces` names, from the staged pieces of `version`, each
/// checked against its digest and the whole against `version` under `view`.
pub fn assemble(
    staged: Option<&StagedManifest>,
    version: DatasetVersion,
    pieces: &ManifestPieces,
    view: &granary_proto::View,
) -> Result<Manifest, StagingRefused> {
    let bytes = pieces
        .assemble(|i| staged.and_then(|s| s.pieces.get(&i)).map(|p| &p.0[..]))
        .map_err(|error| StagingRefused::Piece { version, error })?;
    let manifest =
        Manifest::from_compact(&bytes).map_err(|e| StagingRefused::Undecodable { version, reason: e.to_string() })?;
    let got = manifest.version(view);
    if got != version {
        return Err(StagingRefused::Version { version, got });
    }
    Ok(manifest)
}

/// Drops what was staged at least [`STAGED_TTL_MS`] before `now_ms`.
pub fn collect(staging: &mut Staging, now_ms: u64) {
    staging.retain(|_, s| !s.expired(now_ms));
}

/// Whether [`collect`] at `now_ms` would drop something.
pub fn expired(staging: &Staging, now_ms: u64) -> bool {
    staging.values().any(|s| s.expired(now_ms))
}

/// Serde for a [`Manifest`] kept in the state: its compact form in base64;
/// reads the JSON object form that earlier snapshots hold too.
pub mod compact_manifest {
    use super::*;

    /// Writes the compact form.
    pub fn serialize<S: Serializer>(m: &std::sync::Arc<Manifest>, s: S) -> Result<S::Ok, S::Error> {
        Blob(m.to_compact()).serialize(s)
    }

    /// Reads either form.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<std::sync::Arc<Manifest>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Compact(Blob),
            Object(Manifest),
        }
        match Either::deserialize(d)? {
            Either::Compact(b) => {
                Manifest::from_compact(&b.0).map(std::sync::Arc::new).map_err(serde::de::Error::custom)
            }
            Either::Object(m) => Ok(std::sync::Arc::new(m)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ClusterState;
    use crate::types::{Command, CommandResult};
    use granary_proto::manifest::PieceError;
    use granary_proto::{FileEntry, NodeId, RowGroupEntry, View};

    fn manifest(files: usize) -> Manifest {
        Manifest {
            source: "file:///data".into(),
            files: (0..files)
                .map(|i| FileEntry {
                    path: format!("day-{}/part-{i}.parquet", i / 10),
                    size_bytes: 100 + i as u64,
                    version_tag: format!("t{i}"),
                    row_groups: vec![RowGroupEntry { rows: 10, compressed_bytes: 50, values_bytes: None }; 1 + i % 5],
                    footer_sha256: Some(format!("{i:064x}")),
                })
                .collect(),
            tensors: vec![],
        }
    }

    fn cluster() -> ClusterState {
        let mut s = ClusterState::default();
        for id in 1..=3 {
            s.apply(&Command::RegisterNode {
                node: NodeId(id),
                addr: format!("127.0.0.1:{id}"),
                ram_bytes: 1 << 30,
                ssd_bytes: 0,
                registration: 0,
            });
        }
        s
    }

    fn staged_result(r: CommandResult) -> Option<StagingRefused> {
        match r {
            CommandResult::PieceStaged { refused } => refused,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_manifest_staged_in_pieces_registers_as_the_whole_one_did() {
        let (m, v) = (manifest(300), View { tensors: vec![] });
        let mut whole = cluster();
        whole.apply(&Command::AddDataset { name: "d".into(), view: v.clone(), manifest: m.clone() });
        let mut pieces = cluster();
        let (_, staged, add) = Command::registration("d", &v, &m, 1_000, 5);
        assert!(staged.len() > 5, "{} pieces", staged.len());
        for cmd in &staged {
            assert!(serde_json::to_vec(cmd).unwrap().len() < 1_000 * 4 / 3 + 200);
            assert_eq!(staged_result(pieces.apply(cmd)), None);
        }
        assert!(!pieces.staged.is_empty());
        assert_eq!(pieces.apply(&add), CommandResult::DatasetAdded { version: m.version(&v), new: true });
        assert_eq!(pieces, whole, "same versions, owners and epochs; nothing left staged");
        // The same version again is known: it needs no pieces.
        assert_eq!(pieces.apply(&add), CommandResult::DatasetAdded { version: m.version(&v), new: false });
    }

    #[test]
    fn a_missing_or_altered_piece_refuses_the_version_naming_the_piece() {
        let (m, v) = (manifest(200), View { tensors: vec![] });
        let version = m.version(&v);
        let (_, staged, add) = Command::registration("d", &v, &m, 500, 5);
        let mut s = cluster();
        for cmd in staged.iter().filter(|c| !matches!(c, Command::StageManifestPiece { index: 2, .. })) {
            s.apply(cmd);
        }
        let before = s.clone();
        let of = staged.len() as u32;
        assert_eq!(
            s.apply(&add),
            CommandResult::DatasetRefused {
                refused: StagingRefused::Piece { version, error: PieceError::Missing { index: 2, of } }
            }
        );
        assert_eq!(s, before, "a refusal changes nothing, and keeps the pieces for a retry");
        let Command::StageManifestPiece { mut data, .. } = staged[2].clone() else { panic!() };
        data.0[7] ^= 1;
        s.apply(&Command::StageManifestPiece { version, index: 2, of, data, at_ms: 5 });
        assert_eq!(
            s.apply(&add),
            CommandResult::DatasetRefused {
                refused: StagingRefused::Piece { version, error: PieceError::Digest { index: 2, of } }
            }
        );
        s.apply(&staged[2]);
        assert!(matches!(s.apply(&add), CommandResult::DatasetAdded { new: true, .. }));
        assert!(s.staged.is_empty());
    }

    #[test]
    fn pieces_of_another_manifest_are_refused_by_version() {
        let v = View { tensors: vec![] };
        let (_, staged, _) = Command::registration("d", &v, &manifest(10), 10_000, 5);
        let (_, _, add) = Command::registration("d", &v, &manifest(11), 10_000, 5);
        let Command::AddStagedDataset { version, .. } = add.clone() else { panic!() };
        let mut s = cluster();
        // The other manifest's pieces, staged under this version.
        for cmd in staged {
            let Command::StageManifestPiece { index, of, data, at_ms, .. } = cmd else { panic!() };
            s.apply(&Command::StageManifestPiece { version, index, of, data, at_ms });
        }
        match s.apply(&add) {
            CommandResult::DatasetRefused {
                refused: StagingRefused::Piece { error: PieceError::Length { .. }, .. },
            }
            | CommandResult::DatasetRefused {
                refused: StagingRefused::Piece { error: PieceError::Digest { .. }, .. },
            } => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn staging_is_bounded_and_what_no_entry_named_is_collected() {
        let version = |b: u8| DatasetVersion([b; 16]);
        let mut st = Staging::new();
        let piece = Blob(vec![1; 600]);
        assert_eq!(stage_within(&mut st, version(1), 0, 2, &piece, 10, 1_000), Ok(()));
        // The same piece again replaces itself.
        assert_eq!(stage_within(&mut st, version(1), 0, 2, &piece, 10, 1_000), Ok(()));
        assert_eq!(
            stage_within(&mut st, version(2), 0, 1, &piece, 10, 1_000),
            Err(StagingRefused::Full { version: version(2), index: 0, staged_bytes: 1_200, cap: 1_000 })
        );
        assert_eq!(
            stage(&mut st, version(1), 2, 2, &piece, 10),
            Err(StagingRefused::Index { version: version(1), index: 2, of: 2 })
        );
        assert!(stage(&mut st, version(3), 0, MAX_MANIFEST_PIECES + 1, &piece, 10).is_err());
        assert!(!expired(&st, 10 + STAGED_TTL_MS - 1));
        let mut s = cluster();
        s.staged = st;
        assert!(s.collection_due(10 + STAGED_TTL_MS, 1 << 40, None));
        s.apply(&Command::CollectVersions {
            now_ms: 10 + STAGED_TTL_MS,
            retention_ms: 1 << 40,
            node_retention_ms: None,
        });
        assert!(s.staged.is_empty());
    }

    #[test]
    fn the_state_keeps_manifests_compact_and_reads_the_object_form() {
        let (m, v) = (manifest(1_000), View { tensors: vec![] });
        let mut s = cluster();
        s.apply(&Command::AddDataset { name: "d".into(), view: v, manifest: m.clone() });
        let json = serde_json::to_string(&s).unwrap();
        assert!(!json.contains("part-999.parquet"), "the manifest is not JSON objects");
        assert_eq!(serde_json::from_str::<ClusterState>(&json).unwrap(), s);
        let rgs = m.shards().len();
        let manifest_json = serde_json::to_string(&m).unwrap().len();
        let compact = Blob(m.to_compact());
        let in_state = serde_json::to_string(&compact).unwrap().len();
        assert!(in_state * 3 < manifest_json, "{in_state} vs {manifest_json} bytes for {rgs} row groups");
        // A state written before: the manifest as a JSON object.
        let old = json.replace(&serde_json::to_string(&compact).unwrap(), &serde_json::to_string(&m).unwrap());
        assert_ne!(old, json);
        assert_eq!(serde_json::from_str::<ClusterState>(&old).unwrap(), s);
    }
}
