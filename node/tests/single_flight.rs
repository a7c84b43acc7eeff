//! Concurrent requests for one shard share one remote read and one
//! conversion; a restarted node serves its SSD tier without remote reads.

use granary_node::Node;
use granary_node::config::{DatasetConfig, NodeConfig, ViewRef};
use granary_testkit::datagen::{self, GenSpec};

fn config(data: &std::path::Path, ssd: Option<&std::path::Path>) -> NodeConfig {
    let view = datagen::view();
    NodeConfig {
        datasets: vec![DatasetConfig {
            name: "ads".into(),
            source: format!("file://{}", data.display()),
            view: ViewRef::Inline(view),
        }],
        ssd_dir: ssd.map(|p| p.to_path_buf()),
        ssd_bytes: 64 << 20,
        ssd_block_bytes: 8 << 20,
        ram_bytes: 64 << 20,
        ..NodeConfig::default()
    }
}

#[test]
fn sixty_four_concurrent_requests_make_one_read_and_one_conversion() {
    let dir = tempfile::tempdir().unwrap();
    let spec = GenSpec {
        seed: 1,
        rows: 2_000,
        files: 1,
        row_group_rows: 500,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    datagen::generate(dir.path(), &spec, |_| {}).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let node = Node::start(&config(dir.path(), None)).await.unwrap();
        let info = node.describe("ads", None).unwrap();
        let opened = node.stats().remote_bytes; // footers
        let shard = info.shards[2].shard;
        let handles: Vec<_> = (0..64)
            .map(|_| {
                let node = node.clone();
                tokio::spawn(async move { node.chunk(info.version, shard).await.map(|c| c.bytes().to_vec()) })
            })
            .collect();
        let mut bodies = Vec::new();
        for h in handles {
            bodies.push(h.await.unwrap().unwrap());
        }
        assert!(bodies.windows(2).all(|w| w[0] == w[1]), "every waiter got the same chunk");
        let stats = node.stats();
        assert_eq!(stats.conversions, 1, "one conversion for 64 requests");
        assert_eq!(stats.misses, 1, "one load started");
        let ds = node.dataset(info.version).unwrap();
        let rg_bytes = ds.manifest.files[0].row_groups[2].compressed_bytes;
        let read = stats.remote_bytes - opened;
        assert!(read <= rg_bytes + (64 << 10), "read {read} bytes for a row group of {rg_bytes}");
    });
}

#[test]
fn a_restarted_node_serves_its_ssd_tier_without_remote_reads() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let ssd = dir.path().join("ssd");
    let spec = GenSpec {
        seed: 2,
        rows: 3_000,
        files: 2,
        row_group_rows: 500,
        compression: "zstd".into(),
        ..GenSpec::default()
    };
    datagen::generate(&data, &spec, |_| {}).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let first: Vec<Vec<u8>> = rt.block_on(async {
        let node = Node::start(&config(&data, Some(&ssd))).await.unwrap();
        let info = node.describe("ads", None).unwrap();
        let mut out = Vec::new();
        for s in &info.shards {
            out.push(node.chunk(info.version, s.shard).await.unwrap().bytes().to_vec());
        }
        node.close().await;
        out
    });
    rt.block_on(async {
        let node = Node::start(&config(&data, Some(&ssd))).await.unwrap();
        let info = node.describe("ads", None).unwrap();
        let opened = node.stats().remote_bytes;
        for (s, want) in info.shards.iter().zip(&first) {
            let got = node.chunk(info.version, s.shard).await.unwrap();
            assert!(got.bytes() == want.as_slice(), "shard {} differs after restart", s.shard);
        }
        let stats = node.stats();
        assert_eq!(stats.conversions, 0, "nothing converted again");
        assert_eq!(stats.remote_bytes, opened, "only the footers were read");
        assert_eq!(stats.ssd_hits, info.shards.len() as u64);
    });
}
