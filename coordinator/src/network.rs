//! Raft RPCs over QUIC: one connection per peer voter (ALPN
//! `granary-raft/1`, mutual TLS with a coordinator certificate), one
//! bidirectional stream per RPC carrying one JSON frame each way.
//!
//! A stream per RPC keeps a large `install_snapshot` chunk from blocking
//! heartbeats behind it, and a dead connection costs one failed RPC: the
//! link reconnects on the next call. Transport failures map to
//! `RPCError::Unreachable`, so openraft backs off instead of spinning.

use crate::types::{TypeConfig, VoterId};
use granary_net::conn::{Connections, DialError};
use granary_net::frame::{self, MAX_FRAME_BYTES, StreamError};
use granary_net::tls::{ALPN_RAFT, Role};
use openraft::BasicNode;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One Raft RPC.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftRpc {
    /// AppendEntries (also the leader's heartbeat).
    Append(AppendEntriesRequest<TypeConfig>),
    /// RequestVote.
    Vote(VoteRequest<VoterId>),
    /// One chunk of a snapshot.
    Snapshot(InstallSnapshotRequest<TypeConfig>),
}

/// The answer to a [`RaftRpc`].
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftReply {
    /// To `Append`.
    Append(Result<AppendEntriesResponse<VoterId>, RaftError<VoterId>>),
    /// To `Vote`.
    Vote(Result<VoteResponse<VoterId>, RaftError<VoterId>>),
    /// To `Snapshot`.
    Snapshot(Result<InstallSnapshotResponse<VoterId>, RaftError<VoterId, InstallSnapshotError>>),
}

/// Transport failure on one RPC, for openraft's error wrappers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LinkError {
    /// No connection to the voter.
    #[error("{voter} at {error}")]
    Dial {
        /// The voter.
        voter: VoterId,
        /// Why no connection was made (names the address).
        error: DialError,
    },
    /// The voter's address in the membership is neither an IP address
    /// with a port nor a host name that resolves.
    #[error("{voter}: bad address {addr:?}: {reason}")]
    BadAddress {
        /// The voter.
        voter: VoterId,
        /// The address as the membership holds it.
        addr: String,
        /// Why it does not parse or resolve.
        reason: String,
    },
    /// The RPC failed on an open connection.
    #[error("{voter} at {addr}: {error}")]
    Call {
        /// The voter.
        voter: VoterId,
        /// Its address.
        addr: SocketAddr,
        /// What failed.
        error: StreamError,
    },
    /// No answer within the RPC's time to live.
    #[error("{voter} at {addr}: no answer within {ttl:?}")]
    Timeout {
        /// The voter.
        voter: VoterId,
        /// Its address, as the membership holds it.
        addr: String,
        /// The time to live.
        ttl: Duration,
    },
    /// The voter answered with a reply of another RPC.
    #[error("{voter} answered with the wrong reply type")]
    WrongReply {
        /// The voter.
        voter: VoterId,
    },
    /// The peer at the voter's address is not that voter by its
    /// certificate.
    #[error("{voter} at {addr}: {reason}")]
    Identity {
        /// The voter dialled.
        voter: VoterId,
        /// Its address.
        addr: SocketAddr,
        /// What the certificate says instead.
        reason: String,
    },
}

impl RaftRpc {
    /// The voter that sent this RPC, by its own account: the leader of an
    /// AppendEntries or snapshot chunk, the candidate of a vote request.
    pub fn sender(&self) -> Option<VoterId> {
        match self {
            Self::Append(r) => r.vote.leader_id().voted_for(),
            Self::Vote(r) => r.vote.leader_id().voted_for(),
            Self::Snapshot(r) => r.vote.leader_id().voted_for(),
        }
    }
}

/// Whether a coordinator certificate bound to voter `bound` (None: it
/// names no voter id) may speak Raft as voter `claimed`: a bound
/// certificate only as its own voter; an unbound one only when
/// `allow_unbound` (an explicit opt-out). Err names why not.
pub fn voter_verdict(bound: Option<u64>, claimed: VoterId, allow_unbound: bool) -> Result<(), String> {
    match bound {
        Some(b) if b == claimed.0 => Ok(()),
        Some(b) => Err(format!("its certificate is bound to voter {b}, not {claimed}")),
        None if allow_unbound => Ok(()),
        None => Err(format!(
            "its coordinator certificate names no voter id, so it may not act as {claimed} (issue one per voter: \
             granary certs init --voters N, or certs issue --role coordinator --voter-id ID; or start every voter \
             with --allow-unbound-voter-certs)"
        )),
    }
}

