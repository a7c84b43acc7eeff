//! The peer fabric: a node that does not own a shard asks its owner over
//! QUIC, so the cluster reads each shard from remote storage once.
//!
//! - [`Cluster`] holds what this node knows of placement: every node's
//!   address and, per dataset version it serves, the owner of each shard. It
//!   is refreshed from the coordinator whenever the placement watch reports
//!   a new epoch or version ([`follow_placement`]), which also opens the
//!   datasets the coordinator lists that the node does not serve yet.
//! - [`PeerLink`] fetches a chunk from an owner: one connection per peer,
//!   reused; one bidirectional stream per chunk (a large chunk never blocks
//!   a small one); at most [`MAX_FETCHES_PER_PEER`] fetches and
//!   [`MAX_INFLIGHT_BYTES_PER_PEER`] chunk bytes in flight per peer; every
//!   fetch bounded by a deadline; every chunk validated (header and payload
//!   checksum) before it is used.
//! - [`serve`] answers other nodes: it requires a node certificate, reads
//!   one [`PeerRequest`] per stream, and sends the chunk bytes as stored,
//!   from the tier or from one load (single flight with local requests).
//!   A peer's request is never forwarded, and is answered at once when it
//!   meets a load of this node that is asking that peer, so two nodes that
//!   disagree about placement cannot chase or wait on each other.
//!
//! Wire format: `granary_proto::peer`. Chunks are immutable and versioned,
//! so a chunk from any node is as good as the owner's.

use crate::service::Node;
use crate::shm::{ChunkFile, SealedChunk};
use granary_net::api::{ApiRequest, ApiResponse, PlacementView};
use granary_net::client::CoordinatorClient;
use granary_net::conn::Connections;
use granary_net::tls::{self, ALPN_PEER, Identity, Role};
use granary_proto::peer::{
    MAX_PEER_CHUNK_LEN, MAX_PEER_FOOTER_LEN, MAX_PEER_FRAME_LEN, PEER_PROGRESS_INTERVAL, PEER_STALL_TIMEOUT,
    PeerRequest, PeerResponse,
};
use granary_proto::wire::{ErrorKind, decode, encode};
use granary_proto::{ChunkView, DatasetVersion, NodeId, ShardId};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::{Semaphore, watch};

/// Chunk fetches in flight to one peer at once; more wait (footer fetches
/// take no slot: see [`PeerLink::fetch_footer`]). With chunks of at most
/// the tier's block size this bounds the bytes in flight per peer.
pub const MAX_FETCHES_PER_PEER: usize = 8;
/// Chunk bytes being received from one peer at once; a fetch reserves its
/// chunk's size (announced in the response header) before allocating the
/// buffer, so a burst of large chunks cannot exhaust memory.
pub const MAX_INFLIGHT_BYTES_PER_PEER: u64 = 256 << 20;
/// Reservation granularity of [`MAX_INFLIGHT_BYTES_PER_PEER`].
const BYTE_PERMIT: u64 = 64 << 10;

/// Bound on establishing a connection to a peer. A dead peer costs about
/// a lease anyway (its shards move only when its lease expires), so this
/// is generous enough for a loaded host to finish a handshake: a live peer
/// wrongly marked down makes this node read its shards itself.
pub const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// After a peer could not be reached, fetches skip it for this long (the
/// caller reads elsewhere at once instead of waiting out a connect timeout
/// per shard) until the placement moves its shards away.
pub const PEER_DOWN_FOR: Duration = Duration::from_secs(2);

/// A peer fetch failed; the caller falls back to another source.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// No connection could be made.
    #[error("peer {addr}: {reason}")]
    Connect {
        /// The peer.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
    /// The stream failed or the peer broke the protocol.
    #[error("peer {addr}, {shard}: {reason}")]
    Transfer {
        /// The peer.
        addr: SocketAddr,
        /// The shard asked for.
        shard: ShardId,
        /// Why.
        reason: String,
    },
    /// The peer answered that it could not produce the chunk.
    #[error("peer {addr} could not serve {shard} ({kind:?}): {message}")]
    Refused {
        /// The peer.
        addr: SocketAddr,
        /// The shard.
        shard: ShardId,
        /// Category.
        kind: ErrorKind,
        /// The peer's message.
        message: String,
    },
    /// Asking for a file's footer failed: the stream, the protocol, or
    /// the peer's own read.
    #[error("peer {addr}, footer of file {file}: {reason}")]
    Footer {
        /// The peer.
        addr: SocketAddr,
        /// File index in the manifest.
        file: u32,
        /// Why.
        reason: String,
    },
    /// The chunk failed validation.
    #[error("peer {addr} sent a corrupt chunk for {shard}: {reason}")]
    Corrupt {
        /// The peer.
        addr: SocketAddr,
        /// The shard.
        shard: ShardId,
        /// What failed.
        reason: String,
    },
    /// The peer sent nothing on the stream (no progress frame, no chunk
    /// byte; see `read_live`) for [`PEER_STALL_TIMEOUT`] while its
    /// connection still answered (see `peer_answers`): the stream is
    /// dropped and the caller reads elsewhere without waiting for the
    /// placement to move. A stall on a connection that went quiet too is a
    /// [`PeerError::Transfer`]: the peer is gone.
    #[error("peer {addr}, {shard}: stalled for {idle:?} ({during})")]
    Stalled {
        /// The peer.
        addr: SocketAddr,
        /// The shard.
        shard: ShardId,
        /// How long nothing came.
        idle: Duration,
        /// What the stall interrupted.
        during: String,
    },
    /// The deadline passed.
    #[error("peer {addr}: no chunk for {shard} within {deadline:?}")]
    Timeout {
        /// The peer.
        addr: SocketAddr,
        /// The shard.
        shard: ShardId,
        /// The deadline.
        deadline: Duration,
    },
}

