//! The simulated cluster's settings (the fabric's and the coordinator's
//! defaults as the simulation times them), a shard's true checksum, and a
//! node's address: what the simulated nodes (`node.rs`) and the invariant
//! checks (`check.rs`) share, in a file neither imports the other for.

use super::world::{Micros, ms};
use std::net::SocketAddr;
use std::time::Duration;

/// The fabric's fetch deadline and reroute wait (`FabricConfig` defaults).
pub const FETCH_DEADLINE: Duration = Duration::from_secs(30);
/// How long a load waits for the placement to move a failed owner's shard.
pub const REROUTE_WAIT: Duration = Duration::from_secs(10);
/// How long a failed peer is not dialed again (`FabricConfig::down_for`).
pub const DOWN_FOR: Micros = ms(2_000);
/// How long a dial waits for its handshake (`FabricConfig::connect_timeout`).
pub const CONNECT_TIMEOUT: Micros = ms(3_000);
/// The coordinator's lease (its default).
pub const LEASE: Micros = ms(3_000);
/// How long a node asked for a held copy may take to answer
/// (`FabricConfig::handoff_wait`).
pub const HANDOFF_WAIT: Micros = ms(1_000);

/// A shard's true checksum.
pub fn checksum(shard: u32) -> u64 {
    granary_proto::rng::seed_of(&[0xC4A0_5000, shard as u64])
}

/// The address a node serves peers at.
pub fn addr_of(node: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, node as u8 + 1], 7000))
}
