//! `granary-chaos run`: the real processes under a seeded fault schedule.
//!
//! A job (a generated dataset, trainer ranks on every node, several epochs)
//! first runs on one node alone, without faults: its batch digests are the
//! reference. Then each seed starts a fresh cluster (3 coordinator voters,
//! N node daemons, each with its own throttled link to a fault-injecting
//! S3 store on loopback ([`store::FaultStore`]), a [`RelayHandle`] between
//! the nodes' peer endpoints), runs the same job,
//! fires the faults [`schedule::draw`] gives for the seed, and judges the run
//! with [`verdict`]: every rank's digests equal the reference, remote reads
//! stay within what the schedule allows, no process log shows a panic or an
//! internal error, every process stops cleanly.
//!
//! A node kill takes its trainer ranks with it (one host): they are started
//! again with the node and run their unfinished epochs from the start, as a
//! job restarted from an epoch checkpoint would.
//!
//! ## Files
//! `schedule` (pure: seed to faults) and `verdict` (pure: what was seen to
//! violations) stand alone; `store` is the S3 store and its fault layer;
//! `config` holds the run's configuration and prepares the job (`job`: the
//! job as data, the fault-free reference included); `faults` executes a
//! seed's faults on the running cluster; `report` is what a seed did; this
//! file runs one seed (`run_seed`) in steps, each a file: `setup` (the
//! cluster started, through the relay), `ranks` (the trainer ranks),
//! `drive` (the faults fired while the job runs), `end` (every process
//! stopped, the run judged and reported).

mod config;
mod drive;
mod end;
mod faults;
mod job;
pub mod lin;
pub mod powerfs;
mod ranks;
mod report;
pub mod schedule;
mod setup;
pub mod ssdfs;
pub mod store;
pub mod verdict;

pub use config::{RunConfig, Tiers, prepare};
pub use faults::remove_ssd_files;
pub use job::Job;
pub use report::SeedReport;

use config::{BUCKET, LIN_PREFIX};
use faults::SsdFaults;

use anyhow::Result;
use granary_testkit::datagen;
use std::time::Instant;
use verdict::Observed;

/// Runs one seed in `cfg.work/seed-N` and judges it. An error means the
/// harness itself could not run (a process did not start); what the system
/// did wrong is in [`SeedReport::violations`]. The steps, each in its
/// file: start the cluster (`setup`), start the ranks (`ranks`), fire the
/// faults while the job runs (`drive`), stop everything and judge (`end`).
pub fn run_seed(cfg: &RunConfig, job: &Job, seed: u64) -> Result<SeedReport> {
    let setup::Setup {
        dir,
        schedule,
        rt,
        store,
        tiers,
        mut cluster,
        ids,
        pids,
        relay,
        lin_endpoints,
        voter_disks,
        ssd_mounts,
        not_injected,
    } = setup::start(cfg, job, seed)?;
    // Every rank ready before the clock starts.
    let mut ranks = ranks::Ranks::start(cfg, &dir)?;
    let mut obs = Observed { memory_budget: tiers.memory_budget(job), ..Observed::default() };
    let mut ssd = SsdFaults {
        mounts: ssd_mounts.as_ref().ok(),
        fs: "tmpfs".into(),
        filled: 0,
        write_kills: 0,
        voter_disks,
        not_injected: not_injected.into_iter().collect(),
        armed: Vec::new(),
    };
    if let Err(why) = &ssd_mounts {
        ssd.fs = format!("the work folder's filesystem (no tmpfs: {why})");
    }
    let mut faults = drive::Faults::of(&schedule);
    let lin = {
        let _rt = rt.enter();
        let voters = cluster.coordinators().iter().map(|a| a.parse()).collect::<Result<Vec<_>, _>>()?;
        let source = format!("s3://{BUCKET}/{LIN_PREFIX}/");
        lin::LinClients::start(lin_endpoints, cluster.certs(), voters, seed, source, datagen::view())?
    };
    store.set_faults(schedule.store);
    let t0 = Instant::now();
    let mut at = drive::Target { cluster: &mut cluster, relay: &relay, pids, seed, ids: &ids };
    let timed_out = drive::run(cfg, t0, &mut at, &mut faults, &mut ranks, &mut obs, &mut ssd)?;
    let secs = t0.elapsed().as_secs_f64();
    faults.end_all(&mut at, &mut obs, &mut ssd)?;
    let fired = faults.fired();
    let lin = rt.block_on(lin.finish());
    obs.lin = Some(lin.clone());
    if timed_out {
        obs.stuck = Some(format!("after {:?}: {}", cfg.seed_timeout, ranks.stuck()));
    }
    // The end: ranks exit, counters are read, every process stops.
    ranks.finish(&mut obs);
    let ran = end::Ran {
        seed,
        job,
        nodes: cfg.nodes,
        epochs: cfg.epochs,
        world: cfg.world(),
        dir,
        schedule,
        tiers,
        pids,
        secs,
        epoch_ends: std::mem::take(&mut ranks.epoch_ends),
        rank_restarts: ranks.restarts,
        lin,
    };
    let running = end::Running { cluster: &mut cluster, ids: &ids, relay, store, rt: &rt };
    Ok(end::stop_and_judge(ran, running, fired, obs, ssd))
}