/// Connections and flow control towards peers.
pub struct PeerLink {
    conns: Connections,
    slots: Mutex<HashMap<SocketAddr, Arc<Semaphore>>>,
    bytes: Mutex<HashMap<SocketAddr, Arc<Semaphore>>>,
    down: Mutex<HashMap<SocketAddr, std::time::Instant>>,
}

impl PeerLink {
    /// Dials from `endpoint` with this node's identity.
    pub fn new(endpoint: quinn::Endpoint, identity: &Identity) -> Result<Self, tls::TlsError> {
        let config = identity.client_config(ALPN_PEER)?;
        Ok(Self {
            conns: Connections::new(endpoint, config, Role::Node, PEER_CONNECT_TIMEOUT),
            slots: Mutex::new(HashMap::new()),
            bytes: Mutex::new(HashMap::new()),
            down: Mutex::new(HashMap::new()),
        })
    }

    async fn connection(&self, addr: SocketAddr) -> Result<quinn::Connection, PeerError> {
        let err = |reason: String| PeerError::Connect { addr, reason };
        if let Some(until) = self.down.lock().unwrap_or_else(|p| p.into_inner()).get(&addr)
            && std::time::Instant::now() < *until
        {
            return Err(err("unreachable moments ago; not retried yet".into()));
        }
        self.conns.get(addr).await.map_err(|reason| {
            self.down.lock().unwrap_or_else(|p| p.into_inner()).insert(addr, std::time::Instant::now() + PEER_DOWN_FOR);
            err(reason)
        })
    }

    fn byte_budget(&self, addr: SocketAddr) -> Arc<Semaphore> {
        self.bytes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(addr)
            .or_insert_with(|| Arc::new(Semaphore::new((MAX_INFLIGHT_BYTES_PER_PEER / BYTE_PERMIT) as usize)))
            .clone()
    }

    fn slot(&self, addr: SocketAddr) -> Arc<Semaphore> {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(addr)
            .or_insert_with(|| Arc::new(Semaphore::new(MAX_FETCHES_PER_PEER)))
            .clone()
    }

    /// Fetches and validates the chunk of `shard` from the node at `addr`.
    /// `expected_len` is the chunk's length from the manifest's layout
    /// ([`granary_proto::ChunkLayout::total_len`]): a peer announcing any
    /// other length is refused before memory is committed for it.
    pub async fn fetch(
        &self,
        addr: SocketAddr,
        version: DatasetVersion,
        shard: ShardId,
        expected_len: u64,
        deadline: Duration,
    ) -> Result<SealedChunk, PeerError> {
        let work = async {
            let slot = self.slot(addr);
            let _permit = slot.acquire().await.map_err(|e| PeerError::Connect { addr, reason: e.to_string() })?;
            let conn = self.connection(addr).await?;
            let result = self.exchange(&conn, addr, version, shard, expected_len).await;
            if matches!(result, Err(PeerError::Transfer { .. })) {
                self.conns.forget(addr);
            }
            result
        };
        tokio::time::timeout(deadline, work).await.map_err(|_| PeerError::Timeout { addr, shard, deadline })?
    }

