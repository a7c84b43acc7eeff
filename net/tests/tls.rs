//! The cluster CA on disk, role certificates, and mutual TLS over QUIC on 127.0.0.1.

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use common::{Cluster, Echo, Endpoints, Pair, bounded};
use granary_net::frame::{self, MAX_FRAME_BYTES};
use granary_net::tls::{self, ALPN_API, ALPN_PEER, Identity, Role, TlsError};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

fn role_of_file(path: &std::path::Path) -> Result<Role, TlsError> {
    let der = CertificateDer::from_pem_file(path).expect("read certificate");
    tls::role_of_cert(&der)
}

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

#[test]
fn init_cluster_writes_a_ca_and_one_certificate_per_role() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("new").join("certs");
    let written: BTreeSet<PathBuf> = tls::init_cluster(&dir).unwrap().into_iter().collect();
    let mut expected = BTreeSet::new();
    for name in ["ca", "coordinator", "node", "trainer", "admin"] {
        expected.insert(dir.join(format!("{name}.pem")));
        expected.insert(dir.join(format!("{name}.key")));
    }
    assert_eq!(written, expected);
    for path in &written {
        assert!(path.is_file(), "{} missing", path.display());
        if path.extension().is_some_and(|e| e == "key") {
            assert_eq!(mode(path), 0o600, "{}", path.display());
        }
    }
    for role in Role::ALL {
        assert_eq!(role_of_file(&dir.join(format!("{role}.pem"))).unwrap(), role);
        assert_eq!(Identity::load(&dir, role.as_str()).unwrap().role(), role);
    }
    assert!(matches!(role_of_file(&dir.join("ca.pem")), Err(TlsError::NoRole)));

    let ca_before = std::fs::read(dir.join("ca.key")).unwrap();
    match tls::init_cluster(&dir) {
        Err(TlsError::AlreadyExists { path }) => assert_eq!(path, dir.join("ca.key")),
        other => panic!("second init_cluster: {other:?}"),
    }
    assert_eq!(std::fs::read(dir.join("ca.key")).unwrap(), ca_before, "second init changed the CA key");
}

#[test]
fn issue_signs_new_certificates_and_never_overwrites() {
    let cluster = Cluster::new();
    let (cert, key) = tls::issue(cluster.dir(), Role::Node, "node-2").unwrap();
    assert_eq!((cert.clone(), key.clone()), (cluster.path("node-2.pem"), cluster.path("node-2.key")));
    assert_eq!(mode(&key), 0o600);
    assert_eq!(role_of_file(&cert).unwrap(), Role::Node);
    assert_eq!(cluster.identity("node-2").role(), Role::Node);

    let before = std::fs::read(&cert).unwrap();
    match tls::issue(cluster.dir(), Role::Admin, "node-2") {
        Err(TlsError::AlreadyExists { path }) => assert!(path == cert || path == key, "{}", path.display()),
        other => panic!("second issue: {other:?}"),
    }
    assert_eq!(std::fs::read(&cert).unwrap(), before);
    // A role-named file from init_cluster is protected too.
    assert!(matches!(tls::issue(cluster.dir(), Role::Node, "node"), Err(TlsError::AlreadyExists { .. })));

    for bad in ["../evil", "ca", "", "a/b", ".hidden"] {
        assert!(matches!(tls::issue(cluster.dir(), Role::Node, bad), Err(TlsError::InvalidName { .. })), "{bad:?}");
    }

    let empty = tempfile::tempdir().unwrap();
    let err = tls::issue(empty.path(), Role::Node, "n").unwrap_err();
    assert!(err.to_string().contains(&empty.path().join("ca.pem").display().to_string()), "{err}");
}

