//! A full SSD filesystem. The node daemon's SSD folder is a 12 MiB tmpfs
//! in a mount namespace of the daemon's own (`unshare -m` as root,
//! `unshare -Urm` otherwise), so nothing stays mounted when the test ends,
//! however it ends.
//!
//! foyer creates its block files sparse, and when a write into them fails
//! with ENOSPC its block manager panics and poisons its state (foyer
//! 0.22.6): the tier stops storing. The node therefore refuses an
//! `ssd_bytes` the filesystem cannot hold and reserves the files' space
//! when it starts. Here: a 32 MiB tier on the 12 MiB filesystem is refused
//! with an error naming the folder; an 8 MiB tier starts, the rest of the
//! filesystem is then filled by someone else, and the daemon serves a
//! 30 MB dataset twice with every chunk equal to a reference, SSD hits, no
//! write error and no panic in its log.

use granary_client::{ChunkSource, LocalSource};
use granary_node::Node;
use granary_node::config::{DatasetConfig, NodeConfig, ViewRef};
use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::NodeProcess;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_granary");

/// `unshare` arguments that give a process a mount namespace in which it
/// may mount a tmpfs: a plain one as root, one inside a user namespace
/// otherwise. Panics, naming what is missing, when neither works.
fn unshare_args() -> Vec<&'static str> {
    for args in [vec!["-m"], vec!["-U", "-r", "-m"]] {
        let ok = Command::new("unshare")
            .args(&args)
            .args([
                "sh",
                "-c",
                "mount -t tmpfs -o size=1m tmpfs /mnt 2>/dev/null || mount -t tmpfs -o size=1m tmpfs /tmp",
            ])
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return args;
        }
    }
    panic!(
        "this test mounts a small tmpfs in a mount namespace of its own: it needs `unshare` (util-linux) and root or \
         unprivileged user namespaces"
    );
}

/// The node config: 4 MiB of RAM (about five chunks of this dataset),
/// `ssd_bytes` in 2 MiB blocks, no prefetch.
fn node_toml(socket: &Path, ssd: &Path, ssd_bytes: u64, data: &Path, view: &Path) -> String {
    format!(
        "socket = {socket:?}\nssd_dir = {ssd:?}\nram_bytes = {}\nssd_bytes = {ssd_bytes}\nssd_block_bytes = {}\n\
         prefetch_bytes = 0\n\n[[dataset]]\nname = \"ads\"\nsource = \"file://{}/\"\nview = {view:?}\n",
        4 << 20,
        2 << 20,
        data.display()
    )
}

