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
        #[arg(long)]
        node_id: Option<u64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a `certs` subcommand.
pub(crate) fn run(cmd: CertsCommand) -> Result<()> {
    let (files, json) = match cmd {
        CertsCommand::Init { out, nodes, json } => {
            let mut files = tls::init_cluster(&out)?;
            for id in 1..=nodes {
                let (c, k) = tls::issue_bound(&out, Role::Node, &format!("node-{id}"), Some(id))?;
                files.extend([c, k]);
            }
            (files, json)
        }
        CertsCommand::Issue { dir, role, name, node_id, json } => {
            let (c, k) = tls::issue_bound(&dir, role, &name, node_id)?;
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
