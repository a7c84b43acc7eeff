//! # granary-node: one per GPU host
//!
//! The node turns Parquet on remote storage into converted chunks once, keeps
//! them in a RAM/SSD tier, and hands them to the trainers on its host.
//!
//! ## Module map (in the order data flows)
//! - [`config`] — `node.toml`.
//! - `granary_source` (its own crate, shared with the coordinator) —
//!   object_store sources, footers, dataset listing, manifest, version, and
//!   the view checked against a file's schema.
//! - `convert` — Arrow-to-chunk conversion (the view is resolved by `granary_source::schema`).
//! - `shm` — chunks in sealed memory files.
//! - `tier` — the foyer RAM/SSD tier.
//! - `load` — one shard read and converted here; the one panic guard.
//! - `service` — [`Node`]: lookup, single flight, load, prefetch.
//! - `session` — one trainer's session: the plan it follows and its requests.
//! - [`daemon`] — the Unix-socket endpoint for trainers.
//! - [`access`] — who may use that socket, and where it lives.
//!   Its connection table (the cap and who makes room) is a pure core,
//!   `granary_node_core::conns`; [`SocketLimits`] are its settings.
//! - [`embedded`] — in-process mode, implementing the client's source trait.
//! - `membership` — registering with the coordinators, lease renewal, the placement watch.
//! - [`fabric`] — the peer fabric: chunks of shards other nodes own, fetched from them over QUIC;
//!   its decisions (fetch route, stall clock) are pure cores in
//!   `granary_node_core`.
//! - `holds` — the versions this node's trainers use, held at the coordinator (pure core).
//! - `computed` — values the converter computes: hashed and crossed ids,
//!   transformed values.
//! - `content` — which chunk the tier holds for each content, so a new
//!   version that keeps an older one's file and view restamps its chunk
//!   instead of reading and converting it again.
//! - `granary_node_core` (its own crate: no tokio, no quinn) — the node's
//!   decisions: the engine of every load in flight (single flight, each
//!   load's route, the permit and placement waits; `service` executes its
//!   commands, and the chaos simulation drives the same engine), the fetch
//!   route, the stall clock, the prefetch window, the connection table.
//! - [`error`] — error types.
//! - [`metrics`] — the Prometheus registry (counters read at scrape time,
//!   latency histograms).
//! - [`decide`] — the pure decision cores, exported for the chaos
//!   simulation (`granary-chaos`), which runs them on a virtual clock and
//!   network; not needed to embed a node.
//!
//! A request flows `daemon` → [`Node::chunk`] → `tier` (hit) or a single
//! shared load: the source's `Remote` reads the row group's column chunks
//! (footers were read once by its `Dataset`), Parquet decodes them, `convert` writes the
//! tensors straight into a memory file from `shm`, which is sealed, handed to
//! every waiter, and inserted into the `tier`.

// The node exports what an embedding program needs: its configuration,
// the node and its embedded form, the daemon entry, the cluster handle and
// peer fabric, and errors. Everything else is the node's own business.
pub mod access;
mod computed;
pub mod config;
mod content;
mod convert;
pub mod daemon;
pub mod embedded;
pub mod error;
pub mod fabric;
mod holds;
mod load;
mod membership;
pub mod metrics;
pub mod process;
mod service;
mod session;
mod shm;
mod tier;
mod timings;

use granary_source::{dataset, remote};

/// The node's pure decision cores (no I/O, `now` as an argument): the
/// engine of the loads in flight, the fetch route of one load,
/// single-flight admission, the stall clock and the liveness probe. The node's async shells execute what they decide;
/// `granary-chaos` drives the same code on a simulated clock and network.
pub mod decide {
    pub use granary_node_core::engine::{
        Admitted, AwaitOutcome, Back, Command, Engine, PLACEMENT_WAIT, Permit, Placement, Timing, Waiting, moved_away,
    };
    pub use granary_node_core::flight::{
        Admission, Asked, Asker, InFlight, admit, reads_here_after_placement, start_for_peer,
    };
    pub use granary_node_core::route::{
        AfterPermit, AskFailure, FooterAnswer, LeaseView, MAX_OWNERS_ASKED, Owner, Route, Step, after_permit,
        answer_footer, may_read_as_owner,
    };
    pub use granary_node_core::stall::{LIVENESS_SAMPLE, LIVENESS_SLACK, Liveness, StallClock, TimerFired, Verdict};
}

pub use config::NodeConfig;
pub use embedded::EmbeddedNode;
pub use granary_node_core::conns::SocketLimits;
pub use membership::{JoinError, node_identity};
pub use service::{ClusterStanding, Follower, Node, PREFETCH_EPOCHS_AHEAD, Shared, StartError};
pub use session::Session;
pub use shm::{SealedChunk, live_chunk_bytes};
