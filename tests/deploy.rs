//! The deployment files in deploy/ cannot drift from the binary: every
//! `granary` command line in them (Kubernetes manifests, systemd units) uses
//! only subcommands and flags that `granary <subcommand> --help` lists, the
//! manifests parse as YAML, their node.toml templates and the example
//! node.toml pass `granary node --check` once filled in, the ports agree,
//! and the image builds with a toolchain the workspace accepts.

use std::path::{Path, PathBuf};
use std::process::Command;
use yaml_rust2::{Yaml, YamlLoader};

const BIN: &str = env!("CARGO_BIN_EXE_granary");

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every document of every manifest.
fn manifests() -> Vec<(PathBuf, Yaml)> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(deploy().join("k8s")).expect("deploy/k8s").map(|e| e.expect("entry").path()).collect();
    files.sort();
    for f in files {
        let docs = YamlLoader::load_from_str(&read(&f)).unwrap_or_else(|e| panic!("{}: not YAML: {e}", f.display()));
        assert!(!docs.is_empty(), "{}: no documents", f.display());
        out.extend(docs.into_iter().map(|d| (f.clone(), d)));
    }
    out
}

/// The containers of a workload document.
fn containers(doc: &Yaml) -> Vec<&Yaml> {
    doc["spec"]["template"]["spec"]["containers"].as_vec().map(|v| v.iter().collect()).unwrap_or_default()
}

/// `granary` command lines in `text` (a shell line, or an ExecStart), as
/// (subcommand, flags).
fn invocations(text: &str) -> Vec<(String, Vec<String>)> {
    let tokens: Vec<String> =
        text.split_whitespace().map(|t| t.trim_matches(|c| c == '"' || c == '\'').to_string()).collect();
    let mut out = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        if (t == "granary" || t.ends_with("/granary")) && i + 1 < tokens.len() && !tokens[i + 1].starts_with('-') {
            let flags = tokens[i + 2..]
                .iter()
                .take_while(|t| !t.contains("&&") && *t != ";")
                .filter(|t| t.starts_with("--"))
                .map(|t| t.split('=').next().unwrap_or(t).to_string())
                .collect();
            out.push((tokens[i + 1].clone(), flags));
        }
    }
    out
}

