//! Where one load gets its chunk, executed: the shell of the pure route
//! ([`crate::fabric::route`]): ask the owner, or the node the shard was
//! handed over from, wait for the placement to move the shard, or read
//! remote storage here, as each [`Step`] says.

use super::{Asking, Node, PLACEMENT_WAIT};
use crate::error::FetchError;
use crate::fabric::route::{AfterPermit, Route, Step, after_permit};
use crate::shm::SealedChunk;
use crate::tier::ChunkKey;
use std::sync::atomic::Ordering;
use tracing::Instrument;

impl Node {
    /// The chunk from the shard's owner when another live node owns it
    /// (and `forward`), else read and converted here; [`Route`] decides
    /// what to do when the owner fails. The flag is true for a chunk
    /// fetched from another node.
    pub(super) async fn load(
        &self,
        key: ChunkKey,
        forward: bool,
        asking: &Asking,
    ) -> Result<(SealedChunk, bool), FetchError> {
        let permit = || async { self.inner.loads.acquire().await.map_err(FetchError::ShuttingDown) };
        let here = |permit| {
            asking.reading.store(true, Ordering::Relaxed);
            self.convert_here(key, permit, true)
        };
        let Some(cluster) = self.inner.cluster.get() else {
            return here(permit().await?).await.map(|c| (c, false));
        };
        // A peer's chunk must have the length the manifest's layout gives
        // (with jagged tensors: its rows and tensors).
        let Some(expected) = self.dataset(key.version).ok().and_then(|d| d.expected(key.shard)) else {
            return here(permit().await?).await.map(|c| (c, false));
        };
        let config = cluster.config();
        // A node that has just joined (or restarted) can be asked for a
        // shard before it knows the version's placement: with no owner to
        // ask it would read the shard itself, though another node owns and
        // may hold it (find 13, soak seed 4064: a node back from a kill
        // read 17 shards its peers held, its restarted ranks' and
        // prefetch's first requests). Wait a moment for the placement.
        if forward
            && !cluster.version_known(key.version)
            && !cluster.version_placed(key.version, PLACEMENT_WAIT.min(config.reroute_wait)).await
        {
            tracing::warn!(shard = %key.shard, "no placement of this version known yet; reading the shard here");
        }
        // A peer's request is never forwarded to the owner; but a handoff
        // is asked for whoever waits (its answer never waits on a load that
        // asks a peer, so no cycle can form through it).
        let owner = if forward { cluster.owner(key.version, key.shard) } else { None };
        // The load permit the route's final step took.
        let reading;
        let mut route =
            Route::new(tokio::time::Instant::now().into_std(), owner, config.fetch_deadline, config.reroute_wait)
                .with_handoff(cluster.handed_from(key.version, key.shard));
        loop {
            match route.poll(tokio::time::Instant::now().into_std()) {
                Step::ReadRemote => {
                    // A load permit first: a load queued behind others, or
                    // across a stop, checks what it knows when it may read.
                    // A load that reads as the shard's owner (and may ask
                    // others) stops waiting if the placement gives the
                    // shard to another node meanwhile.
                    let me = cluster.me();
                    let as_owner = cluster.placed_owner(key.version, key.shard) == Some(me);
                    let p = if forward && as_owner && route.may_recheck() {
                        tokio::select! {
                            biased;
                            p = permit() => Some(p?),
                            moved = cluster.reroute(key.version, key.shard, me, config.fetch_deadline) => match moved {
                                Ok(_) => None,
                                Err(()) => Some(permit().await?),
                            },
                        }
                    } else {
                        Some(permit().await?)
                    };
                    // Then, once per route (`after_permit`): the shard moved
                    // to another node while the load waited (a peer's load
                    // refuses, a forwarding one asks it); or it reads as the
                    // owner on a placement that may be stale (its lease is
                    // in doubt): wait for the lease and the placement that
                    // comes with it, and route again.
                    let after = match p {
                        // The wait ended because the shard moved.
                        None => AfterPermit::RouteAgain { wait_for_lease: false },
                        Some(_) => after_permit(
                            me,
                            forward,
                            as_owner,
                            cluster.placed_owner(key.version, key.shard),
                            cluster.may_read_as_owner(),
                            route.may_recheck(),
                            asking.local_waits.load(Ordering::Relaxed),
                        ),
                    };
                    match (after, p) {
                        (AfterPermit::Read, Some(p)) => {
                            reading = p;
                            break;
                        }
                        (AfterPermit::Read, None) => {
                            reading = permit().await?;
                            break;
                        }
                        (AfterPermit::NotOwner(owner), _) => {
                            return Err(FetchError::NotOwner { shard: key.shard, owner });
                        }
                        (AfterPermit::RouteAgain { wait_for_lease }, p) => {
                            drop(p);
                            if wait_for_lease {
                                tracing::info!(shard = %key.shard,
                                    "this node's lease is in doubt; waiting for it before reading the shard as its owner");
                                cluster.lease_settled(config.reroute_wait).await;
                            } else {
                                tracing::info!(shard = %key.shard,
                                    "the placement gave the shard to another node while the load waited to read it; asking it");
                            }
                            let owner = if forward { cluster.owner(key.version, key.shard) } else { None };
                            route.recheck_as_owner(owner, cluster.handed_from(key.version, key.shard));
                            continue;
                        }
                    }
                }
                Step::AskHeld { former, within } => {
                    match cluster.link().fetch_held(former.addr, key.version, key.shard, &expected, within).await {
                        Ok(chunk) => {
                            let c = &self.inner.counters;
                            c.peer_fetched.fetch_add(1, Ordering::Relaxed);
                            c.peer_fetched_bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                            tracing::debug!(shard = %key.shard, from = %former.node, "handed over by the node that owned it before");
                            return self.take_peer_chunk(cluster, key, chunk, former.node).await;
                        }
                        Err(e) => {
                            tracing::debug!(shard = %key.shard, from = %former.node, "no copy handed over: {e}");
                            route.handle_held(&e.to_string());
                        }
                    }
                }
                Step::Ask { owner, within } => {
                    let c = &self.inner.counters;
                    *asking.asked.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(crate::flight::Asked { addr: owner.addr, epoch: owner.epoch });
                    let started = std::time::Instant::now();
                    let span = tracing::info_span!("peer_fetch", peer = %owner.node, addr = %owner.addr);
                    let fetched = tokio::select! {
                        fetched = cluster
                            .link()
                            .fetch(owner.addr, owner.epoch, key.version, key.shard, &expected, within)
                            .instrument(span) =>
                            Some(fetched),
                        () = asking.read_here.notified() => None,
                    };
                    *asking.asked.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    self.inner.stages.peer_fetch(started.elapsed());
                    let Some(fetched) = fetched else {
                        tracing::info!(shard = %key.shard, owner = %owner.node,
                            "a newer placement names this node the owner (its own, or a peer's that asks it) while asking the owner an older one named; reading it here");
                        route.handle_owned_here();
                        continue;
                    };
                    match fetched {
                        Ok(chunk) => {
                            self.inner.timings.peer_fetch(started.elapsed());
                            c.peer_fetched.fetch_add(1, Ordering::Relaxed);
                            c.peer_fetched_bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                            return self.take_peer_chunk(cluster, key, chunk, owner.node).await;
                        }
                        Err(e) => {
                            c.peer_failures.fetch_add(1, Ordering::Relaxed);
                            route.handle_failed(e.as_ask_failure());
                            // Polling again returns the same step: say
                            // which way the route went (a stalled owner, or
                            // the last owner, is read around at once).
                            match route.poll(tokio::time::Instant::now().into_std()) {
                                Step::AwaitPlacement { .. } => tracing::warn!(shard = %key.shard, owner = %owner.node,
                                    "owner could not serve; waiting for the placement to move it: {e}"),
                                _ => tracing::warn!(shard = %key.shard, owner = %owner.node,
                                    "owner could not serve; reading remote storage: {e}"),
                            }
                        }
                    }
                }
                Step::AwaitPlacement { failed, addr, within } => {
                    // Whichever comes first: the placement moves the shard,
                    // or the owner answers a handshake again (it was cut
                    // off or stopped and keeps its lease and its shards, or
                    // it refused while the placements disagreed). The
                    // placement wins a tie.
                    let moved = tokio::select! {
                        biased;
                        moved = cluster.reroute(key.version, key.shard, failed, within) => Some(moved),
                        () = cluster.link().reachable_again(addr) => None,
                    };
                    match moved {
                        Some(Ok(next)) => route.handle_moved(next),
                        Some(Err(())) => {
                            tracing::warn!(shard = %key.shard, owner = %failed, "placement did not move it in time; reading remote storage");
                            route.handle_not_moved();
                        }
                        // Back, but the placement may have moved the shard
                        // meanwhile (its lease ran out while it was away):
                        // then ask the owner the placement gives.
                        None => match cluster.placed_owner(key.version, key.shard) {
                            Some(owner) if owner != failed => route.handle_moved(cluster.owner(key.version, key.shard)),
                            _ => {
                                tracing::info!(shard = %key.shard, owner = %failed, "owner answers again; asking it again");
                                route.handle_owner_back();
                            }
                        },
                    }
                }
            }
        }
        let tried = route.into_tried();
        match here(reading).await {
            Ok(c) => Ok((c, false)),
            Err(e) if !tried.is_empty() => Err(FetchError::NoSource { shard: key.shard, tried, source: Box::new(e) }),
            Err(e) => Err(e),
        }
    }
}
