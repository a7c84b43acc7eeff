//! Serving other nodes: [`serve`] requires a node certificate, reads one
//! [`PeerRequest`] per stream, and sends the chunk bytes as stored, from
//! the tier or from one load (single flight with local requests). A peer's
//! request is never forwarded, and is answered at once when it meets a load
//! of this node that is asking that peer, or asking a node an older
//! placement named (`granary_node_core::flight`), so nodes that disagree about
//! placement cannot chase or wait on each other. A handoff
//! ([`PeerRequest::HandOver`]) is answered from what this node holds, or
//! from a load of its own already reading remote storage, else at once with
//! "not held": it never starts a load. While the answer is
//! produced, a progress frame goes out every progress interval, so the
//! requester can tell a slow owner from a stalled one.

use super::config::FabricConfig;
use super::read::peer_frame;
use crate::service::Node;
use granary_net::tls::{self, ALPN_PEER_PREVIOUS, Role};
use granary_proto::frame::{self, FrameError, HEADER_LEN};
use granary_proto::peer::{MAX_PEER_FRAME_LEN, PeerRequest, PeerResponse};
use granary_proto::wire::{ErrorKind, decode, encode};
use std::net::SocketAddr;

/// What a node's peer server sends as a chunk's bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PeerAnswers {
    /// The chunk as stored: what every node does.
    #[default]
    Honest,
    /// Fault injection only (`granary-chaos node`, the byzantine peer of
    /// `granary-chaos run`; the `granary` binary never sets it): every
    /// chunk sent to a peer has one value changed and its checksums sealed
    /// again, so it passes every check a peer chunk gets and only a
    /// verification (`verify_peer_chunks`) can catch it. Footers and this
    /// node's own trainers get the honest bytes.
    Forged,
}

/// The chunk `bytes` with the first byte of its first tensor flipped and
/// its checksums sealed again ([`PeerAnswers::Forged`]); `None` when it
/// has no tensor bytes to change.
fn forged(bytes: &[u8]) -> Option<bytes::Bytes> {
    use granary_proto::{ChunkLayout, ChunkView, TensorLayout, chunk::Verify};
    let view = ChunkView::parse(bytes, Verify::HeaderOnly).ok()?;
    let h = view.header();
    let tensors: Vec<TensorLayout> = h
        .tensors
        .iter()
        .map(|t| TensorLayout { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone(), jagged: t.is_jagged() })
        .collect();
    let values: Vec<u64> = h.tensors.iter().map(|t| t.len / t.row_bytes().max(1) as u64).collect();
    let layout = ChunkLayout::with_values(h.dataset_version, h.shard, h.rows, &tensors, &values).ok()?;
    let first = layout.tensor_range(0);
    if first.is_empty() || layout.total_len() != bytes.len() {
        return None;
    }
    let mut out = bytes.to_vec();
    out[first.start] ^= 0x01;
    layout.seal(&mut out).ok()?;
    Some(bytes::Bytes::from(out))
}

/// Serves chunks to other nodes on `endpoint` until it closes, within the
/// bounds of `config`.
pub async fn serve(node: Node, endpoint: quinn::Endpoint, config: FabricConfig) {
    serve_with(node, endpoint, config, PeerAnswers::Honest).await
}

/// Handshakes a node's peer endpoint runs at once (a peer that starts
/// handshakes and never finishes holds at most these).
pub const MAX_PEER_HANDSHAKES: usize = 256;
/// Of them, from one source address.
pub const MAX_PEER_HANDSHAKES_PER_ADDRESS: usize = 32;
/// How long a handshake may take before it is dropped.
const PEER_HANDSHAKE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
/// Connections a node's peer endpoint holds at once: every other node of
/// a 10,000-node cluster, with room.
pub const MAX_PEER_CONNECTIONS: usize = 20_000;
/// Of them, from one node identity (a node dials a peer once; a restart
/// or a redial may overlap the old connection briefly).
pub const MAX_PEER_CONNECTIONS_PER_NODE: usize = 4;

