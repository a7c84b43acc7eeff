//! # granary-chaos: chaos testing of Granary
//!
//! Granary must hand every trainer the same batch stream while hosts die and
//! networks misbehave. This crate holds the pieces of chaos testing's two
//! layers (issue 14): a deterministic simulation of the decision cores over
//! a virtual clock and network, and runs of the real processes under a seeded
//! schedule of faults. Both must replay from a seed, and both end in the same
//! question: was what the system did allowed?
//!
//! ## Module map
//! - [`lincheck`] — a linearizability checker for recorded histories
//!   (memoizing Wing–Gong–Lowe) with a step bound, ready models of a
//!   register ([`lincheck::Register`]) and a grow-only set
//!   ([`lincheck::GrowSet`]), and per-key checking
//!   ([`lincheck::check_by_key`]). It judges what a chaos client saw of the
//!   coordinator's writes.
//! - [`relay`] — a seeded userspace UDP fault relay between real processes
//!   (drop, delay, duplication, reordering, partitions, bandwidth caps), for
//!   QUIC links on a kernel without netem. Its decisions are pure:
//!   [`relay::decide`](mod@relay::decide) (the fate of the n-th datagram of a link, from the
//!   seed alone) and [`relay::core`] (a sans-I/O state machine with time as
//!   an argument); [`relay::RelayHandle`] is the tokio shell around them.
//!
//! ## Data flow
//! A real-process run starts a [`relay::RelayHandle`] in front of the
//! processes, points each at the others' front addresses, changes faults as
//! its schedule says, and afterwards reads the relay's counts. Its chaos
//! client records each call and answer as a [`lincheck::Operation`], and
//! [`lincheck::check`] says whether the history is linearizable.
//!
//! - [`sim`] — `granary-chaos sim`: the node's and the coordinator's
//!   decision cores on a simulated clock and network, one seed per run,
//!   with the invariants of the fabric checked after every run.
//!
//! - [`netns`] and [`hosts`] — `granary-chaos hosts`: hosts made of
//!   network namespaces on a bridge, and issue 14's two cost targets (a
//!   node stopped, or its host cut off, in the cold epoch) measured on them
//!   against the same job without the fault.
//!
//! - [`run`] — `granary-chaos run`: a real cluster (voters, node daemons,
//!   trainer ranks, a [`relay::RelayHandle`] between the nodes) under a
//!   seed's fault schedule ([`run::schedule`]), judged by
//!   [`run::verdict`] against a fault-free single-node reference.
//!
//! The fault-injecting store and the coordinator's linearizability client
//! will be added here as they are built.

pub mod hosts;
pub mod lincheck;
pub mod netns;
pub mod relay;
pub mod run;
pub mod sim;
