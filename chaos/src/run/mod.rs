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
//! file runs one seed's processes (`run_seed`).

mod config;
mod faults;
mod job;
pub mod lin;
pub mod powerfs;
mod report;
pub mod schedule;
pub mod ssdfs;
pub mod store;
pub mod verdict;

pub use config::{RunConfig, Tiers, prepare};
pub use faults::remove_ssd_files;
pub use job::Job;
pub use report::SeedReport;

use config::{BUCKET, LIN_PREFIX, SSD_BYTES, runtime};
use faults::{Edge, MEMORY_SAMPLE_EVERY, Pids, SsdFaults, add, apply, cluster_socket, link_faults, sample_memory};

use crate::relay::{RelayConfig, RelayHandle};
use anyhow::{Context, Result, anyhow, bail};
use granary_testkit::datagen;
use granary_testkit::harness::{ClusterCounters, LocalCluster, TrainerEvent, TrainerProcess};
use schedule::Fault;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use store::FaultStore;
use verdict::Observed;

/// One rank's state in a seed's run.
struct Rank {
    proc: Option<TrainerProcess>,
    /// Waiting for its Ready line after a (re)start.
    starting: bool,
    /// The first epoch it has not finished.
    next_epoch: u64,
    finished: bool,
    /// Failed while its node ran: it is not started again.
    lost: bool,
}

