//! The Prometheus endpoint: `GET /metrics` over plain HTTP/1.1, answering
//! with a [`Registry`] in the OpenMetrics text format; and the probes an
//! orchestrator asks (issue 48): `/healthz` (the process answers: 200)
//! and `/readyz` (200 when the [`Readiness`] it was given says so, else
//! 503 with the reason).
//!
//! Nodes and voters build their own registries (counters read at scrape
//! time through collectors, histograms updated where the work happens) and
//! serve them here on the address their configuration names. The format is
//! `prometheus-client`'s; the server is hyper's. Scraping reads only memory:
//! no request can block the node or the coordinator, and the endpoint holds
//! at most [`MAX_METRICS_CONNECTIONS`] connections,
//! [`MAX_METRICS_CONNECTIONS_PER_ADDRESS`] from one address (so a flood
//! cannot fail the readiness probe), each for at most two minutes (issue
//! 29).

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE_OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long one connection may take to send its request headers.
const HEADER_WAIT: Duration = Duration::from_secs(10);

/// Connections answered at once: more are closed as soon as they are
/// accepted, so a flood of connections holds neither tasks nor memory of
/// the node or voter behind the endpoint (a scraper connects once).
pub const MAX_METRICS_CONNECTIONS: usize = 64;

/// Connections from one address answered at once: a process that holds
/// connections open cannot take the slots of the scraper or of the
/// readiness probe, which come from other addresses.
pub const MAX_METRICS_CONNECTIONS_PER_ADDRESS: usize = 8;

/// How long one connection is kept, requests and idle time together: a
/// scraper that keeps its connection alive simply connects again.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(120);

/// The metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve metrics on {addr}: {source}")]
pub struct MetricsError {
    /// The address asked for.
    pub addr: SocketAddr,
    /// Why binding failed.
    #[source]
    pub source: std::io::Error,
}

/// Whether the process behind the endpoint is ready: `Ok` with what it
/// is ready as, or `Err` with why not (a sentence, shown in `/readyz`).
pub type Readiness = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// A running metrics endpoint; stops when dropped or [`stop`](Self::stop)ped.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl MetricsServer {
    /// Binds `addr` (port 0 picks a free one) and serves `registry` until
    /// stopped, always ready. Must run inside a tokio runtime.
    pub async fn bind(addr: SocketAddr, registry: Arc<Registry>) -> Result<Self, MetricsError> {
        Self::bind_with(addr, registry, Arc::new(|| Ok("serving".to_string()))).await
    }

    /// [`MetricsServer::bind`], `/readyz` answering as `ready` says.
    pub async fn bind_with(addr: SocketAddr, registry: Arc<Registry>, ready: Readiness) -> Result<Self, MetricsError> {
        let listener = TcpListener::bind(addr).await.map_err(|source| MetricsError { addr, source })?;
        let addr = listener.local_addr().map_err(|source| MetricsError { addr, source })?;
        let task = tokio::spawn(accept_loop(listener, registry, ready));
        tracing::info!(%addr, "serving Prometheus metrics on http://{addr}/metrics");
        Ok(Self { addr, task })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops listening (connections being answered are dropped).
    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, registry: Arc<Registry>, ready: Readiness) {
    let slots = Arc::new(std::sync::Mutex::new(crate::budget::AddressBudget::new(
        MAX_METRICS_CONNECTIONS,
        MAX_METRICS_CONNECTIONS_PER_ADDRESS,
    )));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors and the like: pause, keep serving.
                tracing::warn!(error = %e, "accepting a metrics connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let slot = match crate::budget::Taken::from(&slots, peer.ip()) {
            Ok(slot) => slot,
            Err(spent) => {
                tracing::debug!(%peer, ?spent, "a metrics connection over the cap closed");
                drop(stream);
                continue;
            }
        };
        let registry = registry.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req| {
                let registry = registry.clone();
                let ready = ready.clone();
                async move { Ok::<_, Infallible>(answer(&req, &registry, &*ready)) }
            });
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(HEADER_WAIT);
            match tokio::time::timeout(CONNECTION_LIFETIME, http.serve_connection(TokioIo::new(stream), service)).await
            {
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics connection ended with an error"),
                Err(_) => tracing::debug!(%peer, "metrics connection closed at its lifetime"),
                Ok(Ok(())) => {}
            }
        });
    }
}

