//! The cluster subcommands: `coordinator`, `certs`, `dataset add/ls/show/
//! placement` and `status`. Each prints a readable table, or JSON with
//! `--json`.

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use granary_coordinator::types::VoterId;
use granary_coordinator::{Coordinator, CoordinatorConfig};
use granary_net::api::{ApiRequest, ApiResponse, ClusterStatus, DatasetSummary};
use granary_net::client::{ClientOptions, CoordinatorClient, parse_addrs};
use granary_net::tls::{self, Identity, Role};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `granary coordinator`.
#[derive(Args)]
pub struct CoordinatorArgs {
    /// This voter's id (a positive integer, unique in the group).
    #[arg(long)]
    id: u64,
    /// UDP address to serve Raft and the API on.
    #[arg(long, default_value = "127.0.0.1:7000")]
    listen: SocketAddr,
    /// Every voter of the group, this one included: `1=HOST:PORT,2=HOST:PORT,3=HOST:PORT`.
    /// Omit for a group of one.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<String>,
    /// Folder for the Raft log and snapshots.
    #[arg(long)]
    data_dir: PathBuf,
    /// Folder made by `granary certs init`.
    #[arg(long, env = "GRANARY_CERTS")]
    certs: PathBuf,
    /// Certificate name in that folder.
    #[arg(long, default_value = "coordinator")]
    cert_name: String,
    /// Node lease: a node whose heartbeats stop this long is expired.
    #[arg(long, default_value_t = 3000)]
    lease_ms: u64,
    /// Election timeout lower bound (the upper bound is 1.25 times it).
    #[arg(long, default_value_t = 500)]
    election_timeout_ms: u64,
    /// Leader heartbeat interval.
    #[arg(long, default_value_t = 100)]
    heartbeat_ms: u64,
    /// Snapshot and compact the log every this many entries.
    #[arg(long, default_value_t = 1000)]
    snapshot_entries: u64,
    /// Log entries kept behind a snapshot for lagging followers.
    #[arg(long, default_value_t = 100)]
    keep_log_entries: u64,
    /// object_store option for reading dataset sources, `KEY=VALUE` (repeatable).
    #[arg(long = "remote-option", value_delimiter = ',')]
    remote_options: Vec<String>,
    /// Print the ready line as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_peers(peers: &[String]) -> Result<BTreeMap<VoterId, String>> {
    let mut out = BTreeMap::new();
    for p in peers {
        let (id, addr) = p.split_once('=').with_context(|| format!("--peers entry {p:?}: expected ID=HOST:PORT"))?;
        let id: u64 = id.trim().parse().with_context(|| format!("--peers entry {p:?}: id is not a number"))?;
        addr.trim().parse::<SocketAddr>().with_context(|| format!("--peers entry {p:?}: bad address"))?;
        if out.insert(VoterId(id), addr.trim().to_string()).is_some() {
            bail!("--peers lists voter {id} twice");
        }
    }
    if !matches!(out.len(), 0 | 1 | 3 | 5) {
        bail!("--peers lists {} voters; a group has 1, 3 or 5", out.len());
    }
    Ok(out)
}

fn parse_kv(items: &[String]) -> Result<BTreeMap<String, String>> {
    items
        .iter()
        .map(|kv| {
            let (k, v) = kv.split_once('=').with_context(|| format!("{kv:?}: expected KEY=VALUE"))?;
            Ok((k.to_string(), v.to_string()))
        })
        .collect()
}

