//! `granary doctor`: attached to a running node while its trainers read, it
//! measures for a few seconds where each rank's time goes and prints one
//! verdict naming the stage that bounds throughput, the numbers behind it
//! and the setting that would help (`--json`: the whole diagnosis).
//!
//! It reads the node's snapshot twice ([`granary_proto::doctor`]) and
//! leaves the verdict to the pure [`granary_proto::doctor::diagnose`].

use anyhow::{Context, Result, bail};
use clap::Args;
use granary_proto::doctor::{Diagnosis, diagnose};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `granary doctor`.
#[derive(Args)]
pub(crate) struct DoctorArgs {
    /// The node's socket (default: the node's default socket).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// How long to measure, in seconds.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Print the diagnosis as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Measures, then prints the diagnosis.
pub(crate) fn run(a: &DoctorArgs) -> Result<()> {
    if !(a.seconds > 0.0 && a.seconds <= 3600.0) {
        bail!("--seconds must be between 0 and 3600, not {}", a.seconds);
    }
    let socket = match &a.socket {
        Some(s) => s.clone(),
        None => granary_node::access::default_socket().map_err(|e| anyhow::anyhow!("{e}; name it with --socket"))?,
    };
    let node = granary_client::LocalSource::connect(&socket)
        .with_context(|| format!("connecting to the node at {}", socket.display()))?;
    let before = node.doctor().with_context(|| format!("asking the node at {}", socket.display()))?;
    let window = Duration::from_secs_f64(a.seconds);
    let started = Instant::now();
    // Progress on stderr, one dot a second, so stdout stays the result.
    let mut err = std::io::stderr();
    let _ = write!(err, "measuring {} for {:.0} s while its trainers run ", socket.display(), a.seconds);
    while started.elapsed() < window {
        std::thread::sleep((window - started.elapsed()).min(Duration::from_secs(1)));
        let _ = write!(err, ".");
        let _ = err.flush();
    }
    let _ = writeln!(err);
    let after = node.doctor().with_context(|| format!("asking the node at {}", socket.display()))?;
    let d = diagnose(&before, &after);
    if a.json {
        super::emit(&format!("{}\n", serde_json::to_string(&d)?))?;
    } else {
        super::emit(&human(&d))?;
    }
    Ok(())
}

fn pct(share: f64) -> String {
    format!("{:.0}%", (share * 100.0).clamp(0.0, 100.0))
}

/// The diagnosis as a person reads it: the verdict first, then the numbers.
fn human(d: &Diagnosis) -> String {
    let mut out = format!("verdict: {}\n  {}\n  {}\n", d.stage.name(), d.verdict, d.advice);
    if !d.ranks.is_empty() {
        out += &format!(
            "\nranks over {:.1} s:\n  {:<12} {:>5} {:>10} {:>8} {:>9} {:>11} {:>14}\n",
            d.window_s, "dataset", "rank", "batches/s", "waiting", "training", "chunk wait", "assembly busy"
        );
        for r in &d.ranks {
            out += &format!(
                "  {:<12} {:>5} {:>10.1} {:>8} {:>9} {:>11} {:>9} ({})\n",
                r.dataset,
                r.rank,
                r.batches_per_s,
                pct(r.waiting),
                pct(r.training),
                pct(r.chunk_wait),
                pct(r.assembly_busy),
                r.assembly_threads
            );
        }
    }
    let n = &d.node;
    out += &format!(
        "\nnode, seconds of work per second: remote read {:.2} ({:.1} MB/s), convert queue {:.2}, conversion {:.2}, peer fetch {:.2}; chunk requests {:.1} ms on average\n",
        n.remote_read,
        n.remote_bytes_per_s / 1e6,
        n.convert_wait,
        n.conversion,
        n.peer_fetch,
        n.chunk_request_ms
    );
    out
}
