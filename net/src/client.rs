//! A coordinator client: it keeps one connection per voter, sends each
//! request to the voter it believes leads, follows `NotLeader` redirects,
//! and retries unreachable voters until a deadline.
//!
//! Handles made with [`CoordinatorClient::sharing`] share those
//! connections, each with its own options and leader hint: a node's
//! heartbeats, placement watch, holds and placement lookups are streams on
//! one connection per voter. A connection to a voter that names another as
//! the leader is closed, so a settled client holds one, to the leader. A
//! request that fails or times out moves on to the next voter but keeps
//! the connection: a slow answer is no reason to dial again (the watch
//! and the other requests on it are fine), and a connection whose voter
//! died closes by its idle timeout (5 s), after which the next request
//! dials anew. Once a voter answers as the leader after the hint moved,
//! the connections to the other voters are closed.
//!
//! Every retry loop is bounded by [`ClientOptions::deadline`]; the pause
//! between failed rounds starts short (an election takes a few hundred
//! milliseconds), doubles while rounds keep failing, and is jittered
//! ([`crate::backoff`]), so that clients refused together spread out.

use crate::api::{AddProgress, ApiRequest, ApiResponse, FailureKind, PlacementView};
use crate::conn::Connections;
use crate::error::TlsError;
use crate::frame::{self, MAX_FRAME_BYTES, StreamError};
use crate::identity::Identity;
use crate::placement::{Placement, UpdateError};
use crate::role::Role;
use crate::transport::{self, ALPN_API};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// How long a client keeps trying.
#[derive(Clone, Copy, Debug)]
pub struct ClientOptions {
    /// Bound on one `call`, retries and redirects included. Default 10 s.
    pub deadline: Duration,
    /// Bound on one connection attempt. Default 2 s.
    pub connect_timeout: Duration,
    /// Pause after a round in which no voter answered, on average: it
    /// doubles while rounds keep failing and is jittered
    /// ([`crate::backoff::pause`]). Default 100 ms.
    pub backoff: Duration,
    /// Bound on one attempt at one voter, so that a voter that died with
    /// the connection open costs this long, not the connection's idle
    /// timeout. Default 3 s. `AddDataset`, whose leader lists the source
    /// and reads every footer before answering, is bounded by `deadline`
    /// alone.
    pub attempt_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            backoff: Duration::from_millis(100),
            attempt_timeout: Duration::from_secs(3),
        }
    }
}

/// A call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No coordinator addresses were given.
    #[error("no coordinator addresses given")]
    NoAddresses,
    /// A coordinator address does not parse.
    #[error("coordinator address {addr:?}: {reason}")]
    BadAddress {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// TLS set-up failed.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// No voter gave an answer before the deadline.
    #[error("no coordinator answered {request} within {deadline:?} (tried {tried}); last error: {last}")]
    Unavailable {
        /// The request kind.
        request: &'static str,
        /// The deadline.
        deadline: Duration,
        /// The addresses tried.
        tried: String,
        /// The last error seen.
        last: String,
    },
    /// The coordinator refused or failed the request.
    #[error("coordinator {addr} refused {request} ({kind:?}): {message}")]
    Failed {
        /// Who answered.
        addr: SocketAddr,
        /// The request kind.
        request: &'static str,
        /// Category.
        kind: FailureKind,
        /// The coordinator's message.
        message: String,
    },
    /// The answer did not fit the request.
    #[error("coordinator {addr} answered {request} with an unexpected message: {got}")]
    Unexpected {
        /// Who answered.
        addr: SocketAddr,
        /// The request kind.
        request: &'static str,
        /// What came back (debug form, shortened).
        got: String,
    },
}

/// A client of the coordinator group.
pub struct CoordinatorClient {
    conns: Arc<Connections>,
    addrs: Vec<SocketAddr>,
    options: ClientOptions,
    leader: Mutex<Option<SocketAddr>>,
    /// Next voter to try without a leader hint; kept across calls so that a
    /// dead first voter does not cost every call a connect timeout.
    next: AtomicUsize,
}

/// Parses `host:port` strings (names resolved once, now).
pub fn parse_addrs(addrs: &[String]) -> Result<Vec<SocketAddr>, ClientError> {
    use std::net::ToSocketAddrs;
    let mut out = Vec::new();
    for a in addrs {
        let mut it =
            a.to_socket_addrs().map_err(|e| ClientError::BadAddress { addr: a.clone(), reason: e.to_string() })?;
        out.push(
            it.next()
                .ok_or_else(|| ClientError::BadAddress { addr: a.clone(), reason: "resolves to nothing".into() })?,
        );
    }
    if out.is_empty() {
        return Err(ClientError::NoAddresses);
    }
    Ok(out)
}

