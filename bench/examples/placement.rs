//! The placement scenario of `granary bench placement`, on its own: places
//! 1,000,000 shards over 10,000 equal nodes, re-places incrementally once
//! without one node and once with one more, and prints one JSON line. Run
//! with `--release`; optional arguments are the shard and node counts.
//!
//! `--events K` first runs K membership events the way the coordinator
//! applies them, each re-placed by `plan_rebalance` from the placement
//! before it: event `e` removes one node (`N -> N-1`), then adds a new one
//! (`N-1 -> N`, caps unchanged). It prints the mean and range over the K
//! events of the shards moved (over the ideal `shards / nodes`), the
//! leaver's and the joiner's load, max load / mean after each event, and
//! the time per call; then the shards moved by one join to `N + 1` nodes
//! from the first placement, which lowers every cap by one when
//! `1.1 * shards / nodes` is an integer (as at 1,000,000 over 10,000).
//!
//! `cargo run --release -p granary-bench --example placement [-- SHARDS NODES] [--events K]`

use granary_bench::placement::{BENCH_WEIGHT, bench_inputs, bench_placement};
use granary_proto::ids::NodeId;
use granary_proto::placement::{NodeWeight, Placement, plan_placement, plan_rebalance};
use std::time::Instant;

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

/// Per-event statistics, as ratios to `shards / nodes` (movement, loads)
/// or plain values (max/mean, seconds).
#[derive(Default)]
struct Series {
    leave: Vec<f64>,
    leaver_load: Vec<f64>,
    leave_max: Vec<f64>,
    leave_s: Vec<f64>,
    join: Vec<f64>,
    joiner_load: Vec<f64>,
    join_max: Vec<f64>,
    join_s: Vec<f64>,
}

/// `events` leaves and joins of different nodes, applied one after another
/// with [`plan_rebalance`], each from the placement the one before left.
fn spread(shards: usize, nodes: usize, events: usize) -> Result<()> {
    let (keys, all) = bench_inputs(shards, nodes);
    let weight = BENCH_WEIGHT;
    let base = plan_placement(&keys, &all)?;
    let ideal = shards as f64 / nodes as f64;
    let capped = base.loads().filter(|&(_, load, cap)| load == cap).count();
    eprintln!("{:.1}% of nodes at their cap", 100.0 * capped as f64 / nodes as f64);

    let mut live = all.clone();
    let mut now = base.clone();
    let mut s = Series::default();
    let timed = |prev: &Placement, live: &[NodeWeight]| -> Result<(Placement, f64)> {
        let previous: Vec<NodeId> = prev.owners().collect();
        let started = Instant::now();
        let next = plan_rebalance(&keys, &previous, live)?;
        Ok((next, started.elapsed().as_secs_f64()))
    };
    for e in 0..events {
        let leaver = live[(e * 7919 + 13) % live.len()].node;
        live.retain(|n| n.node != leaver);
        let (gone, secs) = timed(&now, &live)?;
        s.leave.push(gone.moved_since(&now)? as f64 / ideal);
        s.leaver_load.push(f64::from(now.load(leaver).unwrap_or(0)) / ideal);
        s.leave_max.push(gone.max_over_mean());
        s.leave_s.push(secs);

        let joiner = NodeId(nodes as u64 + 1 + e as u64);
        live.push(NodeWeight { node: joiner, weight });
        let (back, secs) = timed(&gone, &live)?;
        s.join.push(back.moved_since(&gone)? as f64 / ideal);
        s.joiner_load.push(f64::from(back.load(joiner).unwrap_or(0)) / ideal);
        s.join_max.push(back.max_over_mean());
        s.join_s.push(secs);
        now = back;
    }
    let stats = |v: &[f64]| {
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        format!("mean {mean:.3} min {lo:.3} max {hi:.3}")
    };
    eprintln!("over {events} incremental events (N -> N-1 -> N, caps unchanged):");
    eprintln!("  leave: moved {}; leaver's own load {}", stats(&s.leave), stats(&s.leaver_load));
    eprintln!("         max/mean after {}; seconds {}", stats(&s.leave_max), stats(&s.leave_s));
    eprintln!("  join:  moved {}; joiner's load {}", stats(&s.join), stats(&s.joiner_load));
    eprintln!("         max/mean after {}; seconds {}", stats(&s.join_max), stats(&s.join_s));

    let mut more = all.clone();
    more.push(NodeWeight { node: NodeId(u64::MAX), weight });
    let previous: Vec<NodeId> = base.owners().collect();
    let grown = plan_rebalance(&keys, &previous, &more)?;
    eprintln!(
        "join to {} nodes from the first placement (cap {} -> {}): moved {:.3}, of which to the joiner {:.3}",
        nodes + 1,
        base.cap(all[0].node).unwrap_or(0),
        grown.cap(all[0].node).unwrap_or(0),
        grown.moved_since(&base)? as f64 / ideal,
        f64::from(grown.load(NodeId(u64::MAX)).unwrap_or(0)) / ideal
    );
    Ok(())
}
