//! A seed's cluster, started: its folder cleared, its schedule drawn, the
//! fault store, the voters and the nodes running, every QUIC link through
//! the relay, the SSD and voter folders mounted where the schedule needs
//! them.

use super::config::{RunConfig, SSD_BYTES, Tiers, runtime};
use super::faults::{Pids, link_faults};
use super::job::Job;
use super::schedule::{self, Fault, Schedule};
use super::store::FaultStore;
use super::{lin, powerfs, ssdfs};
use crate::relay::{RelayConfig, RelayHandle};
use anyhow::{Context, Result, anyhow};
use granary_testkit::harness::LocalCluster;
use std::net::SocketAddr;
use std::path::PathBuf;

/// A seed's running cluster and what runs beside it.
pub(super) struct Setup {
    pub(super) dir: PathBuf,
    pub(super) schedule: Schedule,
    pub(super) rt: tokio::runtime::Runtime,
    pub(super) store: FaultStore,
    pub(super) tiers: Tiers,
    pub(super) cluster: LocalCluster,
    pub(super) ids: Vec<u64>,
    pub(super) pids: Pids,
    pub(super) relay: RelayHandle,
    /// The linearizability checker's client sockets, bound before the relay
    /// starts so it knows their addresses.
    pub(super) lin_endpoints: lin::Endpoints,
    pub(super) voter_disks: powerfs::VoterDisks,
    /// The nodes' SSD filesystems, or why there are none.
    pub(super) ssd_mounts: Result<ssdfs::SsdMounts, String>,
    /// A fault the schedule drew that this run cannot inject, and why.
    pub(super) not_injected: Option<String>,
}

/// Starts seed `seed`'s cluster in `cfg.work/seed-N`.
pub(super) fn start(cfg: &RunConfig, job: &Job, seed: u64) -> Result<Setup> {
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
    let mut not_injected = None;
    match (schedule.byzantine, &cfg.forger) {
        (Some(node), Some(forger)) => {
            spec.node_exe = Some((node, forger.clone()));
            spec.verify_peer_chunks = Some(1.0);
        }
        (Some(node), None) => {
            schedule.byzantine = None;
            not_injected = Some(format!("byzantine node {node}: no granary-chaos binary to run it"));
        }
        (None, _) => {}
    }
    let mut cluster = LocalCluster::plan(&cfg.exe, &dir, &job.data, spec)?;
    let ids = cluster.node_ids();
    let pids = Pids { nodes: cfg.nodes, voters: cfg.voters };
    let lin_endpoints = {
        let _rt = rt.enter();
        lin::LinClients::bind(2)?
    };
    let relay = through_relay(&rt, &mut cluster, &ids, pids, seed, &schedule, &lin_endpoints)?;
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
    Ok(Setup {
        dir,
        schedule,
        rt,
        store,
        tiers,
        cluster,
        ids,
        pids,
        relay,
        lin_endpoints,
        voter_disks,
        ssd_mounts,
        not_injected,
    })
}

/// Starts the relay and routes every QUIC link through it: node to node,
/// node to voter, voter to voter, and the chaos client to the voters. The
/// operator's tools (`granary status`, `dataset add`) pass outside the
/// faults.
fn through_relay(
    rt: &tokio::runtime::Runtime,
    cluster: &mut LocalCluster,
    ids: &[u64],
    pids: Pids,
    seed: u64,
    schedule: &Schedule,
    lin_endpoints: &lin::Endpoints,
) -> Result<RelayHandle> {
    let lin_addrs = lin_endpoints.addrs()?;
    let mut processes: Vec<SocketAddr> = ids.iter().map(|&id| cluster.peer_listen(id)).collect();
    processes.extend(cluster.voter_ids().iter().map(|&v| cluster.voter_listen(v)));
    processes.push(lin_addrs[0]);
    let mut relay_cfg = RelayConfig::new(seed, processes);
    relay_cfg.processes[pids.lin().0 as usize].sends_from = lin_addrs[1..].to_vec();
    relay_cfg.default_faults = link_faults(schedule);
    relay_cfg.pass_outsiders = true;
    let relay = rt.block_on(RelayHandle::start(relay_cfg)).context("starting the relay")?;
    for &id in ids {
        let front = relay.front(pids.node(id)).ok_or_else(|| anyhow!("relay has no front for node {id}"))?;
        cluster.set_advertise(id, front);
    }
    for v in cluster.voter_ids() {
        let front = relay.front(pids.voter(v)).ok_or_else(|| anyhow!("relay has no front for voter {v}"))?;
        cluster.set_voter_advertise(v, front);
    }
    Ok(relay)
}