/// The answer to one request: the registry for `GET /metrics`, the probes
/// at `/healthz` and `/readyz`, a pointer to them for `/`, 404 or 405
/// otherwise.
fn answer<B>(
    req: &Request<B>,
    registry: &Registry,
    ready: &(dyn Fn() -> Result<String, String> + Send + Sync),
) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        r
    };
    let text = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, text, "only GET is served\n".into());
    }
    match req.uri().path() {
        "/metrics" => match render(registry) {
            Ok(body) => reply(StatusCode::OK, CONTENT_TYPE_OPENMETRICS, body),
            Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, text, format!("encoding the metrics failed: {e}\n")),
        },
        "/healthz" => reply(StatusCode::OK, text, "alive\n".into()),
        "/readyz" => match ready() {
            Ok(what) => reply(StatusCode::OK, text, format!("ready: {what}\n")),
            Err(why) => reply(StatusCode::SERVICE_UNAVAILABLE, text, format!("not ready: {why}\n")),
        },
        "/" => reply(StatusCode::OK, text, "Granary: metrics at /metrics, probes at /healthz and /readyz\n".into()),
        other => reply(
            StatusCode::NOT_FOUND,
            text,
            format!("{other}: not found; metrics are at /metrics, probes at /healthz and /readyz\n"),
        ),
    }
}

/// Encodes one counter's current value from a collector (a value kept
/// elsewhere, read at scrape time).
pub fn const_counter(
    enc: &mut prometheus_client::encoding::DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&prometheus_client::registry::Unit>,
    value: u64,
) -> std::fmt::Result {
    use prometheus_client::encoding::EncodeMetric;
    let c = prometheus_client::metrics::counter::ConstCounter::new(value);
    c.encode(enc.encode_descriptor(name, help, unit, c.metric_type())?)
}

/// Encodes one gauge's current value from a collector.
pub fn const_gauge(
    enc: &mut prometheus_client::encoding::DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&prometheus_client::registry::Unit>,
    value: i64,
) -> std::fmt::Result {
    use prometheus_client::encoding::EncodeMetric;
    let g = prometheus_client::metrics::gauge::ConstGauge::new(value);
    g.encode(enc.encode_descriptor(name, help, unit, g.metric_type())?)
}

