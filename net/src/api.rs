//! The coordinator's API: one [`ApiRequest`] per bidirectional QUIC stream,
//! answered by one [`ApiResponse`] (the placement watch answers with a
//! stream of them).
//!
//! Which role may send what is decided by [`ApiRequest::allowed`], a pure
//! function the server applies to the role in the peer's certificate, so
//! the rule is in one place and tested without a network.

use crate::role::Role;
use granary_proto::manifest::{Blob, ManifestPieces};
use granary_proto::{DatasetVersion, Manifest, NodeId, View};
use serde::{Deserialize, Serialize};

/// A request to the coordinator.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub enum ApiRequest {
    /// Sets a node's placement weight (admin only): its share of the shards
    /// against the other nodes' weights. `None` gives it the default back.
    /// A node's own registration does not set its weight.
    SetNodeWeight {
        /// The node (registered or not yet).
        node: NodeId,
        /// The weight, at least 1; `None`: the default.
        weight: Option<u64>,
    },
    /// A node (re)joins the cluster and gets a new incarnation.
    RegisterNode {
        /// The node's id.
        node: NodeId,
        /// Address peers reach it at (`host:port`).
        addr: String,
        /// RAM tier capacity (reported in status; placement weights are an
        /// admin's: [`ApiRequest::SetNodeWeight`]).
        ram_bytes: u64,
        /// SSD tier capacity (reported, as `ram_bytes`).
        ssd_bytes: u64,
        /// A token the node picks for this registration and repeats when it
        /// retries it, so that a retry of a registration that did commit
        /// returns the same incarnation instead of starting another. 0: none.
        #[serde(default)]
        registration: u64,
    },
    /// A node renews its lease.
    Heartbeat {
        /// The node.
        node: NodeId,
        /// The incarnation the node holds.
        incarnation: u64,
    },
    /// Registers a dataset: the leader lists the source, reads every footer
    /// and commits the manifest.
    AddDataset {
        /// Name.
        name: String,
        /// Source URL prefix.
        source: String,
        /// The view.
        view: View,
        /// Send [`ApiResponse::AddProgress`] frames (at most four a second)
        /// before the answer. Older clients leave it out: one answer.
        #[serde(default)]
        progress: bool,
    },
    /// Lists datasets (linearizable).
    ListDatasets,
    /// One dataset's current version, manifest and view (linearizable).
    DescribeDataset {
        /// Name.
        name: String,
        /// A version registered under the name (a job pinned it); `None`:
        /// the current one.
        #[serde(default)]
        version: Option<granary_proto::DatasetVersion>,
    },
    /// One piece of a registered version's manifest in its compact form
    /// (linearizable): how nodes fetch a manifest of any size in answers
    /// of at most [`MANIFEST_PIECE_BYTES`](granary_proto::manifest::MANIFEST_PIECE_BYTES).
    ManifestPiece {
        /// Name.
        name: String,
        /// The version.
        version: DatasetVersion,
        /// The piece (0 first; the answer says how many there are).
        index: u32,
    },
    /// Which node owns each shard of a dataset's current version, or of a
    /// held older one (linearizable).
    DescribePlacement {
        /// Name.
        name: String,
        /// An older version a node holds; `None`: the current one.
        #[serde(default)]
        version: Option<DatasetVersion>,
    },
    /// The versions trainers on a node use (the whole set): the
    /// coordinator keeps them placed and never collects them while held.
    HoldVersions {
        /// The node.
        node: NodeId,
        /// The incarnation the node holds.
        incarnation: u64,
        /// (dataset, version) pairs.
        versions: Vec<(String, DatasetVersion)>,
    },
    /// Leader, term, voters, nodes and their leases, placement epoch,
    /// shards per node.
    Status,
    /// A long-lived stream: the current cluster view, then every newer
    /// placement epoch or dataset change.
    WatchPlacement {
        /// Send only views newer than this revision (0 for all).
        after_revision: u64,
        /// Answer with [`crate::placement::PlacementUpdate`]s: the whole
        /// placement with every version's owners first, then only what
        /// changed. Without it (and from older clients), whole
        /// [`PlacementView`]s without owners.
        #[serde(default)]
        deltas: bool,
    },
}

