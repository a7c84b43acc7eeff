//! The local endpoint: trainers on this host talk to the node over a Unix
//! socket (file mode 0660, in a folder only the node's user can write;
//! every connection's credentials checked against an allow-list:
//! [`crate::access`]).
//!
//! One task per connection reads length-prefixed frames, answers each in
//! order, and attaches the chunk's memory file to chunk replies. A frame
//! that is oversized or does not validate gets a `BadRequest` reply and the
//! connection is closed (the stream can no longer be trusted to be in
//! sync); the daemon itself keeps serving everyone else, and a failed
//! accept (say, out of descriptors under a flood of connections) is retried
//! rather than ending the listener.
//!
//! Every resource a connection holds is bounded (issue 29): the node holds
//! at most `max_connections` (at the cap the longest-idle one is closed to
//! make room: [`granary_node_core::conns`]); a connection that sends no request for
//! `idle_timeout_ms`, or does not send a whole request within
//! [`REQUEST_WAIT`] of its header, is closed (and counts as idle, so
//! evictable, until its whole request is in); at most
//! [`CONCURRENT_REFUSALS`] refusals are answered at once; a reply not read within
//! `write_timeout_ms` closes it; each answers one request at a time (so
//! requests waiting for a version the node does not know yet are bounded
//! by the connections), and its loader reports take one slot.

use crate::access::{self, LocalAccess};
use crate::error::FetchError;
use crate::service::Node;
use crate::session::Session;
use granary_node_core::conns::{Admit, ConnId, ConnTable, SocketLimits};
use granary_proto::Walk;
use granary_proto::frame;
use granary_proto::version;
use granary_proto::wire::{self, ErrorKind, LocalRequest, LocalResponse, MAX_FRAME_LEN};
use rustix::fd::BorrowedFd;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};

/// Pause after a failed accept before trying again.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// The largest request frame: every request is a few hundred bytes (replies,
/// such as a large dataset description, may be up to `MAX_FRAME_LEN`).
const MAX_REQUEST_LEN: usize = 64 << 10;

/// `Follow` requests planned at once. Planning materialises a rank's rows
/// for this epoch and the next ones (CPU and memory in proportion to the
/// dataset), so it runs on the blocking pool, a few at a time, never on the
/// runtime's workers that also keep the lease and serve peers.
const CONCURRENT_FOLLOWS: usize = 2;

/// How long a connection may take to send the rest of a request once its
/// header came.
pub const REQUEST_WAIT: Duration = Duration::from_secs(10);

/// How long a refused connection gets to send its first request and read
/// the refusal.
const REFUSAL_WAIT: Duration = Duration::from_secs(2);

/// Refusals being answered at once; past it a refused connection is closed
/// without an answer, so a flood of refused connections holds no more.
const CONCURRENT_REFUSALS: usize = 64;