fn help(sub: &str) -> String {
    let out = Command::new(BIN).args([sub, "--help"]).output().expect("run granary");
    assert!(out.status.success(), "granary {sub} --help: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_known(origin: &str, sub: &str, flags: &[String]) {
    let text = help(sub);
    for f in flags {
        assert!(
            text.contains(&format!("{f} ")) || text.contains(&format!("{f}\n")),
            "{origin}: granary {sub} has no {f}"
        );
    }
}

#[test]
fn every_command_line_in_deploy_uses_flags_the_binary_has() {
    let mut seen = 0;
    for (file, doc) in manifests() {
        for c in containers(&doc) {
            let mut line = String::new();
            for part in [&c["command"], &c["args"]] {
                for item in part.as_vec().into_iter().flatten() {
                    line += item.as_str().unwrap_or_default();
                    line.push(' ');
                }
            }
            for (sub, flags) in invocations(&line) {
                assert_known(&file.display().to_string(), &sub, &flags);
                seen += 1;
            }
        }
    }
    for unit in ["granary-coordinator.service", "granary-node.service"] {
        let path = deploy().join("systemd").join(unit);
        for line in read(&path).lines().filter(|l| l.starts_with("ExecStart")) {
            let (_, cmd) = line.split_once('=').expect("ExecStart=...");
            for (sub, flags) in invocations(cmd) {
                assert_known(&path.display().to_string(), &sub, &flags);
                seen += 1;
            }
        }
    }
    // Voter and node in Kubernetes, voter, node check and node in systemd.
    assert!(seen >= 5, "found {seen} granary command lines");
}

/// `templ` with its placeholders filled in and its certificate folder
/// pointing at `certs`, checked by `granary node --check`.
fn node_check(origin: &str, templ: &str, certs: &Path, dir: &Path) {
    let mut text = templ.replace("@HOST_IP@", "10.1.2.3");
    let line = text.lines().find(|l| l.trim_start().starts_with("certs =")).map(str::to_string);
    if let Some(line) = line {
        text = text.replace(&line, &format!("certs = {certs:?}"));
    }
    let path = dir.join("node.toml");
    std::fs::write(&path, &text).expect("write");
    let out = Command::new(BIN).args(["node", "--check", "--config"]).arg(&path).output().expect("run granary");
    assert!(
        out.status.success(),
        "{origin} does not pass granary node --check:\n{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains(": ok") && said.contains("node 1 in the cluster"), "{said}");
}

#[test]
fn the_node_configurations_pass_the_nodes_own_check() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .args(["certs", "init", "--nodes", "1", "--out"])
        .arg(tmp.path().join("certs"))
        .output()
        .expect("certs init");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Node 1's own identity folder, as a host is given it.
    let certs = tmp.path().join("certs").join("hosts").join("node-1");
    let mut checked = 0;
    for (file, doc) in manifests() {
        if doc["kind"].as_str() == Some("ConfigMap")
            && let Some(templ) = doc["data"]["node.toml.in"].as_str()
        {
            node_check(&file.display().to_string(), templ, &certs, tmp.path());
            checked += 1;
        }
    }
    let example = deploy().join("systemd").join("node.toml");
    node_check(&example.display().to_string(), &read(&example), &certs, tmp.path());
    assert_eq!(checked, 1, "the DaemonSet's node.toml template");

    // And a template a node would refuse fails the check, naming the file.
    let bad = tmp.path().join("bad.toml");
    std::fs::write(&bad, "ram_bytes = 1\nssd_dir = \"/x\"\n").expect("write");
    let out = Command::new(BIN).args(["node", "--check", "--config"]).arg(&bad).output().expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.toml"));
}

#[test]
fn ports_annotations_and_the_environment_file_agree() {
    for (file, doc) in manifests() {
        let Some(port) = doc["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"].as_str() else {
            continue;
        };
        let c = containers(&doc)[0];
        let declared: Vec<i64> =
            c["ports"].as_vec().into_iter().flatten().filter_map(|p| p["containerPort"].as_i64()).collect();
        assert!(
            declared.contains(&port.parse().expect("port")),
            "{}: metrics port {port} not declared",
            file.display()
        );
        let mut line = String::new();
        for item in c["command"].as_vec().into_iter().flatten() {
            line += item.as_str().unwrap_or_default();
        }
        let templ = manifests()
            .into_iter()
            .filter_map(|(_, d)| d["data"]["node.toml.in"].as_str().map(str::to_string))
            .collect::<String>();
        // A voter pod has a network of its own; a node on the host network
        // serves metrics on the host's address, never every interface.
        assert!(
            line.contains(&format!("--metrics 0.0.0.0:{port}"))
                || templ.contains(&format!("metrics = \"@HOST_IP@:{port}\"")),
            "{}: the scrape annotation names port {port}, which nothing serves",
            file.display()
        );
        if doc["spec"]["template"]["spec"]["hostNetwork"].as_bool() == Some(true) {
            assert!(!templ.contains("metrics = \"0.0.0.0"), "{}: metrics on every host interface", file.display());
        }
        // Issue 48: the probes ask what the endpoint answers for them.
        let port: i64 = port.parse().expect("port");
        for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
            let get = &c[probe]["httpGet"];
            assert_eq!(
                (get["path"].as_str(), get["port"].as_i64()),
                (Some(path), Some(port)),
                "{}: {probe}",
                file.display()
            );
        }
    }
    // A voter is ready only once a quorum has a leader, so voters must
    // reach each other before they are ready.
    for (file, doc) in manifests() {
        if doc["kind"].as_str() == Some("Service") && file.ends_with("coordinator.yaml") {
            let name = doc["metadata"]["name"].as_str().unwrap_or_default().to_string();
            assert_eq!(doc["spec"]["publishNotReadyAddresses"].as_bool(), Some(true), "Service {name}");
        }
    }
    let unit = read(&deploy().join("systemd").join("granary-coordinator.service"));
    let env = read(&deploy().join("systemd").join("coordinator.env"));
    for var in ["GRANARY_ID", "GRANARY_PEERS"] {
        assert!(unit.contains(&format!("${{{var}}}")), "the unit uses {var}");
        assert!(env.lines().any(|l| l.starts_with(&format!("{var}="))), "coordinator.env sets {var}");
    }
}

#[test]
fn the_image_builds_with_a_toolchain_the_workspace_accepts() {
    let file = read(&deploy().join("Containerfile"));
    let from = file.lines().find(|l| l.starts_with("FROM rust:")).expect("a Rust build stage");
    let image: Vec<u32> = from["FROM rust:".len()..]
        .split('-')
        .next()
        .expect("version")
        .split('.')
        .map(|n| n.parse().expect("number"))
        .collect();
    let manifest = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
    let wanted = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .expect("rust-version")
        .trim_matches('"')
        .split('.')
        .map(|n| n.parse::<u32>().expect("number"))
        .collect::<Vec<_>>();
    assert!(image >= wanted, "the image's Rust {image:?} is older than the workspace's rust-version {wanted:?}");
    assert!(file.contains("--bin granary") && file.contains("ENTRYPOINT [\"/usr/local/bin/granary\"]"));
    let ignore = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".dockerignore"));
    assert!(ignore.lines().any(|l| l.trim() == "target"), "target/ stays out of the build context");
}

