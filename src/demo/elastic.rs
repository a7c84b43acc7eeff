//! `granary demo --elastic`: a job whose world size changes mid-epoch.
//!
//! One node daemon serves the generated dataset (with `--nodes N` ≥ 2, a
//! coordinator and N node daemons, rank r on node r mod N); trainer
//! processes walk the
//! global plan (global batches of `--global-batch` rows over
//! `--partitions` canonical partitions). First one rank reads epoch 0
//! uninterrupted: the reference. Then 4 ranks read its first third and
//! stop; 2 ranks, each made from the resume state rank 2 saved, read the
//! second third; 3 ranks, made from the state rank 0 of those saved, read
//! the rest. Every rank reports which rows each of its batches held
//! ([`granary_client::Batch::row_digests`]), and the demo checks that the
//! elastic job delivered every row of the epoch exactly once, and that its
//! global steps (the ranks' batches of a step, in rank order) hold the
//! reference's rows in the reference's order.

use super::args::DemoArgs;
use super::pass::{Settings, daemon};
use super::report::{say_to, style};
use super::setup::{Setup, cluster_spec};
use anyhow::{Context, Result, bail};
use granary_testkit::harness::{LocalCluster, NodeProcess, TrainerEvent, TrainerProcess, rank_args};
use indicatif::{MultiProgress, ProgressBar};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The world sizes of the three phases.
const WORLDS: [u32; 3] = [4, 2, 3];

/// Rows each step held, all ranks in rank order: step -> row digests.
type Steps = BTreeMap<u64, Vec<u64>>;

/// Runs the elastic demo.
pub(super) fn run(a: DemoArgs) -> Result<()> {
    let g = a.global_batch;
    if g == 0 || WORLDS.iter().any(|w| !g.is_multiple_of(*w)) {
        bail!("--global-batch {g} must be divisible by every world size of the demo ({WORLDS:?}): try 1200");
    }
    let Setup { started, exe, work, data, bars, source_bytes } = Setup::new(&a)?;
    let say = |s: String| {
        if !a.json {
            say_to(&bars, s);
        }
    };
    let settings = Settings {
        prefetch_bytes: 256 << 20,
        loads: 4,
        convert_threads: 2,
        prefetch_batches: 2,
        assembly_threads: 1,
        ceiling: false,
    };
    let serving = if a.nodes > 1 {
        let spec = cluster_spec(&a);
        say(format!(
            "starting a coordinator and {} node daemons; rank r reads through node r mod {}",
            a.nodes, a.nodes
        ));
        Serving::Cluster(Box::new(LocalCluster::start(&exe, &work.path().join("cluster"), &data, spec)?))
    } else {
        let (node, socket) =
            daemon(&exe, &a, &work.path().join("node"), &settings, &data, a.bandwidth_mib << 20, source_bytes)?;
        Serving::Node(node, socket)
    };
    let common: Vec<String> = [
        "--global-batch",
        &g.to_string(),
        "--partitions",
        &a.partitions.to_string(),
        "--seed",
        "2026",
        "--assembly-threads",
        "1",
        "--prefetch-batches",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let phase = |name: &str, world: u32, from: u64, to: Option<u64>, resume: Option<&Path>, saver: u32| {
        run_phase(&exe, &|r| serving.socket(r), &bars, name, world, from, to, &common, resume, saver)
            .with_context(|| format!("{name}\n{}", serving.log_tail()))
    };

    // The reference: one rank, the whole epoch.
    let (steps, (reference, _)) = phase("reference, 1 rank", 1, 0, None, None, 0)?;
    let (k1, k2) = (steps / 3, 2 * steps / 3);
    say(format!(
        "global plan: {steps} steps of {g} rows ({} partitions); the reference read them on 1 rank",
        a.partitions
    ));

    let states = work.path().join("states");
    std::fs::create_dir_all(&states)?;
    let (_, (mut elastic, state)) = phase(&format!("{} ranks", WORLDS[0]), WORLDS[0], 0, Some(k1), None, 2)?;
    let saved = states.join("after-first.json");
    std::fs::write(&saved, &state)?;
    say(format!("{} ranks read steps 0..{k1} and stopped; rank 2 saved its state", WORLDS[0]));
    let (_, (second, state)) = phase(&format!("{} ranks", WORLDS[1]), WORLDS[1], k1, Some(k2), Some(&saved), 0)?;
    elastic.extend(second);
    let saved = states.join("after-second.json");
    std::fs::write(&saved, &state)?;
    say(format!("{} ranks resumed from it and read steps {k1}..{k2}; rank 0 saved its state", WORLDS[1]));
    let (_, (third, _)) = phase(&format!("{} ranks", WORLDS[2]), WORLDS[2], k2, None, Some(&saved), 0)?;
    elastic.extend(third);
    say(format!("{} ranks resumed from it and read steps {k2}..{steps}", WORLDS[2]));
    serving.stop();

    let all_rows = |s: &Steps| s.values().flatten().copied().collect::<Vec<u64>>();
    let (mut got, mut want) = (all_rows(&elastic), all_rows(&reference));
    let delivered = got.len();
    got.sort_unstable();
    want.sort_unstable();
    let repeated = got.windows(2).filter(|w| w[0] == w[1]).count();
    let exactly_once = repeated == 0 && got == want && want.len() as u64 == a.rows;
    let same_global_order = elastic == reference;
    let differing = (0..steps).filter(|k| elastic.get(k) != reference.get(k)).count();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "scenario": "summary",
                "exactly_once": u8::from(exactly_once),
                "same_global_order": u8::from(same_global_order),
                "rows": a.rows,
                "rows_delivered": delivered,
                "rows_repeated": repeated,
                "global_batch": g,
                "partitions": a.partitions,
                "steps": steps,
                "worlds": WORLDS,
                "resumed_at": [k1, k2],
                "steps_differing": differing,
                "secs": started.elapsed().as_secs_f64(),
            })
        );
    } else {
        println!();
        println!(
            "exactly once: {} — {delivered} rows delivered over {} -> {} -> {} ranks, {repeated} repeated, of the \
             epoch's {} rows",
            if exactly_once { "OK" } else { "FAILED" },
            WORLDS[0],
            WORLDS[1],
            WORLDS[2],
            a.rows
        );
        println!(
            "same global order: {} — {} of {steps} global steps hold the 1-rank run's rows in its order",
            if same_global_order { "OK" } else { "FAILED" },
            steps as usize - differing
        );
        println!("total {:.1}s", started.elapsed().as_secs_f64());
    }
    if !(exactly_once && same_global_order) {
        bail!("the elastic job did not deliver the reference's rows exactly once in its order");
    }
    Ok(())
}

