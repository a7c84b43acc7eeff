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

/// Issue 43: a new day's file makes a new version, and a node restarted
/// with it converts only the new file's row groups; every older file's
/// chunk comes from its SSD tier, restamped as the new version's shard
/// (the same payload), with no remote read beyond the footers.
#[test]
fn a_new_day_converts_only_its_own_row_groups_after_a_restart() {
    use granary_proto::ChunkView;
    use granary_proto::chunk::Verify;
    let dir = tempfile::tempdir().unwrap();
    let (data, ssd, day) = (dir.path().join("data"), dir.path().join("ssd"), dir.path().join("day"));
    let days = GenSpec { seed: 4, rows: 2_000, files: 2, row_group_rows: 500, ..GenSpec::default() };
    datagen::generate(&data, &days, |_| {}).unwrap();
    let new_day = GenSpec { seed: 5, rows: 1_000, files: 1, row_group_rows: 500, ..GenSpec::default() };
    datagen::generate(&day, &new_day, |_| {}).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (old_version, first) = rt.block_on(async {
        let node = Node::start(&config(&data, Some(&ssd))).await.unwrap();
        let info = node.describe("ads", None).unwrap();
        let mut out = Vec::new();
        for s in &info.shards {
            out.push(node.chunk(info.version, s.shard).await.unwrap().bytes().to_vec());
        }
        assert_eq!(node.stats().conversions, 4);
        node.close().await;
        (info.version, out)
    });
    // The new day, sorted after the others.
    std::fs::copy(day.join("part-00000.parquet"), data.join("part-00002.parquet")).unwrap();
    rt.block_on(async {
        let node = Node::start(&config(&data, Some(&ssd))).await.unwrap();
        let info = node.describe("ads", None).unwrap();
        assert_ne!(info.version, old_version, "a new file is a new version");
        assert_eq!(info.shards.len(), 6);
        let opened = node.stats().remote_bytes;
        let ds = node.dataset(info.version).unwrap();
        for (i, s) in info.shards.iter().enumerate() {
            let got = node.chunk(info.version, s.shard).await.unwrap();
            let v = ChunkView::parse(got.bytes(), Verify::Full).expect("a valid chunk");
            v.expect_identity(info.version, s.shard).expect("the new version's shard");
            if let Some(old) = first.get(i) {
                let was = ChunkView::parse(old, Verify::Full).unwrap();
                let payload = |c: &ChunkView<'_>, b: &[u8]| b[b.len() - c.header().payload_len as usize..].to_vec();
                assert_eq!(payload(&v, got.bytes()), payload(&was, old), "shard {} holds what it held", s.shard);
            }
        }
        let stats = node.stats();
        assert_eq!(stats.conversions, 2, "the new day's two row groups, and only them");
        assert_eq!(node.chunks_reused(), 4, "every older row group restamped");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &granary_node::metrics::registry(&node)).unwrap();
        assert!(text.lines().any(|l| l == "granary_node_chunks_reused_total 4"), "{text}");
        let new_rg: u64 = ds.manifest.files[2].row_groups.iter().map(|g| g.compressed_bytes).sum();
        let read = stats.remote_bytes - opened;
        assert!(read <= new_rg + (64 << 10), "read {read} bytes for the new day's {new_rg}");
    });
}
