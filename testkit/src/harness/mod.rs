//! Real processes for demos and benchmarks: the node daemon and trainer
//! ranks, started from the `granary` binary, stopped by handle, every wait
//! bounded.
//!
//! ## Files
//! Imports go one way: `child` (a child's environment and log tail) is used
//! by `node`, `trainer` and `coordinator`; `cluster` builds on `node` and
//! `coordinator`; `memory` stands alone.

mod child;
mod cluster;
mod coordinator;
mod memory;
mod node;
mod trainer;

pub use cluster::{ClusterCounters, LocalCluster, LocalClusterSpec, NetHost, PEER_PORT, VOTER_PORT};
pub use coordinator::{CoordinatorProcess, VoterSpec, reserve_tcp_port, reserve_udp_port};
pub use memory::{ProcMemory, peak_rss, proc_memory};
pub use node::NodeProcess;
pub use trainer::{EpochOutcome, TrainerEvent, TrainerProcess, rank_args, run_epoch, spawn_ranks};