/// What serves the ranks: one node daemon, or a cluster (`--nodes` ≥ 2).
enum Serving {
    Node(NodeProcess, PathBuf),
    Cluster(Box<LocalCluster>),
}

impl Serving {
    /// The socket rank `rank` reads through: node `rank mod nodes` of a
    /// cluster, so every phase's ranks spread over the nodes.
    fn socket(&self, rank: u32) -> PathBuf {
        match self {
            Serving::Node(_, socket) => socket.clone(),
            Serving::Cluster(c) => {
                let ids = c.node_ids();
                c.socket(ids[rank as usize % ids.len()])
            }
        }
    }

    fn log_tail(&self) -> String {
        match self {
            Serving::Node(node, _) => node.log_tail(),
            Serving::Cluster(c) => c.log_tails(),
        }
    }

    fn stop(self) {
        match self {
            Serving::Node(node, _) => node.stop(),
            Serving::Cluster(c) => drop(c),
        }
    }
}

/// One phase: `world` ranks (each from the state at `resume`, if any) read
/// steps `from..to` of epoch 0 (`None`: to its end). Returns the epoch's
/// steps, the rows of each step read (ranks in order) and the resume state
/// rank `saver` printed.
#[allow(clippy::too_many_arguments)]
fn run_phase(
    exe: &Path,
    socket: &dyn Fn(u32) -> PathBuf,
    bars: &MultiProgress,
    name: &str,
    world: u32,
    from: u64,
    to: Option<u64>,
    common: &[String],
    resume: Option<&Path>,
    saver: u32,
) -> Result<(u64, (Steps, String))> {
    let mut ranks = Vec::new();
    for r in 0..world {
        let mut args = rank_args(&socket(r), r, world);
        args.extend_from_slice(common);
        if let Some(path) = resume {
            args.extend(["--resume".into(), path.display().to_string()]);
        }
        ranks.push(TrainerProcess::spawn(exe, r, world as usize, &args)?);
    }
    let timeout = Duration::from_secs(300);
    let mut steps = 0;
    for t in &ranks {
        match t.next_event(timeout)? {
            TrainerEvent::Ready { batches, .. } => steps = batches,
            TrainerEvent::Error { message, .. } => bail!("rank {} failed: {message}", t.rank),
            other => bail!("unexpected event {other:?}"),
        }
    }
    let to = to.unwrap_or(steps);
    let mut slices: BTreeMap<u64, Vec<Vec<u64>>> = BTreeMap::new();
    let mut state = String::new();
    if to > from {
        let bar = bars.add(ProgressBar::new(to - from));
        bar.set_style(style(name));
        for t in &mut ranks {
            t.run_steps(0, from, to)?;
        }
        for t in &ranks {
            loop {
                match t.next_event(timeout)? {
                    TrainerEvent::Rows { step, rows, .. } => {
                        let slice = slices.entry(step).or_insert_with(|| vec![Vec::new(); world as usize]);
                        slice[t.rank as usize] = rows;
                        if t.rank == 0 {
                            bar.inc(1);
                        }
                    }
                    TrainerEvent::Stopped { state: s, .. } => {
                        if t.rank == saver {
                            state = s;
                        }
                        break;
                    }
                    TrainerEvent::Error { message, .. } => bail!("rank {} failed: {message}", t.rank),
                    other => bail!("unexpected event {other:?}"),
                }
            }
        }
        bar.finish_and_clear();
    }
    for t in ranks {
        t.finish(Duration::from_secs(30))?;
    }
    let steps_read = slices.into_iter().map(|(k, parts)| (k, parts.concat())).collect();
    Ok((steps, (steps_read, state)))
}
