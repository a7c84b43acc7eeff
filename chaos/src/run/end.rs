//! A seed's end: every process stopped and its counters read, the logs
//! scanned, the run judged ([`super::verdict`]) and reported
//! ([`SeedReport`]).

use super::config::Tiers;
use super::drive::Fired;
use super::faults::{Pids, SsdFaults, add};
use super::job::Job;
use super::lin::LinReport;
use super::report::SeedReport;
use super::schedule::Schedule;
use super::store::FaultStore;
use super::verdict::{self, Observed};
use crate::relay::RelayHandle;
use granary_testkit::harness::LocalCluster;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What the seed ran and saw, for [`stop_and_judge`].
pub(super) struct Ran<'a> {
    pub(super) seed: u64,
    pub(super) job: &'a Job,
    pub(super) nodes: u32,
    pub(super) epochs: u64,
    pub(super) world: u32,
    pub(super) dir: PathBuf,
    pub(super) schedule: Schedule,
    pub(super) tiers: Tiers,
    pub(super) pids: Pids,
    pub(super) secs: f64,
    pub(super) epoch_ends: Vec<f64>,
    pub(super) rank_restarts: u64,
    pub(super) lin: LinReport,
}

/// The seed's processes and what runs beside them, to stop.
pub(super) struct Running<'a> {
    pub(super) cluster: &'a mut LocalCluster,
    pub(super) ids: &'a [u64],
    pub(super) relay: RelayHandle,
    pub(super) store: FaultStore,
    pub(super) rt: &'a tokio::runtime::Runtime,
}

/// Stops the nodes, voters, relay and store, reads their counters and
/// logs, and judges the seed.
pub(super) fn stop_and_judge(
    ran: Ran,
    running: Running,
    fired: Fired,
    mut obs: Observed,
    ssd: SsdFaults,
) -> SeedReport {
    let Running { cluster, ids, relay, store, rt } = running;
    let mut total = fired.retired;
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
    let mut by_fault = fired.by_fault;
    for (kind, n) in [
        // One condition for the whole run (its datagrams: relay_throttled).
        ("link_cap", u64::from(ran.schedule.noise.bandwidth_mib > 0)),
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
    logs.extend((0..ran.world).map(|r| ran.dir.join(format!("rank-{r}.log"))));
    for log in &logs {
        obs.scan_log(log);
    }
    obs.remote_bytes = total.remote_bytes;
    obs.peer_mismatched = total.peer_mismatched;
    let (job, schedule) = (ran.job, &ran.schedule);
    let violations = verdict::judge(&obs, job, schedule, ran.nodes, ran.epochs);
    let links = relay_stats.links.values();
    let mut relay_links: BTreeMap<&'static str, u64> = BTreeMap::new();
    for (l, c) in &relay_stats.links {
        *relay_links.entry(ran.pids.link_kind(l.from, l.to)).or_insert(0) += c.sent;
    }
    let source_bytes = job.source_bytes.max(1) as f64;
    SeedReport {
        seed: ran.seed,
        remote_ratio: total.remote_bytes as f64 / source_bytes,
        remote_bound: verdict::remote_bound(schedule, ran.nodes, ran.epochs)
            + store_counts.wasted_bytes as f64 / source_bytes,
        store: store_counts,
        lin: ran.lin,
        conversions: total.conversions,
        rank_restarts: ran.rank_restarts,
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
        tiers: ran.tiers,
        memory_budget: obs.memory_budget,
        memory: obs.memory.clone(),
        relay_dropped: links.clone().map(|l| l.dropped + l.partitioned).sum(),
        relay_duplicated: links.clone().map(|l| l.duplicated).sum(),
        relay_throttled: links.map(|l| l.throttled + l.throttle_dropped).sum(),
        relay_links,
        relay_outsiders: relay_stats.outsiders,
        relay_unknown: relay_stats.unknown_source,
        voters_hit: fired.voters_hit.into_values().collect(),
        schedule: ran.schedule,
        by_fault,
        peer_mismatched: total.peer_mismatched,
        peers_quarantined: total.peers_quarantined,
        secs: ran.secs,
        epoch_ends: ran.epoch_ends,
        violations,
        dir: ran.dir,
    }
}
