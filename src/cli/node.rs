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

/// Runs the daemon until SIGTERM or ctrl-c.
pub(crate) fn run(a: &NodeArgs) -> Result<()> {
    let cfg = granary_node::NodeConfig::load(&a.config)?;
    if a.check {
        return check(&a.config, &cfg);
    }
    granary_node::process::run_daemon(&a.config, cfg, granary_node::fabric::PeerAnswers::Honest)
}
