//! `granary stats`: one node's counters, read over its local socket, as
//! `Debug` output or as one JSON object with `--json`.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

/// `granary stats`.
#[derive(Args)]
pub(crate) struct StatsArgs {
    /// The node's socket.
    #[arg(long)]
    socket: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Prints the counters once.
pub(crate) fn run(a: &StatsArgs) -> Result<()> {
    let s = granary_client::LocalSource::connect(&a.socket)?.stats()?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "remote_bytes": s.remote_bytes, "remote_requests": s.remote_requests,
                "conversions": s.conversions, "converted_bytes": s.converted_bytes,
                "ram_hits": s.ram_hits, "ssd_hits": s.ssd_hits, "misses": s.misses, "joined": s.joined,
                "corrupt_entries": s.corrupt_entries, "prefetched": s.prefetched,
                "chunk_memory_bytes": s.chunk_memory_bytes,
                "peer_fetched": s.peer_fetched, "peer_fetched_bytes": s.peer_fetched_bytes,
                "peer_failures": s.peer_failures, "peer_served": s.peer_served,
                "guest_hits": s.guest_hits, "guest_bytes": s.guest_bytes,
            })
        );
    } else {
        println!("{s:#?}");
    }
    Ok(())
}