    /// Fetches the Parquet footer of file `file` of `version` from the node
    /// at `addr` (bytes as stored; the caller decodes and checks them).
    /// `file_size` (from the manifest) bounds what the peer may announce.
    ///
    /// Footer fetches take no fetch slot: a load that needs a footer waits
    /// on it with its load permit held, while chunk fetches hold the slots
    /// waiting on the other node's loads, which can be waiting on footers
    /// from this node. Sharing the slots closed that cycle between two
    /// nodes until the footer deadline (10 s) broke it, in about a third of
    /// two-node cold epochs (docs/BENCHMARKS.md). Footer fetches are
    /// bounded anyway: only a load holding a load permit makes one.
    pub async fn fetch_footer(
        &self,
        addr: SocketAddr,
        version: DatasetVersion,
        file: u32,
        file_size: u64,
        deadline: Duration,
    ) -> Result<bytes::Bytes, PeerError> {
        let fail = |reason: String| PeerError::Footer { addr, file, reason };
        let work = async {
            let conn = self.connection(addr).await?;
            let (response, mut recv) =
                ask(&conn, &PeerRequest::FetchFooter { version, file }).await.map_err(|e| fail(e.to_string()))?;
            match response {
                PeerResponse::Footer { len } if len <= MAX_PEER_FOOTER_LEN.min(file_size) => {
                    let mut buf = vec![0u8; len as usize];
                    read_live(&mut recv, &mut Buffer { buf: &mut buf, pos: 0 }, "footer bytes")
                        .await
                        .map_err(|e| fail(e.to_string()))?;
                    Ok(bytes::Bytes::from(buf))
                }
                PeerResponse::Footer { len } => Err(fail(format!(
                    "announced a footer of {len} bytes, over {} (the file is {file_size} bytes)",
                    MAX_PEER_FOOTER_LEN.min(file_size)
                ))),
                PeerResponse::Failed { kind, message } => Err(fail(format!("refused ({kind:?}): {message}"))),
                PeerResponse::Chunk { .. } => Err(fail("answered with a chunk".into())),
                PeerResponse::Working => Err(fail("a progress frame was taken for an answer".into())),
            }
        };
        tokio::time::timeout(deadline, work).await.map_err(|_| fail(format!("no footer within {deadline:?}")))?
    }

    async fn exchange(
        &self,
        conn: &quinn::Connection,
        addr: SocketAddr,
        version: DatasetVersion,
        shard: ShardId,
        expected_len: u64,
    ) -> Result<SealedChunk, PeerError> {
        let transfer = |reason: String| PeerError::Transfer { addr, shard, reason };
        // A stall on a connection that hears nothing at all is a dead
        // peer: a transfer failure, which waits for the placement.
        let failed = async |e: StreamError| match e {
            StreamError::Stalled { idle, during } if peer_answers(conn).await => {
                PeerError::Stalled { addr, shard, idle, during }
            }
            StreamError::Stalled { idle, during } => PeerError::Transfer {
                addr,
                shard,
                reason: format!("nothing for {idle:?} ({during}), and the connection went quiet too: the peer is gone"),
            },
            StreamError::Failed(reason) => PeerError::Transfer { addr, shard, reason },
        };
        let (response, mut recv) = match ask(conn, &PeerRequest::FetchChunk { version, shard }).await {
            Ok(answer) => answer,
            Err(e) => return Err(failed(e).await),
        };
        match response {
            PeerResponse::Failed { kind, message } => Err(PeerError::Refused { addr, shard, kind, message }),
            PeerResponse::Footer { .. } => Err(transfer("answered with a footer".into())),
            PeerResponse::Working => Err(transfer("a progress frame was taken for an answer".into())),
            PeerResponse::Chunk { len } => {
                if len > MAX_PEER_CHUNK_LEN {
                    return Err(transfer(format!("announced a chunk of {len} bytes, over {MAX_PEER_CHUNK_LEN}")));
                }
                // The manifest fixes every chunk's length: refuse another
                // before committing memory for it.
                if len != expected_len {
                    return Err(PeerError::Corrupt {
                        addr,
                        shard,
                        reason: format!("announced a chunk of {len} bytes; the manifest's layout gives {expected_len}"),
                    });
                }
                // A chunk larger than the whole budget takes all of it.
                let units = len.div_ceil(BYTE_PERMIT).clamp(1, MAX_INFLIGHT_BYTES_PER_PEER / BYTE_PERMIT) as u32;
                let budget = self.byte_budget(addr);
                let _reserved = budget.acquire_many(units).await.map_err(|e| transfer(e.to_string()))?;
                // Written straight from QUIC's receive buffers into the
                // memory file the chunk is kept and handed to trainers in:
                // one copy, and no page cleared before it is filled.
                if len == 0 {
                    return Err(PeerError::Corrupt { addr, shard, reason: "announced an empty chunk".into() });
                }
                let mut file = ChunkFile::new(len as usize)
                    .map_err(|e| transfer(format!("cannot allocate {len} bytes of chunk memory: {e}")))?;
                if let Err(e) = read_live(&mut recv, &mut Pieces::new(&mut file), "chunk bytes").await {
                    return Err(failed(e).await);
                }
                let chunk = file.seal().map_err(|e| transfer(format!("cannot seal the chunk's memory: {e}")))?;
                let view = ChunkView::parse(chunk.bytes(), granary_proto::chunk::Verify::Full)
                    .map_err(|e| PeerError::Corrupt { addr, shard, reason: e.to_string() })?;
                let (got_version, got_shard) = (view.header().dataset_version, view.header().shard);
                if got_version != version || got_shard != shard {
                    return Err(PeerError::Corrupt {
                        addr,
                        shard,
                        reason: format!("it is the chunk of {got_shard} in version {got_version}"),
                    });
                }
                Ok(chunk)
            }
        }
    }
}

