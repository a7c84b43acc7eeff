//! A real QUIC connection through the relay: the address mapping holds (no
//! path migration) and quinn's recovery carries a transfer across 5% loss
//! each way, alone and with delay, duplication and reordering. Every wait is bounded so a hang fails.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use granary_chaos::relay::{DelayRange, Link, LinkFaults, ProcessId, RelayConfig, RelayHandle, RelayStats, Reorder};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::time::timeout;

const TRANSFER_BYTES: usize = 1 << 20;
const ROUND_TRIPS: usize = 50;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server endpoint with a self-signed certificate for "localhost", and a
/// client endpoint that trusts it; both bound on loopback port 0.
fn endpoints() -> (quinn::Endpoint, quinn::Endpoint) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("self-signed certificate");
    let der = CertificateDer::from(cert.cert.der().to_vec());
    let key = PrivateKeyDer::try_from(cert.signing_key.serialize_der()).expect("key der");
    let tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_no_client_auth()
        .with_single_cert(vec![der.clone()], key)
        .expect("server config");
    let server_config = quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(tls).expect("quic")));
    let localhost: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let server = quinn::Endpoint::server(server_config, localhost).expect("server endpoint");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der).expect("trust the certificate");
    let tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut client = quinn::Endpoint::client(localhost).expect("client endpoint");
    client.set_default_client_config(quinn::ClientConfig::new(Arc::new(
        QuicClientConfig::try_from(tls).expect("quic client"),
    )));
    (server, client)
}

/// Serves one connection: echoes each small request; for a request of
/// "bulk", reads the rest of the stream and answers its length; for
/// "whoami", answers the address the connection's datagrams come from.
async fn serve(server: quinn::Endpoint) {
    let conn = server.accept().await.expect("incoming").await.expect("handshake");
    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
        let body = recv.read_to_end(TRANSFER_BYTES + 16).await.expect("read request");
        let answer = if body.starts_with(b"bulk") {
            (body.len() as u64).to_be_bytes().to_vec()
        } else if body == b"whoami" {
            conn.remote_address().to_string().into_bytes()
        } else {
            body
        };
        send.write_all(&answer).await.expect("write answer");
        send.finish().expect("finish");
    }
}

async fn call(conn: &quinn::Connection, request: &[u8]) -> Vec<u8> {
    let (mut send, mut recv) = conn.open_bi().await.expect("open stream");
    send.write_all(request).await.expect("write request");
    send.finish().expect("finish");
    recv.read_to_end(64).await.expect("read answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_connection_survives_five_percent_loss() {
    transfer_through(LinkFaults::lossy(0.05)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_connection_survives_loss_delay_duplication_and_reordering() {
    let faults = LinkFaults {
        drop: 0.05,
        duplicate: 0.02,
        delay: DelayRange { min: Duration::from_millis(1), max: Duration::from_millis(5) },
        reorder: Some(Reorder { probability: 0.02, after_datagrams: 3, timeout: Duration::from_millis(20) }),
        bandwidth: None,
    };
    let stats = transfer_through(faults).await;
    for link in [Link::new(0, 1), Link::new(1, 0)] {
        let n = stats.link(link);
        assert!(n.duplicated > 0 && n.reordered > 0 && n.delayed > 0, "{link}: {n:?}");
    }
}

/// Runs the calls and the 1 MiB transfer with `faults` on both directions
/// and checks what every run must show; returns the relay's counts.
async fn transfer_through(faults: LinkFaults) -> RelayStats {
    let (server, client) = endpoints();
    let (server_addr, client_addr) = (server.local_addr().expect("addr"), client.local_addr().expect("addr"));
    let (c, s) = (ProcessId(0), ProcessId(1));
    let mut config = RelayConfig::new(14, [client_addr, server_addr]);
    config.default_faults = faults;
    let relay = RelayHandle::start(config).await.expect("relay starts");
    let serving = tokio::spawn(serve(server.clone()));

    let run = async {
        let conn = client
            .connect(relay.front(s).expect("front"), "localhost")
            .expect("connect")
            .await
            .expect("handshake through the relay");
        let seen_at_start = call(&conn, b"whoami").await;
        for i in 0..ROUND_TRIPS {
            let msg = format!("ping {i}");
            assert_eq!(call(&conn, msg.as_bytes()).await, msg.as_bytes());
        }
        let mut bulk = vec![7u8; TRANSFER_BYTES];
        bulk[..4].copy_from_slice(b"bulk");
        assert_eq!(call(&conn, &bulk).await, (TRANSFER_BYTES as u64).to_be_bytes());
        // The server saw the client at one address throughout (its back
        // socket, not its own address): no path migration.
        let seen_at_end = call(&conn, b"whoami").await;
        assert_eq!(seen_at_start, seen_at_end);
        assert_ne!(seen_at_start, client_addr.to_string().into_bytes());
        conn.close(0u32.into(), b"done");
    };
    timeout(Duration::from_secs(60), run).await.expect("the transfer finishes within 60 s despite 5% loss");

    let stats = relay.stats();
    let (up, down) = (stats.link(Link { from: c, to: s }), stats.link(Link { from: s, to: c }));
    // Loss was real both ways, and the connection recovered from it.
    assert!(up.dropped > 0 && down.dropped > 0, "up {up:?} down {down:?}");
    assert!(up.received > 700, "a 1 MiB transfer is at least ~700 datagrams: {up:?}");
    assert_eq!(stats.unknown_source, 0, "the client and server spoke only through the relay");
    // The close may itself be lost; the server's task is not waited for.
    serving.abort();
    relay.shutdown().await;
    stats
}
