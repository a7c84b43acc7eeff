//! Faults of the kind that can stop progress, on real processes (issue
//! 14, "Bad input and faults"). The object store answers every GET with
//! 503, so no node can read a shard, owner or not: the trainer's error
//! names the shard, what was tried (the owner, the store's file) and why,
//! and the job, started again on its epoch once the store answers, reads
//! exactly the fault-free reference. A majority of the coordinator's
//! voters down does not stop the job: the nodes read on with the
//! placement they know, and once the voters are back the job reads
//! exactly the reference again.
//!
//! The cluster is `granary-chaos run`'s (its job, its fault-injecting S3
//! store and its reference of every rank's batch checksums), without the
//! relay: two nodes, one rank each, one epoch.

use granary_chaos::run::{self, RunConfig, store::FaultStore, store::StoreFaults};
use granary_testkit::harness::{LocalCluster, TrainerEvent, TrainerProcess};
use std::path::Path;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_granary");

struct Outage {
    cfg: RunConfig,
    job: run::Job,
    dir: std::path::PathBuf,
    store: FaultStore,
    cluster: LocalCluster,
    _rt: tokio::runtime::Runtime,
    _tmp: tempfile::TempDir,
}

fn start(voters: u32) -> Outage {
    let tmp = tempfile::tempdir().expect("temp dir");
    let mut cfg = RunConfig::new(BIN.into(), tmp.path().join("work"));
    cfg.nodes = 2;
    cfg.voters = voters;
    cfg.ranks_per_node = 1;
    cfg.epochs = 1;
    cfg.rows = 24_000;
    let job = run::prepare(&cfg, &mut |_| {}).expect("dataset and reference");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let store = rt.block_on(FaultStore::start(&job.store_root, 0)).expect("store");
    let dir = tmp.path().join("cluster");
    let spec = cfg.spec(cfg.nodes, cfg.voters, &store, None);
    let cluster = LocalCluster::start(Path::new(BIN), &dir, &job.data, spec).expect("cluster");
    cluster.wait_placement(&[1, 2], 2, 1, Duration::from_secs(60)).expect("placement");
    Outage { cfg, job, dir, store, cluster, _rt: rt, _tmp: tmp }
}

impl Outage {
    /// Rank `rank` (on node `rank + 1`), ready for its first epoch.
    fn rank(&self, rank: u32) -> TrainerProcess {
        let socket = self.dir.join(format!("node-{}", rank + 1)).join("node.sock");
        let args = self.cfg.rank_args(&socket, rank);
        let log = self.dir.join(format!("rank-{rank}.log"));
        let p = TrainerProcess::spawn_logged(&self.cfg.exe, rank, 1, &args, &log).expect("spawn rank");
        match p.next_event(Duration::from_secs(60)).expect("ready") {
            TrainerEvent::Ready { .. } => p,
            other => panic!("rank {rank}: expected ready, got {other:?}"),
        }
    }

    /// Epoch 0 of `rank` to its end: its digest, or the error it failed with.
    fn epoch(&self, rank: u32, within: Duration) -> Result<String, String> {
        let mut p = self.rank(rank);
        p.start_epoch(0).expect("start epoch");
        let until = Instant::now() + within;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match p.next_event(left).unwrap_or_else(|e| panic!("rank {rank}: {e:#}")) {
                TrainerEvent::Progress { .. } => {}
                TrainerEvent::Epoch { digest, .. } => return Ok(digest),
                TrainerEvent::Error { message, .. } => return Err(message),
                other => panic!("rank {rank}: unexpected {other:?}"),
            }
        }
    }

    fn reference(&self, rank: u32) -> &str {
        &self.job.reference[&(rank, 0)]
    }
}

#[test]
fn a_store_that_answers_nothing_stops_the_epoch_with_an_error_naming_the_shard_and_the_job_resumes_exactly() {
    let o = start(1);
    // Every GET answered 503 SlowDown: neither the owner nor the asking
    // node can read any shard.
    o.store.set_faults(StoreFaults { error: 1.0, ..StoreFaults::default() });
    let started = Instant::now();
    let err = o.epoch(0, Duration::from_secs(150)).expect_err("no shard can be read");
    let waited = started.elapsed();
    println!("after {waited:?}: {err}");
    // Before a fix it said "not a readable Parquet file" (and, comparing a
    // modification-time tag with an ETag, "the file changed since the
    // version was registered"), and was not retryable.
    assert!(err.contains("shard file#"), "names the shard: {err}");
    assert!(err.contains("reading s3://chaos/ads/part-"), "names what was tried, the file in the store: {err}");
    assert!(err.contains("503") && err.contains("SlowDown"), "says why: {err}");
    assert!(!err.contains("not a readable Parquet file") && !err.contains("changed"), "no wrong cause: {err}");
    // The fault clears: the job, started again on its epoch, reads exactly
    // what it reads without faults, on both nodes.
    o.store.set_faults(StoreFaults::default());
    for rank in 0..2 {
        let digest = o.epoch(rank, Duration::from_secs(120)).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(digest, o.reference(rank), "rank {rank}'s batches equal the fault-free reference");
    }
}

#[test]
fn with_a_majority_of_voters_down_the_job_reads_on_and_after_they_return_reads_exactly() {
    let mut o = start(3);
    let leader = o.cluster.leader(Duration::from_secs(10)).expect("status").expect("a leader");
    let down: Vec<u64> = (1..=3).filter(|&v| v != leader).take(1).chain([leader]).collect();
    for &v in &down {
        o.cluster.kill_voter(v);
    }
    let started = Instant::now();
    let outcome = o.epoch(0, Duration::from_secs(150));
    println!("voters {down:?} down: {outcome:?} after {:?}", started.elapsed());
    // The data path does not go through the coordinator: the nodes keep
    // the placement they know, and a node whose lease is in doubt waits
    // (the reroute wait) before it reads a shard as its owner, then reads.
    let digest = outcome.expect("the job reads on without a coordinator majority");
    assert_eq!(digest, o.reference(0), "rank 0's batches equal the reference");
    for &v in &down {
        o.cluster.start_voter(v).expect("voter back");
    }
    for rank in 0..2 {
        let digest = o.epoch(rank, Duration::from_secs(120)).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(digest, o.reference(rank), "rank {rank}'s batches equal the fault-free reference");
    }
}
