//! `granary certs init|issue` (issue 29): one folder per identity, each
//! holding the CA certificate and that identity's key and certificate and
//! nothing else; the CA key and the admin key kept off the hosts' folders;
//! ids bound into node and voter certificates.

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_granary");

fn run(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).env("GRANARY_LOG", "warn").output().expect("run granary")
}

/// `certs init --nodes N --voters M` writes one folder per identity (issue
/// 29): `hosts/node-ID/` and `hosts/coordinator-ID/` each hold the CA
/// certificate and that identity's certificate (bound to its id) and key,
/// nothing else, so a host given its folder holds no key but its own and
/// can register as no other node and vote as no other voter (what a bound
/// certificate may do: `coordinator/tests/server.rs`). No unbound `node` or
/// `coordinator` identity unless `--unbound`; the CA key and the admin key
/// are in folders of their own (issue 15). `certs issue` makes one more
/// folder, and refuses to put a second key into one.
#[test]
fn certs_init_writes_one_identity_per_folder_and_binds_ids() {
    use rustls::pki_types::pem::PemObject;
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("certs");
    let out = run(&["certs", "init", "--out", root.to_str().expect("utf8"), "--nodes", "2", "--voters", "3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let hosts = root.join("hosts");
    let der_of = |path: PathBuf| {
        let pem = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        rustls::pki_types::CertificateDer::from_pem_slice(&pem).expect("a PEM certificate").into_owned()
    };
    let names_in = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("entry").file_name().to_string_lossy().into())
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        names_in(&hosts),
        ["coordinator-1", "coordinator-2", "coordinator-3", "node-1", "node-2", "trainer"],
        "one folder per host identity, no unbound node or coordinator"
    );
    for name in names_in(&hosts) {
        let folder = hosts.join(&name);
        assert_eq!(names_in(&folder), ["ca.pem".to_string(), format!("{name}.key"), format!("{name}.pem")], "{name}");
        let der = der_of(folder.join(format!("{name}.pem")));
        match name.split_once('-') {
            Some(("node", id)) => {
                assert_eq!(granary_net::tls::node_id_of_cert(&der).expect("readable"), Some(id.parse().expect("id")))
            }
            Some(("coordinator", id)) => {
                assert_eq!(granary_net::tls::voter_id_of_cert(&der).expect("readable"), Some(id.parse().expect("id")))
            }
            _ => assert_eq!(granary_net::tls::role_of_cert(&der).expect("readable"), granary_net::tls::Role::Trainer),
        }
        // The folder alone is a usable identity.
        let (_, loaded) = granary_net::tls::Identity::load_in(&folder, None, "node").expect("usable");
        assert_eq!(loaded, name);
    }
    // No folder made by `certs init` holds more than one private key.
    for dir in [root.join("ca"), root.join("admin")].into_iter().chain(names_in(&hosts).iter().map(|n| hosts.join(n))) {
        let keys = names_in(&dir).into_iter().filter(|n| n.ends_with(".key")).count();
        assert_eq!(keys, 1, "{}", dir.display());
    }
    assert!(root.join("ca/ca.key").exists() && root.join("admin/admin.key").exists());
    assert!(!root.join("admin/ca.key").exists());
    // One more node, into a folder of its own, signed by the CA found two
    // levels up; named after its folder.
    let node3 = hosts.join("node-3");
    let out = run(&["certs", "issue", "--dir", node3.to_str().expect("utf8"), "--role", "node", "--node-id", "3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(names_in(&node3), ["ca.pem", "node-3.key", "node-3.pem"]);
    let der = der_of(node3.join("node-3.pem"));
    assert_eq!(granary_net::tls::node_id_of_cert(&der).expect("readable"), Some(3));
    granary_net::tls::Identity::load(&node3, "node-3").expect("a usable identity, trusted by the hosts' CA");
    // A second key into a host's folder is refused, naming the folder.
    let out = run(&[
        "certs",
        "issue",
        "--dir",
        node3.to_str().expect("utf8"),
        "--role",
        "node",
        "--name",
        "node-4",
        "--node-id",
        "4",
    ]);
    assert!(!out.status.success(), "a second identity was written into node-3's folder");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("one identity per folder") && err.contains("node-3"), "{err}");
    assert_eq!(names_in(&node3), ["ca.pem", "node-3.key", "node-3.pem"]);
    // The shared, unbound identities only when asked.
    let asked = tmp.path().join("unbound");
    let out = run(&["certs", "init", "--out", asked.to_str().expect("utf8"), "--unbound"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(names_in(&asked.join("hosts")), ["coordinator", "node", "trainer"]);
}