/// How long a restarted cluster node keeps a trainer's describe waiting
/// for the datasets of its first placement before it answers that it has
/// not joined yet (retryable: the trainer's loader asks again).
const FIRST_PLACEMENT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Binds `path` (replacing a stale socket file) and serves the peers
/// `allowed` admits until `shutdown` resolves. A failed accept is logged
/// and retried, never fatal.
pub async fn serve(
    node: Node,
    path: &Path,
    allowed: LocalAccess,
    shutdown: impl std::future::Future<Output = ()>,
) -> io::Result<()> {
    let listener = bind(path)?;
    let limits = node.socket_limits();
    tracing::info!(socket = %path.display(), max_connections = limits.max_connections, "serving trainers");
    let follows = std::sync::Arc::new(tokio::sync::Semaphore::new(CONCURRENT_FOLLOWS));
    let conns = Conns::new(limits);
    let refusals = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_REFUSALS));
    let answer_refused = |stream: UnixStream, kind: ErrorKind, why: String| {
        // Past the bound the stream is dropped: closed without an answer.
        if let Ok(permit) = refusals.clone().try_acquire_owned() {
            tokio::spawn(async move {
                refuse(stream, kind, why).await;
                drop(permit);
            });
        }
    };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Accept fails for reasons of the moment (out of
                        // descriptors under a connection flood, a peer gone
                        // before it was accepted); the listener is intact,
                        // so keep serving. The pause stops a lasting error
                        // from spinning.
                        tracing::warn!(error = %e, "accepting a trainer connection failed; still serving");
                        tokio::time::sleep(ACCEPT_RETRY).await;
                        continue;
                    }
                };
                let (node, follows) = (node.clone(), follows.clone());
                let cred = stream.peer_cred().ok().map(|c| (c.uid(), c.gid()));
                if let Some((uid, gid)) = cred.filter(|&(u, g)| !allowed.admits(u, g)) {
                    let why = allowed.refusal(uid, gid);
                    tracing::warn!(uid, gid, "a process not on the allow-list connected; refused");
                    answer_refused(stream, ErrorKind::BadRequest, why);
                    continue;
                }
                if cred.is_none() {
                    tracing::warn!("a connection without peer credentials; refused");
                    continue;
                }
                let conn = match conns.open() {
                    Ok(conn) => conn,
                    Err(open) => {
                        tracing::warn!(open, "every trainer connection is inside a request; refused one more");
                        let why = format!(
                            "the node holds {open} connections, each inside a request (max_connections in \
                             node.toml); try again"
                        );
                        answer_refused(stream, ErrorKind::Unavailable, why);
                        continue;
                    }
                };
                tokio::spawn(async move {
                    let client = client_name(&stream);
                    match connection(node, stream, &client, follows, &conn).await {
                        Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                            tracing::warn!(%client, error = %e, "a trainer connection that reads no replies closed");
                        }
                        Err(e) => tracing::debug!(%client, error = %e, "trainer connection ended"),
                        Ok(()) => {}
                    }
                    drop(conn);
                });
            }
        }
    }
    let _ = std::fs::remove_file(path);
    Ok(())
}

/// Binds the socket with mode 0660, in a folder only this user (or root)
/// can write, replacing a dead node's socket owned by this user.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    access::prepare_dir(path)?;
    access::clear_stale(path)?;
    let listener = UnixListener::bind(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    Ok(listener)
}

/// The shell around [`ConnTable`]: the table, and how to tell each
/// connection's task to close.
#[derive(Clone)]
struct Conns {
    limits: SocketLimits,
    table: Arc<Mutex<ConnTable>>,
    closers: Arc<Mutex<HashMap<ConnId, Arc<tokio::sync::Notify>>>>,
}

/// One connection's place in [`Conns`].
struct Conn {
    id: ConnId,
    /// Told when the table closes this connection to make room.
    close: Arc<tokio::sync::Notify>,
    conns: Conns,
}

