//! `granary coordinator`: one voter of the coordinator group (Raft over
//! QUIC), serving the cluster API on the same address until SIGTERM or
//! ctrl-c. The flags map one to one onto [`CoordinatorConfig`]; this file
//! only parses and checks them (`--peers`, `--remote-option`) and prints the
//! ready line that scripts and the process tests wait for.

use anyhow::{Context, Result, bail};
use clap::Args;
use granary_coordinator::types::VoterId;
use granary_coordinator::{Coordinator, CoordinatorConfig};
use granary_net::tls::Identity;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `granary coordinator`.
#[derive(Args)]
pub(crate) struct CoordinatorArgs {
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
    /// This voter's identity folder of `granary certs init` (`hosts/coordinator-ID/`).
    #[arg(long, env = "GRANARY_CERTS")]
    certs: PathBuf,
    /// Certificate name in that folder. Default: `coordinator` if the folder holds it, else the folder's one
    /// identity.
    #[arg(long)]
    cert_name: Option<String>,
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
    /// Let node certificates that name no node id register (as any node).
    /// Without it a node needs a certificate bound to its id.
    #[arg(long)]
    allow_unbound_node_certs: bool,
    /// Let coordinator certificates that name no voter id speak Raft (as
    /// any voter). Without it, in a group of more than one voter, each
    /// voter needs a certificate bound to its id (`certs init --voters N`).
    #[arg(long)]
    allow_unbound_voter_certs: bool,
    /// Seconds an older dataset version that no trainer uses is kept
    /// before it is collected (coordinator state and nodes' tiers).
    #[arg(long, default_value_t = 24 * 3600)]
    version_retention_s: u64,
    /// Seconds the record of a node that is not live is kept before it is
    /// collected (a node that comes back later registers anew).
    #[arg(long, default_value_t = 24 * 3600)]
    node_retention_s: u64,
    /// MiB of large API answers (over 4 KiB) written and not yet
    /// acknowledged by their clients, at most; past it answers wait, then
    /// are answered "unavailable".
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    response_budget_mib: u64,
    /// Milliseconds a client may take to acknowledge an API answer before
    /// it is abandoned and its stream reset.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    response_write_wait_ms: u64,
    /// Serve Prometheus metrics (`GET /metrics`) on this TCP address, for
    /// example 127.0.0.1:9465.
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// Print the ready line as JSON.
    #[arg(long)]
    json: bool,
}

/// Checks `HOST:PORT`: an IP address with a port, or a host name (resolved
/// when a voter dials it, so a Kubernetes service name works) with a port.
fn check_host_port(addr: &str) -> Result<()> {
    if addr.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let (host, port) = addr.rsplit_once(':').context("expected HOST:PORT")?;
    port.parse::<u16>().with_context(|| format!("port {port:?} is not a number from 0 to 65535"))?;
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .split('.')
            .all(|l| !l.is_empty() && l.len() <= 63 && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    if !name_ok {
        bail!("{host:?} is neither an IP address nor a host name");
    }
    Ok(())
}

/// Parses `--peers` (`ID=HOST:PORT` entries) and checks the group's size.
fn parse_peers(peers: &[String]) -> Result<BTreeMap<VoterId, String>> {
    let mut out = BTreeMap::new();
    for p in peers {
        let (id, addr) = p.split_once('=').with_context(|| format!("--peers entry {p:?}: expected ID=HOST:PORT"))?;
        let id: u64 = id.trim().parse().with_context(|| format!("--peers entry {p:?}: id is not a number"))?;
        check_host_port(addr.trim()).with_context(|| format!("--peers entry {p:?}: bad address"))?;
        if out.insert(VoterId(id), addr.trim().to_string()).is_some() {
            bail!("--peers lists voter {id} twice");
        }
    }
    if !matches!(out.len(), 0 | 1 | 3 | 5) {
        bail!("--peers lists {} voters; a group has 1, 3 or 5", out.len());
    }
    Ok(out)
}

/// Parses `KEY=VALUE` items (`--remote-option`).
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
pub(crate) fn run(a: CoordinatorArgs) -> Result<()> {
    if a.id == 0 {
        bail!("--id must be a positive integer");
    }
    let (identity, _) = Identity::load_in(&a.certs, a.cert_name.as_deref(), "coordinator")?;
    let mut cfg = CoordinatorConfig::new(VoterId(a.id), a.listen, a.data_dir.clone(), identity);
    cfg.voters = parse_peers(&a.peers)?;
    cfg.lease = Duration::from_millis(a.lease_ms);
    cfg.election_timeout = Duration::from_millis(a.election_timeout_ms);
    cfg.heartbeat_interval = Duration::from_millis(a.heartbeat_ms);
    cfg.snapshot_after_entries = a.snapshot_entries;
    cfg.keep_log_entries = a.keep_log_entries;
    cfg.remote_options = parse_kv(&a.remote_options)?;
    cfg.allow_unbound_node_certs = a.allow_unbound_node_certs;
    cfg.allow_unbound_voter_certs = a.allow_unbound_voter_certs;
    cfg.version_retention = Duration::from_secs(a.version_retention_s);
    cfg.node_retention = Duration::from_secs(a.node_retention_s);
    cfg.response_budget_bytes = a.response_budget_mib << 20;
    cfg.response_write_wait = Duration::from_millis(a.response_write_wait_ms);
    // Four workers: Raft, the API and the lease clock keep running while one
    // worker applies a re-placement.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?;
    rt.block_on(async move {
        let coordinator = Coordinator::start(cfg).await?;
        let addr = coordinator.local_addr();
        // Kept alive until the voter stops.
        let _metrics = match a.metrics {
            Some(at) => {
                let registry = std::sync::Arc::new(coordinator.metrics_registry());
                Some(granary_net::metrics::MetricsServer::bind_with(at, registry, coordinator.readiness()).await?)
            }
            None => None,
        };
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
