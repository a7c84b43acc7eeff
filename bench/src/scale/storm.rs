//! Every node re-opening its placement watch at once, as after a leader
//! change: each of `nodes` watchers (its own connection and a certificate
//! bound to its node id, as a real node has) asks the new leader for
//! deltas, whose first message is the whole placement. The leader writes
//! one encoding of it to every watcher; what is measured is the time until
//! the last watcher has it whole, the opens that were refused and tried
//! again (handshakes over the per-address limit, answers over the byte
//! budget), and the leader's peak RSS.
//!
//! The watchers read the message's bytes and check its kind without
//! decoding it (a thousand decodes of 4 MB of JSON in this process would
//! measure this process, not the leader).

use anyhow::{Context, Result, bail};
use granary_net::api::{ApiRequest, ApiResponse};
use granary_net::conn::Connections;
use granary_net::frame::{self, LEN_PREFIX_BYTES, MAX_FRAME_BYTES};
use granary_net::tls::{self, Identity, Role};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long the storm may take before the run fails.
const STORM_DEADLINE: Duration = Duration::from_secs(300);
/// The wait before a refused open is tried again.
const RETRY_AFTER: Duration = Duration::from_millis(50);

/// What the storm measured.
#[derive(Debug)]
pub(super) struct Storm {
    /// From the first open to the last watcher holding the whole placement.
    pub(super) all_s: f64,
    /// Half of the watchers had it by then.
    pub(super) p50_s: f64,
    /// Connections refused or failed and tried again (every watcher here
    /// dials from one address, and a voter takes at most 32 handshakes
    /// from one address at a time: a cluster's nodes have an address each).
    pub(super) redials: u64,
    /// Watches refused or ended before their first message (no room in the
    /// answer budget, not the leader) and opened again.
    pub(super) reopens: u64,
    /// The whole placement's frame, as one watcher received it.
    pub(super) whole_bytes: u64,
}

/// Issues a certificate bound to each of nodes `1..=nodes` (what the storm's
/// watchers present).
pub(super) fn issue_certs(certs: &Path, nodes: u64) -> Result<()> {
    for n in 1..=nodes {
        tls::issue_bound(certs, Role::Node, &format!("node-{n}"), Some(n))?;
    }
    Ok(())
}

/// Opens `nodes` delta watches on `leader` at once, each holding its stream
/// until every watcher has the whole placement.
pub(super) async fn run(certs: &Path, leader: SocketAddr, nodes: u64) -> Result<Storm> {
    let endpoint = granary_net::transport::endpoint("127.0.0.1:0".parse()?, None)?;
    let retries = Arc::new(Retries::default());
    let start = Instant::now();
    let mut tasks = Vec::new();
    for n in 1..=nodes {
        let identity = Identity::load(certs, &format!("node-{n}"))?;
        let config = identity.client_config(granary_net::transport::ALPN_API)?;
        let conns = Connections::new(
            endpoint.clone(),
            config,
            granary_net::transport::ALPN_API,
            Role::Coordinator,
            Duration::from_secs(5),
        );
        let retries = retries.clone();
        tasks.push(tokio::spawn(async move { watch_whole(conns, leader, start, &retries).await }));
    }
    let mut done = Vec::with_capacity(tasks.len());
    for t in tasks {
        done.push(t.await.context("a watcher task panicked")??);
    }
    let mut times: Vec<f64> = done.iter().map(|d| d.0).collect();
    times.sort_by(f64::total_cmp);
    let whole_bytes = done.iter().map(|d| d.1).max().unwrap_or(0);
    // Every watcher held its stream (and connection) until now.
    drop(done);
    endpoint.close(0u32.into(), b"storm over");
    Ok(Storm {
        all_s: times.last().copied().unwrap_or(0.0),
        p50_s: times.get(times.len() / 2).copied().unwrap_or(0.0),
        redials: retries.redials.load(Ordering::Relaxed),
        reopens: retries.reopens.load(Ordering::Relaxed),
        whole_bytes,
    })
}

/// One watcher: opens the watch until its first message is the whole
/// placement; returns when it had it (seconds from `start`), its size and
/// the open stream.
async fn watch_whole(
    conns: Connections,
    leader: SocketAddr,
    start: Instant,
    retries: &Retries,
) -> Result<(f64, u64, quinn::SendStream, quinn::RecvStream, Connections)> {
    let req = ApiRequest::WatchPlacement { after_revision: 0, deltas: true };
    loop {
        if start.elapsed() > STORM_DEADLINE {
            bail!("a watcher had no whole placement within {STORM_DEADLINE:?}");
        }
        let conn = match conns.get(leader).await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::debug!(error = %e, "dial failed; trying again");
                retries.redials.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(RETRY_AFTER).await;
                continue;
            }
        };
        let opened = async {
            let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
            frame::write_frame(&mut send, &req).await.map_err(|e| e.to_string())?;
            let first = first_message(&mut recv).await?;
            Ok::<_, String>((send, recv, first))
        };
        match opened.await {
            Ok((send, recv, First::Whole(bytes))) => {
                return Ok((start.elapsed().as_secs_f64(), bytes, send, recv, conns));
            }
            Ok((_, _, First::Other(what))) => tracing::debug!(%what, "watch refused; trying again"),
            Err(e) => tracing::debug!(error = %e, "watch ended before its first message; trying again"),
        }
        retries.reopens.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(RETRY_AFTER).await;
    }
}

/// The storm's tries again.
#[derive(Default)]
struct Retries {
    redials: AtomicU64,
    reopens: AtomicU64,
}

/// A watch's first message, as far as the storm cares.
enum First {
    /// The whole placement, of this many bytes (prefix included).
    Whole(u64),
    /// Anything else (unavailable, not the leader), named.
    Other(String),
}

/// Reads the first frame: its tag from its first bytes, the rest counted
/// and dropped.
async fn first_message(recv: &mut quinn::RecvStream) -> Result<First, String> {
    let mut prefix = [0u8; LEN_PREFIX_BYTES];
    recv.read_exact(&mut prefix).await.map_err(|e| e.to_string())?;
    let len = frame::decode_len(prefix, MAX_FRAME_BYTES).map_err(|e| e.to_string())?;
    const TAG: &[u8] = b"{\"PlacementUpdate\"";
    if len < 64 << 10 {
        let mut body = vec![0; len];
        recv.read_exact(&mut body).await.map_err(|e| e.to_string())?;
        return Ok(match frame::decode_body::<ApiResponse>(&body) {
            Ok(ApiResponse::PlacementUpdate(_)) => First::Whole((len + LEN_PREFIX_BYTES) as u64),
            Ok(ApiResponse::Failed { message, .. }) => First::Other(message),
            Ok(other) => First::Other(format!("{other:?}").chars().take(200).collect()),
            Err(e) => First::Other(e.to_string()),
        });
    }
    let mut head = vec![0; TAG.len()];
    recv.read_exact(&mut head).await.map_err(|e| e.to_string())?;
    if head != TAG {
        return Err(format!("a first message of {len} bytes that is no placement update"));
    }
    let mut left = len - TAG.len();
    while left > 0 {
        match recv.read_chunk(left, true).await.map_err(|e| e.to_string())? {
            Some(chunk) => left -= chunk.bytes.len(),
            None => return Err(format!("the stream ended {left} bytes before its first message did")),
        }
    }
    Ok(First::Whole((len + LEN_PREFIX_BYTES) as u64))
}