/// Creates links to peer voters; shared by all of them.
#[derive(Clone)]
pub struct QuicNetwork {
    conns: Arc<Connections>,
    /// The version of Raft each voter this one dialed speaks with it (the
    /// ALPN its connection chose: 2 or 1), for the switches only a group
    /// of new builds may turn on ([`crate::switch`]).
    speaks: Arc<std::sync::Mutex<std::collections::BTreeMap<VoterId, u16>>>,
    /// When each voter this one dialed last answered an RPC (issue 48:
    /// the leader's view of its voters in `granary status`).
    answered: Arc<std::sync::Mutex<std::collections::BTreeMap<VoterId, std::time::Instant>>>,
    allow_unbound: bool,
    /// Whether the endpoint dials IPv4 (a name is resolved to that family).
    ipv4: bool,
}

impl QuicNetwork {
    /// Dials out from `endpoint` with `config` (a coordinator identity's
    /// client configuration for ALPN `granary-raft/1`). A peer must present
    /// a certificate bound to the voter id dialled ([`voter_verdict`]).
    pub fn new(
        endpoint: quinn::Endpoint,
        config: quinn::ClientConfig,
        connect_timeout: Duration,
        allow_unbound: bool,
    ) -> Self {
        let ipv4 = endpoint.local_addr().map_or(true, |a| a.is_ipv4());
        Self {
            conns: Arc::new(Connections::new(endpoint, config, ALPN_RAFT, Role::Coordinator, connect_timeout)),
            speaks: Default::default(),
            answered: Default::default(),
            allow_unbound,
            ipv4,
        }
    }

    async fn connection(&self, addr: SocketAddr) -> Result<quinn::Connection, DialError> {
        self.conns.get(addr).await
    }

    fn forget(&self, addr: SocketAddr) {
        self.conns.forget(addr);
    }

    /// The version of Raft each voter dialed speaks with this one, as its
    /// last connection chose.
    pub fn raft_versions(&self) -> std::collections::BTreeMap<VoterId, u16> {
        self.speaks.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// When each voter dialed last answered an RPC.
    pub fn last_answers(&self) -> std::collections::BTreeMap<VoterId, std::time::Instant> {
        self.answered.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn answered(&self, voter: VoterId) {
        self.answered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(voter, std::time::Instant::now());
    }

    fn heard(&self, voter: VoterId, conn: &quinn::Connection) {
        let version = if granary_net::tls::alpn_of(conn).as_deref() == Some(ALPN_RAFT) { 2 } else { 1 };
        self.speaks.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(voter, version);
    }
}

impl RaftNetworkFactory<TypeConfig> for QuicNetwork {
    type Network = PeerLink;

    async fn new_client(&mut self, target: VoterId, node: &BasicNode) -> PeerLink {
        PeerLink { target, addr: node.addr.clone(), net: self.clone(), resolved: std::sync::Mutex::new(None) }
    }
}

/// The link to one peer voter.
pub struct PeerLink {
    target: VoterId,
    addr: String,
    net: QuicNetwork,
    /// The address a host name last resolved to, and whether an RPC to it
    /// failed since (then the name is resolved again first).
    resolved: std::sync::Mutex<Option<(SocketAddr, bool)>>,
}

impl PeerLink {
    async fn rpc(&self, rpc: &RaftRpc, ttl: Duration) -> Result<RaftReply, LinkError> {
        let voter = self.target;
        let exchange = async {
            let addr = self.resolve().await?;
            let conn = self.net.connection(addr).await.map_err(|error| LinkError::Dial { voter, error })?;
            let bound = granary_net::tls::peer_voter_id(&conn).map_err(|e| LinkError::Identity {
                voter,
                addr,
                reason: e.to_string(),
            })?;
            voter_verdict(bound, voter, self.net.allow_unbound).map_err(|reason| {
                self.net.forget(addr);
                LinkError::Identity { voter, addr, reason }
            })?;
            self.net.heard(voter, &conn);
            frame::call::<_, RaftReply>(&conn, rpc, MAX_FRAME_BYTES).await.map_err(|error| {
                self.net.forget(addr);
                LinkError::Call { voter, addr, error }
            })
        };
        let answered = tokio::time::timeout(ttl, exchange).await.map_err(|_| LinkError::Timeout {
            voter,
            addr: self.addr.clone(),
            ttl,
        });
        if matches!(answered, Ok(Ok(_))) {
            self.net.answered(voter);
        } else {
            // Resolve the name again before the next RPC.
            if let Some((_, stale)) = self.resolved().as_mut() {
                *stale = true;
            }
        }
        answered?
    }

    fn resolved(&self) -> std::sync::MutexGuard<'_, Option<(SocketAddr, bool)>> {
        // An address and a flag: a panic elsewhere cannot leave them torn.
        self.resolved.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The voter's address: an IP address as is; a host name (a Kubernetes
    /// service, say) resolved once, and again after an RPC to it failed,
    /// so a voter that comes back at a new address under the same name is
    /// found there, while a name server that is down costs nothing as long
    /// as the last address answers.
    async fn resolve(&self) -> Result<SocketAddr, LinkError> {
        if let Ok(addr) = self.addr.parse::<SocketAddr>() {
            return Ok(addr);
        }
        let last = *self.resolved();
        if let Some((addr, false)) = last {
            return Ok(addr);
        }
        let bad = |reason: String| LinkError::BadAddress { voter: self.target, addr: self.addr.clone(), reason };
        let looked_up = match tokio::net::lookup_host(self.addr.as_str()).await {
            Ok(found) => {
                let found: Vec<SocketAddr> = found.collect();
                // The endpoint's family first (an IPv4 socket cannot reach ::1).
                found
                    .iter()
                    .find(|a| a.is_ipv4() == self.net.ipv4)
                    .or(found.first())
                    .copied()
                    .ok_or_else(|| bad("the name resolves to no address".into()))
            }
            Err(e) => Err(bad(e.to_string())),
        };
        match (looked_up, last) {
            (Ok(addr), _) => {
                *self.resolved() = Some((addr, false));
                Ok(addr)
            }
            // The name server did not answer: the last address may still.
            (Err(_), Some((addr, _))) => Ok(addr),
            (Err(e), None) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_certificate_speaks_only_as_its_voter_and_an_unbound_one_only_when_allowed() {
        assert_eq!(voter_verdict(Some(2), VoterId(2), false), Ok(()));
        let e = voter_verdict(Some(2), VoterId(3), true).unwrap_err();
        assert!(e.contains("bound to voter 2, not voter-3"), "{e}");
        assert!(voter_verdict(None, VoterId(1), false).unwrap_err().contains("--voters N"));
        assert_eq!(voter_verdict(None, VoterId(1), true), Ok(()));
    }
}

fn unreachable<E: std::error::Error>(e: LinkError) -> RPCError<VoterId, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&e))
}

fn mismatch<E: std::error::Error>(target: VoterId) -> RPCError<VoterId, BasicNode, E> {
    RPCError::Network(NetworkError::new(&LinkError::WrongReply { voter: target }))
}

impl RaftNetwork<TypeConfig> for PeerLink {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<VoterId>, RPCError<VoterId, BasicNode, RaftError<VoterId>>> {
        match self.rpc(&RaftRpc::Append(rpc), option.hard_ttl()).await.map_err(unreachable)? {
            RaftReply::Append(r) => r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            _ => Err(mismatch(self.target)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<VoterId>, RPCError<VoterId, BasicNode, RaftError<VoterId, InstallSnapshotError>>>
    {
        match self.rpc(&RaftRpc::Snapshot(rpc), option.hard_ttl()).await.map_err(unreachable)? {
            RaftReply::Snapshot(r) => r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            _ => Err(mismatch(self.target)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<VoterId>,
        option: RPCOption,
    ) -> Result<VoteResponse<VoterId>, RPCError<VoterId, BasicNode, RaftError<VoterId>>> {
        match self.rpc(&RaftRpc::Vote(rpc), option.hard_ttl()).await.map_err(unreachable)? {
            RaftReply::Vote(r) => r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e))),
            _ => Err(mismatch(self.target)),
        }
    }
}

/// When this voter last received an AppendEntries RPC (a leader's
/// heartbeat or entries). The server feeds it to the election watchdog
/// ([`crate::election::Watchdog`]).
#[derive(Debug, Default)]
pub struct LeaderContact(Mutex<Option<std::time::Instant>>);

impl LeaderContact {
    /// Records contact now.
    pub fn touch(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
    }