#[test]
fn the_ssd_tier_reserves_its_space_and_serves_correct_chunks_when_the_filesystem_fills() {
    let unshare = unshare_args();
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    // 40 shards of ~0.75 MB converted (1,000 rows of 748 bytes).
    let spec = GenSpec {
        seed: 21,
        rows: 40_000,
        files: 4,
        row_group_rows: 1_000,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    let generated = datagen::generate(&data, &spec, |_| {}).expect("generate");
    let view = tmp.path().join("view.toml");
    std::fs::write(&view, datagen::VIEW_TOML).expect("view");
    let ssd = tmp.path().join("ssd");
    std::fs::create_dir_all(&ssd).expect("ssd dir");
    let socket = tmp.path().join("node.sock");
    let config = tmp.path().join("node.toml");
    // `NodeProcess` runs `EXE node --config FILE`; EXE is this script,
    // which mounts the tmpfs over the SSD folder in a new mount namespace
    // and then becomes the daemon.
    let wrapper = tmp.path().join("granary-on-small-ssd");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec unshare {} sh -c 'mount -t tmpfs -o size=12m tmpfs \"$0\" && exec \"$@\"' {ssd:?} {BIN:?} \"$@\"\n",
            unshare.join(" ")
        ),
    )
    .expect("wrapper");
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let log = tmp.path().join("node.log");

    // More SSD than the filesystem holds: refused, naming the folder.
    std::fs::write(&config, node_toml(&socket, &ssd, 32 << 20, &data, &view)).expect("config");
    let refused = NodeProcess::spawn(&wrapper, &config, &socket, &log, Duration::from_secs(60))
        .err()
        .expect("a 32 MiB tier on a 12 MiB filesystem is refused");
    // The whole log: with RUST_BACKTRACE set, a backtrace follows the error.
    let message = std::fs::read_to_string(&log).expect("log");
    assert!(message.contains(&ssd.display().to_string()) && message.contains("ssd_bytes"), "{refused:#}\n{message}");

    // 8 MiB fits. Once the daemon serves, fill the rest of its filesystem
    // (seen through /proc/PID/root, as the mount is in its namespace).
    std::fs::write(&config, node_toml(&socket, &ssd, 8 << 20, &data, &view)).expect("config");
    let daemon = NodeProcess::spawn(&wrapper, &config, &socket, &log, Duration::from_secs(60)).expect("daemon");
    let filler = Path::new(&format!("/proc/{}/root", daemon.pid()))
        .join(ssd.strip_prefix("/").expect("absolute"))
        .join("filler");
    let mut f = std::fs::File::create(&filler).expect("filler");
    let block = vec![7u8; 64 << 10];
    let full = loop {
        if let Err(e) = std::io::Write::write_all(&mut f, &block).and_then(|()| f.sync_data()) {
            break e;
        }
    };
    assert_eq!(full.raw_os_error(), Some(28), "the filesystem filled up: {full}");
    drop(f);

    // The reference: the same dataset converted by a node without SSD.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let reference = rt.block_on(async {
        let cfg = NodeConfig {
            datasets: vec![DatasetConfig {
                name: "ads".into(),
                source: format!("file://{}/", data.display()),
                view: ViewRef::Inline(datagen::view()),
            }],
            ram_bytes: 256 << 20,
            prefetch_bytes: 0,
            ..NodeConfig::default()
        };
        let node = Node::start(&cfg).await.expect("reference node");
        let info = node.describe("ads", None).expect("describe");
        let mut chunks = Vec::new();
        for s in &info.shards {
            chunks.push(node.chunk(info.version, s.shard).await.expect("chunk").bytes().to_vec());
        }
        chunks
    });

    // Every request gets an answer within the deadline: run the passes on
    // a thread and wait for it.
    let (tx, rx) = std::sync::mpsc::channel();
    let socket_for_passes = socket.clone();
    std::thread::spawn(move || {
        // No client-side mapping cache: every fetch asks the daemon.
        let src = LocalSource::connect(&socket_for_passes).expect("connect").mapping_cache(0);
        let info = src.describe("ads", None).expect("describe");
        // The second pass walks backwards, so that it meets the chunks the
        // first one left in RAM and on SSD before it evicts them.
        let mut passes = Vec::new();
        for backwards in [false, true] {
            let mut order: Vec<usize> = (0..info.shards.len()).collect();
            if backwards {
                order.reverse();
            }
            let mut pass = vec![Vec::new(); order.len()];
            for i in order {
                pass[i] = src.fetch(info.version, info.shards[i].shard).expect("fetch").bytes().to_vec();
            }
            passes.push(pass);
        }
        let _ = tx.send((passes, src.stats().expect("stats")));
    });
    let (passes, stats) = rx.recv_timeout(Duration::from_secs(120)).unwrap_or_else(|_| {
        panic!("two passes over 40 shards did not finish in 120 s; node log:\n{}", daemon.log_tail())
    });
    for (p, pass) in passes.iter().enumerate() {
        assert_eq!(pass.len(), reference.len());
        for (i, (got, want)) in pass.iter().zip(&reference).enumerate() {
            assert!(got == want, "pass {p}, shard {i}: the daemon's chunk differs from the reference");
        }
    }
    let text = std::fs::read_to_string(&log).expect("log");
    for bad in ["No space left", "panicked", "ERROR"] {
        assert!(!text.contains(bad), "{bad:?} in the node log:\n{}", daemon.log_tail());
    }
    // RAM and SSD together hold about a third of the 40 chunks: the second
    // pass found some on SSD and read the others again.
    assert!(stats.ssd_hits > 0, "{stats:?}");
    assert!(stats.remote_bytes > generated.bytes, "{stats:?} vs {} dataset bytes", generated.bytes);
    assert_eq!(stats.corrupt_entries, 0, "{stats:?}");
}
