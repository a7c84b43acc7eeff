//! Issue 15, local access: the node's socket admits the uids and groups on
//! its allow-list (default: its own), checked with `SO_PEERCRED` on every
//! connection, whatever the socket file's mode; a socket folder any user
//! can write is refused at start.
//!
//! Connecting as another user needs root; without it the test says
//! "skipped" and why.

use granary_testkit::datagen::{self, GenSpec};
use granary_testkit::harness::NodeProcess;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_granary");
/// `nobody` on Debian.
const OTHER: u32 = 65534;

fn node_toml(socket: &Path, data: &Path, view: &Path, extra: &str) -> String {
    format!(
        "socket = {socket:?}\nram_bytes = {}\nprefetch_bytes = 0\n{extra}\n[[dataset]]\nname = \"ads\"\n\
         source = \"file://{}/\"\nview = {view:?}\n",
        64 << 20,
        data.display()
    )
}

fn stats_as(uid: u32, socket: &Path) -> std::process::Output {
    stats_as_ids(uid, uid, socket)
}

fn stats_as_ids(uid: u32, gid: u32, socket: &Path) -> std::process::Output {
    Command::new(BIN)
        .args(["stats", "--json", "--socket"])
        .arg(socket)
        .uid(uid)
        .gid(gid)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run granary stats")
}

/// A folder every user may reach (the allow-list alone decides who is
/// served) with a small dataset and its view; `None`, saying "skipped",
/// where connecting as another user cannot be done (not root).
fn as_root_with_a_dataset() -> Option<(tempfile::TempDir, std::path::PathBuf, std::path::PathBuf)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        granary_testkit::skip::skipped("connecting as another user needs root");
        return None;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let data = tmp.path().join("data");
    let spec = GenSpec { seed: 2, rows: 2_000, files: 1, row_group_rows: 1_000, ..GenSpec::default() };
    datagen::generate(&data, &spec, |_| {}).expect("generate");
    let view = tmp.path().join("view.toml");
    std::fs::write(&view, datagen::VIEW_TOML).expect("view");
    Some((tmp, data, view))
}

#[test]
fn a_process_of_a_user_not_on_the_allow_list_is_refused_whatever_the_socket_mode() {
    let Some((tmp, data, view)) = as_root_with_a_dataset() else { return };

    for (name, extra, other_admitted) in [("default", "", false), ("listed", &*format!("allow_uids = [{OTHER}]"), true)]
    {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let socket = dir.join("node.sock");
        let config = dir.join("node.toml");
        std::fs::write(&config, node_toml(&socket, &data, &view, extra)).expect("config");
        let node = NodeProcess::spawn(Path::new(BIN), &config, &socket, &dir.join("node.log"), Duration::from_secs(60))
            .expect("node");
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).expect("chmod socket");
        let other = stats_as(OTHER, &socket);
        let stderr = String::from_utf8_lossy(&other.stderr);
        if other_admitted {
            assert!(other.status.success(), "{name}: uid {OTHER} is on the list: {stderr}");
        } else {
            assert!(!other.status.success(), "{name}: uid {OTHER} was served");
            assert!(
                stderr.contains(&format!("uid {OTHER} (group {OTHER}) may not use this node")),
                "{name}: the refusal names the user and the setting: {stderr}"
            );
        }
        assert!(stats_as(0, &socket).status.success(), "{name}: root is admitted");
        node.terminate(Duration::from_secs(20)).expect("clean stop");
    }
}

#[test]
fn a_socket_folder_every_user_can_write_is_refused_at_start() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let shared = tmp.path().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let data = tmp.path().join("data");
    let spec = GenSpec { seed: 2, rows: 1_000, files: 1, row_group_rows: 1_000, ..GenSpec::default() };
    datagen::generate(&data, &spec, |_| {}).expect("generate");
    let view = tmp.path().join("view.toml");
    std::fs::write(&view, datagen::VIEW_TOML).expect("view");
    let config = tmp.path().join("node.toml");
    std::fs::write(&config, node_toml(&shared.join("node.sock"), &data, &view, "")).expect("config");
    let out = Command::new(BIN)
        .args(["node", "--config"])
        .arg(&config)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run granary node");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the node served from a folder every user can write");
    assert!(stderr.contains("writable by every user"), "{stderr}");
    assert!(!shared.join("node.sock").exists());
}

/// The `allow_*` lines of the DaemonSet's node.toml template.
fn manifest_access_lines() -> String {
    let yaml = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/k8s/node.yaml"))
        .expect("deploy/k8s/node.yaml");
    let lines: Vec<&str> = yaml.lines().map(str::trim).filter(|l| l.starts_with("allow_")).collect();
    assert!(!lines.is_empty(), "the manifest's node.toml names who may use the socket");
    lines.join("\n")
}

/// Issue 29: with the manifest's node.toml, a uid-1000 trainer in the
/// trainer group (1000) is served; a process of another user whose group
/// is 0 is refused, by the manifest's lists and by default too (a node run
/// as root admitted every gid-0 process before: many container processes
/// have group 0).
#[test]
fn the_trainer_group_is_admitted_and_a_gid_0_process_is_not() {
    let Some((tmp, data, view)) = as_root_with_a_dataset() else { return };
    for (name, extra, trainer_admitted) in
        [("manifest", manifest_access_lines(), true), ("default", String::new(), false)]
    {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let socket = dir.join("node.sock");
        let config = dir.join("node.toml");
        std::fs::write(&config, node_toml(&socket, &data, &view, &extra)).expect("config");
        let node = NodeProcess::spawn(Path::new(BIN), &config, &socket, &dir.join("node.log"), Duration::from_secs(60))
            .expect("node");
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).expect("chmod socket");
        let trainer = stats_as_ids(1000, 1000, &socket);
        assert_eq!(trainer.status.success(), trainer_admitted, "{name}: {}", String::from_utf8_lossy(&trainer.stderr));
        let gid0 = stats_as_ids(1234, 0, &socket);
        let stderr = String::from_utf8_lossy(&gid0.stderr);
        assert!(!gid0.status.success(), "{name}: a gid-0 process was served");
        assert!(stderr.contains("uid 1234 (group 0) may not use this node"), "{name}: {stderr}");
        node.terminate(Duration::from_secs(20)).expect("clean stop");
    }
}
