//! `granary-chaos node --config node.toml`: a node daemon, the same as
//! `granary node` in every way but one: its peer server forges every chunk
//! it sends to another node (one value changed, checksums sealed again;
//! `granary_node::fabric::PeerAnswers::Forged`). It is the byzantine peer
//! of `granary-chaos run`: a node holding a valid certificate that lies,
//! which only the other nodes' `verify_peer_chunks` can catch.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

/// `granary-chaos node`.
#[derive(Args)]
pub(crate) struct NodeArgs {
    /// Path of node.toml.
    #[arg(long)]
    config: PathBuf,
}

/// Runs the forging daemon until SIGTERM or ctrl-c.
pub(crate) fn run(a: &NodeArgs) -> Result<()> {
    let cfg = granary_node::NodeConfig::load(&a.config)?;
    tracing::warn!(config = %a.config.display(), "a byzantine node: every chunk sent to a peer is forged");
    granary_node::process::run_daemon(&a.config, cfg, granary_node::fabric::PeerAnswers::Forged)
}