/// Issue 29: every container of the Kubernetes manifests runs with a
/// read-only root filesystem, no privilege escalation and no capability
/// but what it names; the voters and the node run as a user other than
/// root; only the node's init container runs as root, to hand the host
/// folders over, with CHOWN and FOWNER alone. Each voter mounts a Secret
/// of its own, and the node's identity folder is a host path (no Secret
/// holds every node's key).
#[test]
fn workloads_run_unprivileged_and_each_holds_only_its_own_key() {
    let mut workloads = 0;
    let mut voter_secrets = std::collections::BTreeSet::new();
    for (file, doc) in manifests() {
        let spec = &doc["spec"]["template"]["spec"];
        if spec.is_badvalue() {
            continue;
        }
        workloads += 1;
        let init = spec["initContainers"].as_vec().map(|v| v.iter().collect::<Vec<_>>()).unwrap_or_default();
        for (c, is_init) in containers(&doc).into_iter().map(|c| (c, false)).chain(init.into_iter().map(|c| (c, true)))
        {
            let name = format!("{}: container {}", file.display(), c["name"].as_str().unwrap_or("?"));
            let sc = &c["securityContext"];
            assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true), "{name}");
            assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false), "{name}");
            let dropped: Vec<&str> =
                sc["capabilities"]["drop"].as_vec().into_iter().flatten().filter_map(|c| c.as_str()).collect();
            assert_eq!(dropped, ["ALL"], "{name}");
            let added: Vec<&str> =
                sc["capabilities"]["add"].as_vec().into_iter().flatten().filter_map(|c| c.as_str()).collect();
            if is_init {
                assert!(added.iter().all(|c| ["CHOWN", "FOWNER"].contains(c)), "{name}: {added:?}");
            } else {
                assert!(added.is_empty(), "{name}: {added:?}");
                assert_eq!(sc["runAsNonRoot"].as_bool(), Some(true), "{name}");
                assert!(sc["runAsUser"].as_i64().is_some_and(|u| u > 0), "{name}");
            }
        }
        for v in spec["volumes"].as_vec().into_iter().flatten() {
            if let Some(secret) = v["secret"]["secretName"].as_str() {
                assert!(
                    secret.starts_with("granary-coordinator-") && voter_secrets.insert(secret.to_string()),
                    "{secret}"
                );
            }
            if v["name"].as_str() == Some("certs") && v["hostPath"]["path"].as_str().is_some() {
                assert_eq!(
                    v["hostPath"]["type"].as_str(),
                    Some("Directory"),
                    "a host without its folder does not start"
                );
            }
        }
    }
    assert_eq!(workloads, 4, "three voters and the node DaemonSet");
    assert_eq!(voter_secrets.len(), 3, "a Secret of its own per voter: {voter_secrets:?}");
}

/// A voter's peak RSS as measured, the largest recorded: `granary bench
/// scale --fleet-nodes 1000` with elections during the join
/// (docs/BENCHMARKS.md, "A thousand real nodes", run 7).
const VOTER_MEASURED_PEAK_BYTES: u64 = 1_850_000_000;

/// Every voter's memory limit covers what a voter can hold: its measured
/// peak, the answers in flight and the staged manifest pieces (issue 42),
/// as the manifest's comment sums them.
#[test]
fn the_voters_memory_limit_covers_its_measured_peak_and_its_budgets() {
    let answers = granary_coordinator::server::DEFAULT_RESPONSE_BUDGET_BYTES;
    let staged = granary_coordinator::staged::MAX_STAGED_BYTES;
    let needed = VOTER_MEASURED_PEAK_BYTES + answers + staged;
    let mut voters = 0;
    for (file, doc) in manifests() {
        for c in containers(&doc) {
            let command =
                c["command"].as_vec().map(|v| v.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(" "));
            if !command.is_some_and(|cmd| cmd.contains("granary coordinator")) {
                continue;
            }
            voters += 1;
            let limit = c["resources"]["limits"]["memory"]
                .as_str()
                .unwrap_or_else(|| panic!("{}: no memory limit", file.display()));
            let bytes = quantity(limit);
            assert!(
                bytes >= needed,
                "{}: a voter's memory limit {limit} is below its peak {VOTER_MEASURED_PEAK_BYTES} + answers {answers} + staged {staged} = {needed} bytes",
                file.display()
            );
        }
    }
    assert_eq!(voters, 3, "three voters in deploy/k8s");
}

/// A Kubernetes memory quantity (`4Gi`, `512Mi`, `2G`) in bytes.
fn quantity(q: &str) -> u64 {
    let (digits, unit): (String, String) = q.chars().partition(|c| c.is_ascii_digit());
    let n: u64 = digits.parse().unwrap_or_else(|_| panic!("quantity {q:?}"));
    n * match unit.as_str() {
        "Gi" => 1 << 30,
        "Mi" => 1 << 20,
        "Ki" => 1 << 10,
        "G" => 1_000_000_000,
        "M" => 1_000_000,
        "" => 1,
        other => panic!("quantity {q:?}: unit {other:?}"),
    }
}