/// Who holds a connection, for the cap per identity: the node id its
/// certificate is bound to, or, for a certificate bound to none
/// (`allow_unbound_peers`), the connection's own address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Asker {
    Node(u64),
    Unbound(SocketAddr),
}

/// [`serve`], sending chunks as `answers` says. Only node certificates
/// are served, bound to a node id unless `allow_unbound_peers`. A source
/// address not yet validated gets a QUIC Retry (nothing is kept for a
/// spoofed one); a
/// handshake takes one of [`MAX_PEER_HANDSHAKES`] (at most
/// [`MAX_PEER_HANDSHAKES_PER_ADDRESS`] from one address) for at most 3 s;
/// a connection takes one of [`MAX_PEER_CONNECTIONS`], at most
/// [`MAX_PEER_CONNECTIONS_PER_NODE`] per node identity, for its life.
pub async fn serve_with(node: Node, endpoint: quinn::Endpoint, config: FabricConfig, answers: PeerAnswers) {
    use granary_net::budget::{AddressBudget, Budget, Taken};
    use std::sync::{Arc, Mutex};
    let config = Arc::new(config);
    let handshakes = Arc::new(Mutex::new(AddressBudget::new(MAX_PEER_HANDSHAKES, MAX_PEER_HANDSHAKES_PER_ADDRESS)));
    let connections = Arc::new(Mutex::new(Budget::<Asker>::new(MAX_PEER_CONNECTIONS, MAX_PEER_CONNECTIONS_PER_NODE)));
    while let Some(incoming) = endpoint.accept().await {
        if !incoming.remote_address_validated() && incoming.may_retry() {
            if let Err(e) = incoming.retry() {
                tracing::debug!(error = %e, "a QUIC retry could not be sent to a peer");
            }
            continue;
        }
        let peer = incoming.remote_address();
        let handshake = match Taken::from(&handshakes, peer.ip()) {
            Ok(taken) => taken,
            Err(spent) => {
                tracing::warn!(%peer, ?spent, "refusing a peer: the handshake budget is spent");
                incoming.refuse();
                continue;
            }
        };
        let node = node.clone();
        let config = config.clone();
        let connections = connections.clone();
        tokio::spawn(async move {
            let conn = match tokio::time::timeout(PEER_HANDSHAKE_WAIT, incoming).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    tracing::warn!(%peer, "refused a peer during the handshake: {e}");
                    return;
                }
                Err(_) => {
                    tracing::warn!(%peer, "dropped a peer's handshake not finished within 3 s");
                    return;
                }
            };
            drop(handshake);
            if tls::answer_versions(&conn, config.peer_alpns()) {
                tracing::warn!(%peer, "refused a peer that speaks no version of the peer protocol this node speaks");
                return;
            }
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
            let asker = match tls::peer_node_id(&conn) {
                Ok(Some(id)) => Asker::Node(id),
                Ok(None) if config.allow_unbound_peers => Asker::Unbound(peer),
                Ok(None) => {
                    tracing::warn!(%peer, "refused a peer whose node certificate names no node id \
                        (allow_unbound_peers in [cluster.fabric] serves such peers)");
                    conn.close(4u32.into(), b"node certificate bound to no node id (allow_unbound_peers)");
                    return;
                }
                Err(e) => {
                    tracing::warn!(%peer, "refused a peer: {e}");
                    conn.close(1u32.into(), b"unreadable node id in the certificate");
                    return;
                }
            };
            let _slot = match Taken::from(&connections, asker.clone()) {
                Ok(taken) => taken,
                Err(spent) => {
                    tracing::warn!(%peer, ?asker, ?spent, "refused a peer: too many connections");
                    conn.close(3u32.into(), b"too many connections from this node");
                    return;
                }
            };
            // The chunk format this peer reads.
            let format = if tls::alpn_of(&conn).as_deref() == Some(ALPN_PEER_PREVIOUS) { 2 } else { 3 };
            let answers = Answers { how: answers, format };
            while let Ok((send, recv)) = conn.accept_bi().await {
                let node = node.clone();
                let config = config.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve_stream(&node, &config, answers, peer, send, recv).await {
                        tracing::warn!(%peer, "peer request failed: {e}");
                    }
                });
            }
        });
    }
}

