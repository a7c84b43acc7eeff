//! [`PeerLink`]: fetching chunks and footers from other nodes. One
//! connection per peer, reused; one bidirectional stream per chunk (a large
//! chunk never blocks a small one); at most
//! [`FabricConfig::max_fetches_per_peer`] fetches and
//! [`FabricConfig::max_inflight_bytes_per_peer`] chunk bytes in flight per
//! peer; every fetch bounded by a deadline; every chunk validated (header
//! and payload checksum) before it is used.

use super::config::{BYTE_PERMIT, FabricConfig};
use super::read::{Buffer, Pieces, StreamError, ask, peer_answers, read_live};
use super::route::AskFailure;
use crate::shm::{ChunkFile, SealedChunk};
use granary_net::conn::Connections;
use granary_net::tls::{self, ALPN_PEER, Identity, Role};
use granary_proto::peer::{MAX_PEER_CHUNK_LEN, MAX_PEER_FOOTER_LEN, PeerRequest, PeerResponse};
use granary_proto::wire::ErrorKind;
use granary_proto::{ChunkView, DatasetVersion, ShardId};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// A peer fetch failed; the caller falls back to another source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    /// byte; see `read_live`) for [`FabricConfig::stall_timeout`] while its
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
    config: FabricConfig,
    conns: Connections,
    slots: Mutex<HashMap<SocketAddr, Arc<Semaphore>>>,
    bytes: Mutex<HashMap<SocketAddr, Arc<Semaphore>>>,
    down: Mutex<HashMap<SocketAddr, std::time::Instant>>,
}

impl PeerLink {
    /// Dials from `endpoint` with this node's identity, within the bounds
    /// of `config`.
    pub fn new(endpoint: quinn::Endpoint, identity: &Identity, config: &FabricConfig) -> Result<Self, tls::TlsError> {
        let client = identity.client_config(ALPN_PEER)?;
        Ok(Self {
            config: config.clone(),
            conns: Connections::new(endpoint, client, Role::Node, config.connect_timeout),
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
            self.down
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(addr, std::time::Instant::now() + self.config.down_for);
            err(reason)
        })
    }

    fn byte_budget(&self, addr: SocketAddr) -> Arc<Semaphore> {
        self.bytes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(addr)
            .or_insert_with(|| Arc::new(Semaphore::new(self.config.byte_permits() as usize)))
            .clone()
    }

    fn slot(&self, addr: SocketAddr) -> Arc<Semaphore> {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(addr)
            .or_insert_with(|| Arc::new(Semaphore::new(self.config.max_fetches_per_peer)))
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
                ask(&conn, &PeerRequest::FetchFooter { version, file }, self.config.stall_timeout)
                    .await
                    .map_err(|e| fail(e.to_string()))?;
            match response {
                PeerResponse::Footer { len } if len <= MAX_PEER_FOOTER_LEN.min(file_size) => {
                    let mut buf = vec![0u8; len as usize];
                    read_live(
                        &mut recv,
                        &mut Buffer { buf: &mut buf, pos: 0 },
                        "footer bytes",
                        self.config.stall_timeout,
                    )
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
            StreamError::Stalled { idle, during } if peer_answers(conn, tls::KEEP_ALIVE_INTERVAL).await => {
                PeerError::Stalled { addr, shard, idle, during }
            }
            StreamError::Stalled { idle, during } => PeerError::Transfer {
                addr,
                shard,
                reason: format!("nothing for {idle:?} ({during}), and the connection went quiet too: the peer is gone"),
            },
            StreamError::Failed(reason) => PeerError::Transfer { addr, shard, reason },
        };
        let (response, mut recv) =
            match ask(conn, &PeerRequest::FetchChunk { version, shard }, self.config.stall_timeout).await {
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
                let units = len.div_ceil(BYTE_PERMIT).clamp(1, self.config.byte_permits()) as u32;
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
                if let Err(e) =
                    read_live(&mut recv, &mut Pieces::new(&mut file), "chunk bytes", self.config.stall_timeout).await
                {
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

impl PeerError {
    /// How the fetch route takes this failure: a stall (the owner is alive)
    /// or an owner that could not serve (it may be dead).
    pub fn as_ask_failure(&self) -> AskFailure {
        match self {
            PeerError::Stalled { .. } => AskFailure::Stalled(self.to_string()),
            _ => AskFailure::Unavailable(self.to_string()),
        }
    }
}