#[tokio::test]
async fn mutual_tls_handshake_carries_roles_alpn_and_frames() {
    let cluster = Cluster::new();
    let endpoints = Endpoints::new(&cluster.identity("coordinator"));
    let server = endpoints.server.clone();
    let server_task = tokio::spawn(async move {
        let incoming = server.accept().await.expect("server endpoint open");
        let conn = incoming.await.expect("server handshake");
        let client_role = tls::peer_role(&conn).expect("client role");
        let alpn = tls::alpn_of(&conn);
        let (mut send, mut recv) = conn.accept_bi().await.expect("accept_bi");
        let req: Echo = frame::read_frame(&mut recv, MAX_FRAME_BYTES).await.expect("read request").expect("a request");
        frame::write_frame(&mut send, &Echo { seq: req.seq + 1, text: req.text.to_uppercase() })
            .await
            .expect("write response");
        send.finish().expect("finish");
        // Keep the connection until the client has read the response and closes.
        conn.closed().await;
        (client_role, alpn)
    });

    let config = cluster.identity("node").client_config(ALPN_API).unwrap();
    let conn = bounded("client handshake", endpoints.dial(config, Role::Coordinator)).await.unwrap();
    assert_eq!(tls::peer_role(&conn).unwrap(), Role::Coordinator);
    assert_eq!(tls::alpn_of(&conn).as_deref(), Some(ALPN_API));
    assert_eq!(tls::require_peer_role(&conn, &[Role::Coordinator]).unwrap(), Role::Coordinator);
    let err = tls::require_peer_role(&conn, &[Role::Node, Role::Admin]).unwrap_err();
    assert!(matches!(err, TlsError::WrongRole { got: Role::Coordinator, .. }), "{err}");
    assert!(err.to_string().contains("expected node or admin, got coordinator"), "{err}");

    let resp: Echo =
        bounded("call", frame::call(&conn, &Echo { seq: 41, text: "hello".into() }, MAX_FRAME_BYTES)).await.unwrap();
    assert_eq!(resp, Echo { seq: 42, text: "HELLO".into() });
    conn.close(0u32.into(), b"done");

    let (client_role, alpn) = bounded("server task", server_task).await.unwrap();
    assert_eq!(client_role, Role::Node);
    assert_eq!(alpn.as_deref(), Some(ALPN_API));
}

/// A client that offers none of the server's protocols gets only
/// `granary-versions`, on which the server names what it speaks and
/// closes; a client that does not offer that either (a build before it)
/// is refused at the handshake.
#[tokio::test]
async fn a_server_refuses_clients_that_offer_none_of_its_protocols() {
    let cluster = Cluster::new();
    let endpoints = Endpoints::new(&cluster.identity("coordinator"));
    let config = cluster.identity("node").client_config(ALPN_PEER).unwrap();
    let server = endpoints.server.clone();
    let accepted = tokio::spawn(async move {
        let conn = server.accept().await.expect("endpoint open").await.expect("handshake");
        assert!(granary_net::tls::answer_versions(&conn, &[ALPN_API]));
    });
    let conn = bounded("client handshake", endpoints.dial(config, Role::Coordinator)).await.expect("handshake");
    assert_eq!(tls::alpn_of(&conn).as_deref(), Some(granary_net::tls::ALPN_VERSIONS));
    match bounded("the server's close", conn.closed()).await {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(c.error_code, granary_net::tls::VERSIONS_CLOSE.into());
            assert_eq!(&c.reason[..], ALPN_API);
        }
        other => panic!("closed otherwise: {other}"),
    }
    bounded("server task", accepted).await.unwrap();

    let server = endpoints.server.clone();
    let accepted = tokio::spawn(async move { server.accept().await.expect("endpoint open").await.map(|_| ()) });
    let chain =
        CertificateDer::pem_file_iter(cluster.path("node.pem")).unwrap().collect::<Result<Vec<_>, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_file(cluster.path("node.key")).unwrap();
    let old = raw_client_config(cluster.identity("node").roots(), Some((chain, key)), ALPN_PEER);
    assert!(bounded("client handshake", endpoints.dial(old, Role::Coordinator)).await.is_err());
    assert!(bounded("server handshake", accepted).await.unwrap().is_err());
}

/// A client configuration built without [`Identity`]: trusts `roots`, offers `alpn` only, and presents `client_cert`
/// (a chain and its key) or no certificate at all.
fn raw_client_config(
    roots: Arc<rustls::RootCertStore>,
    client_cert: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    alpn: &[u8],
) -> quinn::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots);
    let mut tls_config = match client_cert {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key).unwrap(),
        None => builder.with_no_client_auth(),
    };
    tls_config.alpn_protocols = vec![alpn.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls_config).unwrap();
    quinn::ClientConfig::new(Arc::new(quic))
}

/// Dials `endpoints` with `config` and tries one request; asserts that the server's handshake fails and that the
/// client cannot complete a call.
async fn assert_refused(endpoints: &Endpoints, config: quinn::ClientConfig) {
    let server = endpoints.server.clone();
    let accepted = tokio::spawn(async move {
        let incoming = server.accept().await.expect("server endpoint open");
        incoming.await.map(|conn| tls::peer_role(&conn))
    });
    let connecting = endpoints.dial(config, Role::Coordinator);
    let client = async {
        // With TLS 1.3 the client may finish its side of the handshake before the server has checked the client's
        // certificate, so the refusal can surface on the first stream rather than on connect.
        let conn = connecting.await?;
        frame::call::<_, Echo>(&conn, &Echo { seq: 1, text: "let me in".into() }, MAX_FRAME_BYTES).await?;
        anyhow::Ok(())
    };
    let client_result = bounded("refused client", client).await;
    assert!(client_result.is_err(), "a refused client completed a call");
    match bounded("server handshake", accepted).await.unwrap() {
        Err(_) => {}
        Ok(role) => panic!("server accepted a connection from a refused client (role {role:?})"),
    }
}