/// Writes a response frame and its bytes (`what`, for the error), within
/// [`FabricConfig::response_timeout_for`]; past it the stream is reset. The bytes go to quinn
/// as shared `Bytes`: it queues them without the copy `write_all` makes (a
/// chunk is megabytes).
async fn send_response(
    config: &FabricConfig,
    send: &mut quinn::SendStream,
    head: &[u8],
    body: bytes::Bytes,
    what: &str,
) -> Result<(), String> {
    let limit = config.response_timeout_for(body.len() as u64);
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
/// every [`FabricConfig::progress_interval`] that it is coming
/// ([`PeerResponse::Working`]), so the requester can tell a slow answer
/// (a remote read, a conversion) from a stalled owner. Fails, and stops
/// waiting, if the requester has gone or stopped reading; the load itself
/// goes on for whoever else waits for it.
async fn with_progress<T>(
    config: &FabricConfig,
    send: &mut quinn::SendStream,
    work: impl std::future::Future<Output = T>,
) -> Result<T, String> {
    with_progress_from(config, send, config.progress_interval, work).await
}

/// [`with_progress`], the first progress frame after `first` (a handoff's
/// asker waits only the handoff wait for a first frame).
async fn with_progress_from<T>(
    config: &FabricConfig,
    send: &mut quinn::SendStream,
    first: std::time::Duration,
    work: impl std::future::Future<Output = T>,
) -> Result<T, String> {
    tokio::pin!(work);
    let working = peer_frame(&encode(&PeerResponse::Working)).map_err(|e| e.to_string())?;
    let start = tokio::time::Instant::now() + first;
    let mut tick = tokio::time::interval_at(start, config.progress_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            out = &mut work => return Ok(out),
            _ = tick.tick() => match tokio::time::timeout(config.stall_timeout, send.write_all(&working)).await {
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

/// How chunks go to one peer: as [`PeerAnswers`] says, in the chunk
/// format its protocol version reads.
#[derive(Clone, Copy, Debug)]
struct Answers {
    how: PeerAnswers,
    /// 2 for `granary-peer/4`, 3 for `/5`.
    format: u32,
}

/// `chunk` as a peer reading chunk `format` takes it: as it is when it is
/// in that format or an older one (a format-2 chunk from the SSD of the
/// build before), else a copy written in `format`.
fn in_format(chunk: bytes::Bytes, format: u32) -> Result<bytes::Bytes, String> {
    use granary_proto::{ChunkView, chunk::Verify};
    if granary_proto::chunk::format_of(&chunk).is_some_and(|stored| stored <= format) {
        return Ok(chunk);
    }
    let view = ChunkView::parse(&chunk, Verify::HeaderOnly).map_err(|e| format!("a chunk of the tier: {e}"))?;
    let mut out = vec![0u8; chunk.len()];
    view.write_format(format, &mut out).map_err(|e| e.to_string())?;
    Ok(bytes::Bytes::from(out))
}

async fn serve_stream(
    node: &Node,
    config: &FabricConfig,
    answers: Answers,
    peer: SocketAddr,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) -> Result<(), String> {
    let request_timeout = config.request_timeout;
    let mut prefix = [0u8; HEADER_LEN];
    tokio::time::timeout(request_timeout, recv.read_exact(&mut prefix))
        .await
        .map_err(|_| format!("no request within {request_timeout:?}"))?
        .map_err(|e| format!("request header: {e}"))?;
    let respond = |resp: &PeerResponse| peer_frame(&encode(resp)).map_err(|e| e.to_string());
    let len = match frame::decode_len(prefix, MAX_PEER_FRAME_LEN) {
        Ok(len) => len,
        Err(e) => {
            let msg = match e {
                FrameError::TooLarge { len, cap } => format!("request frame of {len} bytes exceeds {cap}"),
                other => other.to_string(),
            };
            if let Ok(reply) = respond(&PeerResponse::Failed { kind: ErrorKind::BadRequest, message: msg.clone() }) {
                let _ = send.write_all(&reply).await;
            }
            let _ = send.finish();
            return Err(msg);
        }
    };
    let mut body = vec![0u8; len];
    tokio::time::timeout(request_timeout, recv.read_exact(&mut body))
        .await
        .map_err(|_| format!("no complete request within {request_timeout:?}"))?
        .map_err(|e| format!("request body: {e}"))?;
    let (version, shard, epoch) = match decode::<PeerRequest>(&body) {
        Ok(PeerRequest::FetchChunk { version, shard, placement_epoch }) => (version, shard, placement_epoch),
        Ok(PeerRequest::HandOver { version, shard }) => {
            // Whatever is not ready at once (an SSD read, a load being
            // read) is announced at once.
            let first = std::time::Duration::ZERO;
            match with_progress_from(config, &mut send, first, node.held_for_peer(version, shard)).await? {
                Some(answer) => send_chunk(config, answers, &mut send, shard, answer).await?,
                None => send.write_all(&respond(&PeerResponse::NotHeld)?).await.map_err(|e| e.to_string())?,
            }
            let _ = send.finish();
            return Ok(());
        }
        Ok(PeerRequest::FetchFooter { version, file }) => {
            match with_progress(config, &mut send, node.footer_for_peer(version, file)).await? {
                Ok(raw) => {
                    let head = respond(&PeerResponse::Footer { len: raw.len() as u64 })?;
                    send_response(config, &mut send, &head, raw, &format!("the footer of file {file}")).await?;
                }
                Err(e) => {
                    let resp = PeerResponse::Failed { kind: e.kind(), message: e.to_string() };
                    send.write_all(&respond(&resp)?).await.map_err(|e| e.to_string())?;
                }
            }
            let _ = send.finish();
            return Ok(());
        }
        Err(e) => {
            let msg = format!("malformed request: {e}");
            if let Ok(reply) = respond(&PeerResponse::Failed { kind: ErrorKind::BadRequest, message: msg.clone() }) {
                let _ = send.write_all(&reply).await;
            }
            let _ = send.finish();
            return Err(msg);
        }
    };
    let answer = with_progress(config, &mut send, node.chunk_for_peer(version, shard, peer, epoch)).await?;
    send_chunk(config, answers, &mut send, shard, answer).await?;
    let _ = send.finish();
    Ok(())
}

/// Sends a chunk (its response frame and bytes), or the error that
/// stood in its way.
async fn send_chunk(
    config: &FabricConfig,
    answers: Answers,
    send: &mut quinn::SendStream,
    shard: granary_proto::ShardId,
    answer: crate::service::Shared,
) -> Result<(), String> {
    let respond = |resp: &PeerResponse| peer_frame(&encode(resp)).map_err(|e| e.to_string());
    match answer {
        Ok(chunk) => {
            let head = respond(&PeerResponse::Chunk { len: chunk.len() as u64 })?;
            let what = format!("the {} bytes of {shard}", chunk.len());
            let body = match answers.how {
                PeerAnswers::Forged => forged(chunk.bytes()).unwrap_or_else(|| chunk.shared_bytes()),
                PeerAnswers::Honest => chunk.shared_bytes(),
            };
            let body = in_format(body, answers.format)?;
            send_response(config, send, &head, body, &what).await
        }
        Err(e) => {
            let resp = PeerResponse::Failed { kind: e.kind(), message: e.to_string() };
            send.write_all(&respond(&resp)?).await.map_err(|e| e.to_string())
        }
    }
}