impl Conns {
    fn new(limits: SocketLimits) -> Self {
        Self { limits, table: Arc::new(Mutex::new(ConnTable::new(limits.max_connections))), closers: Arc::default() }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, ConnTable> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn closers(&self) -> std::sync::MutexGuard<'_, HashMap<ConnId, Arc<tokio::sync::Notify>>> {
        self.closers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a new connection (closing the longest-idle one at the
    /// cap), or the number of connections, all busy, when there is none.
    fn open(&self) -> Result<Conn, usize> {
        let admit = self.table().handle_open(Instant::now());
        match admit {
            Admit::Refused { open } => Err(open),
            Admit::Accepted { id, evict } => {
                let close = Arc::new(tokio::sync::Notify::new());
                let mut closers = self.closers();
                if let Some(evicted) = evict.and_then(|e| closers.remove(&e)) {
                    tracing::info!(
                        max_connections = self.limits.max_connections,
                        "the connection idle the longest closed to make room for a new one"
                    );
                    evicted.notify_one();
                }
                closers.insert(id, close.clone());
                Ok(Conn { id, close, conns: self.clone() })
            }
        }
    }
}

impl Conn {
    fn busy(&self) {
        self.conns.table().handle_busy(self.id);
    }

    fn idle(&self) {
        self.conns.table().handle_idle(self.id, Instant::now());
    }

    /// `read`'s result, or `None` when the table closes this connection to
    /// make room first (it is idle while it reads).
    async fn unless_evicted<T>(&self, client: &str, read: impl std::future::Future<Output = T>) -> Option<T> {
        tokio::select! {
            r = read => Some(r),
            _ = self.close.notified() => {
                tracing::debug!(%client, "closed to make room for a new connection");
                None
            }
        }
    }
}

impl Drop for Conn {
    /// The connection ended, however (a panic of its task included): its
    /// place in the table is free.
    fn drop(&mut self) {
        self.conns.table().handle_closed(self.id);
        self.conns.closers().remove(&self.id);
    }
}

/// Answers a peer that may not use the node with `why` and closes: after
/// its first request (at most [`REFUSAL_WAIT`]), so the answer is what it
/// reads rather than a reset connection; the request itself is never
/// looked at.
async fn refuse(mut stream: UnixStream, kind: ErrorKind, why: String) {
    let _ = tokio::time::timeout(REFUSAL_WAIT, async {
        let mut header = [0u8; frame::HEADER_LEN];
        stream.read_exact(&mut header).await?;
        let len = frame::decode_len(header, MAX_REQUEST_LEN).map_err(io::Error::other)?;
        let mut body = vec![0u8; len];
        stream.read_exact(&mut body).await.map(|_| ())
    })
    .await;
    let _ = send(&stream, &failed(kind, why), None, REFUSAL_WAIT).await;
}

/// Answers a trainer's hello (its magic read): the version both speak, or
/// a refusal naming both ranges. `None` when the connection is to close.
async fn greet(stream: &mut UnixStream, client: &str, write: Duration) -> io::Result<Option<u16>> {
    let mut rest = [0u8; version::HELLO_LEN - 4];
    match tokio::time::timeout(REQUEST_WAIT, stream.read_exact(&mut rest)).await {
        Ok(read) => read?,
        Err(_) => return Ok(None),
    };
    let trainer = version::decode_hello(rest);
    let chosen = version::LOCAL.negotiate(trainer);
    if let Err(m) = chosen {
        tracing::warn!(%client, "{}", refusal(m));
    }
    let reply = version::encode_hello_reply(chosen.ok(), version::LOCAL);
    match tokio::time::timeout(write, stream.write_all(&reply)).await {
        Ok(written) => written?,
        Err(_) => return Ok(None),
    }
    Ok(chosen.ok())
}

/// Why this node refuses a trainer, for its log and for a trainer of local
/// protocol 1 (which reads no hello reply).
fn refusal(m: version::Mismatch) -> String {
    let upgrade = match m.older() {
        version::Older::Theirs => "upgrade granary in the trainer",
        version::Older::Ours => "upgrade this node",
    };
    format!("this node speaks local protocol {}, the trainer {}: no version in common; {upgrade}", m.ours, m.theirs)
}

/// Names the process at the other end of a trainer connection for logs.
fn client_name(stream: &UnixStream) -> String {
    match stream.peer_cred() {
        Ok(c) => format!("pid {} uid {}", c.pid().map_or_else(|| "?".to_string(), |p| p.to_string()), c.uid()),
        Err(_) => "an unknown process".to_string(),
    }
}

/// A connection's state: the plan it follows, if any.
async fn connection(
    node: Node,
    mut stream: UnixStream,
    client: &str,
    follows: std::sync::Arc<tokio::sync::Semaphore>,
    conn: &Conn,
) -> io::Result<()> {
    let mut session = Session::new(node.clone());
    let limits = conn.conns.limits;
    let write = limits.write_timeout;
    let mut first = true;
    // The local protocol this trainer speaks: 1 until a hello says more.
    let mut protocol = 1;
    loop {
        conn.idle();
        let mut header = [0u8; frame::HEADER_LEN];
        let Some(read) = conn
            .unless_evicted(client, tokio::time::timeout(limits.idle_timeout, stream.read_exact(&mut header)))
            .await
        else {
            return Ok(());
        };
        match read {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                tracing::debug!(%client, idle_ms = limits.idle_timeout.as_millis() as u64, "idle connection closed");
                return Ok(());
            }
        }
        if std::mem::take(&mut first) {
            if version::is_hello(header) {
                // Idle (evictable) while it greets, as while a request
                // comes in whole.
                match conn.unless_evicted(client, greet(&mut stream, client, write)).await {
                    Some(Ok(Some(v))) => {
                        protocol = v;
                        continue;
                    }
                    Some(Ok(None)) | None => return Ok(()),
                    Some(Err(e)) => return Err(e),
                }
            }
            // No hello: a trainer of local protocol 1.
            if let Err(m) = version::without_hello(version::LOCAL) {
                let why = refusal(m);
                tracing::warn!(%client, "{why}");
                return send(&stream, &failed(ErrorKind::BadRequest, why), None, write).await;
            }
        }
        let len = match frame::decode_len(header, MAX_REQUEST_LEN) {
            Ok(len) => len,
            Err(e) => {
                let len = match e {
                    frame::FrameError::TooLarge { len, .. } => len,
                    _ => 0,
                };
                tracing::warn!(%client, bytes = len, "oversized request frame; closing the connection");
                let reply =
                    failed(ErrorKind::BadRequest, format!("request frame of {len} bytes exceeds {MAX_REQUEST_LEN}"));
                return send(&stream, &reply, None, write).await;
            }
        };
        let mut body = vec![0u8; len];
        // Still idle (evictable) until the whole request is in: a process
        // that sends headers alone cannot hold the cap.
        let Some(body_read) =
            conn.unless_evicted(client, tokio::time::timeout(REQUEST_WAIT, stream.read_exact(&mut body))).await
        else {
            return Ok(());
        };
        match body_read {
            Ok(read) => read?,
            Err(_) => {
                tracing::warn!(%client, bytes = len, "a request not sent whole within 10 s; closing the connection");
                return Ok(());
            }
        };
        conn.busy();
        let req = match wire::decode::<LocalRequest>(&body) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(%client, error = %e, "malformed request frame; closing the connection");
                let reply = failed(ErrorKind::BadRequest, format!("malformed request: {e}"));
                return send(&stream, &reply, None, write).await;
            }
        };
        // What a `Follow` (a rank plan from its first batch) or a
        // `FollowWalk` asks the node to prefetch along.
        let follow = match &req {
            LocalRequest::Follow { version, params } => Some((*version, Walk::Rank { params: *params, start: 0 })),
            LocalRequest::FollowWalk { version, walk } => Some((*version, *walk)),
            _ => None,
        };
        match req {
            LocalRequest::Describe { dataset, version } => {
                let reply = match node.describe_when_known(&dataset, version, FIRST_PLACEMENT_WAIT).await {
                    Ok(info) => LocalResponse::Described(info),
                    Err(FetchError::NotServed { dataset, version, current, served }) => {
                        LocalResponse::NotServed { dataset, version, current, served }
                    }
                    Err(e) => failed(e.kind(), e.to_string()),
                };
                send(&stream, &reply, None, write).await?;
            }
            LocalRequest::Follow { .. } | LocalRequest::FollowWalk { .. } => {
                let Some((version, walk)) = follow else { continue };
                let admitted = node.admit_follow(version, &walk);
                let planned = match admitted {
                    Err(e) => Err(e),
                    Ok(()) => match follows.clone().acquire_owned().await {
                        Ok(permit) => {
                            let node = node.clone();
                            tokio::task::spawn_blocking(move || {
                                let _permit = permit;
                                node.follow(version, &walk)
                            })
                            .await
                            .unwrap_or_else(|source| Err(FetchError::Task { what: "planning", source }))
                        }
                        Err(e) => Err(FetchError::ShuttingDown(e)),
                    },
                };
                let reply = match planned {
                    Ok(f) => {
                        session.follow(f);
                        LocalResponse::Following
                    }
                    Err(e) => failed(e.kind(), e.to_string()),
                };
                send(&stream, &reply, None, write).await?;
            }
            LocalRequest::FetchChunk { version, shard } => {
                let chunk = session.chunk(version, shard).await.map_err(|e| (e.kind(), e.to_string())).and_then(|c| {
                    for_protocol(c, protocol)
                        .map_err(|e| (ErrorKind::Unavailable, format!("a copy for local protocol {protocol}: {e}")))
                });
                match chunk {
                    Ok(chunk) => {
                        let reply = LocalResponse::Chunk { len: chunk.len() as u64 };
                        send(&stream, &reply, Some(chunk.fd()), write).await?;
                    }
                    Err((kind, e)) => send(&stream, &failed(kind, format!("shard {shard}: {e}")), None, write).await?,
                }
            }
            LocalRequest::Stats => send(&stream, &LocalResponse::Stats(node.stats()), None, write).await?,
            LocalRequest::Touch { shard, .. } => {
                session.touch(shard);
                send(&stream, &LocalResponse::Touched, None, write).await?;
            }
            LocalRequest::Report(report) => {
                // One slot per connection: a connection sending many
                // distinct reports replaces its own.
                node.report(conn.id, report);
                send(&stream, &LocalResponse::Reported, None, write).await?;
            }
            LocalRequest::Doctor => send(&stream, &LocalResponse::Doctor(node.doctor_snapshot()), None, write).await?,
            LocalRequest::Counters => send(&stream, &LocalResponse::Counters(node.counters()), None, write).await?,
        }
    }
}

