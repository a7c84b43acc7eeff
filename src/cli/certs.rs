//! `granary certs init|issue`: the cluster's certificate authority and the
//! certificates of each role (coordinator, node, trainer, admin), written as
//! PEM files into three folders: `ca/` (the CA key: keep it off the hosts),
//! `admin/` (the operator's), `hosts/` (what hosts take as `--certs`).

use anyhow::Result;
use clap::Subcommand;
use granary_net::tls::{self, Role};
use std::path::PathBuf;

/// `granary certs`.
#[derive(Subcommand)]
pub(crate) enum CertsCommand {
    /// Create a cluster CA and the certificates of each role, in three folders of OUT: `ca/` (the CA's key; keep
    /// it off the hosts), `admin/` (the admin identity; the operator's), `hosts/` (coordinator, node and trainer
    /// certificates; give hosts this one as --certs).
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
    /// Issue another certificate into DIR, signed by the CA.
    Issue {
        /// Folder to write it into (`hosts/` or `admin/` of `certs init`; created if missing, with the CA
        /// certificate copied in).
        #[arg(long)]
        dir: PathBuf,
        /// Folder holding the CA's certificate and key. Default: DIR itself if it holds `ca.key` (a folder of
        /// `granary_net::tls::init_cluster`), else `ca/` beside DIR (the layout of `certs init`).
        #[arg(long)]
        ca: Option<PathBuf>,
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
            let files = tls::init_split(&out, nodes, voters)?;
            if !json {
                println!(
                    "{}/: the CA's certificate and key; keep it off the hosts (certs issue --ca signs with it)",
                    out.join(tls::CA_FOLDER).display()
                );
                println!(
                    "{}/: the admin identity (dataset add); the operator's",
                    out.join(tls::ADMIN_FOLDER).display()
                );
                println!(
                    "{}/: what coordinators, nodes and trainers take as --certs",
                    out.join(tls::HOSTS_FOLDER).display()
                );
            }
            (files, json)
        }
        CertsCommand::Issue { dir, ca, role, name, node_id, voter_id, json } => {
            match (role, node_id, voter_id) {
                (Role::Node, _, Some(_)) => {
                    anyhow::bail!("--voter-id binds a coordinator certificate; a node's takes --node-id")
                }
                (Role::Coordinator, Some(_), _) => {
                    anyhow::bail!("--node-id binds a node certificate; a coordinator's takes --voter-id")
                }
                _ => {}
            }
            let ca = ca.unwrap_or_else(|| {
                let beside = dir.parent().map(|p| p.join(tls::CA_FOLDER));
                match beside {
                    Some(b) if !dir.join("ca.key").exists() && b.join("ca.key").exists() => b,
                    _ => dir.clone(),
                }
            });
            let (c, k) = tls::issue_from(&ca, &dir, role, &name, node_id.or(voter_id))?;
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