/// `registry` in the OpenMetrics text format.
pub fn render(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, request: &str) -> anyhow::Result<String> {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(request.as_bytes()).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out)
    }

    #[tokio::test]
    async fn serves_the_registry_at_metrics_and_refuses_the_rest() -> anyhow::Result<()> {
        let mut registry = Registry::with_prefix("granary_test");
        let counter = Counter::<u64>::default();
        registry.register("things", "Things seen", counter.clone());
        counter.inc_by(3);
        let server = MetricsServer::bind("127.0.0.1:0".parse()?, Arc::new(registry)).await?;
        let addr = server.local_addr();
        let close = "Connection: close\r\n\r\n";

        let ok = get(addr, &format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{close}")).await?;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("application/openmetrics-text"), "{ok}");
        assert!(ok.contains("# HELP granary_test_things Things seen."), "{ok}");
        assert!(ok.contains("granary_test_things_total 3"), "{ok}");
        assert!(ok.trim_end().ends_with("# EOF"), "{ok}");

        let missing = get(addr, &format!("GET /other HTTP/1.1\r\nHost: x\r\n{close}")).await?;
        assert!(missing.starts_with("HTTP/1.1 404") && missing.contains("/metrics"), "{missing}");
        let post = get(addr, &format!("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n{close}")).await?;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        // Garbage is answered (400) or dropped; the server keeps serving.
        let _ = get(addr, "\x00\x01garbage\r\n\r\n").await;
        let again = get(addr, &format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{close}")).await?;
        assert!(again.starts_with("HTTP/1.1 200"), "{again}");
        server.stop();
        Ok(())
    }

    /// Issue 48: `/healthz` answers while the process does; `/readyz` as
    /// its readiness says, with the reason when not ready.
    #[tokio::test]
    async fn the_probes_answer_alive_and_ready_or_why_not() -> anyhow::Result<()> {
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = flag.clone();
        let ready: Readiness = Arc::new(move || match seen.load(std::sync::atomic::Ordering::Relaxed) {
            true => Ok("node 3, placement epoch 7".into()),
            false => Err("not registered with the coordinators yet".into()),
        });
        let server = MetricsServer::bind_with("127.0.0.1:0".parse()?, Arc::new(Registry::default()), ready).await?;
        let addr = server.local_addr();
        let ask = |path: &str| {
            let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            async move { get(addr, &request).await }
        };
        let alive = ask("/healthz").await?;
        assert!(alive.starts_with("HTTP/1.1 200") && alive.ends_with("alive\n"), "{alive}");
        let not = ask("/readyz").await?;
        assert!(not.starts_with("HTTP/1.1 503"), "{not}");
        assert!(not.ends_with("not ready: not registered with the coordinators yet\n"), "{not}");
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
        let ok = ask("/readyz").await?;
        assert!(ok.starts_with("HTTP/1.1 200") && ok.ends_with("ready: node 3, placement epoch 7\n"), "{ok}");
        Ok(())
    }

    #[tokio::test]
    async fn a_taken_address_is_an_error_naming_it() -> anyhow::Result<()> {
        let held = TcpListener::bind("127.0.0.1:0").await?;
        let addr = held.local_addr()?;
        let err = MetricsServer::bind(addr, Arc::new(Registry::default())).await.expect_err("taken");
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
        Ok(())
    }

    /// A connection to `addr` from `from` (a loopback address).
    async fn connect_from(from: &str, addr: SocketAddr) -> anyhow::Result<tokio::net::TcpStream> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(format!("{from}:0").parse()?)?;
        Ok(socket.connect(addr).await?)
    }

    /// Issue 29: one address holds at most its share of connections, so a
    /// scrape from another address is answered while it floods; a flood
    /// from many addresses holds at most the cap, the connections over it
    /// closed at once, and a scrape is answered once the flood is gone.
    #[tokio::test]
    async fn connections_over_the_cap_are_closed_at_once() -> anyhow::Result<()> {
        let server = MetricsServer::bind("0.0.0.0:0".parse()?, Arc::new(Registry::default())).await?;
        let addr = SocketAddr::from(([127, 0, 0, 1], server.local_addr().port()));
        let mut flood = Vec::new();
        for _ in 0..200 {
            flood.push(connect_from("127.0.0.2", addr).await?);
        }
        let ok = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await?;
        assert!(ok.starts_with("HTTP/1.1 200"), "a scrape from another address during the flood: {ok}");
        drop(flood);
        // Let the server see the flood's connections close.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut held = Vec::new();
        for i in 0..MAX_METRICS_CONNECTIONS {
            held.push(connect_from(&format!("127.0.1.{}", i % 200 + 1), addr).await?);
        }
        // Let the server take them all before the ones over the cap arrive.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for i in 0..200 {
            let mut over = connect_from(&format!("127.0.2.{}", i % 200 + 1), addr).await?;
            let mut b = [0u8; 1];
            let read = tokio::time::timeout(Duration::from_secs(2), over.read(&mut b)).await;
            assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "a connection over the cap was kept: {read:?}");
        }
        drop(held);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let ok = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
            if ok.as_deref().is_ok_and(|r| r.starts_with("HTTP/1.1 200")) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no scrape after the flood: {ok:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}
