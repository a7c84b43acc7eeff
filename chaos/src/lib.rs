//! # granary-chaos: chaos testing of Granary
//!
//! Granary must hand every trainer the same batch stream while hosts die and
//! networks misbehave. This crate holds the pieces of issue 14's two layers:
//! a deterministic simulation of the decision cores, and runs of real
//! processes under a seeded schedule of faults. Both end in the same
//! question, whether what the system did is allowed, and both must replay
//! from a seed.
//!
//! ## Module map
//! - [`lincheck`] — a linearizability checker for recorded histories
//!   (memoizing Wing–Gong–Lowe), with ready models of a register
//!   ([`lincheck::Register`]) and a grow-only set ([`lincheck::GrowSet`]).
//!
//! The simulation harness, the fault schedule and the `granary chaos`
//! commands will be added here as they are built.

pub mod lincheck;
