//! # granary-client: what a trainer links
//!
//! A trainer rank asks for batches; this crate computes the rank's epoch plan
//! locally (so the order never depends on the node, timing or faults),
//! fetches the chunks the plan needs from a [`ChunkSource`], and hands out
//! each batch ahead of need: in place, as a view into chunk memory, where
//! the batch is one run of rows of one chunk, otherwise assembled into
//! reusable 64-byte-aligned buffers by a small pool of threads, in plan
//! order whatever their number.
//!
//! ## Module map
//! - [`source`] — the [`ChunkSource`] trait, validated [`Chunk`]s, and the
//!   in-memory source used for tests and the in-RAM ceiling.
//! - [`local`] — [`LocalSource`], the node on this host over a Unix socket;
//!   chunks arrive as sealed memory files and are mapped, not copied.
//! - [`loader`] — [`Loader`] and [`EpochStream`]: plan, fetch, assemble,
//!   resume from a [`ResumeState`].
//! - [`position`] — [`Position`], a place in a rank's plan.
//! - [`resume`] — [`ResumeState`], a rank's whole resume state: the
//!   pinned dataset version, the plan parameters and the position.
//! - [`hostbuf`] — the memory batches are assembled into (heap, or
//!   page-locked with `cuda`), how tensors are packed in it, and the pool
//!   that keeps buffers across epochs.
//! - `assemble` — the copy kernels: a batch's rows grouped into runs of one
//!   chunk, copied tensor by tensor with compile-time widths.
//! - [`batch`] — [`Batch`] and typed tensor views ([`TensorView`]).
//! - `cuda` (feature `cuda`): copies batches to the GPU on a stream,
//!   double-buffered; straight from page-locked batch buffers or registered
//!   chunk memory where it can (one host copy, or none for a view).
//!
//! This crate depends on `granary-proto` and a few small crates only: no
//! async runtime, no Arrow, no object store. The node's in-process mode
//! implements [`ChunkSource`] on the node side.

mod assemble;
pub mod batch;
mod clock;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod error;
pub mod hostbuf;
pub mod loader;
pub mod local;
pub mod position;
pub mod resume;
pub mod source;

pub use batch::{Batch, Element, TensorView};
pub use error::{ClientError, GpuError, ProducerError, ProtocolError, TensorError};
pub use granary_proto as proto;
pub use hostbuf::HostMemory;
pub use loader::{EpochStream, Loader, LoaderConfig, default_assembly_threads, default_assembly_threads_for};
pub use local::LocalSource;
pub use position::Position;
pub use resume::{PlanKind, ResumeMismatch, ResumeState};
pub use source::{Chunk, ChunkBytes, ChunkSource, MemorySource, Stalls};
