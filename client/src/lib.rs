//! # granary-client: what a trainer links
//!
//! A trainer rank asks for batches; this crate computes the rank's epoch plan
//! locally (so the order never depends on the node, timing or faults),
//! fetches the chunks the plan needs from a [`ChunkSource`], and assembles
//! each batch into reusable 64-byte-aligned buffers, ahead of need on one
//! background thread.
//!
//! ## Module map
//! - [`source`] — the [`ChunkSource`] trait, validated [`Chunk`]s, and the
//!   in-memory source used for tests and the in-RAM ceiling.
//! - [`local`] — [`LocalSource`], the node on this host over a Unix socket;
//!   chunks arrive as sealed memory files and are mapped, not copied.
//! - [`loader`] — [`Loader`] and [`EpochStream`]: plan, fetch, assemble,
//!   resume from a [`Position`].
//! - [`batch`] — [`Batch`] and typed tensor views ([`TensorView`]).
//! - `cuda` (feature `cuda`): copies batches to the GPU on a stream,
//!   double-buffered.
//!
//! This crate depends on `granary-proto` and a few small crates only: no
//! async runtime, no Arrow, no object store. The node's in-process mode
//! implements [`ChunkSource`] on the node side.

pub mod batch;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod error;
pub mod loader;
pub mod local;
pub mod source;

pub use batch::{Batch, Element, TensorView};
pub use error::ClientError;
pub use granary_proto as proto;
pub use loader::{EpochStream, Loader, LoaderConfig, Position};
pub use local::LocalSource;
pub use source::{Chunk, ChunkBytes, ChunkSource, MemorySource};
