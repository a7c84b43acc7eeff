//! `granary certs init|issue`: the cluster's certificate authority and the
//! certificates of each role (coordinator, node, trainer, admin), written as
//! PEM files, one folder per identity: `ca/` (the CA key: keep it off the
//! hosts), `admin/` (the operator's), and under `hosts/` one folder per host
//! identity (`node-3/`, `coordinator-1/`, `trainer/`): each host is given
//! its own as `--certs`, and can be no other identity.

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use granary_net::tls::{self, Role};
use std::path::{Path, PathBuf};

/// `granary certs`.
#[derive(Subcommand)]
pub(crate) enum CertsCommand {
    /// Create a cluster CA and the certificates of each role, one folder per identity in OUT: `ca/` (the CA's
    /// key; keep it off the hosts), `admin/` (the admin identity; the operator's), and `hosts/NAME/` for each host
    /// identity (the CA certificate and that identity's key and certificate, nothing else: give each host its
    /// own folder as --certs).
    Init {
        /// Folder to create.
        #[arg(long)]
        out: PathBuf,
        /// Issue `hosts/node-1/` .. `hosts/node-N/`, each bound to its node
        /// id: with its folder a host may register, heartbeat and serve
        /// chunks only as that node. One more later: `granary certs issue
        /// --dir OUT/hosts/node-ID --role node --node-id ID`.
        #[arg(long, default_value_t = 0)]
        nodes: u64,
        /// Issue `hosts/coordinator-1/` .. `hosts/coordinator-M/`, each
        /// bound to its voter id: Raft accepts it only as that voter. One
        /// more later: `granary certs issue --dir OUT/hosts/coordinator-ID
        /// --role coordinator --voter-id ID`.
        #[arg(long, default_value_t = 0)]
        voters: u64,
        /// Also issue the shared, unbound `hosts/node/` and
        /// `hosts/coordinator/` identities, which may act as any node or
        /// voter where the coordinators allow it
        /// (--allow-unbound-node-certs, --allow-unbound-voter-certs). Off:
        /// one key lets a host be one identity.
        #[arg(long)]
        unbound: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Issue another identity into its own folder DIR, signed by the CA.
    Issue {
        /// The identity's folder (`OUT/hosts/node-5` for a node of `certs init --out OUT`): created if missing,
        /// with the CA certificate copied in. Refused if it holds another identity's key.
        #[arg(long)]
        dir: PathBuf,
        /// Folder holding the CA's certificate and key. Default: DIR itself if it holds `ca.key` (a folder of
        /// `granary_net::tls::init_cluster`), else the nearest `ca/` beside DIR or beside its parent (the layout
        /// of `certs init`).
        #[arg(long)]
        ca: Option<PathBuf>,
        /// coordinator, node, trainer or admin.
        #[arg(long)]
        role: Role,
        /// File name (NAME.pem, NAME.key). Default: DIR's own name.
        #[arg(long)]
        name: Option<String>,
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

/// The CA folder of `certs issue --dir DIR` without `--ca`: DIR if it holds `ca.key`, else the first `ca/` with a
/// `ca.key` beside DIR or beside its parent.
fn find_ca(dir: &Path) -> Result<PathBuf> {
    if dir.join("ca.key").exists() {
        return Ok(dir.to_path_buf());
    }
    let candidates: Vec<PathBuf> = dir.ancestors().skip(1).take(2).map(|p| p.join(tls::CA_FOLDER)).collect();
    candidates.iter().find(|c| c.join("ca.key").exists()).cloned().with_context(|| {
        let looked: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
        format!(
            "no CA key (ca.key) in {} nor in {}: name the CA's folder with --ca",
            dir.display(),
            looked.join(" or ")
        )
    })
}

/// Runs a `certs` subcommand.
pub(crate) fn run(cmd: CertsCommand) -> Result<()> {
    let (files, json) = match cmd {
        CertsCommand::Init { out, nodes, voters, unbound, json } => {
            let files = tls::init_split(&out, tls::SplitPlan { nodes, voters, unbound })?;
            if !json {
                let hosts = out.join(tls::HOSTS_FOLDER);
                println!(
                    "{}/: the CA's certificate and key; keep it off the hosts (certs issue signs with it)",
                    out.join(tls::CA_FOLDER).display()
                );
                println!(
                    "{}/: the admin identity (dataset add); the operator's",
                    out.join(tls::ADMIN_FOLDER).display()
                );
                let mut folders: Vec<String> = std::fs::read_dir(&hosts)
                    .with_context(|| format!("listing {}", hosts.display()))?
                    .filter_map(|e| e.ok().and_then(|e| e.file_name().into_string().ok()))
                    .collect();
                folders.sort();
                println!(
                    "{}/{{{}}}/: one identity each; give each host only its own folder as --certs",
                    hosts.display(),
                    folders.join(",")
                );
            }
            (files, json)
        }
        CertsCommand::Issue { dir, ca, role, name, node_id, voter_id, json } => {
            match (role, node_id, voter_id) {
                (Role::Node, _, Some(_)) => {
                    bail!("--voter-id binds a coordinator certificate; a node's takes --node-id")
                }
                (Role::Coordinator, Some(_), _) => {
                    bail!("--node-id binds a node certificate; a coordinator's takes --voter-id")
                }
                _ => {}
            }
            let name = match name {
                Some(n) => n,
                None => dir.file_name().and_then(|n| n.to_str()).map(str::to_owned).with_context(|| {
                    format!("{}: no folder name to name the identity by; pass --name", dir.display())
                })?,
            };
            let ca = match ca {
                Some(ca) => ca,
                None => find_ca(&dir)?,
            };
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