#[tokio::test]
async fn a_client_certificate_from_another_cluster_is_refused() {
    let ours = Cluster::new();
    let theirs = Cluster::new();
    let endpoints = Endpoints::new(&ours.identity("coordinator"));
    // Trusts our CA (so the client accepts the server) but presents a certificate signed by the other CA.
    // Identity::load_files refuses to pair them, so the intruder builds its configuration by hand.
    let err =
        Identity::load_files(&ours.path("ca.pem"), &theirs.path("node.pem"), &theirs.path("node.key")).unwrap_err();
    assert!(matches!(err, TlsError::NotSignedByCa { .. }), "{err}");
    let chain = CertificateDer::pem_file_iter(theirs.path("node.pem")).unwrap().collect::<Result<Vec<_>, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_file(theirs.path("node.key")).unwrap();
    let roots = ours.identity("node").roots();
    assert_refused(&endpoints, raw_client_config(roots, Some((chain, key)), ALPN_API)).await;

    // A client that trusts only the other CA refuses our server: nothing reaches the server's accept either.
    let outsider = theirs.identity("node").client_config(ALPN_API).unwrap();
    let server = endpoints.server.clone();
    let accepted = tokio::spawn(async move { server.accept().await.expect("endpoint open").await.map(|_| ()) });
    assert!(bounded("outsider handshake", endpoints.dial(outsider, Role::Coordinator)).await.is_err());
    assert!(bounded("server side of outsider", accepted).await.unwrap().is_err());
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let cluster = Cluster::new();
    let coordinator = cluster.identity("coordinator");
    let endpoints = Endpoints::new(&coordinator);
    assert_refused(&endpoints, raw_client_config(coordinator.roots(), None, ALPN_API)).await;
}

#[tokio::test]
async fn peer_role_is_read_on_both_ends_of_a_pair() {
    let pair = Pair::new().await;
    assert_eq!(tls::peer_role(&pair.server).unwrap(), Role::Node);
    assert_eq!(tls::peer_role(&pair.client).unwrap(), Role::Coordinator);
    let err = tls::require_peer_role(&pair.server, &[Role::Coordinator]).unwrap_err();
    assert!(err.to_string().contains(&pair.server.remote_address().to_string()), "{err}");
}

#[test]
fn load_errors_name_the_file() {
    let cluster = Cluster::new();
    let empty = tempfile::tempdir().unwrap();
    let err = Identity::load(empty.path(), "node").unwrap_err();
    assert!(err.to_string().contains(&empty.path().join("ca.pem").display().to_string()), "{err}");

    let ca = cluster.path("ca.pem");
    let cert = cluster.path("node.pem");
    let key = cluster.path("node.key");
    let missing = cluster.path("nope.pem");
    let err = Identity::load_files(&ca, &missing, &key).unwrap_err();
    assert!(err.to_string().contains(&missing.display().to_string()), "{err}");

    let cases: [(&str, &[u8]); 3] = [
        ("garbage.pem", b"this is not PEM at all\n"),
        ("bad-base64.pem", b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n"),
        ("bad-der.pem", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
    ];
    for (name, contents) in cases {
        let path = cluster.path(name);
        std::fs::write(&path, contents).unwrap();
        for (ca, cert, key) in [(&path, &cert, &key), (&ca, &path, &key), (&ca, &cert, &path)] {
            let err = Identity::load_files(ca, cert, key).unwrap_err();
            assert!(err.to_string().contains(&path.display().to_string()), "{name}: {err}");
        }
    }

    // A key that belongs to another certificate, and a certificate without a role.
    let err = Identity::load_files(&ca, &cert, &cluster.path("admin.key")).unwrap_err();
    assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
    assert!(err.to_string().contains(&cluster.path("admin.key").display().to_string()), "{err}");
    let err = Identity::load_files(&ca, &ca, &cluster.path("ca.key")).unwrap_err();
    assert!(
        err.to_string().contains(&ca.display().to_string()) && err.to_string().contains("no granary role"),
        "{err}"
    );
}