/// Reading a peer's stream failed.
#[derive(Debug)]
enum StreamError {
    /// The stream stalled for `idle` ([`PEER_STALL_TIMEOUT`]).
    Stalled { idle: Duration, during: String },
    /// The stream or connection failed, or the peer broke the protocol.
    Failed(String),
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stalled { idle, during } => write!(f, "stalled for {idle:?} ({during})"),
            Self::Failed(reason) => f.write_str(reason),
        }
    }
}

/// Where [`read_live`] puts what it reads.
trait Fill {
    /// Bytes wanted in all.
    fn len(&self) -> usize;
    /// Bytes taken so far.
    fn filled(&self) -> usize;
    /// Takes what `recv` has, waiting for at least one byte; false when
    /// the stream ended first.
    async fn take(&mut self, recv: &mut quinn::RecvStream) -> Result<bool, String>;
}

/// A buffer filled by copying.
struct Buffer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl Fill for Buffer<'_> {
    fn len(&self) -> usize {
        self.buf.len()
    }

    fn filled(&self) -> usize {
        self.pos
    }

    async fn take(&mut self, recv: &mut quinn::RecvStream) -> Result<bool, String> {
        match recv.read(&mut self.buf[self.pos..]).await.map_err(|e| e.to_string())? {
            Some(n) => {
                self.pos += n;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// Pieces [`Pieces`] takes from QUIC per write into the file.
const PIECES_PER_WRITE: usize = 64;

/// A memory file filled with the pieces QUIC received, as they are (no
/// copy into memory first), as many as are there at once per write. Bytes
/// past the file's length are not taken.
struct Pieces<'a> {
    file: &'a mut ChunkFile,
    pieces: [bytes::Bytes; PIECES_PER_WRITE],
}

impl<'a> Pieces<'a> {
    fn new(file: &'a mut ChunkFile) -> Self {
        Self { file, pieces: std::array::from_fn(|_| bytes::Bytes::new()) }
    }
}

impl Fill for Pieces<'_> {
    fn len(&self) -> usize {
        self.file.len()
    }

    fn filled(&self) -> usize {
        self.file.written()
    }

    async fn take(&mut self, recv: &mut quinn::RecvStream) -> Result<bool, String> {
        let Some(n) = recv.read_chunks(&mut self.pieces).await.map_err(|e| e.to_string())? else {
            return Ok(false);
        };
        // What comes after the chunk's announced length is not the chunk:
        // left unwritten, as a read of exactly that length would leave it.
        let mut room = self.file.len() - self.file.written();
        for piece in &mut self.pieces[..n] {
            piece.truncate(room);
            room -= piece.len();
        }
        let written = self.file.append(&self.pieces[..n]).map_err(|e| e.to_string());
        self.pieces[..n].fill(bytes::Bytes::new());
        written.map(|()| true)
    }
}

/// Fills `into` from `recv`, failing when the stream ends early or when no
/// byte arrives for [`PEER_STALL_TIMEOUT`] (`what` names the bytes). A
/// transfer that keeps moving, however slowly, is not a stall (the whole
/// fetch's deadline bounds it). One timer per quiet period, not per read:
/// each read notes the time, and a timer that fires after bytes came is
/// set again from the last of them.
async fn read_live(recv: &mut quinn::RecvStream, into: &mut impl Fill, what: &str) -> Result<(), StreamError> {
    let len = into.len();
    let mut last = tokio::time::Instant::now();
    while into.filled() < len {
        let until = last + PEER_STALL_TIMEOUT;
        let reading = async {
            while into.filled() < len {
                match into.take(recv).await {
                    Ok(true) => last = tokio::time::Instant::now(),
                    Ok(false) => {
                        let got = into.filled();
                        return Err(StreamError::Failed(format!(
                            "{what}: the stream ended after {got} of {len} bytes"
                        )));
                    }
                    Err(e) => return Err(StreamError::Failed(format!("{what}: {e}"))),
                }
            }
            Ok(())
        };
        match tokio::time::timeout_at(until, reading).await {
            Ok(done) => return done,
            // Bytes came since the timer was set: set it from the last.
            Err(_) if last + PEER_STALL_TIMEOUT > tokio::time::Instant::now() => continue,
            Err(_) => {
                return Err(StreamError::Stalled {
                    idle: PEER_STALL_TIMEOUT,
                    during: format!("{what}: nothing came after {} of {len} bytes", into.filled()),
                });
            }
        }
    }
    Ok(())
}

/// Whether the other end of `conn` still answers, asked after a stream on
/// it stalled: a live peer acknowledges the keep-alive this side sends
/// every [`tls::KEEP_ALIVE_INTERVAL`] while nothing else is sent, so some
/// datagram arrives within two intervals. A peer that died (SIGKILL, a
/// lost host) sends nothing, and its connection's idle timeout closes it
/// about then too. Telling the two apart matters: a stalled owner is
/// alive and keeps its lease, so the asker reads elsewhere at once; a
/// dead owner's shards move to one survivor, which the asker waits for.
async fn peer_answers(conn: &quinn::Connection) -> bool {
    if conn.close_reason().is_some() {
        return false;
    }
    let heard = conn.stats().udp_rx.datagrams;
    let until = tokio::time::Instant::now() + 2 * tls::KEEP_ALIVE_INTERVAL + Duration::from_millis(100);
    while tokio::time::Instant::now() < until {
        tokio::select! {
            _ = conn.closed() => return false,
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        if conn.stats().udp_rx.datagrams > heard {
            return true;
        }
    }
    false
}

/// Opens a stream on `conn`, sends `request` as one frame, finishes the
/// sending side and reads the response frame, skipping the owner's
/// [`PeerResponse::Working`] frames; bytes that follow the answer (a chunk,
/// a footer) are left on the returned stream. An owner that sends nothing
/// for [`PEER_STALL_TIMEOUT`] has stalled.
async fn ask(
    conn: &quinn::Connection,
    request: &PeerRequest,
) -> Result<(PeerResponse, quinn::RecvStream), StreamError> {
    let failed = |e: &dyn std::fmt::Display| StreamError::Failed(e.to_string());
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| failed(&e))?;
    send.write_all(&frame(encode(request))).await.map_err(|e| failed(&e))?;
    let _ = send.finish();
    loop {
        let mut prefix = [0u8; 4];
        read_live(&mut recv, &mut Buffer { buf: &mut prefix, pos: 0 }, "response header").await?;
        let len = u32::from_le_bytes(prefix) as usize;
        if len > MAX_PEER_FRAME_LEN {
            return Err(StreamError::Failed(format!("response frame of {len} bytes exceeds {MAX_PEER_FRAME_LEN}")));
        }
        let mut head = vec![0u8; len];
        read_live(&mut recv, &mut Buffer { buf: &mut head, pos: 0 }, "response header").await?;
        match decode::<PeerResponse>(&head).map_err(|e| failed(&e))? {
            PeerResponse::Working => continue,
            response => return Ok((response, recv)),
        }
    }
}

/// One frame: a u32 little-endian length, then `body` (a message's
/// archive from [`encode`]).
fn frame(body: Vec<u8>) -> Vec<u8> {
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

/// What this node knows of placement.
pub struct Cluster {
    me: NodeId,
    link: PeerLink,
    map: RwLock<PlacementMap>,
    /// Bumped on every placement update, so fetches can wait for one.
    updates: watch::Sender<u64>,
    /// Bound on asking peers for one chunk: every owner tried and the waits
    /// for the placement to move the shard, together. After it the node
    /// reads remote storage itself.
    pub fetch_deadline: Duration,
    /// How long a fetch whose owner failed waits for a newer placement (the
    /// owner's lease expiring moves its shards) before reading remote
    /// storage itself.
    pub reroute_wait: Duration,
}

#[derive(Default)]
struct PlacementMap {
    epoch: u64,
    addrs: HashMap<NodeId, SocketAddr>,
    owners: HashMap<DatasetVersion, HashMap<ShardId, NodeId>>,
}

impl Cluster {
    /// This node is `me`; peers are reached through `link`.
    pub fn new(me: NodeId, link: PeerLink) -> Self {
        Self {
            me,
            link,
            map: RwLock::new(PlacementMap::default()),
            updates: watch::channel(0).0,
            fetch_deadline: Duration::from_secs(30),
            reroute_wait: Duration::from_secs(10),
        }
    }

    /// This node's id.
    pub fn me(&self) -> NodeId {
        self.me
    }

    /// The live owner of `shard` and its address, when it is another node.
    pub fn owner(&self, version: DatasetVersion, shard: ShardId) -> Option<(NodeId, SocketAddr)> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let owner = *map.owners.get(&version)?.get(&shard)?;
        if owner == self.me {
            return None;
        }
        map.addrs.get(&owner).map(|a| (owner, *a))
    }

    /// The link to peers.
    pub fn link(&self) -> &PeerLink {
        &self.link
    }

    /// The placement epoch known.
    pub fn epoch(&self) -> u64 {
        self.map.read().unwrap_or_else(|p| p.into_inner()).epoch
    }

    /// The owners last known for `version`.
    fn owners_of(&self, version: DatasetVersion) -> Option<HashMap<ShardId, NodeId>> {
        self.map.read().unwrap_or_else(|p| p.into_inner()).owners.get(&version).cloned()
    }

    fn replace(&self, map: PlacementMap) {
        *self.map.write().unwrap_or_else(|p| p.into_inner()) = map;
        self.updates.send_modify(|n| *n += 1);
    }

    /// Replaces what this node knows of placement: the live nodes'
    /// addresses and, per dataset version, each shard's owner.
    /// [`follow_placement`] calls it with what the coordinator says; tests
    /// may call it directly.
    pub fn apply_placement(
        &self,
        epoch: u64,
        addrs: HashMap<NodeId, SocketAddr>,
        owners: HashMap<DatasetVersion, HashMap<ShardId, NodeId>>,
    ) {
        self.replace(PlacementMap { epoch, addrs, owners });
    }

    /// Waits until the owner of `shard` is no longer `failed` (a newer
    /// placement moved it), or `wait` passes. Returns the new owner (None:
    /// this node owns it now, or the owner is unknown).
    pub async fn reroute(
        &self,
        version: DatasetVersion,
        shard: ShardId,
        failed: NodeId,
        wait: Duration,
    ) -> Result<Option<(NodeId, SocketAddr)>, ()> {
        let mut updates = self.updates.subscribe();
        let moved = |c: &Self| {
            let owner = c.map.read().unwrap_or_else(|p| p.into_inner()).owners.get(&version)?.get(&shard).copied()?;
            (owner != failed).then_some(())
        };
        let waited = tokio::time::timeout(wait, async {
            loop {
                if moved(self).is_some() {
                    return;
                }
                if updates.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        })
        .await;
        match waited {
            Ok(()) => Ok(self.owner(version, shard)),
            Err(_) => Err(()),
        }
    }
}

/// Serves, on `node`, the coordinator's current version of each dataset in
/// `view` that the node does not serve yet (manifest, source and view come
/// from `DescribeDataset`; footers are read when first needed). Returns
/// false if one could not be served, so the caller tries again later.
async fn open_listed_datasets(node: &Node, client: &CoordinatorClient, view: &PlacementView) -> bool {
    let mut all = true;
    for (name, version) in &view.datasets {
        if node.dataset(*version).is_ok() {
            continue;
        }
        match client.call(&ApiRequest::DescribeDataset { name: name.clone() }).await {
            Ok((_, ApiResponse::Dataset { manifest, view: dview, .. })) => {
                if manifest.version(&dview) != *version {
                    tracing::debug!(dataset = %name, "the coordinator's current version moved on; waiting for the next view");
                    continue;
                }
                let source = manifest.source.clone();
                if let Err(e) = node.serve_manifest(name, dview, manifest) {
                    tracing::warn!(dataset = %name, %source, "cannot serve the coordinator's dataset: {e}");
                    all = false;
                }
            }
            Ok((_, other)) => tracing::debug!(dataset = %name, "dataset not described: {other:?}"),
            Err(e) => {
                tracing::warn!(dataset = %name, "cannot describe the dataset: {e}");
                all = false;
            }
        }
    }
    all
}

/// Retry interval of [`open_listed_datasets`] after a failure.
const OPEN_RETRY: Duration = Duration::from_secs(5);

/// Keeps `cluster` current: on every view from the placement watch, opens
/// the datasets the coordinator lists that `node` does not serve yet, then
/// asks the coordinator for the owners of each dataset version it serves.
pub async fn follow_placement(
    cluster: Arc<Cluster>,
    node: Node,
    client: CoordinatorClient,
    mut views: watch::Receiver<Option<PlacementView>>,
) {
    loop {
        let view = views.borrow_and_update().clone();
        let mut retry = false;
        if let Some(view) = view {
            retry = !open_listed_datasets(&node, &client, &view).await;
            let mut map = PlacementMap { epoch: view.placement_epoch, ..Default::default() };
            for n in view.nodes.iter().filter(|n| n.live) {
                match n.addr.parse::<SocketAddr>() {
                    Ok(a) => {
                        map.addrs.insert(n.node, a);
                    }
                    Err(e) => tracing::warn!(node = %n.node, addr = %n.addr, "unusable peer address: {e}"),
                }
            }
            for (name, version) in &view.datasets {
                if node.dataset(*version).is_err() {
                    continue; // not a version this node serves
                }
                match client.call(&ApiRequest::DescribePlacement { name: name.clone() }).await {
                    Ok((_, ApiResponse::Placement(report))) if report.version == *version => {
                        let owners = report
                            .owners
                            .iter()
                            .map(|&(file, row_group, owner)| (ShardId { file, row_group }, owner))
                            .collect();
                        map.owners.insert(*version, owners);
                    }
                    // Keep what was known for this version (a slightly old
                    // owner still serves; no owner at all would make this
                    // node read every shard itself) and ask again soon.
                    Ok((_, other)) => {
                        tracing::debug!(dataset = %name, "placement not current yet: {other:?}");
                        map.owners.extend(cluster.owners_of(*version).map(|o| (*version, o)));
                        retry = true;
                    }
                    Err(e) => {
                        tracing::warn!(dataset = %name, "cannot read placement; keeping the last known owners: {e}");
                        map.owners.extend(cluster.owners_of(*version).map(|o| (*version, o)));
                        retry = true;
                    }
                }
            }
            tracing::info!(
                placement_epoch = map.epoch,
                peers = map.addrs.len(),
                versions = map.owners.len(),
                "placement known"
            );
            cluster.replace(map);
        }
        if retry {
            tokio::select! {
                changed = views.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(OPEN_RETRY) => {}
            }
        } else if views.changed().await.is_err() {
            return;
        }
    }
}

/// Serves chunks to other nodes on `endpoint` until it closes.
pub async fn serve(node: Node, endpoint: quinn::Endpoint) {
    while let Some(incoming) = endpoint.accept().await {
        let node = node.clone();
        tokio::spawn(async move {
            let peer = incoming.remote_address();
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(%peer, "refused a peer during the handshake: {e}");
                    return;
                }
            };
            match tls::peer_role(&conn) {
                Ok(Role::Node) => {}
                Ok(r) => {
                    tracing::warn!(%peer, role = %r, "refused a peer: chunks are served to nodes only");
                    conn.close(2u32.into(), b"chunks are served to node certificates only");
                    return;
                }
                Err(e) => {
                    tracing::warn!(%peer, "refused a peer: {e}");
                    conn.close(1u32.into(), b"certificate carries no granary role");
                    return;
                }
            }
            while let Ok((send, recv)) = conn.accept_bi().await {
                let node = node.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve_stream(&node, peer, send, recv).await {
                        tracing::warn!(%peer, "peer request failed: {e}");
                    }
                });
            }
        });
    }
}