impl ApiRequest {
    /// A short name for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::SetNodeWeight { .. } => "set-node-weight",
            Self::RegisterNode { .. } => "register-node",
            Self::Heartbeat { .. } => "heartbeat",
            Self::AddDataset { .. } => "add-dataset",
            Self::ListDatasets => "list-datasets",
            Self::DescribeDataset { .. } => "describe-dataset",
            Self::DescribePlacement { .. } => "describe-placement",
            Self::ManifestPiece { .. } => "manifest-piece",
            Self::HoldVersions { .. } => "hold-versions",
            Self::Status => "status",
            Self::WatchPlacement { .. } => "watch-placement",
        }
    }

    /// Whether a peer holding `role` may send this request. Nodes join and
    /// heartbeat; only admins change datasets; anyone of the cluster may
    /// read.
    pub fn allowed(&self, role: Role) -> bool {
        match self {
            Self::RegisterNode { .. } | Self::Heartbeat { .. } | Self::HoldVersions { .. } => role == Role::Node,
            Self::AddDataset { .. } | Self::SetNodeWeight { .. } => role == Role::Admin,
            Self::ListDatasets
            | Self::DescribeDataset { .. }
            | Self::ManifestPiece { .. }
            | Self::DescribePlacement { .. }
            | Self::Status
            | Self::WatchPlacement { .. } => true,
        }
    }
}

/// A dataset in a listing.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct DatasetSummary {
    /// Name.
    pub name: String,
    /// Current version.
    pub version: DatasetVersion,
    /// Versions registered so far.
    pub versions: usize,
    /// Source URL prefix.
    pub source: String,
    /// Files.
    pub files: usize,
    /// Shards (row groups).
    pub shards: usize,
    /// Rows.
    pub rows: u64,
    /// Total source bytes.
    pub source_bytes: u64,
    /// Every registered version, oldest first (the last is current).
    /// Absent from older coordinators.
    #[serde(default)]
    pub version_list: Vec<VersionSummary>,
}

/// One registered version of a dataset, as listed.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct VersionSummary {
    /// The version.
    pub version: DatasetVersion,
    /// What it is to the cluster.
    pub state: VersionStatus,
    /// Nodes whose trainers follow it (current or older).
    #[serde(default)]
    pub held_by: Vec<NodeId>,
    /// Rows.
    pub rows: u64,
    /// Files.
    pub files: usize,
}

/// What a registered version is to the cluster.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum VersionStatus {
    /// The current version (new jobs get it).
    Current,
    /// An older version that trainers on these nodes use: placed, so it is
    /// read once per cluster, and kept.
    Held {
        /// The nodes whose trainers use it.
        nodes: Vec<NodeId>,
    },
    /// An older version nobody uses: not placed; collected at
    /// `collect_at_ms` (ms since the Unix epoch; None until the leader's
    /// next collection pass marks it).
    Unused {
        /// When it will be collected.
        collect_at_ms: Option<u64>,
    },
}

/// A node as reported by status and the placement watch.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The node.
    pub node: NodeId,
    /// Peer address.
    pub addr: String,
    /// Current incarnation.
    pub incarnation: u64,
    /// Whether its lease is live.
    pub live: bool,
    /// RAM tier capacity.
    pub ram_bytes: u64,
    /// SSD tier capacity.
    pub ssd_bytes: u64,
    /// Placement weight (set by an admin, or the default).
    #[serde(default)]
    pub weight: u64,
    /// Milliseconds until the lease expires, as the leader sees it (absent
    /// for expired nodes and when not answered by the leader).
    pub lease_left_ms: Option<u64>,
    /// Shards it owns over all datasets' current versions.
    pub shards: u64,
}

/// A coordinator voter.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct VoterStatus {
    /// Voter id.
    pub id: u64,
    /// Its address.
    pub addr: String,
    /// As the leader sees it (issue 48): whether the voter answered the
    /// leader within half a lease. None from a follower, or from voters
    /// of older builds.
    #[serde(default)]
    pub reachable: Option<bool>,
    /// As the leader sees it: how long ago the voter last answered it.
    #[serde(default)]
    pub answered_ms_ago: Option<u64>,
    /// As the leader sees it: log entries the voter has yet to take.
    #[serde(default)]
    pub lag_entries: Option<u64>,
}

/// The cluster as the answering voter sees it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// The voter that answered.
    pub answered_by: u64,
    /// The leader, if known.
    pub leader: Option<u64>,
    /// Current term.
    pub term: u64,
    /// Last log index applied by the answering voter.
    pub applied_index: Option<u64>,
    /// Voters of the group.
    pub voters: Vec<VoterStatus>,
    /// Placement epoch.
    pub placement_epoch: u64,
    /// Nodes, live and expired.
    pub nodes: Vec<NodeStatus>,
    /// Datasets.
    pub datasets: Vec<DatasetSummary>,
    /// Whether a new version's shards start with the owners of the shards
    /// of the same content (turned on once every voter speaks
    /// `granary-raft/2`); false from voters of the build before.
    #[serde(default)]
    pub content_owners: bool,
    /// As the leader sees it (issue 48): how many more voters may become
    /// unreachable before the group loses its quorum (negative: it has
    /// lost it). None from a follower, or from voters of older builds.
    #[serde(default)]
    pub quorum_margin: Option<i64>,
}

