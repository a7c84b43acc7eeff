//! `granary node`: the node daemon. Starts the node, joins the cluster when
//! `node.toml` has a `[cluster]` table, and serves trainers on the local
//! socket until SIGTERM or ctrl-c; then it stops heartbeating and serving
//! peers, and closes the node.

use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

/// `granary node`.
#[derive(Args)]
pub(crate) struct NodeArgs {
    /// Path of node.toml.
    #[arg(long)]
    config: PathBuf,
    /// Check the configuration (its datasets' views and, in a cluster, the
    /// node's certificate and role), print what it sets up, and exit.
    #[arg(long)]
    check: bool,
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

/// `--check`: what a start would refuse, refused now, without starting.
fn check(path: &std::path::Path, cfg: &granary_node::NodeConfig) -> Result<()> {
    for d in &cfg.datasets {
        d.view().with_context(|| format!("{}: dataset {:?}", path.display(), d.name))?;
    }
    let mut lines = vec![format!("{}: ok", path.display())];
    let socket = match &cfg.socket {
        Some(s) => s.display().to_string(),
        None => "the default socket".to_string(),
    };
    lines.push(format!("  trainers connect to {socket}"));
    let ssd = match &cfg.ssd_dir {
        Some(dir) => format!("an SSD tier of {} in {}", gib(cfg.ssd_bytes), dir.display()),
        None => "no SSD tier".to_string(),
    };
    lines.push(format!("  a RAM tier of {}, {ssd}", gib(cfg.ram_bytes)));
    lines.push(format!("  {} dataset(s) of its own", cfg.datasets.len()));
    if let Some(c) = &cfg.cluster {
        let (_, node_id) = granary_node::node_identity(c)
            .with_context(|| format!("{}: [cluster] identity in {}", path.display(), c.certs.display()))?;
        lines.push(format!(
            "  node {} in the cluster of {}, peers reach it at {}",
            node_id.0,
            c.coordinators.join(", "),
            c.advertise
        ));
    }
    if let Some(m) = cfg.metrics {
        lines.push(format!("  metrics on http://{m}/metrics"));
    }
    println!("{}", lines.join("\n"));
    Ok(())
}

/// Caps glibc's malloc arenas for the daemon. Its many short-lived decode
/// buffers, allocated and freed on different runtime threads, otherwise
/// spread over one arena per thread that each keep their freed memory:
/// measured with a 128 MiB RAM tier, the daemon's anonymous memory went from
/// ~150 MiB to ~95 MiB with two arenas (docs/BENCHMARKS.md).
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; it is called before the
    // runtime starts any thread, and M_ARENA_MAX takes any positive value.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Runs the daemon until SIGTERM or ctrl-c.
pub(crate) fn run(a: &NodeArgs) -> Result<()> {
    let cfg = granary_node::NodeConfig::load(&a.config)?;
    if a.check {
        return check(&a.config, &cfg);
    }
    limit_malloc_arenas();
    let socket = match cfg.socket.clone() {
        Some(s) => s,
        None => granary_node::access::default_socket().map_err(|e| anyhow::anyhow!("{}: {e}", a.config.display()))?,
    };
    let allowed = granary_node::access::LocalAccess::new(cfg.allow_uids.clone(), cfg.allow_gids.clone());
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let node = granary_node::Node::start(&cfg).await?;
        let membership = match &cfg.cluster {
            Some(c) => {
                let ssd = if cfg.ssd_dir.is_some() { cfg.ssd_bytes } else { 0 };
                Some(granary_node::fabric::ClusterHandle::start(&node, c, cfg.ram_bytes, ssd)?)
            }
            None => None,
        };
        // Kept alive until the daemon stops.
        let _metrics = match cfg.metrics {
            Some(addr) => {
                let registry = std::sync::Arc::new(granary_node::metrics::registry(&node));
                Some(granary_net::metrics::MetricsServer::bind(addr, registry).await?)
            }
            None => None,
        };
        let shutdown = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
        };
        granary_node::daemon::serve(node.clone(), &socket, allowed, shutdown).await.with_context(|| format!("serving {}", socket.display()))?;
        if let Some(m) = membership {
            m.stop();
        }
        node.close().await;
        tracing::info!("node stopped");
        Ok(())
    })
}
