//! The Raft type configuration: voter ids, the commands the log carries and
//! what applying them returns.
//!
//! Commands are decisions already made: the leader lists sources and reads
//! footers *before* proposing `AddDataset`, and decides that a lease has
//! expired before proposing `ExpireNode`, so applying a command never reads
//! a clock or the network and every replica reaches the same state.

use crate::staged::{Blob, StagingRefused};
use granary_proto::manifest::ManifestPieces;
use granary_proto::{DatasetVersion, Manifest, NodeId, View};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A coordinator voter's id (distinct from a data node's [`NodeId`]).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct VoterId(pub u64);

impl fmt::Display for VoterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "voter-{}", self.0)
    }
}

/// A command in the replicated log.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub enum Command {
    /// Registers a dataset version whose manifest the leader has built,
    /// carried whole. Written by coordinators before manifests were staged
    /// in pieces (a log may still hold it); leaders now write
    /// [`Command::StageManifestPiece`]s and [`Command::AddStagedDataset`].
    AddDataset {
        /// Dataset name.
        name: String,
        /// The view the version was built with.
        view: View,
        /// Files, row groups and tensor layouts.
        manifest: Manifest,
    },
    /// One piece of a manifest's compact form, staged under the version it
    /// belongs to until a [`Command::AddStagedDataset`] names it
    /// ([`crate::staged`]).
    StageManifestPiece {
        /// The dataset version the manifest gives.
        version: DatasetVersion,
        /// The piece's index.
        index: u32,
        /// How many pieces the manifest has.
        of: u32,
        /// The piece's bytes (base64 in the log).
        data: Blob,
        /// The leader's clock (ms since the Unix epoch): staged pieces no
        /// entry names are collected a while after it.
        at_ms: u64,
    },
    /// Registers a dataset version from its staged pieces: assembled,
    /// each piece checked against its digest and the manifest against
    /// `version`, then as [`Command::AddDataset`].
    AddStagedDataset {
        /// Dataset name.
        name: String,
        /// The view the version was built with.
        view: View,
        /// The version (content hash of manifest and view).
        version: DatasetVersion,
        /// How the manifest's compact form is cut, with each piece's digest.
        pieces: ManifestPieces,
    },
    /// A node (re)joins: it gets a new incarnation and the placement epoch
    /// advances.
    RegisterNode {
        /// The node.
        node: NodeId,
        /// Its peer address (`host:port`).
        addr: String,
        /// RAM tier capacity.
        ram_bytes: u64,
        /// SSD tier capacity.
        ssd_bytes: u64,
        /// The node's token for this registration (0: none); a repeat of
        /// the live incarnation's token changes nothing.
        #[serde(default)]
        registration: u64,
    },
    /// An admin set a node's placement weight (`None`: the default).
    SetNodeWeight {
        /// The node.
        node: NodeId,
        /// Its weight, or `None` for the default.
        weight: Option<u64>,
    },
    /// The leader saw this incarnation's lease pass its deadline.
    ExpireNode {
        /// The node.
        node: NodeId,
        /// The incarnation whose lease expired; a later incarnation is
        /// unaffected.
        incarnation: u64,
    },
    /// The leader saw these incarnations' leases pass their deadlines at
    /// one tick: one re-placement and one placement epoch for all of them
    /// (a thousand nodes whose leases lapse together move the epoch once,
    /// not a thousand times). Each is [`Command::ExpireNode`]'s rule.
    ExpireNodes {
        /// Each node with the incarnation whose lease expired.
        nodes: Vec<(NodeId, u64)>,
    },
    /// The versions trainers on `node` use (the whole set, replacing the
    /// node's earlier holds). A held version that is not current keeps a
    /// placement, so jobs pinned to it keep reading through the fabric,
    /// and is never collected.
    HoldVersions {
        /// The node.
        node: NodeId,
        /// Its incarnation; holds of an incarnation that is not live are
        /// ignored.
        incarnation: u64,
        /// (dataset, version) pairs.
        versions: Vec<(String, DatasetVersion)>,
    },
    /// Turns on owners that follow content (`crate::inherit`): from this
    /// entry on, a new version's shard holding what a shard of the version
    /// it replaces held starts with that shard's owner. The leader proposes
    /// it once every voter speaks `granary-raft/2`: a voter of the build
    /// before cannot read it (`crate::switch`).
    EnableContentOwners,
    /// The leader's collection pass: marks older versions nobody holds as
    /// unused at `now_ms`, and removes those unused for `retention_ms`;
    /// likewise the records of nodes that are not live.
    CollectVersions {
        /// The leader's clock (ms since the Unix epoch).
        now_ms: u64,
        /// How long an unused version is kept.
        retention_ms: u64,
        /// How long the record of a node that is not live is kept (marked
        /// at the first pass that finds it down, removed once this has
        /// passed). None (entries of older leaders): node records are kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node_retention_ms: Option<u64>,
    },
}