/// The cluster view the placement watch pushes: the placement epoch, the
/// nodes and every dataset's current version. Owners depend on the history
/// of membership events (they are re-placed incrementally in the
/// coordinator's state machine), so a node does not compute them: it asks
/// with [`ApiRequest::DescribePlacement`] when the epoch or a version
/// changes.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct PlacementView {
    /// Log revision this view was taken at (the applied index); increases
    /// with every change.
    pub revision: u64,
    /// Placement epoch.
    pub placement_epoch: u64,
    /// Nodes, live and expired.
    pub nodes: Vec<NodeStatus>,
    /// Current version of every dataset.
    pub datasets: Vec<(String, DatasetVersion)>,
    /// Older versions that trainers still use (placed like the current
    /// ones). Absent from older coordinators.
    #[serde(default)]
    pub held: Vec<(String, DatasetVersion)>,
    /// Every registered version that is not current (held or not); a node
    /// drops a version it serves that is in neither this list nor
    /// `datasets` (the coordinator collected it). None from older
    /// coordinators: nothing is dropped.
    #[serde(default)]
    pub older: Option<Vec<(String, DatasetVersion)>>,
}

/// One shard whose placement changed: its index in manifest order, its
/// owner, and the live node it was handed over from (if any).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ShardChange(pub u32, pub NodeId, pub Option<NodeId>);

/// How one version's owner table changed.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum OwnersChange {
    /// The whole table: the owner of every shard in manifest order, and
    /// `(index, node)` for shards handed over from a live node.
    Whole {
        /// Owners in manifest order.
        owners: Vec<NodeId>,
        /// Shards handed over, by index.
        handed: Vec<(u32, NodeId)>,
    },
    /// Only these shards changed.
    Changed(Vec<ShardChange>),
}

/// One message of a watch that asked for deltas
/// (`WatchPlacement { deltas: true }`); [`crate::placement`] builds and
/// folds them.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct PlacementUpdate {
    /// Log revision the placement was taken at.
    pub revision: u64,
    /// Placement epoch.
    pub placement_epoch: u64,
    /// Whether this replaces everything known (a stream's first message);
    /// otherwise it changes the placement the stream's last message left.
    pub full: bool,
    /// Nodes whose status changed (every node when `full`).
    pub nodes: Vec<NodeStatus>,
    /// Nodes whose records are gone.
    #[serde(default)]
    pub nodes_gone: Vec<NodeId>,
    /// Current version of every dataset.
    pub datasets: Vec<(String, DatasetVersion)>,
    /// Older versions trainers still use (placed like the current ones).
    pub held: Vec<(String, DatasetVersion)>,
    /// Every registered version that is not current.
    pub older: Vec<(String, DatasetVersion)>,
    /// Owner tables that changed; a placed version (current or held) not
    /// listed keeps its table, and a table of a version no longer placed is
    /// dropped.
    pub owners: Vec<(DatasetVersion, OwnersChange)>,
}

/// Where a dataset registration stands.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct AddProgress {
    /// The step.
    pub stage: AddStage,
    /// Of that step: files whose footer was read, or manifest pieces
    /// committed.
    pub done: u64,
    /// Of that step, in all.
    pub total: u64,
}

/// The steps of a dataset registration on the leader, in order.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Default, Serialize, Deserialize)]
pub enum AddStage {
    /// Listing the source.
    #[default]
    Listing,
    /// Reading every file's footer.
    Footers,
    /// Committing the manifest's pieces to the log.
    Staging,
    /// Committing the entry that registers the version (and places it).
    Registering,
}

impl std::fmt::Display for AddStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AddStage::Listing => "listing the source",
            AddStage::Footers => "reading footers",
            AddStage::Staging => "committing manifest pieces",
            AddStage::Registering => "registering and placing",
        })
    }
}

/// The owner of every shard of a dataset version, in manifest order.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct PlacementReport {
    /// Dataset name.
    pub name: String,
    /// Version placed.
    pub version: DatasetVersion,
    /// Placement epoch.
    pub placement_epoch: u64,
    /// `(file, row_group, owner)` per shard; empty when no node is live.
    pub owners: Vec<(u32, u32, NodeId)>,
    /// `(file, row_group, node)` for shards a placement moved to their
    /// owner from a node that is still live: the owner asks that node
    /// before reading remote storage. Absent from older coordinators.
    #[serde(default)]
    pub handed_from: Vec<(u32, u32, NodeId)>,
}

