//! A fault-injecting S3 store on loopback: s3s-fs serving a folder, behind
//! a layer that answers some GET requests with a 503 (`SlowDown`), holds
//! some back before answering, cuts some answers short (the headers
//! promise the whole range, the connection ends halfway: a short read) and
//! stalls some in the middle of the body (half is sent, then nothing for a
//! while, then the rest, on the same connection).
//!
//! The fate of the n-th GET after [`FaultStore::set_faults`] is a pure
//! function of (seed, n) ([`fate`]); which node's request is the n-th is the
//! run's own interleaving. Requests other than GET (listing, HEAD) always
//! pass, and nothing is injected before `set_faults`, so registering the
//! dataset and opening it are not part of the schedule.

use anyhow::{Context, Result};
use bytes::Bytes;
use granary_proto::rng::seed_of;
use http_body_util::BodyExt;
use serde::Serialize;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Rates of the store's faults, each a chance per GET request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StoreFaults {
    /// Answer 503 SlowDown.
    pub error: f64,
    /// Answer after `slow_ms`.
    pub slow: f64,
    /// How long a slow answer is held back.
    pub slow_ms: u64,
    /// Send half the body, then end the connection.
    pub short: f64,
    /// Send half the body, wait `stall_ms`, then send the rest.
    pub stall: f64,
    /// How long a stalled body waits halfway.
    pub stall_ms: u64,
}

impl StoreFaults {
    /// Whether any fault may happen.
    pub fn any(&self) -> bool {
        self.error + self.slow + self.short + self.stall > 0.0
    }
}

/// What happens to one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Served as asked.
    Pass,
    /// 503 SlowDown.
    Error,
    /// Served after a delay.
    Slow(Duration),
    /// Half the body, then the connection ends.
    Short,
    /// Half the body, a pause, then the rest.
    Stall(Duration),
}

/// The fate of GET number `index` under `faults` and `seed`.
pub fn fate(seed: u64, index: u64, faults: &StoreFaults) -> Fate {
    let x = (seed_of(&[seed, 0x0053_544f_5245, index]) >> 11) as f64 / (1u64 << 53) as f64;
    if x < faults.error {
        Fate::Error
    } else if x < faults.error + faults.slow {
        Fate::Slow(Duration::from_millis(faults.slow_ms))
    } else if x < faults.error + faults.slow + faults.short {
        Fate::Short
    } else if x < faults.error + faults.slow + faults.short + faults.stall {
        Fate::Stall(Duration::from_millis(faults.stall_ms))
    } else {
        Fate::Pass
    }
}

/// What the store did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StoreCounts {
    /// GET requests seen while faults were on.
    pub gets: u64,
    /// Answered 503.
    pub errors: u64,
    /// Held back.
    pub slowed: u64,
    /// Cut short.
    pub shortened: u64,
    /// Body bytes sent in answers that were cut short.
    pub wasted_bytes: u64,
    /// Stalled halfway.
    pub stalled: u64,
}

#[derive(Default)]
struct Counters {
    gets: AtomicU64,
    errors: AtomicU64,
    slowed: AtomicU64,
    shortened: AtomicU64,
    wasted_bytes: AtomicU64,
    stalled: AtomicU64,
}

struct Shared {
    seed: u64,
    faults: Mutex<Option<StoreFaults>>,
    counters: Counters,
}

