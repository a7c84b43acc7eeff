//! # granary-node-core: the node's decisions, pure
//!
//! Everything a node decides about the loads it runs, with no tokio, no
//! quinn and no I/O: inputs are `handle_*` calls that carry `now`, outputs
//! are values the caller executes (the `quinn-proto` shape beside `quinn`,
//! `../shared/STYLE.md`). The node's async shell (`granary-node`) and the
//! chaos simulation (`granary-chaos sim`) drive the same code; `cargo tree
//! -p granary-node-core -e normal` shows why it can be trusted to stay
//! pure: its only dependency is `granary-proto`.
//!
//! ## Module map
//! - [`engine`] — every load in flight on one node as one state machine:
//!   single flight, each load's route, the placement wait, the permit and
//!   its race against a move, the lease wait ([`engine::Engine`],
//!   [`engine::Command`]).
//! - [`health`] — whether the node is ready (`/readyz`).
//! - [`flight`] — single-flight admission: who may join a load, and
//!   whether a peer's request may start a read here.
//! - [`route`] — one load's fetch route: ask the owner, wait for the
//!   placement, read remote; the post-permit rule; the footer rule.
//! - [`stall`] — the stall clock of a transfer and the liveness probe of
//!   its connection.
//! - [`prefetch`] — the prefetch window along one rank's plan.
//! - [`conns`] — the node's local socket's connection table.

pub mod conns;
pub mod engine;
pub mod flight;
pub mod health;
pub mod prefetch;
pub mod route;
pub mod stall;