/// `chunk` as a trainer of local `protocol` reads it: before protocol 3,
/// chunks of format 2 only (`granary_proto::chunk`), so a chunk of format
/// 3 goes as a format-2 copy (during a rolling upgrade only: trainers are
/// upgraded after their nodes).
fn for_protocol(
    chunk: std::sync::Arc<crate::shm::SealedChunk>,
    protocol: u16,
) -> Result<std::sync::Arc<crate::shm::SealedChunk>, String> {
    use granary_proto::{ChunkView, chunk::Verify};
    if protocol >= 3 || granary_proto::chunk::format_of(chunk.bytes()).is_some_and(|f| f <= 2) {
        return Ok(chunk);
    }
    let view = ChunkView::parse(chunk.bytes(), Verify::HeaderOnly).map_err(|e| e.to_string())?;
    let mut old = vec![0u8; chunk.len()];
    view.write_format(2, &mut old).map_err(|e| e.to_string())?;
    crate::shm::SealedChunk::copy_of(&old).map(std::sync::Arc::new).map_err(|e| e.to_string())
}

fn failed(kind: ErrorKind, message: String) -> LocalResponse {
    LocalResponse::Failed { kind, message }
}

/// Writes one frame, attaching `fd` to its first byte, within `deadline`: a
/// client that does not read its replies gets a `TimedOut` error (and its
/// connection closed) instead of holding the task and the reply forever.
async fn send(
    stream: &UnixStream,
    msg: &LocalResponse,
    fd: Option<BorrowedFd<'_>>,
    deadline: Duration,
) -> io::Result<()> {
    match tokio::time::timeout(deadline, send_frame(stream, msg, fd)).await {
        Ok(sent) => sent,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the reply was not read within {} ms (write_timeout_ms)", deadline.as_millis()),
        )),
    }
}

