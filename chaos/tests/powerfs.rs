//! The power-cut filesystem through the kernel: files written with std's
//! calls, synced or not, and what a cut leaves. Needs root and /dev/fuse;
//! where they are missing the tests say "skipped" and why.

use granary_chaos::run::powerfs::{PowerFs, available};
use std::io::Write;

fn mounted() -> Option<(tempfile::TempDir, PowerFs)> {
    let dir = tempfile::tempdir().expect("temp dir");
    if let Err(why) = available(dir.path()) {
        granary_testkit::skip::skipped(format!("no power-cut filesystem here: {why}"));
        return None;
    }
    let fs = PowerFs::mount(&dir.path().join("mnt")).expect("mount");
    Some((dir, fs))
}

#[test]
fn a_cut_keeps_synced_files_and_a_durably_replaced_one_and_loses_the_rest() {
    let Some((_dir, mut fs)) = mounted() else { return };
    let m = fs.mount_point().to_path_buf();
    // Synced, then more written without a sync.
    let mut a = std::fs::File::create(m.join("a")).expect("create a");
    a.write_all(b"synced").expect("write");
    a.sync_all().expect("sync");
    a.write_all(b" and lost").expect("write");
    drop(a);
    // Never synced (its name is, by the folder's sync below).
    std::fs::write(m.join("b"), b"lost").expect("write b");
    std::fs::write(m.join("e"), b"lost too").expect("write e");
    // Replaced the durable way: temp file synced, renamed, folder synced.
    std::fs::write(m.join("c"), b"old").expect("write c");
    std::fs::File::open(m.join("c")).expect("open").sync_all().expect("sync c");
    let mut tmp = std::fs::File::create(m.join("c.tmp")).expect("create");
    tmp.write_all(b"new").expect("write");
    tmp.sync_all().expect("sync");
    drop(tmp);
    std::fs::rename(m.join("c.tmp"), m.join("c")).expect("rename");
    std::fs::File::open(&m).expect("open folder").sync_all().expect("sync folder");
    std::fs::remove_file(m.join("e")).expect("unlink e");
    // Renamed without the folder's sync.
    std::fs::write(m.join("d.tmp"), b"d").expect("write d");
    std::fs::File::open(m.join("d.tmp")).expect("open").sync_all().expect("sync d");
    std::fs::rename(m.join("d.tmp"), m.join("d")).expect("rename d");
    assert_eq!(std::fs::read(m.join("a")).expect("read a"), b"synced and lost");

    let cut = fs.cut().expect("cut");
    assert!(cut.unsynced_bytes > 0 && cut.syncs >= 5, "{cut:?}");
    assert_eq!(std::fs::read(m.join("a")).expect("read a"), b"synced");
    // b's name was made durable by the folder's sync, its bytes never.
    assert_eq!(std::fs::read(m.join("b")).expect("read b"), b"", "a file never synced is empty");
    assert_eq!(std::fs::read(m.join("c")).expect("read c"), b"new");
    assert!(!m.join("c.tmp").exists());
    assert!(!m.join("d").exists(), "a rename without the folder's sync is undone");
    assert!(m.join("e").exists(), "so is an unlink");
    assert_eq!(std::fs::read(m.join("d.tmp")).expect("read d.tmp"), b"d");
}

#[test]
fn a_caught_write_waits_until_let_go_and_a_cut_then_loses_it() {
    let Some((_dir, mut fs)) = mounted() else { return };
    let m = fs.mount_point().to_path_buf();
    std::fs::write(m.join("log"), b"kept").expect("write");
    std::fs::File::open(m.join("log")).expect("open").sync_all().expect("sync");
    std::fs::File::open(&m).expect("open folder").sync_all().expect("sync folder");
    let path = m.join("log");
    let writer = std::thread::spawn(move || {
        // Give the trap time to be armed first.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).expect("open");
        f.write_all(b" and lost").expect("write");
        std::time::Instant::now()
    });
    assert!(fs.catch_write(std::time::Duration::from_secs(10)), "the write was caught");
    // The writer waits for its answer while the write is held.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!writer.is_finished(), "the writer waits while its write is held");
    let released = std::time::Instant::now();
    fs.let_go();
    let answered = writer.join().expect("writer");
    assert!(answered >= released, "answered only once let go");
    assert_eq!(std::fs::read(m.join("log")).expect("read"), b"kept and lost");
    let cut = fs.cut().expect("cut");
    assert!(cut.unsynced_bytes > 0, "{cut:?}");
    assert_eq!(std::fs::read(m.join("log")).expect("read"), b"kept");
    // Nothing written: nothing caught, and the trap is off again.
    assert!(!fs.catch_write(std::time::Duration::from_millis(100)));
    std::fs::write(m.join("other"), b"x").expect("a write after the trap timed out is answered");
}
