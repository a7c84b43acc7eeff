//! # granary-proto: the contract every Granary process computes identically
//!
//! This crate is pure: no I/O, no clock, no async runtime. Anything that two
//! processes must agree on byte for byte lives here, once.
//!
//! ## Module map
//! - [`ids`] — identifier newtypes ([`DatasetVersion`], [`ShardId`], [`NodeId`]).
//! - [`dtype`] — the element types a tensor may have ([`DType`]).
//! - [`view`] — which tensors to build from which Parquet columns ([`View`]).
//! - [`manifest`] — what a dataset version contains, and the version hash.
//! - [`chunk`] — the self-describing, 64-byte-aligned converted shard
//!   ([`ChunkLayout`] writes one, [`ChunkView`] validates and reads one).
//! - [`plan`] — the deterministic epoch plan ([`plan_rank`]).
//! - [`placement`] — which live node owns each shard, balanced by weight
//!   with little movement on membership changes ([`plan_placement`]).
//! - [`frame`] — the length-prefixed frame every stream carries, with its
//!   cap checked before allocation ([`frame::FrameDecoder`], sans-I/O).
//! - [`wire`] — messages between a trainer and its local node.
//! - [`doctor`] — where a job's time goes and which stage bounds it
//!   ([`doctor::diagnose`], pure), from the clocks ranks and nodes keep.
//! - [`peer`] — messages between nodes (chunk fetches from a shard's owner).
//! - [`transform`] — the steps a view applies to values at conversion
//!   (`log1p`, `clip`, `standardize`, `bucketize`).
//! - [`rng`] — the seeded generator the plan uses; frozen, because changing it
//!   would change every sample order ever published.
//! - [`aligned`] — a 64-byte-aligned byte buffer.
//! - [`version`] — the protocol versions a build speaks on each wire, how
//!   two builds agree on one, and the local socket's hello.
//!
//! ## Data flow
//! A node reads a [`manifest::Manifest`] and a [`View`], hashes them into a
//! [`DatasetVersion`], converts each shard (a Parquet row group) into a chunk
//! laid out by [`ChunkLayout`], and hands chunk bytes to trainers. A trainer
//! validates them with [`ChunkView::parse`] and assembles batches in the order
//! [`plan_rank`] gives, which depends only on the job's parameters.

pub mod aligned;
pub mod chunk;
pub mod doctor;
pub mod dtype;
pub mod frame;
pub mod ids;
pub mod manifest;
pub mod peer;
pub mod placement;
pub mod plan;
pub mod rng;
pub mod transform;
pub mod version;
pub mod view;
pub mod wire;

pub use aligned::AlignedBuf;
pub use chunk::{ChunkError, ChunkHeader, ChunkLayout, ChunkView, TensorMeta};
pub use dtype::DType;
pub use ids::{DatasetVersion, NodeId, PlanKey, ShardId};
pub use manifest::{FileEntry, Manifest, RowGroupEntry, ShardRows};
pub use placement::{NodeWeight, Placement, PlacementError, plan_placement, shard_key};
pub use plan::{
    Cursor, GlobalCursor, GlobalParams, GlobalPlan, PlanCost, PlanCursor, PlanError, PlanParams, RankPlan, RowRef,
    Shuffle, Walk, plan_cost, plan_rank, rank_shard_order, window_rows_bound,
};
pub use view::{NullRows, TensorLayout, TensorSpec, Truncate, View, ViewError};