/// Why a request failed.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum FailureKind {
    /// The caller's role may not send this request.
    Forbidden,
    /// The request names something that does not exist.
    NotFound,
    /// The request is malformed or its input (source, footers, view) is bad.
    BadRequest,
    /// The group could not commit or confirm leadership in time; retry.
    Unavailable,
    /// Anything else on the server.
    Internal,
}

/// A response from the coordinator.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub enum ApiResponse {
    /// `SetNodeWeight` committed.
    WeightSet {
        /// The placement epoch after it (a live node's new weight starts one).
        placement_epoch: u64,
    },
    /// This voter is not the leader; ask the one named, if any.
    NotLeader {
        /// The leader's id and API address, if known.
        leader: Option<(u64, String)>,
    },
    /// `RegisterNode` committed.
    Registered {
        /// The node's new incarnation.
        incarnation: u64,
        /// The placement epoch it starts.
        placement_epoch: u64,
        /// Lease length: heartbeat well within it.
        lease_ms: u64,
    },
    /// Heartbeat accepted.
    HeartbeatAccepted {
        /// Current placement epoch.
        placement_epoch: u64,
    },
    /// `HoldVersions` committed (or changed nothing).
    VersionsHeld {
        /// Pairs named that the cluster does not know (collected, or never
        /// registered).
        unknown: Vec<(String, DatasetVersion)>,
    },
    /// The heartbeating incarnation is no longer live: register again.
    LeaseLost {
        /// The node.
        node: NodeId,
    },
    /// `AddDataset` committed.
    DatasetAdded {
        /// Summary of the current version.
        summary: DatasetSummary,
        /// False when this exact version was already current.
        new: bool,
    },
    /// `ListDatasets`.
    Datasets(Vec<DatasetSummary>),
    /// `DescribeDataset`.
    Dataset {
        /// Summary.
        summary: DatasetSummary,
        /// Manifest of the version asked for (the current one by default).
        manifest: Manifest,
        /// View of that version.
        view: View,
    },
    /// `ManifestPiece`.
    ManifestPiece {
        /// The version.
        version: DatasetVersion,
        /// Its view.
        view: View,
        /// How its compact manifest is cut, with each piece's digest.
        pieces: ManifestPieces,
        /// The piece's index.
        index: u32,
        /// The piece (base64).
        data: Blob,
    },
    /// `DescribePlacement`.
    Placement(PlacementReport),
    /// `Status`.
    Status(ClusterStatus),
    /// One view of the placement watch.
    PlacementChanged(PlacementView),
    /// One message of a placement watch that asked for deltas.
    PlacementUpdate(PlacementUpdate),
    /// How far an `AddDataset { progress: true }` is; the answer follows.
    AddProgress(AddProgress),
    /// The request failed.
    Failed {
        /// Category.
        kind: FailureKind,
        /// What failed, naming the file, dataset, node or role.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_checked_per_request() {
        let hb = ApiRequest::Heartbeat { node: NodeId(1), incarnation: 1 };
        assert!(hb.allowed(Role::Node));
        for r in [Role::Trainer, Role::Admin, Role::Coordinator] {
            assert!(!hb.allowed(r), "{r} may not heartbeat");
        }
        let add = ApiRequest::AddDataset {
            name: "d".into(),
            source: "file:///x".into(),
            view: View { tensors: vec![] },
            progress: false,
        };
        assert!(add.allowed(Role::Admin));
        for r in [Role::Trainer, Role::Node, Role::Coordinator] {
            assert!(!add.allowed(r), "{r} may not add a dataset");
        }
        for r in Role::ALL {
            assert!(ApiRequest::Status.allowed(r));
        }
        let hold = ApiRequest::HoldVersions { node: NodeId(1), incarnation: 1, versions: vec![] };
        assert!(hold.allowed(Role::Node));
        for r in [Role::Trainer, Role::Admin, Role::Coordinator] {
            assert!(!hold.allowed(r), "{r} may not hold versions");
        }
    }

    #[test]
    fn messages_round_trip_through_json() {
        let r = ApiResponse::NotLeader { leader: Some((2, "127.0.0.1:7000".into())) };
        let back: ApiResponse = serde_json::from_slice(&serde_json::to_vec(&r).expect("encode")).expect("decode");
        assert_eq!(back, r);
    }
}
