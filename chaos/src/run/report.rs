//! What one seed did and how it was judged ([`SeedReport`]).

use super::config::Tiers;
use super::schedule::Schedule;
use super::store::StoreCounts;
use super::verdict::Violation;
use super::{lin, verdict};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What one seed did and how it was judged.
#[derive(Clone, Debug, Serialize)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Its schedule.
    pub schedule: Schedule,
    /// Fault events fired, by kind.
    pub by_fault: BTreeMap<String, u64>,
    /// Peer chunks the nodes found forged (differing from their own
    /// conversion), every life counted.
    pub peer_mismatched: u64,
    /// Peers the nodes running at the end had quarantined, summed.
    pub peers_quarantined: u64,
    /// Wall time from the first epoch's start to the last rank's end.
    pub secs: f64,
    /// When the last rank finished each epoch, seconds from the start.
    pub epoch_ends: Vec<f64>,
    /// Remote bytes read by the cluster over the dataset's bytes.
    pub remote_ratio: f64,
    /// What the schedule allows of it.
    pub remote_bound: f64,
    /// Shards converted, all nodes, all lives.
    pub conversions: u64,
    /// Trainer ranks started again after their node was killed.
    pub rank_restarts: u64,
    /// Chunk entries damaged on SSD. foyer's entry checksum turns a
    /// damaged entry into a miss (the node reads the shard again); the
    /// streams matching the reference show none was served.
    pub ssd_damaged: u64,
    /// Where the nodes' SSD tiers lived: `tmpfs` (a filesystem of their
    /// own, which the fill fault fills), or why not.
    pub ssd_fs: String,
    /// Bytes the fill faults took of the nodes' SSD filesystems.
    pub ssd_filled: u64,
    /// Nodes killed at a write into their SSD tier.
    pub ssd_write_kills: u64,
    /// What the voters' data folders were: `fuse` (folders that lose what
    /// was not synced when a voter's power is cut), or why not.
    pub voter_fs: String,
    /// Voters whose power was cut.
    pub power_cuts: u64,
    /// Bytes of the voters' files that held writes not synced when their
    /// power was cut (each back to its synced image).
    pub power_cut_unsynced_bytes: u64,
    /// Syncs the power-cut voters' folders had seen before their cut (the
    /// log's commits, the vote, snapshots): what the cut kept.
    pub power_cut_syncs: u64,
    /// Power cuts that came between a write and its sync (the voter was
    /// caught in a write whose answer was held back, then killed).
    pub power_cuts_mid_write: u64,
    /// Faults that could not be injected as drawn and what was done
    /// instead (a plain kill and restart), with why.
    pub not_injected: Vec<String>,

    /// What the object store injected.
    pub store: StoreCounts,
    /// The coordinator client's history and its verdict.
    pub lin: lin::LinReport,
    /// Datagrams the relay dropped (faults and partitions).
    pub relay_dropped: u64,
    /// Datagrams the relay sent twice.
    pub relay_duplicated: u64,
    /// Datagrams the links' bandwidth cap held back or dropped.
    pub relay_throttled: u64,
    /// Datagrams the relay passed, by kind of link: `node-node`,
    /// `node-voter` (either way), `voter-voter`, `client-voter`.
    pub relay_links: BTreeMap<&'static str, u64>,
    /// Datagrams from the operator's tools, passed without faults.
    pub relay_outsiders: u64,
    /// Datagrams dropped for coming from an address the relay does not
    /// expect there (a reply to an operator's tool that has exited, whose
    /// port the relay has since bound again).
    pub relay_unknown: u64,
    /// Voters a voter fault hit, in order ("leader" picks resolved).
    pub voters_hit: Vec<u64>,
    /// Each node's RAM tier and guest area.
    pub tiers: Tiers,
    /// A node's memory budget.
    pub memory_budget: u64,
    /// Each node's largest sampled footprint.
    pub memory: BTreeMap<u64, verdict::NodeMemory>,
    /// What broke an invariant; empty when the seed passed.
    pub violations: Vec<Violation>,
    /// Where its processes' logs are.
    pub dir: PathBuf,
}
