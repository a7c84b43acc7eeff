//! # granary-testkit: what tests, demos and benchmarks share
//!
//! Nothing here ships inside a library a trainer or a node links: the
//! shipped crates take this one only as a dev-dependency; the `granary`
//! binary uses it for `demo`, `bench` and `gen`.
//!
//! ## Module map
//! - [`datagen`] — a deterministic synthetic dataset (Parquet files and the
//!   view that reads them), the one every demo, benchmark and test uses.
//! - [`harness`] — real processes: coordinator voters, node daemons and
//!   trainer ranks started from the `granary` binary, stopped by handle,
//!   every wait bounded; the trainers' JSON-lines protocol
//!   ([`harness::TrainerEvent`]).
//! - [`skip`] — a test that cannot run here says "skipped" and records why.

pub mod datagen;
pub mod harness;
pub mod skip;
