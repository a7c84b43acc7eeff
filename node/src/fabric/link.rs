//! [`PeerLink`]: fetching chunks and footers from other nodes. One
//! connection per peer, reused; one bidirectional stream per chunk (a large
//! chunk never blocks a small one); at most
//! [`FabricConfig::max_fetches_per_peer`] fetches and
//! [`FabricConfig::max_inflight_bytes_per_peer`] chunk bytes in flight per
//! peer; every fetch bounded by a deadline; every chunk validated (header
//! and payload checksum) before it is used.

use super::config::{BYTE_PERMIT, FabricConfig};
use super::error::{Corruption, LinkFault, PeerError};
use super::read::{Buffer, Pieces, StreamError, ask, peer_answers, read_live};
use crate::shm::{ChunkFile, SealedChunk};
use granary_net::conn::Connections;
use granary_net::tls::{self, ALPN_PEER_PREVIOUS, Identity, Role};
use granary_proto::chunk::Expected;
use granary_proto::peer::{MAX_PEER_CHUNK_LEN, MAX_PEER_FOOTER_LEN, PeerRequest, PeerResponse};
use granary_proto::{ChunkView, DatasetVersion, NodeId, ShardId};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

/// Connections and flow control towards peers.
pub struct PeerLink {
    config: FabricConfig,
    conns: Connections,
    slots: Mutex<HashMap<SocketAddr, Arc<Semaphore>>>,
    bytes: Mutex<HashMap<SocketAddr, Arc<Semaphore>>>,
    down: Mutex<HashMap<SocketAddr, std::time::Instant>>,
    /// The node the placement names at each peer address.
    expected: Mutex<HashMap<SocketAddr, NodeId>>,
}

/// Whether a peer whose certificate names `presented` may serve as the
/// node `want` the placement lists at its address (`None`: the address is
/// not in the placement, as when a test dials it directly).
pub(crate) fn identity_verdict(
    want: Option<NodeId>,
    presented: Option<u64>,
    allow_unbound: bool,
) -> Result<(), String> {
    match (want, presented) {
        (None, _) => Ok(()),
        (Some(w), Some(id)) if w.0 == id => Ok(()),
        (Some(w), Some(id)) => Err(format!("its certificate names node-{id}; the placement names {w} here")),
        (Some(_), None) if allow_unbound => Ok(()),
        (Some(w), None) => Err(format!(
            "its certificate names no node id; the placement names {w} here \
             (allow_unbound_peers in [cluster.fabric] accepts such peers)"
        )),
    }
}

impl PeerLink {
    /// Dials from `endpoint` with this node's identity, within the bounds
    /// of `config`.
    pub fn new(endpoint: quinn::Endpoint, identity: &Identity, config: &FabricConfig) -> Result<Self, tls::TlsError> {
        let alpns = config.peer_alpns();
        let client = identity.client_config_for(alpns)?;
        Ok(Self {
            config: config.clone(),
            conns: Connections::new(endpoint, client, alpns[0], Role::Node, config.connect_timeout),
            slots: Mutex::new(HashMap::new()),
            bytes: Mutex::new(HashMap::new()),
            down: Mutex::new(HashMap::new()),
            expected: Mutex::new(HashMap::new()),
        })
    }

    /// The nodes the placement lists, by address: from now on a peer
    /// dialed at one of these addresses must prove, by its certificate's
    /// node id, that it is the node listed there.
    pub fn expect_peers(&self, addrs: &HashMap<NodeId, SocketAddr>) {
        let by_addr = addrs.iter().map(|(&node, &addr)| (addr, node)).collect();
        *self.expected.lock().unwrap_or_else(|p| p.into_inner()) = by_addr;
    }

    async fn connection(&self, addr: SocketAddr) -> Result<quinn::Connection, PeerError> {
        if let Some(until) = self.down.lock().unwrap_or_else(|p| p.into_inner()).get(&addr)
            && std::time::Instant::now() < *until
        {
            return Err(PeerError::Connect { addr, fault: LinkFault::RecentlyDown });
        }
        let conn = self.conns.get(addr).await.map_err(|error| {
            self.down
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(addr, std::time::Instant::now() + self.config.down_for);
            PeerError::Connect { addr, fault: LinkFault::Dial(error) }
        })?;
        let want = self.expected.lock().unwrap_or_else(|p| p.into_inner()).get(&addr).copied();
        let verdict = match tls::peer_node_id(&conn) {
            Ok(presented) => identity_verdict(want, presented, self.config.allow_unbound_peers),
            Err(e) => Err(e.to_string()),
        };
        if let Err(why) = verdict {
            tracing::warn!(%addr, "refusing a peer: {why}");
            self.conns.forget(addr);
            return Err(PeerError::Connect { addr, fault: LinkFault::Identity(why) });
        }
        Ok(conn)
    }

