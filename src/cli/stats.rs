//! `granary stats`: one node's counters, read over its local socket, one
//! concern per line, or as one JSON object with `--json`.

use anyhow::Result;
use clap::Args;
use granary_proto::wire::NodeStats;
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
    let source = granary_client::LocalSource::connect(&a.socket)?;
    let s = source.stats()?;
    // Counters by name, from a node of local protocol 3 or newer; an older
    // node has none of them.
    let more = match source.counters() {
        Ok(more) => more,
        Err(granary_client::ClientError::Version { .. }) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    if a.json {
        let mut more_json = serde_json::Map::new();
        for (name, value) in &more {
            more_json.insert(name.clone(), (*value).into());
        }
        super::emit(&format!(
            "{}\n",
            serde_json::json!({
                "remote_bytes": s.remote_bytes, "remote_requests": s.remote_requests,
                "conversions": s.conversions, "converted_bytes": s.converted_bytes,
                "ram_hits": s.ram_hits, "ssd_hits": s.ssd_hits, "misses": s.misses, "joined": s.joined,
                "corrupt_entries": s.corrupt_entries, "prefetched": s.prefetched,
                "chunk_memory_bytes": s.chunk_memory_bytes,
                "peer_fetched": s.peer_fetched, "peer_fetched_bytes": s.peer_fetched_bytes,
                "peer_failures": s.peer_failures, "peer_served": s.peer_served, "peer_refused": s.peer_refused,
                "guest_hits": s.guest_hits, "guest_bytes": s.guest_bytes,
                "peer_verified": s.peer_verified, "peer_mismatched": s.peer_mismatched,
                "peers_quarantined": s.peers_quarantined,
                "loads_in_flight": s.loads_in_flight,
                "counters": more_json,
            })
        ))?;
    } else {
        super::emit(&human(&s, &more))?;
    }
    Ok(())
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// The counters as a person reads them: one concern per line (`more`:
/// the counters a node reports by name).
fn human(s: &NodeStats, more: &[(String, u64)]) -> String {
    let requests = s.ram_hits + s.ssd_hits + s.guest_hits + s.misses + s.joined;
    let mut o = String::new();
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:<16}{v}\n"));
    line(
        "remote storage",
        format!(
            "{} in {} requests; footers: {} read, {} from peers",
            mib(s.remote_bytes),
            s.remote_requests,
            s.remote_footers,
            s.peer_footers
        ),
    );
    line("conversions", format!("{} ({} converted)", s.conversions, mib(s.converted_bytes)));
    line(
        "chunk requests",
        format!(
            "{requests}: {} RAM, {} SSD, {} guest copies, {} joined a load, {} started one",
            s.ram_hits, s.ssd_hits, s.guest_hits, s.joined, s.misses
        ),
    );
    line(
        "peer fabric",
        format!(
            "{} fetched ({}), {} failed; {} asked by peers, {} of them refused (not this node's)",
            s.peer_fetched,
            mib(s.peer_fetched_bytes),
            s.peer_failures,
            s.peer_served,
            s.peer_refused
        ),
    );
    line(
        "peer checks",
        format!(
            "{} peer chunks verified, {} differed; {} peers quarantined",
            s.peer_verified, s.peer_mismatched, s.peers_quarantined
        ),
    );
    line(
        "now",
        format!(
            "{} loads in flight; {} in chunk memory, {} of it guest copies",
            s.loads_in_flight,
            mib(s.chunk_memory_bytes),
            mib(s.guest_bytes)
        ),
    );
    if let Some(standing) = cluster_line(more) {
        line("cluster", standing);
    }
    if let Some((_, reused)) = more.iter().find(|(n, _)| n == "chunks_reused") {
        line("reuse", format!("{reused} shards served from another version's chunk of the same content"));
    }
    line("other", format!("{} prefetched, {} corrupt SSD entries re-read", s.prefetched, s.corrupt_entries));
    o
}

/// A cluster node's standing from its counters (issue 48); None for a
/// node alone or one too old to say.
fn cluster_line(more: &[(String, u64)]) -> Option<String> {
    let get = |name: &str| more.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    get("in_cluster")?;
    let epoch = get("placement_epoch").unwrap_or(0);
    Some(match (get("registered"), get("lease_left_ms"), get("since_renewal_ms")) {
        (Some(1), Some(0), Some(since)) => {
            format!("registered, but the lease ran out: no heartbeat answered for {since} ms; placement epoch {epoch}")
        }
        (Some(1), Some(left), Some(since)) => {
            format!("registered, lease {left} ms left (heartbeat answered {since} ms ago); placement epoch {epoch}")
        }
        _ => format!("not registered with the coordinators; placement epoch {epoch} known"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_print_one_concern_per_line_with_units() {
        let s = NodeStats {
            remote_bytes: 3 << 20,
            conversions: 4,
            ram_hits: 2,
            misses: 4,
            loads_in_flight: 1,
            ..NodeStats::default()
        };
        let text = human(&s, &[("chunks_reused".into(), 5)]);
        assert!(text.contains("reuse           5 shards served from another version's chunk"), "{text}");
        assert!(!human(&s, &[]).contains("reuse"), "a node of protocol 2 reports no reuse line");
        assert!(!text.contains("cluster"), "a node alone has no cluster line: {text}");
        let standing = |registered, left, since| {
            let mut c =
                vec![("in_cluster".to_string(), 1), ("registered".into(), registered), ("placement_epoch".into(), 7)];
            if registered == 1 {
                c.extend([("lease_left_ms".to_string(), left), ("since_renewal_ms".into(), since)]);
            }
            human(&s, &c)
        };
        let live = standing(1, 2412, 588);
        assert!(
            live.contains(
                "cluster         registered, lease 2412 ms left (heartbeat answered 588 ms ago); placement epoch 7"
            ),
            "{live}"
        );
        assert!(standing(1, 0, 3500).contains("the lease ran out: no heartbeat answered for 3500 ms"));
        assert!(standing(0, 0, 0).contains("cluster         not registered with the coordinators; placement epoch 7"));
        assert!(text.contains("remote storage  3.0 MiB in 0 requests"), "{text}");
        assert!(text.contains("chunk requests  6: 2 RAM"), "{text}");
        assert!(text.contains("1 loads in flight"), "{text}");
        assert!(!text.contains('{'), "not a debug dump: {text}");
    }
}
