//! Fetching a dataset version's manifest from the coordinator in pieces.
//!
//! A manifest of a million row groups is megabytes even in its compact
//! form, so the coordinator serves it in pieces of at most
//! [`MANIFEST_PIECE_BYTES`](granary_proto::manifest::MANIFEST_PIECE_BYTES)
//! (`ManifestPiece`). The first answer says how the whole is cut, with a
//! digest per piece; every later answer must describe the same cut, and
//! every piece must match its digest, before the pieces are assembled,
//! decoded and checked to hash, with the view, to the version asked for.
//! Any mismatch is an error naming the dataset, version and piece, never a
//! wrong manifest.

use granary_net::api::{ApiRequest, ApiResponse};
use granary_net::client::{ClientError, CoordinatorClient};
use granary_proto::manifest::{CompactError, ManifestPieces, PieceError};
use granary_proto::{DatasetVersion, Manifest, View};

/// Why a version's manifest could not be fetched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestFetchError {
    /// The request failed (a `NotFound` failure: the coordinator does not
    /// know the version).
    #[error("dataset {name} version {version}: {source}")]
    Client {
        /// Dataset name.
        name: String,
        /// The version.
        version: DatasetVersion,
        /// The client's error.
        source: ClientError,
    },
    /// A piece does not fit the cut or its digest, or answers disagree on
    /// the cut or the version.
    #[error("dataset {name} version {version}: {error}")]
    Piece {
        /// Dataset name.
        name: String,
        /// The version.
        version: DatasetVersion,
        /// Which piece and what is wrong with it.
        error: PieceError,
    },
    /// The assembled bytes are not a compact manifest.
    #[error("dataset {name} version {version}: the assembled manifest does not decode: {error}")]
    Decode {
        /// Dataset name.
        name: String,
        /// The version.
        version: DatasetVersion,
        /// The decoder's error.
        error: CompactError,
    },
    /// The manifest and view hash to another version.
    #[error("dataset {name}: the coordinator's manifest for version {version} hashes to {got}")]
    Version {
        /// Dataset name.
        name: String,
        /// The version asked for.
        version: DatasetVersion,
        /// The version the answer gives.
        got: DatasetVersion,
    },
    /// An answer of another kind, or for another version or piece.
    #[error("dataset {name} version {version}: unexpected answer to piece {index}: {got}")]
    Unexpected {
        /// Dataset name.
        name: String,
        /// The version.
        version: DatasetVersion,
        /// The piece asked for.
        index: u32,
        /// What came instead.
        got: String,
    },
}

impl ManifestFetchError {
    /// Whether the coordinator said it does not know the version.
    pub fn not_found(&self) -> bool {
        matches!(
            self,
            ManifestFetchError::Client {
                source: ClientError::Failed { kind: granary_net::api::FailureKind::NotFound, .. },
                ..
            }
        )
    }
}

/// The view and manifest of `version` of dataset `name`, fetched piece by
/// piece and checked (see the module docs).
pub async fn fetch_manifest(
    client: &CoordinatorClient,
    name: &str,
    version: DatasetVersion,
) -> Result<(View, Manifest), ManifestFetchError> {
    let piece_error = |error| ManifestFetchError::Piece { name: name.to_string(), version, error };
    let mut cut: Option<(View, ManifestPieces)> = None;
    let mut bytes = Vec::new();
    let mut index = 0u32;
    loop {
        let ask = ApiRequest::ManifestPiece { name: name.to_string(), version, index };
        let answer = client.call(&ask).await.map_err(|source| ManifestFetchError::Client {
            name: name.to_string(),
            version,
            source,
        })?;
        let (view, pieces, data) = match answer.1 {
            ApiResponse::ManifestPiece { version: v, view, pieces, index: i, data } if v == version && i == index => {
                (view, pieces, data)
            }
            other => {
                let got = format!("{other:?}").chars().take(200).collect();
                return Err(ManifestFetchError::Unexpected { name: name.to_string(), version, index, got });
            }
        };
        let (_, known) = cut.get_or_insert_with(|| (view, pieces.clone()));
        if *known != pieces {
            return Err(piece_error(PieceError::Cut(format!("piece {index} is of another cut than piece 0"))));
        }
        known.verify(index, &data.0).map_err(piece_error)?;
        bytes.extend_from_slice(&data.0);
        index += 1;
        if index >= known.count() {
            break;
        }
    }
    let Some((view, _)) = cut else {
        return Err(piece_error(PieceError::Missing { index: 0, of: 0 }));
    };
    let manifest = Manifest::from_compact(&bytes).map_err(|error| ManifestFetchError::Decode {
        name: name.to_string(),
        version,
        error,
    })?;
    let got = manifest.version(&view);
    if got != version {
        return Err(ManifestFetchError::Version { name: name.to_string(), version, got });
    }
    Ok((view, manifest))
}
