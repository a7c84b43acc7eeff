//! `granary certs init|issue`: the cluster's certificate authority and the
//! certificates of each role (coordinator, node, trainer, admin), written as
//! PEM files into one folder that the cluster commands take as `--certs`.

use anyhow::Result;
use clap::Subcommand;
use granary_net::tls::{self, Role};
use std::path::PathBuf;

/// `granary certs`.
#[derive(Subcommand)]
pub(crate) enum CertsCommand {
    /// Create a cluster CA and one certificate per role (coordinator, node, trainer, admin).
    Init {
        /// Folder to create.
        #[arg(long)]
        out: PathBuf,
        /// Also issue `node-1` .. `node-N`, each bound to its node id (the
        /// coordinator refuses node certificates that name no id unless
        /// started with --allow-unbound-node-certs). One more later:
        /// `granary certs issue --dir DIR --role node --name node-ID --node-id ID`.
        #[arg(long, default_value_t = 0)]
        nodes: u64,
        /// Also issue `coordinator-1` .. `coordinator-M`, each bound to its
        /// voter id (in a group of more than one voter, Raft refuses
        /// coordinator certificates that name no voter id unless every
        /// voter runs with --allow-unbound-voter-certs); start voter ID
        /// with `--cert-name coordinator-ID`. One more later: `granary
        /// certs issue --dir DIR --role coordinator --name coordinator-ID
        /// --voter-id ID`.
        #[arg(long, default_value_t = 0)]
        voters: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Issue another certificate from the CA in DIR.
    Issue {
        /// Folder made by `certs init`.
        #[arg(long)]
        dir: PathBuf,
        /// coordinator, node, trainer or admin.
        #[arg(long)]
        role: Role,
        /// File name (NAME.pem, NAME.key).
        #[arg(long)]
        name: String,
        /// Bind a node certificate to this node id: it may register and heartbeat only as that node.
        #[arg(long, conflicts_with = "voter_id")]
        node_id: Option<u64>,
        /// Bind a coordinator certificate to this voter id: Raft accepts it only as that voter.
        #[arg(long)]
        voter_id: Option<u64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a `certs` subcommand.
pub(crate) fn run(cmd: CertsCommand) -> Result<()> {
    let (files, json) = match cmd {
        CertsCommand::Init { out, nodes, voters, json } => {
            let mut files = tls::init_cluster(&out)?;
            for id in 1..=nodes {
                let (c, k) = tls::issue_bound(&out, Role::Node, &format!("node-{id}"), Some(id))?;
                files.extend([c, k]);
            }
            for id in 1..=voters {
                let (c, k) = tls::issue_bound(&out, Role::Coordinator, &format!("coordinator-{id}"), Some(id))?;
                files.extend([c, k]);
            }
            (files, json)
        }
        CertsCommand::Issue { dir, role, name, node_id, voter_id, json } => {
            match (role, node_id, voter_id) {
                (Role::Node, _, Some(_)) => {
                    anyhow::bail!("--voter-id binds a coordinator certificate; a node's takes --node-id")
                }
                (Role::Coordinator, Some(_), _) => {
                    anyhow::bail!("--node-id binds a node certificate; a coordinator's takes --voter-id")
                }
                _ => {}
            }
            let (c, k) = tls::issue_bound(&dir, role, &name, node_id.or(voter_id))?;
            (vec![c, k], json)
        }
    };
    if json {
        let files: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
        println!("{}", serde_json::json!({ "written": files }));
    } else {
        for f in files {
            println!("wrote {}", f.display());
        }
    }
    Ok(())
}