impl Command {
    /// Whether applying this command may re-place dataset versions (every
    /// version over the live nodes on a membership or weight change, a new
    /// version, held older versions): seconds of work at a million shards,
    /// which the state machine does outside its state lock.
    pub fn re_places(&self) -> bool {
        match self {
            Command::AddDataset { .. }
            | Command::AddStagedDataset { .. }
            | Command::RegisterNode { .. }
            | Command::SetNodeWeight { .. }
            | Command::ExpireNode { .. }
            | Command::ExpireNodes { .. }
            | Command::HoldVersions { .. } => true,
            Command::StageManifestPiece { .. } | Command::CollectVersions { .. } | Command::EnableContentOwners => {
                false
            }
        }
    }

    /// The entries that register `manifest` under `view` as dataset `name`:
    /// one [`Command::StageManifestPiece`]
    /// per piece of `piece_bytes`, in order, then the
    /// [`Command::AddStagedDataset`]
    /// that names them, with the version they register. `at_ms` is the
    /// leader's clock.
    pub fn registration(
        name: &str,
        view: &granary_proto::View,
        manifest: &Manifest,
        piece_bytes: usize,
        at_ms: u64,
    ) -> (DatasetVersion, Vec<Command>, Command) {
        let version = manifest.version(view);
        let compact = manifest.to_compact();
        let pieces = ManifestPieces::cut(&compact, piece_bytes);
        let of = pieces.count();
        let staged = (0..of)
            .filter_map(|index| {
                let r = pieces.range(index)?;
                let data = Blob(compact[r.start as usize..r.end as usize].to_vec());
                Some(Command::StageManifestPiece { version, index, of, data, at_ms })
            })
            .collect();
        let add = Command::AddStagedDataset { name: name.to_string(), view: view.clone(), version, pieces };
        (version, staged, add)
    }
}

/// What applying a [`Command`] returned.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum CommandResult {
    /// `AddDataset` applied.
    DatasetAdded {
        /// The version (content hash of manifest and view).
        version: DatasetVersion,
        /// False when this exact version was already registered.
        new: bool,
    },
    /// `StageManifestPiece` applied (or refused).
    PieceStaged {
        /// Why the piece was not staged, if it was not.
        refused: Option<StagingRefused>,
    },
    /// `AddStagedDataset` refused: nothing changed.
    DatasetRefused {
        /// Why.
        refused: StagingRefused,
    },
    /// `RegisterNode` applied.
    NodeRegistered {
        /// The node's new incarnation.
        incarnation: u64,
        /// The placement epoch it starts.
        placement_epoch: u64,
    },
    /// `ExpireNode` applied; `None` when the node or incarnation was no
    /// longer live (nothing changed).
    NodeExpired {
        /// The new placement epoch, if one started.
        placement_epoch: Option<u64>,
    },
    /// `ExpireNodes` applied: the nodes that were live with the
    /// incarnation named (the others changed nothing), and the new
    /// placement epoch if any was.
    NodesExpired {
        /// The nodes expired.
        expired: Vec<NodeId>,
        /// The new placement epoch, if one started.
        placement_epoch: Option<u64>,
    },
    /// `HoldVersions` applied.
    VersionsHeld {
        /// Pairs the node named that the cluster does not know (never
        /// registered, or collected).
        unknown: Vec<(String, DatasetVersion)>,
        /// True when the incarnation was not live: nothing changed.
        stale: bool,
    },
    /// `SetNodeWeight` applied.
    WeightSet {
        /// The placement epoch after it.
        placement_epoch: u64,
    },
    /// `CollectVersions` applied: the versions it removed.
    VersionsCollected {
        /// (dataset, version) pairs removed.
        collected: Vec<(String, DatasetVersion)>,
        /// Node records removed.
        #[serde(default)]
        nodes: Vec<NodeId>,
    },
    /// `EnableContentOwners` applied.
    ContentOwners {
        /// False when they were on already.
        turned_on: bool,
    },
    /// Membership changes and blank entries carry no command.
    None,
}

openraft::declare_raft_types!(
    /// Granary's coordinator Raft types.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = VoterId,
        Node = openraft::BasicNode,
        SnapshotData = tokio::fs::File,
);

/// The coordinator's Raft handle.
pub type Raft = openraft::Raft<TypeConfig>;

impl From<u64> for VoterId {
    fn from(id: u64) -> Self {
        Self(id)
    }
}