/// How long a peer may take to send its request frame once it opened a
/// stream. QUIC keep-alives keep an idle connection open, so without it a
/// stream that never sends would hold a task forever.
const PEER_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a requester may take to receive a response of `len` bytes: a
/// minute (its own fetch deadline and byte budget included) plus 1 MiB/s.
/// Past it the stream is reset, so a requester that stops reading cannot
/// pin a chunk the tier has evicted.
fn response_timeout(len: u64) -> Duration {
    Duration::from_secs(60) + Duration::from_secs(len >> 20)
}

/// Writes a response frame and its bytes (`what`, for the error), within
/// [`response_timeout`]; past it the stream is reset. The bytes go to quinn
/// as shared `Bytes`: it queues them without the copy `write_all` makes (a
/// chunk is megabytes).
async fn send_response(
    send: &mut quinn::SendStream,
    head: &[u8],
    body: bytes::Bytes,
    what: &str,
) -> Result<(), String> {
    let limit = response_timeout(body.len() as u64);
    let write = async {
        send.write_all(head).await?;
        send.write_chunk(body).await
    };
    match tokio::time::timeout(limit, write).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => {
            let _ = send.reset(0u32.into());
            Err(format!("the requester did not take {what} within {limit:?}"))
        }
    }
}

/// Awaits `work` (the answer to a peer's request), telling the requester
/// every [`PEER_PROGRESS_INTERVAL`] that it is coming
/// ([`PeerResponse::Working`]), so the requester can tell a slow answer
/// (a remote read, a conversion) from a stalled owner. Fails, and stops
/// waiting, if the requester has gone or stopped reading; the load itself
/// goes on for whoever else waits for it.
async fn with_progress<T>(
    send: &mut quinn::SendStream,
    work: impl std::future::Future<Output = T>,
) -> Result<T, String> {
    tokio::pin!(work);
    let working = frame(encode(&PeerResponse::Working));
    let start = tokio::time::Instant::now() + PEER_PROGRESS_INTERVAL;
    let mut tick = tokio::time::interval_at(start, PEER_PROGRESS_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            out = &mut work => return Ok(out),
            _ = tick.tick() => match tokio::time::timeout(PEER_STALL_TIMEOUT, send.write_all(&working)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(format!("the requester left while the answer was produced: {e}")),
                Err(_) => {
                    let _ = send.reset(0u32.into());
                    return Err("the requester stopped reading while the answer was produced".into());
                }
            },
        }
    }
}