/// Writes one frame, attaching `fd` to its first byte.
async fn send_frame(stream: &UnixStream, msg: &LocalResponse, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let mut body = wire::encode(msg);
    if body.len() > MAX_FRAME_LEN {
        // The client would refuse it as oversized without saying why;
        // say why here (a description of millions of row groups).
        let what = match msg {
            LocalResponse::Described(info) => format!("the description of dataset {:?}", info.name),
            _ => "the reply".to_string(),
        };
        let reply = failed(
            ErrorKind::Unavailable,
            format!("{what} is {} bytes, over the {MAX_FRAME_LEN}-byte frame limit", body.len()),
        );
        body = wire::encode(&reply);
    }
    let frame = frame::encode(&body, MAX_FRAME_LEN).map_err(io::Error::other)?;
    let mut sent = 0;
    while sent < frame.len() {
        stream.writable().await?;
        let attach = if sent == 0 { fd } else { None };
        let res = stream.try_io(Interest::WRITABLE, || {
            let iov = [IoSlice::new(&frame[sent..])];
            let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut cmsg = SendAncillaryBuffer::new(&mut space);
            let fds;
            if let Some(fd) = attach {
                fds = [fd];
                cmsg.push(SendAncillaryMessage::ScmRights(&fds));
            }
            rustix::net::sendmsg(stream, &iov, &mut cmsg, SendFlags::NOSIGNAL).map_err(io::Error::from)
        });
        match res {
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
