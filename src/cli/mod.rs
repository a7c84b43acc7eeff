//! The commands of the `granary` binary, one file per command: each file
//! holds that command's `clap` arguments next to the body that uses them, so
//! a change to one command's grammar and behaviour stays in one place.
//!
//! - [`node`]: `granary node`, the node daemon.
//! - [`coordinator`]: `granary coordinator`, one Raft voter.
//! - [`certs`]: `granary certs init|issue`, the cluster CA and certificates.
//! - [`dataset`]: `granary dataset gen` (local files) and `add|ls|show|placement`
//!   (datasets registered with the coordinators).
//! - [`status`]: `granary status`, the cluster as the leader sees it.
//! - [`nodes`]: `granary nodes weight`, an admin sets a node's placement weight.
//! - [`connect`]: how the one-shot cluster commands (`dataset`, `status`) reach
//!   the coordinators.
//! - [`stats`]: `granary stats`, one node's counters.
//! - [`doctor`]: `granary doctor`, which stage bounds a running job.
//! - [`bench`](mod@bench): `granary bench local|placement|cluster|failover`;
//!   [`bench_scale`] prints `granary bench scale`.
//! - [`view`]: `granary view check`, a view against a source before deploying it.
//! - [`trainer`]: the hidden `granary trainer`, one rank driven by the demo
//!   and the benchmarks.
//!
//! The demo has several parts and lives in [`crate::demo`]. No file here
//! imports the crate root or a sibling that imports it back: `dataset` and
//! `status` use `connect`, and `status` prints `dataset`'s table.

pub(crate) mod bench;
pub(crate) mod bench_scale;
pub(crate) mod certs;
pub(crate) mod connect;
pub(crate) mod coordinator;
pub(crate) mod dataset;
pub(crate) mod doctor;
pub(crate) mod node;
pub(crate) mod nodes;
pub(crate) mod stats;
pub(crate) mod status;
pub(crate) mod trainer;
pub(crate) mod view;

/// Writes `text` to stdout. A reader that went away (`granary stats |
/// head -1`) ends the process quietly with the status a closed pipe's
/// SIGPIPE gives (141), never a panic; for commands that keep ignoring
/// SIGPIPE because they also write to a socket.
pub(crate) fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(141),
        other => Ok(other?),
    }
}
