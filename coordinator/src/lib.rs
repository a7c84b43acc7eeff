//! Granary's coordinator: a Raft group (openraft) that owns datasets, node
//! membership with leases, and the placement epoch. It is never on the path
//! of a batch.
//!
//! - [`types`]: the Raft type configuration and the commands in the log.
//! - [`state`]: the replicated [`state::ClusterState`] and the pure function
//!   that applies a command to it.
//! - [`store`]: the log and vote on redb, synced before acknowledged.
//! - [`sm`]: the state machine and its snapshots on disk; [`checksum`]: the
//!   checksum line that ends a snapshot file.
//! - [`staged`]: manifests in the log as pieces, and the compact form the
//!   state and its snapshots keep them in.
//! - [`network`]: Raft RPCs over QUIC with mutual TLS.
//! - [`switch`]: entries turned on once every voter reads them, pure;
//!   [`inherit`]: a new version's owners where its content's chunks are,
//!   pure (the first such switch).
//! - [`leases`]: the leader's lease table, pure: which live node's lease ran
//!   out at `now`, with the grace a new leader grants.
//! - [`election`]: the election watchdog, pure: when a follower that stopped
//!   hearing from its leader campaigns.
//! - [`admission`]: which connections a voter admits, pure: caps in all,
//!   per role and per node identity.
//! - [`commit_rate`]: how often one node may make the leader commit, pure:
//!   a token bucket per node on `now`.
//! - [`server`]: the voter process, the only async part: endpoint and
//!   accept loop, API handlers with role checks, the placement watch, and
//!   the timer tasks that carry out what [`leases`] and [`election`] decide.
//!
//! Flow: an API request reaches any voter; writes and current reads are
//! redirected to the leader, which proposes a [`types::Command`]; once
//! committed, every voter applies it to its [`state::ClusterState`], and the
//! placement watch pushes the new placement epoch to the nodes, which
//! compute owners with the pure `granary_proto::plan_placement`. Time
//! enters only through the two pure clocks: the leader's lease table turns
//! missed heartbeats into `ExpireNode` commands, and the watchdog turns a
//! silent leader into an election.

pub mod admission;
pub mod checksum;
pub mod commit_rate;
pub mod election;
pub mod health;
pub mod inherit;
pub mod leases;
pub mod network;
pub mod server;
pub mod sm;
pub mod staged;
pub mod state;
pub mod store;
pub mod switch;
pub mod types;

pub use server::{Coordinator, CoordinatorConfig, StartError};
