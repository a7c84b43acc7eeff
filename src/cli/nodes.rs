//! `granary nodes weight`: an admin sets a node's placement weight (its
//! share of the shards against the other nodes' weights). A node's own
//! registration does not weigh it (issue 29): every node weighs the default
//! until an admin says otherwise.

use super::connect::{ConnectArgs, call, unexpected};
use anyhow::{Result, bail};
use clap::Subcommand;
use granary_net::api::{ApiRequest, ApiResponse};
use granary_proto::NodeId;

/// `granary nodes`.
#[derive(Subcommand)]
pub(crate) enum NodesCommand {
    /// Set a node's placement weight (admin identity), or give it the
    /// default back with --default. Every node weighs 100 until set.
    Weight {
        /// The node id.
        #[arg(long)]
        node: u64,
        /// Its weight, at least 1 (a node of weight 200 takes twice the
        /// shards of one of 100).
        #[arg(long, required_unless_present = "default", conflicts_with = "default")]
        weight: Option<u64>,
        /// Back to the default weight.
        #[arg(long)]
        default: bool,
        /// How to reach the coordinators.
        #[command(flatten)]
        connect: ConnectArgs,
    },
}

/// Runs a `nodes` subcommand.
pub(crate) fn run(cmd: NodesCommand) -> Result<()> {
    match cmd {
        NodesCommand::Weight { node, weight, default: _, connect } => {
            if weight == Some(0) {
                bail!("--weight must be at least 1");
            }
            match call(&connect, ApiRequest::SetNodeWeight { node: NodeId(node), weight })? {
                ApiResponse::WeightSet { placement_epoch } => {
                    if connect.json {
                        println!(
                            "{}",
                            serde_json::json!({ "node": node, "weight": weight, "placement_epoch": placement_epoch })
                        );
                    } else {
                        let w = weight.map_or_else(|| "the default".to_string(), |w| w.to_string());
                        println!("node-{node} weighs {w}; placement epoch {placement_epoch}");
                    }
                    Ok(())
                }
                other => Err(unexpected(other)),
            }
        }
    }
}