/// Runs one voter until SIGTERM or ctrl-c.
pub fn run_coordinator(a: CoordinatorArgs) -> Result<()> {
    if a.id == 0 {
        bail!("--id must be a positive integer");
    }
    let identity = Identity::load(&a.certs, &a.cert_name)?;
    let mut cfg = CoordinatorConfig::new(VoterId(a.id), a.listen, a.data_dir.clone(), identity);
    cfg.voters = parse_peers(&a.peers)?;
    cfg.lease = Duration::from_millis(a.lease_ms);
    cfg.election_timeout = Duration::from_millis(a.election_timeout_ms);
    cfg.heartbeat_interval = Duration::from_millis(a.heartbeat_ms);
    cfg.snapshot_after_entries = a.snapshot_entries;
    cfg.keep_log_entries = a.keep_log_entries;
    cfg.remote_options = parse_kv(&a.remote_options)?;
    // Four workers: Raft, the API and the lease clock keep running while one
    // worker applies a re-placement.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?;
    rt.block_on(async move {
        let coordinator = Coordinator::start(cfg).await?;
        let addr = coordinator.local_addr();
        if a.json {
            println!("{}", serde_json::json!({"event": "ready", "id": a.id, "addr": addr.to_string()}));
        } else {
            println!("coordinator voter-{} serving on {addr} (data in {})", a.id, a.data_dir.display());
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        coordinator.shutdown().await;
        tracing::info!("coordinator stopped");
        Ok(())
    })
}

/// `granary certs`.
#[derive(Subcommand)]
pub enum CertsCommand {
    /// Create a cluster CA and one certificate per role (coordinator, node, trainer, admin).
    Init {
        /// Folder to create.
        #[arg(long)]
        out: PathBuf,
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
pub fn certs(cmd: CertsCommand) -> Result<()> {
    let (files, json) = match cmd {
        CertsCommand::Init { out, json } => (tls::init_cluster(&out)?, json),
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

/// How to reach the coordinators.
#[derive(Args, Clone)]
pub struct ConnectArgs {
    /// Coordinator addresses, `HOST:PORT,...` (any voter; requests find the leader).
    #[arg(long, env = "GRANARY_COORDINATORS", value_delimiter = ',', required = true)]
    coordinators: Vec<String>,
    /// Folder made by `granary certs init`.
    #[arg(long, env = "GRANARY_CERTS")]
    certs: PathBuf,
    /// Certificate name in that folder.
    #[arg(long, default_value = "admin")]
    cert_name: String,
    /// Give up after this many milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Cluster-side dataset commands.
#[derive(Subcommand)]
pub enum ClusterDatasetCommand {
    /// Register a dataset: the leader lists the source, reads every footer and commits the manifest.
    Add {
        /// Dataset name.
        name: String,
        /// Source URL prefix (file://, s3://, gs://, http(s)://).
        #[arg(long)]
        source: String,
        /// View TOML file.
        #[arg(long)]
        view: PathBuf,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// List datasets.
    Ls {
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Show one dataset's current version, files and tensors.
    Show {
        /// Dataset name.
        name: String,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Show which node owns each shard of a dataset.
    Placement {
        /// Dataset name.
        name: String,
        #[command(flatten)]
        connect: ConnectArgs,
    },
}

fn client_call(connect: &ConnectArgs, req: ApiRequest) -> Result<ApiResponse> {
    let identity = Identity::load(&connect.certs, &connect.cert_name)?;
    let addrs = parse_addrs(&connect.coordinators)?;
    let options = ClientOptions { deadline: Duration::from_millis(connect.timeout_ms), ..Default::default() };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let client = CoordinatorClient::new(&identity, addrs, options)?;
        let (_, resp) = client.call(&req).await?;
        client.close();
        Ok(resp)
    })
}

fn print_datasets(list: &[DatasetSummary]) {
    println!("{:<20} {:<14} {:>5} {:>7} {:>12} {:>10}  source", "name", "version", "files", "shards", "rows", "MiB");
    for d in list {
        println!(
            "{:<20} {:<14} {:>5} {:>7} {:>12} {:>10.1}  {}",
            d.name,
            d.version.to_string(),
            d.files,
            d.shards,
            d.rows,
            d.source_bytes as f64 / (1 << 20) as f64,
            d.source
        );
    }
}

fn unexpected(resp: ApiResponse) -> anyhow::Error {
    anyhow::anyhow!("unexpected answer from the coordinator: {resp:?}")
}

/// Runs a cluster dataset command.
pub fn dataset(cmd: ClusterDatasetCommand) -> Result<()> {
    match cmd {
        ClusterDatasetCommand::Add { name, source, view, connect } => {
            let text = std::fs::read_to_string(&view).with_context(|| format!("reading view {}", view.display()))?;
            let parsed: granary_proto::View =
                toml::from_str(&text).with_context(|| format!("parsing view {}", view.display()))?;
            let parsed = parsed.validated().with_context(|| format!("view {}", view.display()))?;
            match client_call(&connect, ApiRequest::AddDataset { name, source, view: parsed })? {
                ApiResponse::DatasetAdded { summary, new } => {
                    if connect.json {
                        println!("{}", serde_json::json!({ "added": summary, "new": new }));
                    } else {
                        let what = if new { "registered" } else { "already current:" };
                        println!(
                            "{what} {} version {} ({} files, {} shards, {} rows)",
                            summary.name, summary.version, summary.files, summary.shards, summary.rows
                        );
                    }
                    Ok(())
                }
                other => Err(unexpected(other)),
            }
        }
        ClusterDatasetCommand::Ls { connect } => match client_call(&connect, ApiRequest::ListDatasets)? {
            ApiResponse::Datasets(list) => {
                if connect.json {
                    println!("{}", serde_json::to_string(&list)?);
                } else {
                    print_datasets(&list);
                }
                Ok(())
            }
            other => Err(unexpected(other)),
        },
        ClusterDatasetCommand::Show { name, connect } => {
            match client_call(&connect, ApiRequest::DescribeDataset { name })? {
                ApiResponse::Dataset { summary, manifest, view } => {
                    if connect.json {
                        println!("{}", serde_json::json!({ "summary": summary, "manifest": manifest, "view": view }));
                    } else {
                        print_datasets(std::slice::from_ref(&summary));
                        for t in &manifest.tensors {
                            println!("  tensor {:<12} {:?} {:?}", t.name, t.dtype, t.shape);
                        }
                        for f in &manifest.files {
                            println!("  {} ({} bytes, {} row groups)", f.path, f.size_bytes, f.row_groups.len());
                        }
                    }
                    Ok(())
                }
                other => Err(unexpected(other)),
            }
        }
        ClusterDatasetCommand::Placement { name, connect } => {
            match client_call(&connect, ApiRequest::DescribePlacement { name })? {
                ApiResponse::Placement(report) => {
                    if connect.json {
                        println!("{}", serde_json::to_string(&report)?);
                    } else {
                        println!(
                            "{} version {} placement epoch {}",
                            report.name, report.version, report.placement_epoch
                        );
                        let mut per: BTreeMap<u64, usize> = BTreeMap::new();
                        for (_, _, n) in &report.owners {
                            *per.entry(n.0).or_default() += 1;
                        }
                        for (n, c) in per {
                            println!("  node-{n}: {c} shards");
                        }
                    }
                    Ok(())
                }
                other => Err(unexpected(other)),
            }
        }
    }
}

/// `granary status`.
pub fn status(connect: ConnectArgs) -> Result<()> {
    match client_call(&connect, ApiRequest::Status)? {
        ApiResponse::Status(s) => {
            if connect.json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                print_status(&s);
            }
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

fn print_status(s: &ClusterStatus) {
    let leader = s.leader.map(|l| format!("voter-{l}")).unwrap_or_else(|| "none".into());
    println!(
        "leader {leader}, term {}, placement epoch {}, answered by voter-{}",
        s.term, s.placement_epoch, s.answered_by
    );
    for v in &s.voters {
        println!("  voter-{} {}", v.id, v.addr);
    }
    println!("nodes:");
    for n in &s.nodes {
        let lease = match (n.live, n.lease_left_ms) {
            (false, _) => "expired".to_string(),
            (true, Some(ms)) => format!("lease {ms} ms"),
            (true, None) => "live".to_string(),
        };
        println!(
            "  {} {} incarnation {} {lease}, {} shards, RAM {} MiB, SSD {} MiB",
            n.node,
            n.addr,
            n.incarnation,
            n.shards,
            n.ram_bytes >> 20,
            n.ssd_bytes >> 20
        );
    }
    println!("datasets:");
    print_datasets(&s.datasets);
}