    /// When the last contact was; `None` if there was none.
    pub fn last(&self) -> Option<std::time::Instant> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Serves one Raft RPC stream: reads the request, checks that its sender is
/// the voter the peer's certificate is bound to (`bound`, see
/// [`voter_verdict`]; a request from another voter id is dropped
/// unanswered), hands it to `raft`, writes the reply. Errors are the
/// caller's to log.
pub async fn serve_rpc(
    raft: &crate::types::Raft,
    contact: &LeaderContact,
    bound: Option<u64>,
    allow_unbound: bool,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) -> Result<(), frame::StreamError> {
    let Some(rpc) = frame::read_frame::<RaftRpc>(&mut recv, MAX_FRAME_BYTES).await? else {
        return Ok(());
    };
    let verdict = match rpc.sender() {
        Some(claimed) => voter_verdict(bound, claimed, allow_unbound),
        None => Err("the request names no sender".to_string()),
    };
    if let Err(reason) = verdict {
        tracing::warn!(sender = ?rpc.sender(), "refused a Raft request: {reason}");
        let _ = send.reset(1u32.into());
        return Ok(());
    }
    let reply = match rpc {
        RaftRpc::Append(r) => {
            let reply = raft.append_entries(r).await;
            // Any AppendEntries whose vote we accepted (success, or a log
            // conflict to resolve) is contact with a current leader.
            if matches!(reply, Ok(ref r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
                contact.touch();
            }
            RaftReply::Append(reply)
        }
        RaftRpc::Vote(r) => RaftReply::Vote(raft.vote(r).await),
        RaftRpc::Snapshot(r) => RaftReply::Snapshot(raft.install_snapshot(r).await),
    };
    frame::write_frame(&mut send, &reply).await?;
    let _ = send.finish();
    Ok(())
}
