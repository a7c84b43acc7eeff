//! The placement scenario of `granary bench placement`, on its own: places
//! 1,000,000 shards over 10,000 equal nodes, removes one node, adds one, and
//! prints one JSON line. Run with `--release`; optional arguments are the
//! shard and node counts, and `--events K` first prints the mean and range
//! of the movement ratios over K different leaving and joining nodes.
//!
//! `cargo run --release -p granary-proto --example placement [-- SHARDS NODES] [--events K]`

use granary_proto::ids::NodeId;
use granary_proto::placement::{BENCH_WEIGHT, NodeWeight, bench_inputs, bench_placement, plan_placement};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut events = 0usize;
    if let Some(i) = args.iter().position(|a| a == "--events") {
        events = args.get(i + 1).map(|v| v.parse()).transpose()?.unwrap_or(10);
        args.drain(i..(i + 2).min(args.len()));
    }
    let shards: usize = args.first().map(|v| v.parse()).transpose()?.unwrap_or(1_000_000);
    let nodes: usize = args.get(1).map(|v| v.parse()).transpose()?.unwrap_or(10_000);

    if events > 0 {
        spread(shards, nodes, events)?;
    }
    let bench = bench_placement(shards, nodes)?;
    println!("{}", serde_json::to_string(&bench)?);
    Ok(())
}

/// Movement over `events` scenarios like the benchmark's, each with a
/// different leaving node and a different new node (leave: `N -> N-1`, join:
/// `N-1 -> N`), as ratios to `shards / nodes`; then one join to `N + 1`
/// nodes, which lowers every cap by one when `1.1 * shards / nodes` is an
/// integer (as at 1,000,000 over 10,000).
fn spread(shards: usize, nodes: usize, events: usize) -> Result<()> {
    let (keys, all) = bench_inputs(shards, nodes);
    let weight = BENCH_WEIGHT;
    let base = plan_placement(&keys, &all)?;
    let ideal = shards as f64 / nodes as f64;
    let capped = base.loads().filter(|&(_, load, cap)| load == cap).count();
    eprintln!("{:.1}% of nodes at their cap", 100.0 * capped as f64 / nodes as f64);
    let (mut leave, mut join, mut own) = (Vec::new(), Vec::new(), Vec::new());
    for e in 0..events {
        let leaver = all[(e * 7919 + 13) % nodes].node;
        let mut rest: Vec<NodeWeight> = all.iter().copied().filter(|n| n.node != leaver).collect();
        let after_leave = plan_placement(&keys, &rest)?;
        leave.push(after_leave.moved_since(&base)? as f64 / ideal);
        own.push(f64::from(base.load(leaver).unwrap_or(0)) / ideal);
        rest.push(NodeWeight { node: NodeId(nodes as u64 + 1 + e as u64), weight });
        let after_join = plan_placement(&keys, &rest)?;
        join.push(after_join.moved_since(&after_leave)? as f64 / ideal);
    }
    let stats = |v: &[f64]| {
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        format!("mean {mean:.3} min {lo:.3} max {hi:.3}")
    };
    eprintln!(
        "over {events} events: leave {}; leaver's own load {}; join {}",
        stats(&leave),
        stats(&own),
        stats(&join)
    );
    let mut more = all.clone();
    more.push(NodeWeight { node: NodeId(u64::MAX), weight });
    let grown = plan_placement(&keys, &more)?;
    eprintln!(
        "join to {} nodes (cap {} -> {}): moved {:.3}",
        nodes + 1,
        base.cap(all[0].node).unwrap_or(0),
        grown.cap(all[0].node).unwrap_or(0),
        grown.moved_since(&base)? as f64 / ideal
    );
    Ok(())
}
