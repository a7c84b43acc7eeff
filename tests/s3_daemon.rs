//! The whole single-host path as real processes: a node daemon reading
//! Parquet from a real S3-compatible server on loopback (s3s-fs, in this
//! test's process), and two trainer processes on its Unix socket. Every
//! batch byte is compared with the naive path (decode and convert on demand,
//! no cache, in this process).

mod common;

use granary_client::{Loader, LoaderConfig};
use granary_node::EmbeddedNode;
use granary_node::config::{DatasetConfig, NodeConfig, ViewRef};
use granary_proto::Shuffle;
use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::{NodeProcess, TrainerEvent, TrainerProcess};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const SEED: u64 = 99;
const BATCH: u32 = 256;
const WORLD: u32 = 2;
const EPOCHS: u64 = 2;

fn node_toml(socket: &Path, ssd: &Path, s3: SocketAddr) -> String {
    format!(
        r#"socket = {socket:?}
ssd_dir = {ssd:?}
ssd_bytes = 67108864
ssd_block_bytes = 8388608
ram_bytes = 268435456
prefetch_bytes = 16777216

[remote]
aws_endpoint = "http://{s3}"
aws_allow_http = "true"
aws_access_key_id = "AKTEST"
aws_secret_access_key = "SKTEST"
aws_region = "us-east-1"

[[dataset]]
name = "ads"
source = "s3://train/ads/"

[dataset.view]
{}"#,
        datagen::VIEW_TOML.replace("[[tensor]]", "[[dataset.view.tensor]]")
    )
}

/// The naive path: an in-process node on the same S3 source (so the same
/// dataset version) with no cache and no prefetch.
fn naive_epoch_bytes(s3: SocketAddr, rank: u32, epoch: u64) -> Vec<u8> {
    let view = datagen::view();
    let remote = [
        ("aws_endpoint", format!("http://{s3}")),
        ("aws_allow_http", "true".into()),
        ("aws_access_key_id", "AKTEST".into()),
        ("aws_secret_access_key", "SKTEST".into()),
        ("aws_region", "us-east-1".into()),
    ];
    let cfg = NodeConfig {
        datasets: vec![DatasetConfig {
            name: "ads".into(),
            source: "s3://train/ads/".into(),
            view: ViewRef::Inline(view),
        }],
        remote: remote.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        ram_bytes: 0,
        prefetch_bytes: 0,
        ..NodeConfig::default()
    };
    let node = Arc::new(EmbeddedNode::start(&cfg, 1).unwrap());
    let loader = Loader::new(
        node,
        LoaderConfig {
            seed: SEED,
            rank,
            world_size: WORLD,
            shuffle: Shuffle::Windowed { window_shards: 4 },
            ..LoaderConfig::new("ads", BATCH)
        },
    )
    .unwrap();
    let mut out = Vec::new();
    for batch in loader.epoch(epoch).unwrap() {
        let batch = batch.unwrap();
        for i in 0..batch.layouts().len() {
            out.extend_from_slice(batch.tensor_bytes(i));
        }
    }
    out
}

#[test]
fn daemon_and_two_trainers_over_s3_match_the_naive_path_byte_for_byte() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("s3").join("train").join("ads");
    let spec = GenSpec {
        seed: 5,
        rows: 7_000,
        files: 3,
        row_group_rows: 1_000,
        compression: "zstd".into(),
        ..GenSpec::default()
    };
    let report = datagen::generate(&data, &spec, |_| {}).unwrap();

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let s3 = rt.block_on(common::serve_object_store(&tmp.path().join("s3"), Some(("AKTEST", "SKTEST"))));

    let socket = tmp.path().join("node.sock");
    let config = tmp.path().join("node.toml");
    std::fs::write(&config, node_toml(&socket, &tmp.path().join("ssd"), s3)).unwrap();
    let exe = Path::new(env!("CARGO_BIN_EXE_granary"));
    let node = NodeProcess::spawn(exe, &config, &socket, &tmp.path().join("node.log"), Duration::from_secs(60))
        .expect("node daemon starts against the S3 endpoint");

    let dumps = tmp.path().join("dumps");
    std::fs::create_dir_all(&dumps).unwrap();
    let mut ranks: Vec<TrainerProcess> = (0..WORLD)
        .map(|r| {
            let args: Vec<String> = [
                "--socket",
                &socket.display().to_string(),
                "--rank",
                &r.to_string(),
                "--world",
                &WORLD.to_string(),
                "--batch-size",
                &BATCH.to_string(),
                "--seed",
                &SEED.to_string(),
                "--dump",
                &dumps.display().to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            TrainerProcess::spawn(exe, r, WORLD as usize, &args).unwrap()
        })
        .collect();
    let wait = Duration::from_secs(120);
    for t in &ranks {
        let ev = t.next_event(wait).unwrap();
        assert!(matches!(ev, TrainerEvent::Ready { .. }), "rank {} said {ev:?}\n{}", t.rank, node.log_tail());
    }
    for epoch in 0..EPOCHS {
        for t in &mut ranks {
            t.start_epoch(epoch).unwrap();
        }
        for t in &ranks {
            loop {
                match t.next_event(wait).unwrap() {
                    TrainerEvent::Progress { .. } => {}
                    TrainerEvent::Epoch { .. } => break,
                    other => panic!("rank {}: {other:?}\n{}", t.rank, node.log_tail()),
                }
            }
        }
    }
    let stats = granary_client::LocalSource::connect(&socket).unwrap().stats().unwrap();
    for t in ranks {
        t.finish(Duration::from_secs(30)).unwrap();
    }
    node.stop();

    for rank in 0..WORLD {
        for epoch in 0..EPOCHS {
            let got = std::fs::read(dumps.join(format!("rank-{rank}-epoch-{epoch}.bin"))).unwrap();
            let want = naive_epoch_bytes(s3, rank, epoch);
            assert_eq!(got.len(), want.len(), "rank {rank} epoch {epoch}: length");
            assert!(got == want, "rank {rank} epoch {epoch}: bytes differ from the naive path");
        }
    }
    // One remote read per shard over both epochs, footers included.
    assert!(
        stats.remote_bytes as f64 <= report.bytes as f64 * 1.01,
        "remote bytes {} vs dataset {}",
        stats.remote_bytes,
        report.bytes
    );
    // 7,000 rows in 3 files of 2,334/2,333/2,333 rows, 1,000-row groups: 9 shards.
    assert_eq!(stats.conversions, 9, "each of the 9 shards converted exactly once");
}