    /// Returns once the peer at `addr` answers again: a handshake with it
    /// completes (or its cached connection still receives datagrams; see
    /// `peer_answers`). Tries every [`FabricConfig::down_for`] (at least
    /// the keep-alive interval); never
    /// returns while the peer is unreachable, so the caller bounds the
    /// wait. A fetch route waiting for the placement to move a failed
    /// owner's shard races this against the placement.
    pub async fn reachable_again(&self, addr: SocketAddr) {
        // Never faster than the keep-alive, however short `down_for` is set:
        // a dial that fails at once must not spin.
        let every = self.config.down_for.max(tls::KEEP_ALIVE_INTERVAL);
        loop {
            tokio::time::sleep(every).await;
            match self.conns.get(addr).await {
                Ok(conn) if peer_answers(&conn, tls::KEEP_ALIVE_INTERVAL).await => {
                    self.down.lock().unwrap_or_else(|p| p.into_inner()).remove(&addr);
                    return;
                }
                Ok(_) => self.conns.forget(addr),
                Err(_) => {}
            }
        }
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
    /// `expected` is what the manifest says of the chunk: its length
    /// ([`granary_proto::ChunkLayout::total_len`]), when a peer announcing
    /// any other is refused before memory is committed for it; or, with
    /// jagged tensors, its rows and tensors, checked once it is parsed.
    pub async fn fetch(
        &self,
        addr: SocketAddr,
        placement_epoch: u64,
        version: DatasetVersion,
        shard: ShardId,
        expected: &Expected,
        deadline: Duration,
    ) -> Result<SealedChunk, PeerError> {
        let work = async {
            let slot = self.slot(addr);
            let _permit = slot.acquire().await.map_err(|_| PeerError::Connect { addr, fault: LinkFault::Closed })?;
            let conn = self.connection(addr).await?;
            let request = PeerRequest::FetchChunk { version, shard, placement_epoch };
            let stall = self.config.stall_timeout;
            let result = self.exchange(&conn, addr, &request, version, shard, expected, stall).await;
            if matches!(result, Err(PeerError::Transfer { .. })) {
                self.conns.forget(addr);
            }
            result
        };
        tokio::time::timeout(deadline, work).await.map_err(|_| PeerError::Timeout { addr, shard, deadline })?
    }

    /// Asks the node at `addr` for a copy of `shard` it holds (a handoff:
    /// the placement handed this node's shard over from it), validated as
    /// [`PeerLink::fetch`] validates a chunk. It answers at once
    /// ([`PeerError::NotHeld`] when it holds none), or says it is reading
    /// the shard and sends it when read; no first answer within
    /// [`FabricConfig::handoff_wait`] is a [`PeerError::Timeout`], as is
    /// the whole fetch past `deadline`. A peer already known to be down is
    /// not dialed.
    pub async fn fetch_held(
        &self,
        addr: SocketAddr,
        version: DatasetVersion,
        shard: ShardId,
        expected: &Expected,
        deadline: Duration,
    ) -> Result<SealedChunk, PeerError> {
        let wait = self.config.handoff_wait.min(deadline);
        let work = async {
            let slot = self.slot(addr);
            let _permit = slot.acquire().await.map_err(|_| PeerError::Connect { addr, fault: LinkFault::Closed })?;
            let conn = tokio::time::timeout(wait, self.connection(addr)).await.map_err(|_| PeerError::Timeout {
                addr,
                shard,
                deadline: wait,
            })??;
            let request = PeerRequest::HandOver { version, shard };
            let result = self.exchange(&conn, addr, &request, version, shard, expected, wait).await;
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
        let fail = |fault: LinkFault| PeerError::Footer { addr, file, fault };
        let work = async {
            let conn = self.connection(addr).await?;
            let (response, mut recv) = ask(
                &conn,
                &PeerRequest::FetchFooter { version, file },
                self.config.stall_timeout,
                self.config.stall_timeout,
            )
            .await
            .map_err(|e| fail(e.into_fault()))?;
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
                    .map_err(|e| fail(e.into_fault()))?;
                    Ok(bytes::Bytes::from(buf))
                }
                PeerResponse::Footer { len } => {
                    Err(fail(LinkFault::TooLarge { what: "footer", len, cap: MAX_PEER_FOOTER_LEN.min(file_size) }))
                }
                PeerResponse::Failed { kind, message } => Err(fail(LinkFault::Refused { kind, message })),
                PeerResponse::Chunk { .. } => Err(fail(LinkFault::Unexpected("a chunk"))),
                PeerResponse::NotHeld => Err(fail(LinkFault::Unexpected("an answer to a handoff"))),
                PeerResponse::Working => Err(fail(LinkFault::Unexpected("a progress frame taken for an answer"))),
            }
        };
        tokio::time::timeout(deadline, work).await.map_err(|_| fail(LinkFault::Timeout(deadline)))?
    }

