//! The simulated cluster's settings (the fabric's as a node runs them by
//! default, `FabricConfig::default()`, and the coordinator's lease), a
//! shard's true checksum, and a node's address: what the simulated nodes
//! (`node/`) and the invariant checks (`check.rs`) share, in a file
//! neither imports the other for.

use super::world::{Micros, ms};
use granary_node::fabric::FabricConfig;
use std::net::SocketAddr;
use std::sync::LazyLock;
use std::time::Duration;

/// The fabric's settings the simulated nodes run: a node's defaults, so
/// the simulation times what a deployment times.
pub fn fabric() -> &'static FabricConfig {
    static FABRIC: LazyLock<FabricConfig> = LazyLock::new(FabricConfig::default);
    &FABRIC
}

/// A duration in simulated microseconds.
pub fn micros(d: Duration) -> Micros {
    Micros::try_from(d.as_micros()).unwrap_or(Micros::MAX)
}

/// The fabric's fetch deadline: every ask of one load ends within it.
pub fn fetch_deadline() -> Duration {
    fabric().fetch_deadline
}

/// How long a failed peer is not dialed again (`FabricConfig::down_for`).
pub fn down_for() -> Micros {
    micros(fabric().down_for)
}

/// How long a dial waits for its handshake (`FabricConfig::connect_timeout`).
pub fn connect_timeout() -> Micros {
    micros(fabric().connect_timeout)
}

/// How long a node asked for a held copy may take to answer
/// (`FabricConfig::handoff_wait`).
pub fn handoff_wait() -> Micros {
    micros(fabric().handoff_wait)
}

/// The load permits of a node (`NodeConfig::max_concurrent_loads`, its
/// default): a node reads at most this many shards at once, and the
/// others queue.
pub fn load_permits() -> usize {
    granary_node::NodeConfig::default().max_concurrent_loads.max(1)
}

/// The coordinator's lease (its default).
pub const LEASE: Micros = ms(3_000);

/// A shard's true checksum.
pub fn checksum(shard: u32) -> u64 {
    granary_proto::rng::seed_of(&[0xC4A0_5000, shard as u64])
}

/// The address a node serves peers at.
pub fn addr_of(node: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, node as u8 + 1], 7000))
}
