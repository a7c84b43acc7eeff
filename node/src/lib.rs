//! # granary-node: one per GPU host
//!
//! The node turns Parquet on remote storage into converted chunks once, keeps
//! them in a RAM/SSD tier, and hands them to the trainers on its host.
//!
//! ## Module map (in the order data flows)
//! - [`config`] — `node.toml`.
//! - [`remote`] — object_store sources, counted and optionally throttled.
//! - [`dataset`] — listing, footers, manifest, version.
//! - [`convert`] — view resolution and Arrow-to-chunk conversion.
//! - [`shm`] — chunks in sealed memory files.
//! - [`tier`] — the foyer RAM/SSD tier.
//! - [`service`] — [`Node`]: lookup, single flight, load, prefetch.
//! - [`daemon`] — the Unix-socket endpoint for trainers.
//! - [`embedded`] — in-process mode, implementing the client's source trait.
//! - [`membership`] — registering with the coordinators, lease renewal, the placement watch.
//! - [`peer`] — the peer fabric: chunks of shards other nodes own, fetched from them over QUIC.
//! - [`datagen`] — a deterministic synthetic dataset for demos and benchmarks.
//! - [`error`] — error types.
//!
//! A request flows `daemon` → [`Node::chunk`] → `tier` (hit) or a single
//! shared load: `remote` reads the row group's column chunks (footers were
//! read once by `dataset`), Parquet decodes them, `convert` writes the
//! tensors straight into a memory file from `shm`, which is sealed, handed to
//! every waiter, and inserted into the `tier`.

pub mod config;
pub mod convert;
pub mod daemon;
pub mod datagen;
pub mod dataset;
pub mod embedded;
pub mod error;
pub mod fabric;
pub mod flight;
pub mod membership;
pub mod prefetch;
pub mod remote;
pub mod service;
pub mod shm;
pub mod tier;

pub use config::NodeConfig;
pub use embedded::EmbeddedNode;
pub use service::Node;