async fn serve_stream(
    node: &Node,
    peer: SocketAddr,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) -> Result<(), String> {
    let mut prefix = [0u8; 4];
    tokio::time::timeout(PEER_REQUEST_TIMEOUT, recv.read_exact(&mut prefix))
        .await
        .map_err(|_| format!("no request within {PEER_REQUEST_TIMEOUT:?}"))?
        .map_err(|e| format!("request header: {e}"))?;
    let len = u32::from_le_bytes(prefix) as usize;
    let respond = |resp: &PeerResponse| frame(encode(resp));
    if len > MAX_PEER_FRAME_LEN {
        let msg = format!("request frame of {len} bytes exceeds {MAX_PEER_FRAME_LEN}");
        let _ =
            send.write_all(&respond(&PeerResponse::Failed { kind: ErrorKind::BadRequest, message: msg.clone() })).await;
        let _ = send.finish();
        return Err(msg);
    }
    let mut body = vec![0u8; len];
    tokio::time::timeout(PEER_REQUEST_TIMEOUT, recv.read_exact(&mut body))
        .await
        .map_err(|_| format!("no complete request within {PEER_REQUEST_TIMEOUT:?}"))?
        .map_err(|e| format!("request body: {e}"))?;
    let (version, shard) = match decode::<PeerRequest>(&body) {
        Ok(PeerRequest::FetchChunk { version, shard }) => (version, shard),
        Ok(PeerRequest::FetchFooter { version, file }) => {
            match with_progress(&mut send, node.footer_for_peer(version, file)).await? {
                Ok(raw) => {
                    let head = respond(&PeerResponse::Footer { len: raw.len() as u64 });
                    send_response(&mut send, &head, raw, &format!("the footer of file {file}")).await?;
                }
                Err(e) => {
                    let resp = PeerResponse::Failed { kind: e.kind(), message: e.to_string() };
                    send.write_all(&respond(&resp)).await.map_err(|e| e.to_string())?;
                }
            }
            let _ = send.finish();
            return Ok(());
        }
        Err(e) => {
            let msg = format!("malformed request: {e}");
            let _ = send
                .write_all(&respond(&PeerResponse::Failed { kind: ErrorKind::BadRequest, message: msg.clone() }))
                .await;
            let _ = send.finish();
            return Err(msg);
        }
    };
    match with_progress(&mut send, node.chunk_for_peer(version, shard, peer)).await? {
        Ok(chunk) => {
            let head = respond(&PeerResponse::Chunk { len: chunk.len() as u64 });
            let what = format!("the {} bytes of {shard}", chunk.len());
            send_response(&mut send, &head, chunk.shared_bytes(), &what).await?;
        }
        Err(e) => {
            let resp = PeerResponse::Failed { kind: e.kind(), message: e.to_string() };
            send.write_all(&respond(&resp)).await.map_err(|e| e.to_string())?;
        }
    }
    let _ = send.finish();
    Ok(())
}

