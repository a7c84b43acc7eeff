//! The node daemon as a process ([`run_daemon`]): the node, its place in
//! the cluster when `node.toml` has a `[cluster]` table, the metrics
//! endpoint, and the trainers' socket until SIGTERM or ctrl-c; then it
//! stops heartbeating and serving peers, and closes the node. `granary
//! node` runs it; so does `granary-chaos node` (a byzantine peer, with
//! [`PeerAnswers::Forged`]).

use crate::config::NodeConfig;
use crate::fabric::PeerAnswers;
use anyhow::{Context, Result};
use std::path::Path;

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

/// Runs the daemon `cfg` (read from `path`, named in errors) describes
/// until SIGTERM or ctrl-c, its peer server sending chunks as `answers`
/// says.
pub fn run_daemon(path: &Path, cfg: NodeConfig, answers: PeerAnswers) -> Result<()> {
    limit_malloc_arenas();
    let socket = match cfg.socket.clone() {
        Some(s) => s,
        None => crate::access::default_socket().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
    };
    let allowed = crate::access::LocalAccess::new(cfg.allow_uids.clone(), cfg.allow_gids.clone());
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let node = crate::Node::start(&cfg).await?;
        let membership = match &cfg.cluster {
            Some(c) => {
                let ssd = if cfg.ssd_dir.is_some() { cfg.ssd_bytes } else { 0 };
                Some(crate::fabric::ClusterHandle::start_with(&node, c, cfg.ram_bytes, ssd, answers)?)
            }
            None => None,
        };
        // Kept alive until the daemon stops.
        let _metrics = match cfg.metrics {
            Some(addr) => {
                let registry = std::sync::Arc::new(crate::metrics::registry(&node));
                let ready = match &membership {
                    Some(m) => m.readiness(),
                    None => std::sync::Arc::new(|| Ok("serving alone".to_string())),
                };
                Some(granary_net::metrics::MetricsServer::bind_with(addr, registry, ready).await?)
            }
            None => None,
        };
        // A fatal misconfiguration found while running (another daemon
        // holds this node's identity) stops the daemon with an error, so
        // an orchestrator restarts and alerts (issue 48).
        let mut fatal = membership.as_ref().map(|m| m.fatal());
        let shutdown = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
                _ = async { match fatal.as_mut() { Some(f) => { let _ = f.wait_for(Option::is_some).await; } None => std::future::pending().await } } => {}
            }
        };
        crate::daemon::serve(node.clone(), &socket, allowed, shutdown)
            .await
            .with_context(|| format!("serving {}", socket.display()))?;
        let fatal = membership.as_ref().and_then(|m| m.fatal().borrow().clone());
        if let Some(m) = membership {
            m.stop();
        }
        node.close().await;
        if let Some(why) = fatal {
            anyhow::bail!("this node cannot be in the cluster: {why}");
        }
        tracing::info!("node stopped");
        Ok(())
    })
}
