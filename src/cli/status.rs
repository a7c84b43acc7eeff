//! `granary status`: the cluster's state as the answering voter reports it —
//! leader, term, voters, nodes with their leases and shard counts, the
//! placement epoch and the registered datasets.

use super::connect::{ConnectArgs, call, unexpected};
use super::dataset::print_datasets;
use anyhow::Result;
use granary_net::api::{ApiRequest, ApiResponse, ClusterStatus};

/// `granary status`.
pub(crate) fn run(connect: &ConnectArgs) -> Result<()> {
    match call(connect, ApiRequest::Status)? {
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

/// Prints the status as readable lines and the dataset table.
fn print_status(s: &ClusterStatus) {
    let leader = s.leader.map(|l| format!("voter-{l}")).unwrap_or_else(|| "none".into());
    println!(
        "leader {leader}, term {}, placement epoch {}, answered by voter-{}",
        s.term, s.placement_epoch, s.answered_by
    );
    for v in &s.voters {
        println!("  voter-{} {}{}", v.id, v.addr, voter_seen(v));
    }
    match s.quorum_margin {
        Some(m) if m > 0 => println!("quorum: {m} more voter(s) may become unreachable before it is lost"),
        Some(0) => println!("quorum: held, but one more unreachable voter loses it"),
        Some(_) => println!("quorum: lost"),
        None => {}
    }
    let owners = if s.content_owners {
        "follow content (a new version's shards start where the same content's chunks are)"
    } else {
        "by version (until every voter speaks granary-raft/2)"
    };
    println!("owners: {owners}");
    println!("nodes:");
    for n in &s.nodes {
        let lease = match (n.live, n.lease_left_ms) {
            (false, _) => "expired".to_string(),
            (true, Some(ms)) => format!("lease {ms} ms"),
            (true, None) => "live".to_string(),
        };
        println!(
            "  {} {} incarnation {} {lease}, weight {}, {} shards, RAM {} MiB, SSD {} MiB",
            n.node,
            n.addr,
            n.incarnation,
            n.weight,
            n.shards,
            n.ram_bytes >> 20,
            n.ssd_bytes >> 20
        );
    }
    println!("datasets:");
    print_datasets(&s.datasets);
}

/// How the leader sees voter `v` (issue 48): empty from a follower.
fn voter_seen(v: &granary_net::api::VoterStatus) -> String {
    match (v.reachable, v.answered_ms_ago, v.lag_entries) {
        (Some(true), Some(ago), Some(lag)) => format!(": reachable, answered {ago} ms ago, {lag} entries behind"),
        (Some(false), Some(ago), lag) => {
            format!(": UNREACHABLE, last answered {ago} ms ago, {} entries behind", lag.unwrap_or(0))
        }
        (Some(false), None, _) => ": UNREACHABLE, never answered the leader".into(),
        _ => String::new(),
    }
}