    /// Sends `request` for the chunk of `shard` and reads the answer (its
    /// first frame within `first`).
    #[allow(clippy::too_many_arguments)]
    async fn exchange(
        &self,
        conn: &quinn::Connection,
        addr: SocketAddr,
        request: &PeerRequest,
        version: DatasetVersion,
        shard: ShardId,
        expected: &Expected,
        first: Duration,
    ) -> Result<SealedChunk, PeerError> {
        let transfer = |fault: LinkFault| PeerError::Transfer { addr, shard, fault };
        let corrupt = |corruption: Corruption| PeerError::Corrupt { addr, shard, corruption };
        // A stall on a connection that hears nothing at all is a dead
        // peer: a transfer failure, which waits for the placement.
        // A handoff's miss is read around at once whatever it was: no probe.
        let held = matches!(request, PeerRequest::HandOver { .. });
        let failed = async |e: StreamError| match e {
            StreamError::Stalled(stall) if held => PeerError::Stalled { addr, shard, stall },
            StreamError::Stalled(stall) if peer_answers(conn, tls::KEEP_ALIVE_INTERVAL).await => {
                PeerError::Stalled { addr, shard, stall }
            }
            StreamError::Stalled(stall) => transfer(LinkFault::Gone(stall)),
            StreamError::Failed(fault) => transfer(fault),
        };
        let (response, mut recv) = match ask(conn, request, first, self.config.stall_timeout).await {
            Ok(answer) => answer,
            Err(e) => return Err(failed(e).await),
        };
        match response {
            PeerResponse::NotHeld if matches!(request, PeerRequest::HandOver { .. }) => {
                Err(PeerError::NotHeld { addr, shard })
            }
            PeerResponse::NotHeld => Err(transfer(LinkFault::Unexpected("an answer to a handoff"))),
            PeerResponse::Failed { kind, message } => Err(PeerError::Refused { addr, shard, kind, message }),
            PeerResponse::Footer { .. } => Err(transfer(LinkFault::Unexpected("a footer"))),
            PeerResponse::Working => Err(transfer(LinkFault::Unexpected("a progress frame taken for an answer"))),
            PeerResponse::Chunk { len } => {
                if len > MAX_PEER_CHUNK_LEN {
                    return Err(transfer(LinkFault::TooLarge { what: "chunk", len, cap: MAX_PEER_CHUNK_LEN }));
                }
                // The manifest fixes a chunk's length unless it has jagged
                // tensors: refuse another before committing memory for it.
                if let Expected::Len(want) = *expected
                    && len != want
                {
                    return Err(corrupt(Corruption::Length { announced: len, expected: want }));
                }
                // A chunk larger than the whole budget takes all of it.
                let units = len.div_ceil(BYTE_PERMIT).clamp(1, self.config.byte_permits()) as u32;
                let budget = self.byte_budget(addr);
                let _reserved = budget.acquire_many(units).await.map_err(|_| transfer(LinkFault::Closed))?;
                // Written straight from QUIC's receive buffers into the
                // memory file the chunk is kept and handed to trainers in:
                // one copy, and no page cleared before it is filled.
                if len == 0 {
                    return Err(corrupt(Corruption::Empty));
                }
                let len = len as usize;
                let mut file = ChunkFile::new(len)
                    .map_err(|error| transfer(LinkFault::Memory { what: "allocating", len, error }))?;
                if let Err(e) =
                    read_live(&mut recv, &mut Pieces::new(&mut file), "chunk bytes", self.config.stall_timeout).await
                {
                    return Err(failed(e).await);
                }
                let chunk = file.seal().map_err(|error| transfer(LinkFault::Memory { what: "sealing", len, error }))?;
                let view = ChunkView::parse(chunk.bytes(), granary_proto::chunk::Verify::Full)
                    .map_err(|e| corrupt(Corruption::Invalid(e)))?;
                // granary-peer/4 carries format 2 only: what the build
                // before reads.
                if view.format() > 2 && tls::alpn_of(conn).as_deref() == Some(ALPN_PEER_PREVIOUS) {
                    return Err(corrupt(Corruption::Invalid(granary_proto::ChunkError::UnsupportedFormat(
                        view.format(),
                    ))));
                }
                let (got_version, got_shard) = (view.header().dataset_version, view.header().shard);
                if got_version != version || got_shard != shard {
                    return Err(corrupt(Corruption::Misplaced { shard: got_shard, version: got_version }));
                }
                if let Expected::Shape { rows, tensors } = expected {
                    view.header().conforms(*rows, tensors).map_err(|m| corrupt(Corruption::Shape(m)))?;
                }
                Ok(chunk)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_serves_only_as_the_node_its_certificate_names() {
        let n = |i| Some(NodeId(i));
        assert_eq!(identity_verdict(n(2), Some(2), false), Ok(()));
        assert!(
            identity_verdict(n(2), Some(3), true).unwrap_err().contains("names node-3; the placement names node-2")
        );
        assert!(identity_verdict(n(2), None, false).unwrap_err().contains("allow_unbound_peers"));
        assert_eq!(identity_verdict(n(2), None, true), Ok(()));
        assert_eq!(identity_verdict(None, Some(7), false), Ok(()), "an address no placement lists");
    }
}
