//! `granary bench scale`: runs [`granary_bench::scale`] at a tenth of the
//! size and at the size asked for, then prints each run and the summary
//! against the targets, or JSON lines.

use anyhow::{Context, Result};
use granary_bench::scale::{FleetOpts, FleetRun, ScaleOpts, ScaleRun, ScaleSummary, run as run_scale, run_fleet};

/// Runs the benchmark: `big`, after a tenth of it when `growth`, then the
/// fleet.
pub(crate) fn run(big: ScaleOpts, growth: bool, fleet: Option<FleetOpts>, json: bool) -> Result<()> {
    let exe = std::env::current_exe().context("locating the granary binary")?;
    let say = |line: &str| {
        if !json {
            eprintln!("· {line}");
        }
    };
    let small = if growth {
        let tenth = ScaleOpts {
            row_groups: big.row_groups / 10,
            files: (big.files / 10).max(1),
            nodes: (big.nodes / 10).max(3),
            ..big.clone()
        };
        let r = run_scale(&exe, &tenth, say)?;
        print_run(&r, json)?;
        Some(r)
    } else {
        None
    };
    let r = run_scale(&exe, &big, say)?;
    print_run(&r, json)?;
    let fleet = match fleet {
        Some(opts) => {
            let f = run_fleet(&exe, &opts, say)?;
            print_fleet(&f, json)?;
            Some(f)
        }
        None => None,
    };
    let s = ScaleSummary::of(small.as_ref(), &r, fleet.as_ref());
    if json {
        println!("{}", serde_json::to_string(&s)?);
        return Ok(());
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!();
    println!("{} row groups on {} nodes:", s.row_groups, s.nodes);
    println!("register            {:.1} s = {:.2}x its footer reads", s.register_s, s.register_over_footers);
    println!("largest log entry   {:.2} MiB (target <= 1)", mib(s.log_entry_max_bytes));
    println!("snapshot            {:.1} bytes per row group (target <= 64)", s.snapshot_bytes_per_row_group);
    println!("snapshot install    {:.2} s", s.snapshot_install_s);
    println!("voter peak RSS      {:.0} MiB (target <= 2048)", mib(s.voter_rss_bytes));
    println!("re-placement        {:.2} s (the slower of a leave and a join)", s.replace_s);
    println!("API p99 meanwhile   {:.1} ms (target <= 50)", s.api_p99_ms);
    println!(
        "watch on a leave    {:.2}x the moved shards' entries (target <= 2; {:.0}x one node's share of them)",
        s.watch_bytes_per_node_over_moved, s.watch_bytes_per_node_over_share
    );
    println!("failover            {:.2}x the election timeout (target <= 2)", s.failover_vs_election_timeout);
    if s.real_nodes > 0 {
        println!(
            "fleet               {} real nodes: {} heartbeats failed, at most {} connection(s) per node at the leader; \
             after a leader kill every node renewed in {:.2} s and watched again in {:.2} s",
            s.real_nodes,
            s.heartbeats_failed,
            s.leader_connections_per_node,
            s.reregister_after_failover_s,
            s.rewatch_after_failover_s
        );
    }
    if let Some(ratio) = s.size_ratio {
        let g = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}x"));
        println!(
            "growth over {ratio:.0}x the size: register {}, snapshot {}, voter RSS {}, re-placement {} (linear: <= {ratio:.0}x)",
            g(s.register_growth),
            g(s.snapshot_growth),
            g(s.rss_growth),
            g(s.replace_growth)
        );
    }
    let c = granary_bench::report::Conditions::current();
    println!("conditions: commit {} · {} cores · {} build", c.commit, c.cores, c.profile);
    Ok(())
}

fn print_run(r: &ScaleRun, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(r)?);
        return Ok(());
    }
    println!(
        "{} row groups, {} files, {} nodes: nodes registered in {:.1} s; footers {:.1} s, register {:.1} s; \
         largest entry {} B; snapshot {} B ({:.1} B/row group), installed in {:.2} s (that voter's peak RSS {:.0} MiB); voter peak RSS {:.0} MiB; \
         leave {:.2} s, join {:.2} s, heartbeat p99 {:.1} ms (max {:.1}); {} of {} heartbeats failed; \
         {} shards moved, a node's watch received {} B for the leave ({:.2}x the moved entries, {:.0}x its share of \
         them; the whole placement was {} B); failover {:.2} s",
        r.row_groups,
        r.files,
        r.nodes,
        r.nodes_register_s,
        r.footers_s,
        r.register_s,
        r.log_entry_max_bytes,
        r.snapshot_bytes,
        r.snapshot_bytes_per_row_group,
        r.snapshot_install_s,
        r.snapshot_install_rss_bytes as f64 / (1 << 20) as f64,
        r.voter_rss_bytes as f64 / (1 << 20) as f64,
        r.replace_leave_s,
        r.replace_join_s,
        r.api_p99_ms,
        r.api_max_ms,
        r.heartbeats_failed,
        r.heartbeats,
        r.moved_shards,
        r.watch_bytes_per_node,
        r.watch_bytes_per_node_over_moved,
        r.watch_bytes_per_node_over_share,
        r.watch_whole_bytes,
        r.failover_s
    );
    Ok(())
}

fn print_fleet(f: &FleetRun, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(f)?);
        return Ok(());
    }
    println!(
        "fleet of {} real nodes ({} row groups): registered in {:.1} s; {:.0} s steady: {} of {} heartbeats failed, \
         {} re-registrations, at most {} connection(s) per node at the leader ({} nodes connected, {} node \
         connections at the followers), leader {:.2} cores and {:.0} MiB peak RSS; leader kill: every node renewed \
         in {:.2} s and watched again in {:.2} s ({} heartbeats retried meanwhile), then at most {} connection(s) \
         per node at the new leader",
        f.real_nodes,
        f.row_groups,
        f.register_all_s,
        f.steady_s,
        f.heartbeats_failed,
        f.heartbeats,
        f.reregistrations,
        f.leader_connections_per_node,
        f.leader_connected_nodes,
        f.follower_node_connections,
        f.leader_cpu_cores,
        f.leader_rss_bytes as f64 / (1 << 20) as f64,
        f.reregister_after_failover_s,
        f.rewatch_after_failover_s,
        f.heartbeats_failed_in_failover,
        f.new_leader_connections_per_node
    );
    Ok(())
}
