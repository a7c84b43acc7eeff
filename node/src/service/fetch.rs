//! One load, executed: the shell of the node engine ([`granary_node_core::engine`]).
//! It polls the engine for the load's next [`Command`], does it (ask the
//! owner, or the node the shard was handed over from, wait for the
//! placement, a permit or the lease, read remote storage here), and
//! reports what came of it; every decision is the engine's. The engine
//! reads what the node knows of placement and its lease through
//! [`NodeView`].

use super::{Node, Pending};
use crate::error::FetchError;
use crate::fabric::owners::Cluster;
use crate::fabric::{Owner, PeerError};
use crate::shm::SealedChunk;
use crate::tier::ChunkKey;
use granary_node_core::engine::{AwaitOutcome, Back, Command, Engine, Permit, Placement};
use granary_node_core::route::AfterPermit;
use granary_proto::NodeId;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;
use tokio::sync::Notify;
use tracing::Instrument;

/// What the node knows of placement and its lease, for the engine.
pub(super) struct NodeView<'a> {
    node: &'a Node,
    cluster: Option<&'a Cluster>,
}

impl Placement<ChunkKey> for NodeView<'_> {
    fn me(&self) -> NodeId {
        self.cluster.map_or(NodeId(0), Cluster::me)
    }
    fn routes(&self, key: ChunkKey) -> bool {
        // A peer's chunk must have the length the manifest's layout gives
        // (with jagged tensors: its rows and tensors): without that, read
        // here.
        self.cluster.is_some() && self.node.dataset(key.version).ok().and_then(|d| d.expected(key.shard)).is_some()
    }
    fn version_known(&self, key: ChunkKey) -> bool {
        self.cluster.is_some_and(|c| c.version_known(key.version))
    }
    fn placed_owner(&self, key: ChunkKey) -> Option<NodeId> {
        self.cluster?.placed_owner(key.version, key.shard)
    }
    fn owner(&self, key: ChunkKey) -> Option<Owner> {
        self.cluster?.owner(key.version, key.shard)
    }
    fn handed_from(&self, key: ChunkKey) -> Option<Owner> {
        self.cluster?.handed_from(key.version, key.shard)
    }
    fn former_owner(&self, key: ChunkKey) -> Option<NodeId> {
        self.cluster?.former_owner(key.version, key.shard)
    }
    fn owner_epoch(&self, key: ChunkKey) -> u64 {
        self.cluster.map_or(0, |c| c.owner_epoch(key.version))
    }
    fn lease_ok(&self, _now: Instant) -> bool {
        self.cluster.is_none_or(Cluster::may_read_as_owner)
    }
}

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