/// A node's part in the cluster: membership, the peer endpoint, and the
/// placement it follows. Dropping it leaves the tasks running; call
/// [`ClusterHandle::stop`].
pub struct ClusterHandle {
    membership: crate::membership::Membership,
    endpoint: quinn::Endpoint,
    tasks: tokio::task::JoinSet<()>,
}

impl ClusterHandle {
    /// Joins the cluster `cfg` describes: registers (in the background),
    /// serves chunks to peers on the advertised address, and makes `node`
    /// fetch the shards others own from them. Must run inside a tokio
    /// runtime.
    pub fn start(
        node: &Node,
        cfg: &crate::config::ClusterConfig,
        ram_bytes: u64,
        ssd_bytes: u64,
    ) -> Result<Self, crate::membership::JoinError> {
        use crate::membership::{JoinError, Membership};
        let membership = Membership::start(cfg, ram_bytes, ssd_bytes)?;
        let id_err = |e: tls::TlsError| JoinError::Identity(e.to_string());
        let identity = Identity::load(&cfg.certs, &cfg.cert_name).map_err(id_err)?;
        let listen: SocketAddr = cfg
            .advertise
            .parse()
            .map_err(|e| JoinError::Identity(format!("advertise address {:?}: {e}", cfg.advertise)))?;
        let endpoint = tls::server_endpoint(&identity, listen, identity.server_config(&[ALPN_PEER]).map_err(id_err)?)
            .map_err(id_err)?;
        let link = PeerLink::new(endpoint.clone(), &identity).map_err(id_err)?;
        let cluster = Arc::new(Cluster::new(NodeId(cfg.node_id), link));
        node.join_cluster(cluster.clone());
        let addrs = granary_net::client::parse_addrs(&cfg.coordinators)?;
        let client = CoordinatorClient::new(&identity, addrs, granary_net::client::ClientOptions::default())?;
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(serve(node.clone(), endpoint.clone()));
        tasks.spawn(follow_placement(cluster, node.clone(), client, membership.view()));
        tracing::info!(%listen, "serving chunks to peers");
        Ok(Self { membership, endpoint, tasks })
    }

    /// Stops heartbeating, following placement and serving peers.
    pub fn stop(mut self) {
        self.tasks.abort_all();
        self.endpoint.close(0u32.into(), b"node stopping");
        self.membership.stop();
    }
}