impl CoordinatorClient {
    /// A client that presents `identity` to the voters at `addrs`. Must run
    /// inside a tokio runtime (it binds a UDP socket).
    pub fn new(identity: &Identity, addrs: Vec<SocketAddr>, options: ClientOptions) -> Result<Self, ClientError> {
        if addrs.is_empty() {
            return Err(ClientError::NoAddresses);
        }
        let bind: SocketAddr = if addrs[0].is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }.parse().map_err(
            |e: std::net::AddrParseError| ClientError::BadAddress { addr: "0.0.0.0:0".into(), reason: e.to_string() },
        )?;
        let endpoint = transport::endpoint(bind, None)?;
        Self::on_endpoint(endpoint, identity, addrs, options)
    }

    /// A client like [`CoordinatorClient::new`] that dials from `endpoint`
    /// (one the caller bound, which may also serve), so that its traffic
    /// comes from that endpoint's address: a node sends everything, to
    /// peers and to voters, from its one peer socket.
    pub fn on_endpoint(
        endpoint: quinn::Endpoint,
        identity: &Identity,
        addrs: Vec<SocketAddr>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        if addrs.is_empty() {
            return Err(ClientError::NoAddresses);
        }
        let config = identity.client_config(ALPN_API)?;
        Ok(Self {
            conns: Arc::new(Connections::new(endpoint, config, ALPN_API, Role::Coordinator, options.connect_timeout)),
            addrs,
            options,
            leader: Mutex::new(None),
            next: AtomicUsize::new(0),
        })
    }

    /// Another handle on this client's connections, with its own `options`
    /// (their `connect_timeout` aside: dials are shared, and keep this
    /// client's) and its own leader hint: a long-lived watch or a slow
    /// request's retries never move the hint a heartbeat follows, and
    /// neither opens a connection of its own.
    pub fn sharing(&self, options: ClientOptions) -> Self {
        Self {
            conns: self.conns.clone(),
            addrs: self.addrs.clone(),
            options,
            leader: Mutex::new(self.leader_hint()),
            next: AtomicUsize::new(self.next.load(Ordering::Relaxed)),
        }
    }

    /// The voter addresses this client knows.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    fn round_robin(&self) -> SocketAddr {
        self.addrs[self.next.fetch_add(1, Ordering::Relaxed) % self.addrs.len()]
    }

    /// With no leader known: dials every voter at once and returns the
    /// first that answers the handshake (the others' dials are dropped),
    /// so dead voters listed first cost nothing (issue 48); or each
    /// voter's dial error when none answers. The voters are taken in turn
    /// from a rotating start, so a tie does not always go to the same one.
    /// Voters in `passed` (those that failed this call already: an open
    /// connection to a dead voter would win every race) are left out
    /// while any other remains; then `passed` starts over.
    async fn first_reachable(&self, passed: &mut Vec<SocketAddr>) -> Result<SocketAddr, Vec<(SocketAddr, String)>> {
        if self.addrs.iter().all(|a| passed.contains(a)) {
            passed.clear();
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.addrs.len();
        let mut dials = tokio::task::JoinSet::new();
        for i in 0..n {
            let addr = self.addrs[(start + i) % n];
            if passed.contains(&addr) {
                continue;
            }
            let conns = self.conns.clone();
            dials.spawn(async move { (addr, conns.get(addr).await) });
        }
        let mut errors = Vec::new();
        while let Some(done) = dials.join_next().await {
            match done {
                Ok((addr, Ok(_))) => return Ok(addr),
                Ok((addr, Err(e))) => errors.push((addr, e.to_string())),
                Err(e) => tracing::debug!("a dial task ended: {e}"),
            }
        }
        Err(errors)
    }

    fn leader_hint(&self) -> Option<SocketAddr> {
        *self.leader.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_leader_hint(&self, addr: Option<SocketAddr>) {
        *self.leader.lock().unwrap_or_else(|p| p.into_inner()) = addr;
    }

    /// The connection to `addr`; the error is text for
    /// [`ClientError::Unavailable`]'s `last`, which sums up one of several
    /// attempts.
    async fn connection(&self, addr: SocketAddr) -> Result<quinn::Connection, String> {
        self.conns.get(addr).await.map_err(|e| e.to_string())
    }

    /// `target` said `leader` leads: follow the hint, and close the
    /// connection to `target`, which only a redirect used.
    fn redirected(&self, target: SocketAddr, leader: Option<SocketAddr>) {
        self.set_leader_hint(leader);
        if leader.is_some() {
            self.conns.close(target, b"not the leader");
        }
    }

    /// `leader` answered as the leader: connections to the other voters
    /// (dialed by a round that timed out, or before a redirect) have
    /// nothing to carry, and are closed.
    fn settled(&self, leader: SocketAddr) {
        for addr in self.conns.open() {
            if addr != leader && self.addrs.contains(&addr) {
                self.conns.close(addr, b"not the leader");
            }
        }
    }

    /// Sleeps after the `failed`th failed round in a row.
    async fn pause(&self, failed: &mut u32) {
        *failed = failed.saturating_add(1);
        tokio::time::sleep(crate::backoff::pause(self.options.backoff, *failed, crate::backoff::jitter_unit())).await;
    }

    /// Sends `req` to the leader, following redirects and retrying until the
    /// deadline. `Failed` answers become [`ClientError::Failed`].
    pub async fn call(&self, req: &ApiRequest) -> Result<(SocketAddr, ApiResponse), ClientError> {
        self.call_reporting(req, |_| {}).await
    }

    /// [`CoordinatorClient::call`] for a request the leader answers with
    /// progress first (`AddDataset { progress: true }`): `on_progress` gets
    /// each [`AddProgress`], and the deadline counts from the last frame
    /// heard, so a registration that keeps progressing is not cut off.
    pub async fn call_reporting(
        &self,
        req: &ApiRequest,
        mut on_progress: impl FnMut(&AddProgress) + Send,
    ) -> Result<(SocketAddr, ApiResponse), ClientError> {
        let kind = req.kind();
        let mut deadline = Instant::now() + self.options.deadline;
        let mut last = String::from("none");
        // What each voter last answered, for the error when none will.
        let mut answers: Vec<(SocketAddr, String)> = Vec::new();
        let mut passed: Vec<SocketAddr> = Vec::new();
        let mut failed = 0u32;
        let reports = matches!(req, ApiRequest::AddDataset { progress: true, .. });
        loop {
            let target = match self.leader_hint() {
                Some(a) => a,
                None => match tokio::time::timeout_at(deadline, self.first_reachable(&mut passed)).await {
                    Ok(Ok(a)) => a,
                    Ok(Err(errors)) => {
                        for (addr, e) in &errors {
                            heard_from(&mut answers, *addr, e.strip_prefix(&format!("{addr}: ")).unwrap_or(e));
                        }
                        last = errors.last().map_or_else(|| "no voter".into(), |(_, e)| e.clone());
                        self.pause(&mut failed).await;
                        continue;
                    }
                    Err(_) => return Err(self.unavailable(kind, last, &answers)),
                },
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(self.unavailable(kind, last, &answers));
            }
            let bound = match req {
                ApiRequest::AddDataset { .. } => left,
                _ => left.min(self.options.attempt_timeout),
            };
            let heard = Mutex::new(Instant::now());
            let on_progress = &mut on_progress;
            let attempt = async {
                let conn = self.connection(target).await?;
                let progress = |r: &ApiResponse| match r {
                    ApiResponse::AddProgress(p) => {
                        *heard.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
                        on_progress(p);
                        true
                    }
                    _ => false,
                };
                frame::call_until::<_, ApiResponse>(&conn, req, MAX_FRAME_BYTES, progress)
                    .await
                    .map_err(|e: StreamError| format!("{target}: {e}"))
            };
            tokio::pin!(attempt);
            let mut until = Instant::now() + bound;
            let outcome = loop {
                match tokio::time::timeout_at(until, &mut attempt).await {
                    Ok(r) => break r,
                    Err(_) => {
                        // Progress heard since: wait as long again from it.
                        let since = *heard.lock().unwrap_or_else(|p| p.into_inner()) + self.options.deadline;
                        if reports && since > Instant::now() {
                            until = since;
                            deadline = deadline.max(since);
                            continue;
                        }
                        break Err(format!("{target}: no answer within {bound:?}"));
                    }
                }
            };
            match outcome {
                Ok(ApiResponse::NotLeader { leader }) => {
                    let hint = leader.and_then(|(_, a)| a.parse::<SocketAddr>().ok()).filter(|a| *a != target);
                    last = format!("{target}: not the leader (leader {:?})", hint);
                    if hint.is_none() {
                        passed.push(target);
                    }
                    heard_from(
                        &mut answers,
                        target,
                        &match hint {
                            Some(l) => format!("not the leader (the leader is {l})"),
                            None => "not the leader, and knows no leader".into(),
                        },
                    );
                    self.redirected(target, hint);
                    if hint.is_none() {
                        self.pause(&mut failed).await;
                    }
                }
                Ok(ApiResponse::Failed { kind: FailureKind::Unavailable, message }) => {
                    heard_from(&mut answers, target, &message);
                    passed.push(target);
                    last = format!("{target}: {message}");
                    self.set_leader_hint(None);
                    self.pause(&mut failed).await;
                }
                Ok(ApiResponse::Failed { kind: fk, message }) => {
                    return Err(ClientError::Failed { addr: target, request: kind, kind: fk, message });
                }
                Ok(resp) => {
                    if self.leader_hint() != Some(target) {
                        self.settled(target);
                    }
                    self.set_leader_hint(Some(target));
                    return Ok((target, resp));
                }
                Err(e) => {
                    passed.push(target);
                    heard_from(&mut answers, target, e.strip_prefix(&format!("{target}: ")).unwrap_or(&e));
                    last = e;
                    self.set_leader_hint(None);
                    self.pause(&mut failed).await;
                }
            }
        }
    }

    /// The error when no voter answered in time: each voter with what it
    /// last answered (or that it was not reached).
    fn unavailable(&self, request: &'static str, last: String, answers: &[(SocketAddr, String)]) -> ClientError {
        let tried = self
            .addrs
            .iter()
            .map(|a| match answers.iter().find(|(x, _)| x == a) {
                Some((_, what)) => format!("{a}: {what}"),
                None => format!("{a}: no answer yet"),
            })
            .collect::<Vec<_>>()
            .join("; ");
        ClientError::Unavailable { request, deadline: self.options.deadline, tried, last }
    }

    /// Opens the placement watch on the leader: whole [`PlacementView`]s
    /// without owners ([`PlacementWatch::next`]). The stream ends when that
    /// voter loses leadership or goes away; open it again to continue.
    pub async fn watch(&self, after_revision: u64) -> Result<PlacementWatch, ClientError> {
        self.open_watch(ApiRequest::WatchPlacement { after_revision, deltas: false }).await
    }

    /// Opens the placement watch on the leader asking for deltas: the whole
    /// placement with every placed version's owners first, then only what
    /// changed ([`PlacementWatch::next_placement`] folds them). From a
    /// coordinator that sends whole views only, placements come without
    /// owner tables.
    pub async fn watch_placement(&self, after_revision: u64) -> Result<PlacementWatch, ClientError> {
        self.open_watch(ApiRequest::WatchPlacement { after_revision, deltas: true }).await
    }

    async fn open_watch(&self, req: ApiRequest) -> Result<PlacementWatch, ClientError> {
        let deadline = Instant::now() + self.options.deadline;
        let mut last = String::from("none");
        let mut failed = 0u32;
        while Instant::now() < deadline {
            let target = self.leader_hint().unwrap_or_else(|| self.round_robin());
            let opened = async {
                let conn = self.connection(target).await?;
                let (mut send, mut recv) = conn.open_bi().await.map_err(|e| format!("{target}: {e}"))?;
                frame::write_frame(&mut send, &req).await.map_err(|e| format!("{target}: {e}"))?;
                let _ = send.finish();
                let first = frame::read_frame_sized::<ApiResponse>(&mut recv, MAX_FRAME_BYTES)
                    .await
                    .map_err(|e| format!("{target}: {e}"))?;
                Ok::<_, String>((recv, first))
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let watch =
                |recv, first, bytes| PlacementWatch { addr: target, recv, first: Some(first), known: None, bytes };
            match tokio::time::timeout(left, opened).await.unwrap_or_else(|_| Err(format!("{target}: timed out"))) {
                Ok((recv, Some((first @ (ApiResponse::PlacementChanged(_) | ApiResponse::PlacementUpdate(_)), n)))) => {
                    self.settled(target);
                    self.set_leader_hint(Some(target));
                    return Ok(watch(recv, first, n as u64));
                }
                Ok((_, Some((ApiResponse::NotLeader { leader }, _)))) => {
                    let hint = leader.and_then(|(_, a)| a.parse::<SocketAddr>().ok()).filter(|a| *a != target);
                    self.redirected(target, hint);
                    last = format!("{target}: not the leader");
                    if hint.is_none() {
                        self.pause(&mut failed).await;
                    }
                }
                Ok((_, Some((ApiResponse::Failed { kind, message }, _)))) => {
                    return Err(ClientError::Failed { addr: target, request: req.kind(), kind, message });
                }
                Ok((_, other)) => {
                    return Err(ClientError::Unexpected {
                        addr: target,
                        request: req.kind(),
                        got: format!("{:?}", other.map(|(r, _)| r)).chars().take(200).collect(),
                    });
                }
                Err(e) => {
                    self.set_leader_hint(None);
                    last = e;
                    self.pause(&mut failed).await;
                }
            }
        }
        Err(self.unavailable(req.kind(), last, &[]))
    }

    /// Closes every connection, and the endpoint they were dialed from
    /// (with every handle sharing it).
    pub fn close(&self) {
        self.conns.endpoint().close(0u32.into(), b"client closed");
    }
}

/// The placement watch's stream of cluster views.
pub struct PlacementWatch {
    addr: SocketAddr,
    recv: quinn::RecvStream,
    first: Option<ApiResponse>,
    /// What the updates so far add up to ([`PlacementWatch::next_placement`]).
    known: Option<Arc<Placement>>,
    /// Bytes received on the stream so far.
    bytes: u64,
}

/// Why a placement watch ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The stream failed.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// An update did not fit what the watch knew (open the watch again).
    #[error(transparent)]
    Update(#[from] UpdateError),
}

impl PlacementWatch {
    /// The voter serving this watch.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Bytes received on this watch so far (frames, prefixes included).
    pub fn bytes_received(&self) -> u64 {
        self.bytes
    }

    async fn next_message(&mut self) -> Result<Option<ApiResponse>, StreamError> {
        if let Some(first) = self.first.take() {
            return Ok(Some(first));
        }
        let read = frame::read_frame_sized::<ApiResponse>(&mut self.recv, MAX_FRAME_BYTES).await?;
        Ok(read.map(|(msg, n)| {
            self.bytes += n as u64;
            msg
        }))
    }

    /// Reads the next message without decoding it: its bytes (the length
    /// prefix included; 0 for the first message, read and counted when
    /// the watch opened), or `Ok(None)` when the voter ended the stream.
    /// For load generators that stand in for many nodes in one process
    /// (`bench scale`'s fleet): applying every update is each node's own
    /// CPU, not the voter's, and a thousand of them in one process would
    /// measure that process.
    pub async fn skip_next(&mut self) -> Result<Option<u64>, StreamError> {
        if self.first.take().is_some() {
            return Ok(Some(0));
        }
        let body = frame::read_frame_body(&mut self.recv, MAX_FRAME_BYTES).await?;
        Ok(body.map(|b| {
            let n = (b.len() + frame::LEN_PREFIX_BYTES) as u64;
            self.bytes += n;
            n
        }))
    }

    /// The next view; `Ok(None)` when the voter ended the stream (it lost
    /// leadership or is shutting down). On a watch that asked for deltas,
    /// the view the updates add up to.
    pub async fn next(&mut self) -> Result<Option<PlacementView>, WatchError> {
        Ok(self.next_placement().await?.map(|p| p.view.clone()))
    }

    /// The next placement: a whole view (without owner tables), or what the
    /// updates so far add up to; `Ok(None)` when the voter ended the stream.
    pub async fn next_placement(&mut self) -> Result<Option<Arc<Placement>>, WatchError> {
        let next = match self.next_message().await? {
            Some(ApiResponse::PlacementChanged(v)) => Placement::from_view(v),
            Some(ApiResponse::PlacementUpdate(u)) => Placement::apply(self.known.as_deref(), u)?,
            Some(_) | None => return Ok(None),
        };
        let next = Arc::new(next);
        self.known = Some(next.clone());
        Ok(Some(next))
    }
}

/// Records that voter `addr` last answered `what`.
fn heard_from(answers: &mut Vec<(SocketAddr, String)>, addr: SocketAddr, what: &str) {
    match answers.iter_mut().find(|(a, _)| *a == addr) {
        Some((_, w)) => *w = what.to_string(),
        None => answers.push((addr, what.to_string())),
    }
}