/// The store; stops when dropped.
pub struct FaultStore {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

/// The access key the store checks.
pub const ACCESS_KEY: &str = "AKCHAOS";
/// Its secret.
pub const SECRET_KEY: &str = "SKCHAOS";

impl FaultStore {
    /// Serves `root` (its sub-folders are buckets) on 127.0.0.1, on the
    /// current tokio runtime, with no faults until [`Self::set_faults`].
    pub async fn start(root: &Path, seed: u64) -> Result<Self> {
        let fs = s3s_fs::FileSystem::new(root).map_err(|e| anyhow::anyhow!("s3s-fs on {}: {e:?}", root.display()))?;
        let mut builder = s3s::service::S3ServiceBuilder::new(fs);
        builder.set_auth(s3s::auth::SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        let service = builder.build();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("binding the store")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared { seed, faults: Mutex::new(None), counters: Counters::default() });
        let s = shared.clone();
        let task = tokio::spawn(async move {
            let index = Arc::new(AtomicU64::new(0));
            loop {
                let Ok((sock, _)) = listener.accept().await else { return };
                let (service, shared, index) = (service.clone(), s.clone(), index.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let (service, shared, index) = (service.clone(), shared.clone(), index.clone());
                        async move { serve(&service, &shared, &index, req).await }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
                        .await;
                });
            }
        });
        Ok(Self { addr, shared, task })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The object_store options that reach it.
    pub fn options(&self) -> std::collections::BTreeMap<String, String> {
        [
            ("aws_endpoint", format!("http://{}", self.addr)),
            ("aws_allow_http", "true".into()),
            ("aws_access_key_id", ACCESS_KEY.into()),
            ("aws_secret_access_key", SECRET_KEY.into()),
            ("aws_region", "us-east-1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Turns faults on (or changes their rates); GETs are counted from here.
    pub fn set_faults(&self, faults: StoreFaults) {
        *self.shared.faults.lock().unwrap_or_else(PoisonError::into_inner) = Some(faults);
    }

    /// What it did so far.
    pub fn counts(&self) -> StoreCounts {
        let c = &self.shared.counters;
        StoreCounts {
            gets: c.gets.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            slowed: c.slowed.load(Ordering::Relaxed),
            shortened: c.shortened.load(Ordering::Relaxed),
            wasted_bytes: c.wasted_bytes.load(Ordering::Relaxed),
            stalled: c.stalled.load(Ordering::Relaxed),
        }
    }
}

impl Drop for FaultStore {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    service: &s3s::service::S3Service,
    shared: &Shared,
    index: &AtomicU64,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<s3s::Body>, s3s::HttpError> {
    let faults = *shared.faults.lock().unwrap_or_else(PoisonError::into_inner);
    let fate = match faults {
        Some(f) if req.method() == hyper::Method::GET => {
            let n = index.fetch_add(1, Ordering::Relaxed);
            shared.counters.gets.fetch_add(1, Ordering::Relaxed);
            fate(shared.seed, n, &f)
        }
        _ => Fate::Pass,
    };
    let req = req.map(s3s::Body::from);
    match fate {
        Fate::Pass => service.call(req).await,
        Fate::Slow(d) => {
            shared.counters.slowed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(d).await;
            service.call(req).await
        }
        Fate::Error => {
            shared.counters.errors.fetch_add(1, Ordering::Relaxed);
            let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
                        <Message>Please reduce your request rate (granary-chaos store).</Message></Error>";
            Ok(hyper::Response::builder()
                .status(503)
                .header("content-type", "application/xml")
                .body(s3s::Body::from(body.to_string()))
                .unwrap_or_else(|_| hyper::Response::new(s3s::Body::empty())))
        }
        Fate::Short => {
            let resp = service.call(req).await?;
            if !resp.status().is_success() {
                return Ok(resp);
            }
            let (parts, body) = resp.into_parts();
            let bytes: Bytes = body.collect().await.map_err(s3s::HttpError::new)?.to_bytes();
            if bytes.len() < 2 {
                return Ok(hyper::Response::from_parts(parts, s3s::Body::from(bytes)));
            }
            // The headers keep the whole length; the body yields half,
            // then fails, so the server ends the connection there. (A body
            // that just ended early would leave the connection open and
            // the client waiting for the rest: a stall, not a short read.)
            let half = bytes.slice(..bytes.len() / 2);
            shared.counters.shortened.fetch_add(1, Ordering::Relaxed);
            shared.counters.wasted_bytes.fetch_add(half.len() as u64, Ordering::Relaxed);
            let cut: s3s::stream::DynByteStream = Box::pin(CutShort { half: Some(half) });
            Ok(hyper::Response::from_parts(parts, s3s::Body::from(cut)))
        }
        Fate::Stall(d) => {
            let resp = service.call(req).await?;
            if !resp.status().is_success() {
                return Ok(resp);
            }
            let (parts, body) = resp.into_parts();
            let bytes: Bytes = body.collect().await.map_err(s3s::HttpError::new)?.to_bytes();
            shared.counters.stalled.fetch_add(1, Ordering::Relaxed);
            let at = bytes.len() / 2;
            let stalled: s3s::stream::DynByteStream = Box::pin(Stalled {
                first: Some(bytes.slice(..at)),
                pause: Box::pin(tokio::time::sleep(d)),
                rest: Some(bytes.slice(at..)),
            });
            Ok(hyper::Response::from_parts(parts, s3s::Body::from(stalled)))
        }
    }
}

/// A body that yields its first half, waits, then yields the rest.
struct Stalled {
    first: Option<Bytes>,
    pause: std::pin::Pin<Box<tokio::time::Sleep>>,
    rest: Option<Bytes>,
}

impl futures::Stream for Stalled {
    type Item = Result<Bytes, s3s::StdError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        if let Some(first) = self.first.take() {
            return std::task::Poll::Ready(Some(Ok(first)));
        }
        if self.rest.is_none() {
            return std::task::Poll::Ready(None);
        }
        match self.pause.as_mut().poll(cx) {
            std::task::Poll::Pending => std::task::Poll::Pending,
            std::task::Poll::Ready(()) => std::task::Poll::Ready(self.rest.take().map(Ok)),
        }
    }
}

impl s3s::stream::ByteStream for Stalled {}

/// A body that yields its half, then an error.
struct CutShort {
    half: Option<Bytes>,
}

impl futures::Stream for CutShort {
    type Item = Result<Bytes, s3s::StdError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        std::task::Poll::Ready(Some(match self.half.take() {
            Some(b) => Ok(b),
            None => Err("granary-chaos store: connection cut short".into()),
        }))
    }
}

impl s3s::stream::ByteStream for CutShort {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fates_follow_the_rates_and_the_seed() {
        let f = StoreFaults { error: 0.1, slow: 0.2, slow_ms: 50, short: 0.05, stall: 0.1, stall_ms: 700 };
        let fates: Vec<Fate> = (0..20_000).map(|n| fate(9, n, &f)).collect();
        let share = |want: fn(&Fate) -> bool| fates.iter().filter(|f| want(f)).count() as f64 / 20_000.0;
        assert!((share(|f| *f == Fate::Error) - 0.1).abs() < 0.01);
        assert!((share(|f| matches!(f, Fate::Slow(d) if d.as_millis() == 50)) - 0.2).abs() < 0.015);
        assert!((share(|f| *f == Fate::Short) - 0.05).abs() < 0.01);
        assert!((share(|f| matches!(f, Fate::Stall(d) if d.as_millis() == 700)) - 0.1).abs() < 0.01);
        // Without stalls, every other request keeps the fate it had.
        let before = StoreFaults { stall: 0.0, ..f };
        assert!((0..20_000).all(|n| match fate(9, n, &f) {
            Fate::Stall(_) => fate(9, n, &before) == Fate::Pass,
            other => fate(9, n, &before) == other,
        }));
        assert_eq!(fates, (0..20_000).map(|n| fate(9, n, &f)).collect::<Vec<_>>());
        assert_ne!(fates, (0..20_000).map(|n| fate(10, n, &f)).collect::<Vec<_>>());
        assert!((0..1000).all(|n| fate(9, n, &StoreFaults::default()) == Fate::Pass));
    }
}
