//! `http://` and `https://` sources: object_store's HTTP store, which lists
//! a folder with WebDAV `PROPFIND` and reads with ranged `GET`s, against a
//! read-only WebDAV file server on loopback (in this test's process). Every
//! tensor of every shard must equal what the same files give from `file://`.

mod sources;
mod webdav;

use granary_node::Node;
use granary_testkit::datagen::{self, GenSpec};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_source_gives_the_same_tensors_as_the_same_files_on_disk() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("train/ads");
    let spec = GenSpec {
        seed: 13,
        rows: 3_000,
        files: 2,
        row_group_rows: 1_000,
        compression: "snappy".into(),
        ..GenSpec::default()
    };
    let generated = datagen::generate(&data, &spec, |_| {}).expect("generate");
    let requests = Arc::new(AtomicU64::new(0));
    let addr = webdav::serve_webdav(tmp.path(), requests.clone()).await;
    let url = format!("http://{addr}/train/ads/");

    // Plain HTTP must be allowed explicitly; the refusal names the source.
    let refused =
        Node::start(&sources::node_config(url.clone(), BTreeMap::new())).await.err().expect("http needs allow_http");
    let message = refused.to_string();
    assert!(message.contains(&url) && message.contains("allow_http"), "{message}");

    // An option the HTTP store does not know is named, not dropped.
    let typo = BTreeMap::from([("allow_http".to_string(), "true".to_string()), ("timout".to_string(), "5s".into())]);
    let message = Node::start(&sources::node_config(url.clone(), typo)).await.err().expect("typo").to_string();
    assert!(message.contains("timout"), "{message}");

    let remote = BTreeMap::from([("allow_http".to_string(), "true".to_string())]);
    let http = Node::start(&sources::node_config(url, remote)).await.expect("http:// node");
    let disk =
        Node::start(&sources::node_config(format!("file://{}", data.display()), BTreeMap::new())).await.expect("node");
    let a = sources::assert_same_tensors(&http, &disk).await;
    assert_eq!(a.files.len(), 2);
    let stats = http.stats();
    assert_eq!(stats.conversions, a.shards.len() as u64, "{stats:?}");
    // Each row group once, plus each footer read as the file's last 64 KiB.
    let bound = generated.bytes + 2 * (64 << 10);
    assert!(stats.remote_bytes > 0 && stats.remote_bytes <= bound, "{stats:?} vs {} bytes", generated.bytes);
    assert!(requests.load(Ordering::Relaxed) > a.shards.len() as u64, "every read went to the server");
}

/// A CA of the test's own and a server configuration whose certificate it
/// signed for `localhost`; returns the CA certificate as PEM.
fn private_ca_server() -> (String, Arc<rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("server key");
    let cert = CertificateParams::new(vec!["localhost".to_string()])
        .expect("server params")
        .signed_by(&key, &issuer)
        .expect("server certificate");
    granary_net::tls::ensure_default_crypto_provider();
    let key = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key der");
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .expect("server config");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    (ca_cert.pem(), Arc::new(config))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_source_with_a_private_ca_is_read_once_ca_file_trusts_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("train/ads");
    let spec = GenSpec {
        seed: 14,
        rows: 2_000,
        files: 2,
        row_group_rows: 1_000,
        compression: "zstd".into(),
        ..GenSpec::default()
    };
    datagen::generate(&data, &spec, |_| {}).expect("generate");
    let (ca_pem, tls) = private_ca_server();
    let requests = Arc::new(AtomicU64::new(0));
    let addr = webdav::serve_webdav_tls(tmp.path(), requests.clone(), tls).await;
    let url = format!("https://localhost:{}/train/ads/", addr.port());

    // The system roots do not know our CA: the node refuses the server,
    // and the error names the source and the certificate problem.
    let unknown = Node::start(&sources::node_config(url.clone(), BTreeMap::new())).await.err().expect("unknown CA");
    let message = unknown.to_string();
    assert!(message.contains("https://localhost") && message.to_lowercase().contains("certificate"), "{message}");

    // A ca_file that is not there is named.
    let missing = tmp.path().join("no-such-ca.pem");
    let remote = BTreeMap::from([("ca_file".to_string(), missing.display().to_string())]);
    let message = Node::start(&sources::node_config(url.clone(), remote)).await.err().expect("missing").to_string();
    assert!(message.contains("no-such-ca.pem"), "{message}");

    let ca_file = tmp.path().join("ca.pem");
    std::fs::write(&ca_file, ca_pem).expect("write CA");
    let remote = BTreeMap::from([("ca_file".to_string(), ca_file.display().to_string())]);
    let https = Node::start(&sources::node_config(url, remote)).await.expect("https:// node");
    let disk =
        Node::start(&sources::node_config(format!("file://{}", data.display()), BTreeMap::new())).await.expect("node");
    let a = sources::assert_same_tensors(&https, &disk).await;
    assert_eq!(a.files.len(), 2);
    assert_eq!(https.stats().conversions, a.shards.len() as u64);
    assert!(requests.load(Ordering::Relaxed) > a.shards.len() as u64, "every read went to the server");
}
