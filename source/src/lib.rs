//! # granary-source: remote Parquet sources, shared by node and coordinator
//!
//! Everything about a dataset that is read from remote storage and needs no
//! cache, no conversion and no peer: the node converts shards of it, and
//! the coordinator registers it (lists the source, reads every footer once,
//! checks the view against every file, computes the version) without
//! linking the node.
//!
//! ## Module map
//! - [`remote`] — object_store sources behind a counting, optionally
//!   throttled Parquet reader ([`Remote`], [`ThrottleConfig`]).
//! - [`schema`] — a view checked against a file's Arrow schema
//!   ([`resolve_view`], [`Resolved`]).
//! - [`path`] — columns inside columns: a struct's field, a list of
//!   structs' field, a map's keys and values, by their path (`user.age`).
//! - [`select`] — globs and brace ranges in a source URL: its base and
//!   what it selects below it.
//! - [`dataset`] — listing, footers, manifest, version ([`Dataset`]).
//! - [`check`] — a view checked against a source's first file, for
//!   `granary view check` ([`check_view`]).
//! - [`error`] — error types.
//!
//! Data flows `remote` (bytes, footers) → `dataset` (manifest, footers kept)
//! → `schema` (each footer's schema against the view).

pub mod check;
pub mod dataset;
pub mod error;
pub mod footer;
pub mod path;
pub mod remote;
pub mod schema;
pub mod select;

pub use check::{CheckedTensor, ViewCheck, check_view};
pub use dataset::{Dataset, OpenError};
pub use error::{RemoteError, SchemaError, SourceError};
pub use remote::{Remote, RemoteCounters, Throttle, ThrottleConfig};
pub use schema::{Resolved, resolve_view};
