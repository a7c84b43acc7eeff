//! # granary-bench: scenario benchmarks, measured side by side
//!
//! Every scenario runs in the same invocation as the baseline it is compared
//! with, on the same generated dataset, because this machine is shared and
//! noisy: ratios measured together are meaningful, absolute numbers less so.
//!
//! ## Module map
//! - The process harness (coordinator voters, node daemons, trainer ranks and their JSON-lines
//!   protocol) and the synthetic dataset live in `granary-testkit`.
//! - [`local`] — `granary bench local`: copy, ceiling, naive, warm (windowed and block shuffle) and cold.
//! - [`local_ranks`] — `granary bench local --ranks N`: N trainer processes, warm against copy.
//! - [`consume`] — the benchmark's trainer (a copy of every batch into a staging buffer) and the
//!   machine's memory copy bandwidth.
//! - [`cluster`] — `granary bench cluster`: 1, 2 and 4 nodes; remote reads, cold epoch, peer transfer against bare QUIC and TCP.
//! - [`placement`] — `granary bench placement`: the placement planners timed on generated shards over
//!   equal nodes, then one leave and one join (the clock-reading half of `granary_proto::placement`).
//! - [`failover`] — `granary bench failover`: leader kills in a coordinator
//!   group of real processes; election and commit times; durability.
//! - [`scale`] — `granary bench scale`: the coordinator with a dataset of
//!   many row groups on many simulated nodes: registration, log entries,
//!   snapshots, re-placement, watch bytes, failover (issue 31).
//! - [`report`] — conditions (commit, cores, flags) and output.
//! - [`plot`] — `--plot out.svg`: rows/s per epoch per scenario, the ceiling dashed.

pub mod cluster;
pub mod consume;
pub mod failover;
pub mod local;
pub mod local_ranks;
pub mod placement;
pub mod plot;
pub mod python;
pub mod report;
pub mod scale;
pub mod two_jobs;