impl Node {
    /// The engine of the loads in flight (held briefly: never across an
    /// await).
    pub(super) fn engine(&self) -> MutexGuard<'_, Engine<ChunkKey, Pending, PeerError>> {
        // A poisoned lock still holds a consistent engine: every method
        // changes it in one step.
        self.inner.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What this node knows of placement, for the engine.
    pub(super) fn view(&self) -> NodeView<'_> {
        NodeView { node: self, cluster: self.inner.cluster.get().map(|c| &**c) }
    }

    /// Runs the load of `key` as the engine commands: the chunk from the
    /// shard's owner (or the node it was handed over from), or read and
    /// converted here. The flag is true for a chunk kept as a guest copy.
    /// `read_here` is told when the engine leaves an ask.
    pub(super) async fn load(&self, key: ChunkKey, read_here: Arc<Notify>) -> Result<(SealedChunk, bool), FetchError> {
        let view = self.view();
        // What a peer's chunk must look like: looked up once, as the
        // engine's `routes` did when the load started.
        let expected = self.expected(key);
        let permit = || async { self.inner.loads.acquire().await.map_err(FetchError::ShuttingDown) };
        // The load permit the engine said to keep.
        let mut held = None;
        loop {
            let Some(command) = self.engine().poll(key, now(), &view) else {
                return Err(FetchError::LoadLost { shard: key.shard });
            };
            match command {
                Command::Read => break,
                Command::NotOwner(owner) => return Err(FetchError::NotOwner { shard: key.shard, owner }),
                Command::AcquirePermit { unless_moved } => {
                    let got = match (unless_moved, view.cluster) {
                        (Some(within), Some(cluster)) => tokio::select! {
                            biased;
                            p = permit() => Some(p?),
                            moved = cluster.reroute(key.version, key.shard, cluster.me(), within) => match moved {
                                Ok(_) => None,
                                Err(()) => Some(permit().await?),
                            },
                        },
                        _ => Some(permit().await?),
                    };
                    let outcome = if got.is_some() { Permit::Granted } else { Permit::Moved };
                    match self.engine().handle_permit(key, outcome, now(), &view) {
                        AfterPermit::Read => held = got,
                        AfterPermit::RouteAgain { wait_for_lease: true } => tracing::info!(shard = %key.shard,
                            "this node's lease is in doubt; waiting for it before reading the shard as its owner"),
                        AfterPermit::RouteAgain { wait_for_lease: false } => tracing::info!(shard = %key.shard,
                            "the placement gave the shard to another node while the load waited to read it; asking it"),
                        AfterPermit::NotOwner(_) => {}
                    }
                }
                Command::AwaitLease { within } => {
                    if let Some(cluster) = view.cluster {
                        cluster.lease_settled(within).await;
                    }
                    self.engine().handle_lease_settled(key, &view);
                }
                Command::AwaitVersion { within } => {
                    if let Some(cluster) = view.cluster
                        && !cluster.version_placed(key.version, within).await
                    {
                        tracing::warn!(shard = %key.shard, "no placement of this version known yet; routing on what is known");
                    }
                    self.engine().handle_version_waited(key);
                }
                Command::AskHeld { former, within } => {
                    // The engine routes only where both are known (`routes`).
                    let (Some(cluster), Some(expected)) = (view.cluster, expected.as_ref()) else {
                        return Err(FetchError::UnknownVersion(key.version));
                    };
                    match cluster.link().fetch_held(former.addr, key.version, key.shard, expected, within).await {
                        Ok(chunk) => {
                            self.count_peer_chunk(&chunk);
                            tracing::debug!(shard = %key.shard, from = %former.node, "handed over by the node that owned it before");
                            return self.take_peer_chunk(cluster, key, chunk, former.node).await;
                        }
                        Err(e) => {
                            tracing::debug!(shard = %key.shard, from = %former.node, "no copy handed over: {e}");
                            self.engine().handle_held(key, e);
                        }
                    }
                }
                Command::Ask { owner, within } => {
                    // The engine routes only where both are known (`routes`).
                    let (Some(cluster), Some(expected)) = (view.cluster, expected.as_ref()) else {
                        return Err(FetchError::UnknownVersion(key.version));
                    };
                    let started = std::time::Instant::now();
                    let span = tracing::info_span!("peer_fetch", peer = %owner.node, addr = %owner.addr);
                    let fetched = tokio::select! {
                        fetched = cluster
                            .link()
                            .fetch(owner.addr, owner.epoch, key.version, key.shard, expected, within)
                            .instrument(span) =>
                            Some(fetched),
                        () = read_here.notified() => None,
                    };
                    self.inner.stages.peer_fetch(started.elapsed());
                    match fetched {
                        None => {
                            tracing::info!(shard = %key.shard, owner = %owner.node,
                                "a newer placement names this node the owner (its own, or a peer's that asks it) while asking the owner an older one named; reading it here");
                            self.engine().handle_ask_left(key);
                        }
                        Some(Ok(chunk)) => {
                            self.engine().handle_asked(key, Ok(()));
                            self.inner.timings.peer_fetch(started.elapsed());
                            self.count_peer_chunk(&chunk);
                            return self.take_peer_chunk(cluster, key, chunk, owner.node).await;
                        }
                        Some(Err(e)) => {
                            self.inner.counters.peer_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let error = e.to_string();
                            let mut engine = self.engine();
                            engine.handle_asked(key, Err(e.into_ask_failure()));
                            // Say which way the load goes (a stalled owner,
                            // or the last owner, is read around at once).
                            let waits = matches!(engine.poll(key, now(), &view), Some(Command::AwaitMove { .. }));
                            let next =
                                if waits { "waiting for the placement to move it" } else { "reading remote storage" };
                            tracing::warn!(shard = %key.shard, owner = %owner.node, "owner could not serve; {next}: {error}");
                        }
                    }
                }
                Command::AwaitMove { failed, addr, within } => {
                    let Some(cluster) = view.cluster else {
                        self.engine().handle_await(key, AwaitOutcome::NotMoved, &view);
                        continue;
                    };
                    // Whichever comes first: the placement moves the shard,
                    // or the owner answers a handshake again (it was cut
                    // off or stopped and keeps its lease and its shards, or
                    // it refused while the placements disagreed). The
                    // placement wins a tie.
                    let outcome = tokio::select! {
                        biased;
                        moved = cluster.reroute(key.version, key.shard, failed, within) => match moved {
                            Ok(next) => AwaitOutcome::Moved(next),
                            Err(()) => {
                                tracing::warn!(shard = %key.shard, owner = %failed,
                                    "placement did not move it in time; reading remote storage");
                                AwaitOutcome::NotMoved
                            }
                        },
                        () = cluster.link().reachable_again(addr) => AwaitOutcome::OwnerBack,
                    };
                    if self.engine().handle_await(key, outcome, &view) == Back::AskAgain {
                        tracing::info!(shard = %key.shard, owner = %failed, "owner answers again; asking it again");
                    }
                }
            }
        }
        let held = match held {
            Some(p) => p,
            None => permit().await?,
        };
        let tried = self.engine().take_tried(key);
        match self.convert_here(key, held, true).await {
            Ok(c) => Ok((c, false)),
            Err(e) if !tried.is_empty() => Err(FetchError::NoSource { shard: key.shard, tried, source: Box::new(e) }),
            Err(e) => Err(e),
        }
    }

    /// What a peer's chunk of `key` must look like.
    fn expected(&self, key: ChunkKey) -> Option<granary_proto::chunk::Expected> {
        self.dataset(key.version).ok().and_then(|d| d.expected(key.shard))
    }

    fn count_peer_chunk(&self, chunk: &SealedChunk) {
        let c = &self.inner.counters;
        c.peer_fetched.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        c.peer_fetched_bytes.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
    }
}
