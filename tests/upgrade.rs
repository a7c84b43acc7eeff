//! Rolling upgrades (issue 42): a fleet halfway through one. One node of
//! three speaks the peer protocol as the build before does
//! (`granary-peer/4`: chunks of format 2 only, `[cluster.fabric]
//! peer_protocol = 4`), and a trainer speaks the local protocol of the
//! build before (2). The job reads the same batches as on a fleet of one
//! build, with as many remote reads, and verification quarantines no one.

use granary_client::{Loader, LoaderConfig};
use granary_proto::version::Speaks;
use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::{LocalCluster, LocalClusterSpec};
use std::path::Path;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_granary");
const TIMEOUT: Duration = Duration::from_secs(120);

/// What one fleet gave: every node's rank's batches (each tensor's bytes),
/// and the cluster's counters.
struct Run {
    batches: Vec<Vec<Vec<Vec<u8>>>>,
    remote_bytes: u64,
    peer_fetched: u64,
    verified: u64,
    mismatched: u64,
    legacy_fetched: u64,
    legacy_served: u64,
}

fn run(dir: &Path, data: &Path, previous: Vec<u64>, verify: Option<f64>) -> Run {
    let spec = LocalClusterSpec {
        nodes: 3,
        prefetch_bytes: 0,
        verify_peer_chunks: verify,
        previous_peer_protocol: previous.clone(),
        ..LocalClusterSpec::default()
    };
    let c = LocalCluster::start(Path::new(BIN), dir, data, spec).expect("cluster");
    let ids = c.node_ids();
    c.wait_placement(&ids, 3, 1, TIMEOUT).expect("placement");
    let before = c.total_stats().expect("stats");
    let cfg = LoaderConfig { seed: 7, ..LoaderConfig::new("ads", 500) };
    let mut batches = Vec::new();
    for &id in &ids {
        // Node 2's rank is a trainer of the build before (local protocol
        // 2): its node hands it format-2 chunks.
        let source = if id == 2 {
            granary_client::LocalSource::connect_speaking(c.socket(id), Speaks { oldest: 1, current: 2 })
        } else {
            granary_client::LocalSource::connect(c.socket(id))
        }
        .expect("connect");
        let loader = Loader::new(std::sync::Arc::new(source), cfg.clone()).expect("loader");
        let epoch: Vec<Vec<Vec<u8>>> = loader
            .epoch(0)
            .unwrap_or_else(|e| panic!("epoch on node {id}: {e}\n{}", c.log_tails()))
            .map(|b| {
                let b = b.unwrap_or_else(|e| panic!("a batch on node {id}: {e}\n{}", c.log_tails()));
                (0..b.layouts().len()).map(|t| b.tensor_bytes(t).to_vec()).collect()
            })
            .collect();
        batches.push(epoch);
    }
    let after = c.total_stats().expect("stats");
    let legacy = previous.first().map(|&id| c.stats(id).expect("stats"));
    let per_node: Vec<_> = ids.iter().map(|&id| c.stats(id).expect("stats")).collect();
    Run {
        batches,
        remote_bytes: after.remote_bytes - before.remote_bytes,
        peer_fetched: after.peer_fetched - before.peer_fetched,
        verified: per_node.iter().map(|s| s.peer_verified).sum(),
        mismatched: per_node.iter().map(|s| s.peer_mismatched + s.peers_quarantined).sum(),
        legacy_fetched: legacy.as_ref().map_or(0, |s| s.peer_fetched),
        legacy_served: legacy.as_ref().map_or(0, |s| s.peer_served),
    }
}

/// Issue 42, item 5: node 3 speaks `granary-peer/4` and node 2's trainer
/// local protocol 2; the other nodes speak both versions of each wire.
/// Every rank gets the batches a fleet of one build gives, the cluster
/// reads remote storage within 1.05x as much, chunks cross between the
/// old and new nodes both ways, and, in a third fleet, verifying every
/// peer chunk (format 2 against this build's own, like with like) finds
/// no mismatch.
#[test]
fn a_fleet_halfway_through_an_upgrade_reads_what_one_build_reads() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let spec = GenSpec {
        seed: 11,
        rows: 12_000,
        files: 3,
        row_group_rows: 1_000,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    datagen::generate(&data, &spec, |_| {}).expect("generate");

    let one_build = run(&tmp.path().join("one-build"), &data, Vec::new(), None);
    let mixed = run(&tmp.path().join("mixed"), &data, vec![3], None);
    // Verifying every peer chunk reads every shard on every node: a run
    // of its own.
    let verified = run(&tmp.path().join("verified"), &data, vec![3], Some(1.0));

    assert_eq!(mixed.batches.len(), 3);
    for (node, a) in one_build.batches.iter().enumerate() {
        assert!(!a.is_empty());
        assert_eq!(a, &mixed.batches[node], "node {}'s rank read other batches in the mixed fleet", node + 1);
        assert_eq!(a, &verified.batches[node], "node {}'s rank, every peer chunk verified", node + 1);
    }
    assert!(
        mixed.remote_bytes as f64 <= 1.05 * one_build.remote_bytes as f64,
        "the mixed fleet read {} bytes remotely, one build {} ({:.3}x)",
        mixed.remote_bytes,
        one_build.remote_bytes,
        mixed.remote_bytes as f64 / one_build.remote_bytes as f64
    );
    assert!(mixed.peer_fetched > 0 && one_build.peer_fetched > 0, "chunks moved between nodes");
    assert!(mixed.legacy_fetched > 0, "the old node took chunks from new ones");
    assert!(mixed.legacy_served > 0, "new nodes took chunks from the old one");
    assert!(
        verified.verified > 0 && verified.legacy_served > 0,
        "peer chunks, the old node's among them, were verified"
    );
    assert_eq!(verified.mismatched, 0, "no peer was taken for a forger");
}