/// Runs one seed in `cfg.work/seed-N` and judges it. An error means the
/// harness itself could not run (a process did not start); what the system
/// did wrong is in [`SeedReport::violations`].
pub fn run_seed(cfg: &RunConfig, job: &Job, seed: u64) -> Result<SeedReport> {
    let dir = cfg.work.join(format!("seed-{seed}"));
    // An earlier run stopped by a signal leaves its SSD filesystems
    // mounted: detach them before the folder goes.
    ssdfs::detach_stale(&dir);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir)?;
    let mut schedule = schedule::draw(seed, cfg.target());
    let rt = runtime()?;
    let store = rt.block_on(FaultStore::start(&job.store_root, seed))?;
    let tiers = Tiers::for_job(job);
    let mut spec = cfg.spec(cfg.nodes, cfg.voters, &store, Some(tiers));
    // A byzantine node forges what it sends its peers in every life; every
    // node verifies every peer chunk.
    let mut byzantine_not_injected = None;
    match (schedule.byzantine, &cfg.forger) {
        (Some(node), Some(forger)) => {
            spec.node_exe = Some((node, forger.clone()));
            spec.verify_peer_chunks = Some(1.0);
        }
        (Some(node), None) => {
            schedule.byzantine = None;
            byzantine_not_injected = Some(format!("byzantine node {node}: no granary-chaos binary to run it"));
        }
        (None, _) => {}
    }
    let mut cluster = LocalCluster::plan(&cfg.exe, &dir, &job.data, spec)?;
    let ids = cluster.node_ids();
    let pids = Pids { nodes: cfg.nodes, voters: cfg.voters };
    // Every QUIC link goes through the relay: node to node, node to voter,
    // voter to voter, and the chaos client to the voters (sockets bound
    // now, so the relay knows their addresses). The operator's tools
    // (`granary status`, `dataset add`) pass outside the faults.
    let lin_endpoints = {
        let _rt = rt.enter();
        lin::LinClients::bind(2)?
    };
    let lin_addrs = lin_endpoints.addrs()?;
    let mut processes: Vec<SocketAddr> = ids.iter().map(|&id| cluster.peer_listen(id)).collect();
    processes.extend(cluster.voter_ids().iter().map(|&v| cluster.voter_listen(v)));
    processes.push(lin_addrs[0]);
    let mut relay_cfg = RelayConfig::new(seed, processes);
    relay_cfg.processes[pids.lin().0 as usize].sends_from = lin_addrs[1..].to_vec();
    relay_cfg.default_faults = link_faults(&schedule);
    relay_cfg.pass_outsiders = true;
    let relay = rt.block_on(RelayHandle::start(relay_cfg)).context("starting the relay")?;
    for &id in &ids {
        let front = relay.front(pids.node(id)).ok_or_else(|| anyhow!("relay has no front for node {id}"))?;
        cluster.set_advertise(id, front);
    }
    for v in cluster.voter_ids() {
        let front = relay.front(pids.voter(v)).ok_or_else(|| anyhow!("relay has no front for voter {v}"))?;
        cluster.set_voter_advertise(v, front);
    }
    // A seed that cuts a voter's power runs every voter on a folder that
    // can lose what was not synced (the leader is picked when it comes).
    let voter_disks = powerfs::VoterDisks::mount(
        &dir,
        &cluster.voter_ids(),
        schedule.events.iter().any(|e| matches!(e.fault, Fault::PowerCutVoter { .. })),
    );
    cluster.start_voters()?;
    let ssd_mounts = match ssdfs::tmpfs_available(&dir) {
        Ok(()) => Ok(ssdfs::SsdMounts::mount(&dir, &ids, SSD_BYTES)?),
        Err(why) => Err(why),
    };
    cluster.start_nodes()?;

    let world = cfg.world();
    let node_of = |rank: u32| u64::from(rank / cfg.ranks_per_node) + 1;
    let spawn_rank = |rank: u32| -> Result<TrainerProcess> {
        let a = cfg.rank_args(&cluster_socket(&dir, node_of(rank)), rank);
        let log = dir.join(format!("rank-{rank}.log"));
        TrainerProcess::spawn_logged(&cfg.exe, rank, cfg.ranks_per_node as usize, &a, &log)
    };
    let mut ranks: Vec<Rank> = Vec::new();
    for rank in 0..world {
        ranks.push(Rank { proc: Some(spawn_rank(rank)?), starting: true, next_epoch: 0, finished: false, lost: false });
    }
    // Every rank ready before the clock starts: the schedule counts from
    // the first epoch.
    for (r, rank) in ranks.iter_mut().enumerate() {
        let p = rank.proc.as_mut().ok_or_else(|| anyhow!("rank {r} missing"))?;
        match p.next_event(Duration::from_secs(120))? {
            TrainerEvent::Ready { .. } => {}
            other => bail!("rank {r}: expected ready, got {other:?}"),
        }
        rank.starting = false;
        p.start_epoch(0)?;
    }

    let mut actions: Vec<(Duration, usize, Edge)> = Vec::new();
    for (i, e) in schedule.events.iter().enumerate() {
        actions.push((e.at, i, Edge::Start));
        actions.push((e.at + e.fault.duration(), i, Edge::End));
    }
    actions.sort_by_key(|a| a.0);
    let mut actions = std::collections::VecDeque::from(actions);

    let mut obs = Observed { memory_budget: tiers.memory_budget(job), ..Observed::default() };
    let mut ssd = SsdFaults {
        mounts: ssd_mounts.as_ref().ok(),
        fs: "tmpfs".into(),
        filled: 0,
        write_kills: 0,
        voter_disks,
        not_injected: Vec::new(),
        armed: Vec::new(),
    };
    if let Err(why) = &ssd_mounts {
        ssd.fs = format!("the work folder's filesystem (no tmpfs: {why})");
    }
    let mut stopped: BTreeSet<u64> = BTreeSet::new();
    let mut sampled = Instant::now();
    let mut retired = ClusterCounters::default();
    let mut voters_hit: BTreeMap<usize, u64> = BTreeMap::new();
    let mut by_fault: BTreeMap<String, u64> = BTreeMap::new();
    if schedule.byzantine.is_some() {
        by_fault.insert("byzantine_peer".into(), 1);
    }
    ssd.not_injected.extend(byzantine_not_injected);
    let mut rank_restarts = 0;
    let mut epoch_ends: Vec<f64> = Vec::new();
    let lin = {
        let _rt = rt.enter();
        let voters = cluster.coordinators().iter().map(|a| a.parse()).collect::<Result<Vec<_>, _>>()?;
        lin::LinClients::start(
            lin_endpoints,
            cluster.certs(),
            voters,
            seed,
            format!("s3://{BUCKET}/{LIN_PREFIX}/"),
            datagen::view(),
        )?
    };
    store.set_faults(schedule.store);
    let t0 = Instant::now();
    let mut timed_out = false;

    loop {
        while actions.front().is_some_and(|a| a.0 <= t0.elapsed()) {
            let Some((_, i, edge)) = actions.pop_front() else { break };
            let fault = schedule.events[i].fault;
            if let Edge::Start = edge {
                *by_fault.entry(fault.kind().to_string()).or_insert(0) += 1;
            }
            if let (Fault::KillInSsdWrite { node, .. }, Edge::End) = (fault, edge)
                && ssd.armed.iter().any(|a| a.kill.node == node)
            {
                // The restart comes after the kill (the write may come
                // late in a slow build): look again shortly.
                let at = t0.elapsed() + Duration::from_millis(20);
                let pos = actions.iter().position(|a| a.0 > at).unwrap_or(actions.len());
                actions.insert(pos, (at, i, edge));
                continue;
            }
            if let Fault::StopNode { node, .. } = fault {
                match edge {
                    Edge::Start => stopped.insert(node),
                    Edge::End => stopped.remove(&node),
                };
            }
            if let (Some(node), Edge::Start) = (fault.host_killed(), edge) {
                // The host goes down: its ranks first (killed on drop).
                for (r, rank) in ranks.iter_mut().enumerate() {
                    if node_of(r as u32) == node {
                        rank.proc = None;
                    }
                }
            }
            apply(&mut cluster, &relay, pids, seed, fault, edge, i, &mut voters_hit, &mut retired, &mut obs, &mut ssd)?;
            if let (Some(node), Edge::End) = (fault.host_killed(), edge) {
                for (r, rank) in ranks.iter_mut().enumerate() {
                    if node_of(r as u32) == node && !rank.finished && !rank.lost {
                        rank.proc = Some(spawn_rank(r as u32)?);
                        rank.starting = true;
                        rank_restarts += 1;
                    }
                }
            }
        }
        ssd.poll_armed(&mut cluster, &mut retired, &mut obs, false);
        for (r, rank) in ranks.iter_mut().enumerate() {
            let r = r as u32;
            let Some(p) = rank.proc.as_mut() else { continue };
            loop {
                let ev = match p.try_event() {
                    Ok(Some(ev)) => ev,
                    Ok(None) => break,
                    Err(e) => TrainerEvent::Error { rank: r, message: format!("{e:#}") },
                };
                match ev {
                    TrainerEvent::Ready { .. } if rank.starting => {
                        rank.starting = false;
                        p.start_epoch(rank.next_epoch)?;
                    }
                    TrainerEvent::Progress { .. } => {}
                    TrainerEvent::Epoch { epoch, digest, .. } => {
                        obs.digests.insert((r, epoch), digest);
                        let e = epoch as usize;
                        if epoch_ends.len() <= e {
                            epoch_ends.resize(e + 1, 0.0);
                        }
                        epoch_ends[e] = f64::max(epoch_ends[e], t0.elapsed().as_secs_f64());
                        rank.next_epoch = epoch + 1;
                        if rank.next_epoch < cfg.epochs {
                            p.start_epoch(rank.next_epoch)?;
                        } else {
                            rank.finished = true;
                        }
                    }
                    TrainerEvent::Error { message, .. } => {
                        obs.rank_errors.push((r, rank.next_epoch, message));
                        rank.proc = None;
                        rank.lost = true;
                        break;
                    }
                    other => {
                        obs.rank_errors.push((r, rank.next_epoch, format!("unexpected event {other:?}")));
                        rank.proc = None;
                        rank.lost = true;
                        break;
                    }
                }
            }
        }
        if sampled.elapsed() >= MEMORY_SAMPLE_EVERY {
            sampled = Instant::now();
            for &id in ids.iter().filter(|id| !stopped.contains(id)) {
                sample_memory(&cluster, id, &mut obs);
            }
        }
        if ranks.iter().all(|r| r.finished || r.lost) {
            break;
        }
        if t0.elapsed() > cfg.seed_timeout {
            timed_out = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let secs = t0.elapsed().as_secs_f64();
    // Whatever is still scheduled ends now: nodes restarted, continued,
    // links healed, voters back.
    while let Some((_, i, edge)) = actions.pop_front() {
        if let Edge::End = edge {
            let fault = schedule.events[i].fault;
            apply(&mut cluster, &relay, pids, seed, fault, edge, i, &mut voters_hit, &mut retired, &mut obs, &mut ssd)?;
        }
    }
    let lin_report = rt.block_on(lin.finish());
    obs.lin = Some(lin_report.clone());
    if timed_out {
        let stuck: Vec<String> = ranks
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.finished)
            .map(|(i, r)| format!("rank {i} in epoch {}", r.next_epoch))
            .collect();
        obs.stuck = Some(format!("after {:?}: {}", cfg.seed_timeout, stuck.join(", ")));
    }

    // The end: ranks exit, counters are read, every process stops.
    for (r, rank) in ranks.iter_mut().enumerate() {
        if let Some(p) = rank.proc.take()
            && rank.finished
            && let Err(e) = p.finish(Duration::from_secs(30))
        {
            obs.unclean.push(format!("rank {r}: {e:#}"));
        }
    }
    let mut total = retired;
    match cluster.total_stats() {
        Ok(now) => add(&mut total, &now),
        Err(e) => obs.unclean.push(format!("reading node counters: {e:#}")),
    }
    for id in ids.iter().copied() {
        if let Err(e) = cluster.terminate(id) {
            obs.unclean.push(format!("node {id}: {e:#}"));
        }
    }
    for v in cluster.voter_ids() {
        if cluster.voter_running(v)
            && let Err(e) = cluster.terminate_voter(v)
        {
            obs.unclean.push(format!("voter {v}: {e:#}"));
        }
    }
    let relay_stats = relay.stats();
    rt.block_on(relay.shutdown());
    let store_counts = store.counts();
    drop(store);
    for (kind, n) in [
        // One condition for the whole run (its datagrams: relay_throttled).
        ("link_cap", u64::from(schedule.noise.bandwidth_mib > 0)),
        ("store_error", store_counts.errors),
        ("store_slow", store_counts.slowed),
        ("store_short", store_counts.shortened),
        ("store_stall", store_counts.stalled),
    ] {
        if n > 0 {
            by_fault.insert(kind.to_string(), n);
        }
    }
    obs.wasted_bytes = store_counts.wasted_bytes;
    let mut logs = cluster.logs();
    logs.extend((0..world).map(|r| dir.join(format!("rank-{r}.log"))));
    for log in &logs {
        obs.scan_log(log);
    }
    obs.remote_bytes = total.remote_bytes;
    obs.peer_mismatched = total.peer_mismatched;
    let violations = verdict::judge(&obs, job, &schedule, cfg.nodes, cfg.epochs);
    let links = relay_stats.links.values();
    let mut relay_links: BTreeMap<&'static str, u64> = BTreeMap::new();
    for (l, c) in &relay_stats.links {
        *relay_links.entry(pids.link_kind(l.from, l.to)).or_insert(0) += c.sent;
    }
    Ok(SeedReport {
        seed,
        remote_ratio: total.remote_bytes as f64 / job.source_bytes.max(1) as f64,
        remote_bound: verdict::remote_bound(&schedule, cfg.nodes, cfg.epochs)
            + store_counts.wasted_bytes as f64 / job.source_bytes.max(1) as f64,
        store: store_counts,
        lin: lin_report,
        conversions: total.conversions,
        rank_restarts,
        ssd_damaged: obs.ssd_damaged,
        ssd_fs: ssd.fs.clone(),
        ssd_filled: ssd.filled,
        ssd_write_kills: ssd.write_kills,
        voter_fs: ssd.voter_disks.fs.clone(),
        power_cuts: ssd.voter_disks.cuts,
        power_cut_unsynced_bytes: ssd.voter_disks.unsynced_bytes,
        power_cut_syncs: ssd.voter_disks.syncs,
        power_cuts_mid_write: ssd.voter_disks.mid_write,
        not_injected: ssd.not_injected.clone(),
        tiers,
        memory_budget: obs.memory_budget,
        memory: obs.memory.clone(),
        relay_dropped: links.clone().map(|l| l.dropped + l.partitioned).sum(),
        relay_duplicated: links.clone().map(|l| l.duplicated).sum(),
        relay_throttled: links.map(|l| l.throttled + l.throttle_dropped).sum(),
        relay_links,
        relay_outsiders: relay_stats.outsiders,
        relay_unknown: relay_stats.unknown_source,
        voters_hit: voters_hit.into_values().collect(),
        schedule,
        by_fault,
        peer_mismatched: total.peer_mismatched,
        peers_quarantined: total.peers_quarantined,
        secs,
        epoch_ends,
        violations,
        dir,
    })
}
