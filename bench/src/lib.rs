//! # granary-bench: scenario benchmarks, measured side by side
//!
//! Every scenario runs in the same invocation as the baseline it is compared
//! with, on the same generated dataset, because this machine is shared and
//! noisy: ratios measured together are meaningful, absolute numbers less so.
//!
//! ## Module map
//! - [`harness`] — real processes: coordinator voters, the node daemon and trainer ranks, with
//!   their JSON-lines protocol ([`harness::TrainerEvent`]).
//! - [`local`] — `granary bench local`: ceiling, naive, warm and cold.
//! - [`cluster`] — `granary bench cluster`: 1, 2 and 4 nodes; remote reads, cold epoch, peer transfer against bare QUIC and TCP.
//! - [`failover`] — `granary bench failover`: leader kills in a coordinator
//!   group of real processes; election and commit times; durability.
//! - [`report`] — conditions (commit, cores, flags) and output.

pub mod cluster;
pub mod failover;
pub mod harness;
pub mod local;
pub mod report;
