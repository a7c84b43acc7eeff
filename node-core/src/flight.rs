//! Single flight: who may join a load in flight, as a pure decision.
//!
//! Concurrent requests for one shard share one load: the first starts it,
//! later ones wait on its result. Who asks matters ([`Asker`]): a trainer's
//! request (or prefetch for the epoch in progress) may be forwarded to the
//! shard's owner; prefetch for a later epoch keeps a guest copy it brings
//! at low priority until something needs it now; a peer's request is never
//! forwarded. Joining a peer's request to a load that is itself asking a
//! peer can make loads wait on each other in a cycle until the fetch
//! deadline, when placements disagree for a moment (`granary-chaos sim`
//! seed 136349: three nodes, each loading one shard from the next). So a
//! peer's request that meets a load of this node asking a peer is
//! - joined, and the load told to stop asking and read the shard here,
//!   when the asker's placement is newer than the one that named the peer
//!   the load asks, and either this node's own placement names this node
//!   the owner (its load asks on a placement it knows is outdated) or the
//!   asker is that very peer (A asks B on a placement that names B; B's
//!   load asks A on an older one: A's newer placement names B the owner,
//!   and B, which may not have learned it yet, is the one to read).
//!   `granary-chaos sim --seed 187788`: refusing there made both read the
//!   shard once the owner they had both asked before crashed again;
//! - refused at once when the load asks that very peer on the same or a
//!   newer placement (A waits on B, which waits on A: the two disagree
//!   about the owner, and the asker's placement is the older one);
//! - otherwise joined.
//!
//! A cycle of longer loads cannot last: around it, the newest placement
//! any of its loads asks on names one owner, and the load that asks that
//! owner asks a node of the cycle, so the owner is in it. Its own load
//! asks on an older placement (that one named another node), so once the
//! owner learns the newest placement its load stops asking and reads the
//! shard here, when a newer asker joins it or when the placement arrives
//! while a peer waits on it (`Node`'s placement hook; the simulation's
//! node does the same). Refusing every asker newer than the load instead
//! rules cycles out at once, but a node that has not yet learned the
//! newer placement then refuses a peer that would have waited a moment,
//! and both read the shard (27 of 100,000 seeds).

use std::net::SocketAddr;

/// Who asks for a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// A trainer on this host, or prefetch for the epoch in progress: the
    /// load may ask the shard's owner, and the chunk is needed now.
    Trainer,
    /// Prefetch for a later epoch: the load may ask the owner; a guest copy
    /// it brings is kept at low priority until something needs it now.
    Ahead,
    /// Another node: never forwarded to a third node.
    Peer {
        /// Where it serves peers.
        addr: SocketAddr,
        /// The placement epoch that named this node the owner, to it.
        epoch: u64,
    },
}

impl Asker {
    /// Whether a load started for this asker may ask the shard's owner.
    pub fn forwards(self) -> bool {
        !matches!(self, Asker::Peer { .. })
    }

    /// Whether the chunk is needed now (false only for a later epoch).
    pub fn wants_now(self) -> bool {
        !matches!(self, Asker::Ahead)
    }
}

/// A load in flight, as the admission sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlight {
    /// The peer the load is asking for the chunk right now, if any.
    pub asking: Option<Asked>,
    /// Whether this node's placement names this node the shard's owner.
    pub owned_here: bool,
}

/// A peer a load asks, and the placement epoch that named it the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    /// Where it serves peers.
    pub addr: SocketAddr,
    /// The placement epoch that named it.
    pub epoch: u64,
}

/// What to do with a request that found no chunk in the tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Wait on the load in flight. `promote`: the load now serves a request
    /// that needs the chunk now, so its guest copy becomes a regular one.
    Join {
        /// Mark the load as wanted now.
        promote: bool,
    },
    /// Wait on the load in flight, and tell it to stop asking and read the
    /// shard here: it asks on a placement older than the asker's, and this
    /// node's placement names this node the owner (see the module doc).
    JoinAndConvert,
    /// Refuse at once: the load in flight is asking the very peer that
    /// asks, or a peer an older placement named (see the module doc).
    Refuse,
    /// A load finished between the lookup and this decision: look again.
    LookAgain,
    /// Start a load.
    Start,
}

/// Admission of `asker`'s request: `pending` is the load in flight for the
/// shard, if any; `finished` says whether a load finished since the tiers
/// were looked up (asked only when it matters); `may_look_again` is false
/// on the last of the bounded attempts, so a lookup that never settles
/// still starts a load.
pub fn admit(
    pending: Option<InFlight>,
    asker: Asker,
    finished: impl FnOnce() -> bool,
    may_look_again: bool,
) -> Admission {
    match pending {
        Some(load) => match (asker, load.asking) {
            (Asker::Peer { epoch, addr }, Some(asked))
                if asked.epoch < epoch && (load.owned_here || asked.addr == addr) =>
            {
                Admission::JoinAndConvert
            }
            (Asker::Peer { addr, .. }, Some(asked)) if asked.addr == addr => Admission::Refuse,
            _ => Admission::Join { promote: asker.wants_now() },
        },
        None if may_look_again && finished() => Admission::LookAgain,
        None => Admission::Start,
    }
}

/// Whether this node may start a load (read the shard from remote storage)
/// for a peer that asked it as the owner on placement epoch `asked_on`,
/// when it holds no copy and no load of its own is in flight. `placed` is
/// the owner this node's placement names (None: it knows no placement of
/// the version yet, and cannot judge), learned at epoch `known_epoch`;
/// `former` the node that placement moved the shard from, if it did.
/// Refused (`Err(owner)`) when that placement names another node, did not
/// move the shard away from this node, and is no older than the asker's:
/// a peer then asks a node no recent placement named, so it is out of
/// date beyond one move or does not play by the placement, and serving
/// would read the shard a second time in the cluster. A node the shard
/// just moved away from still serves (a peer one placement behind asks
/// it: refusing it made both read the shard in 8 of 200,000 simulated
/// seeds, `pair-reads`), and so does a node asked on a newer placement
/// (it may own the shard there and not know it yet).
pub fn start_for_peer<N: PartialEq + Copy>(
    me: N,
    placed: Option<N>,
    former: Option<N>,
    known_epoch: u64,
    asked_on: u64,
) -> Result<(), N> {
    match placed {
        Some(owner) if owner != me && former != Some(me) && asked_on <= known_epoch => Err(owner),
        _ => Ok(()),
    }
}

/// On a new placement: whether a load in flight that asks `asking` stops
/// and reads the shard here. Yes when the placement names this node the
/// owner (`owned_at`: that placement's epoch), it is newer than the one
/// the load asks on, and a peer's request waits on the load (then the
/// load may be the owner's link in a cycle; see the module doc). Without a
/// peer waiting, the load keeps asking: the former owner's answer is the
/// cheapest way to hand the shard over.
pub fn reads_here_after_placement(asking: Option<Asked>, owned_at: Option<u64>, peer_waits: bool) -> bool {
    matches!((asking, owned_at), (Some(a), Some(e)) if a.epoch < e && peer_waits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_served_as_the_owner_only_where_the_placement_allows() {
        // The placement names this node (1): served.
        assert_eq!(start_for_peer(1, Some(1), None, 5, 5), Ok(()));
        // It names node 2, and the asker's placement is no newer: refused.
        assert_eq!(start_for_peer(1, Some(2), None, 5, 5), Err(2));
        assert_eq!(start_for_peer(1, Some(2), Some(3), 5, 3), Err(2));
        // It moved the shard away from this node: a peer one placement
        // behind is served.
        assert_eq!(start_for_peer(1, Some(2), Some(1), 5, 4), Ok(()));
        // The asker knows a newer placement (this node may own it there).
        assert_eq!(start_for_peer(1, Some(2), None, 5, 6), Ok(()));
        // No placement of the version known here: cannot judge.
        assert_eq!(start_for_peer(1, None, None, 5, 1), Ok(()));
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    fn peer(port: u16, epoch: u64) -> Asker {
        Asker::Peer { addr: addr(port), epoch }
    }

    fn asking(port: u16, epoch: u64) -> InFlight {
        InFlight { asking: Some(Asked { addr: addr(port), epoch }), owned_here: false }
    }

    #[test]
    fn the_first_request_starts_a_load_and_later_ones_join_it() {
        assert_eq!(admit(None, Asker::Trainer, || false, true), Admission::Start);
        let load = InFlight { asking: None, owned_here: false };
        assert_eq!(admit(Some(load), Asker::Trainer, || false, true), Admission::Join { promote: true });
        assert_eq!(admit(Some(load), peer(1, 7), || false, true), Admission::Join { promote: true });
    }

    #[test]
    fn prefetch_for_a_later_epoch_does_not_promote_a_load() {
        let load = asking(2, 1);
        assert_eq!(admit(Some(load), Asker::Ahead, || false, true), Admission::Join { promote: false });
    }

    #[test]
    fn disagreeing_placements_are_refused_at_once_not_waited_on() {
        // This node's load asks peer 2 for the shard; peer 2 asks this node
        // for the same shard (each thinks the other owns it).
        let load = asking(2, 5);
        assert_eq!(admit(Some(load), peer(2, 5), || false, true), Admission::Refuse);
        assert_eq!(admit(Some(load), peer(2, 3), || false, true), Admission::Refuse);
        // A load asking a third node (say, a dead owner) is joined.
        assert_eq!(admit(Some(load), peer(3, 5), || false, true), Admission::Join { promote: true });
    }

    #[test]
    fn a_load_asking_a_third_node_is_joined_whatever_the_epochs() {
        // The asker's placement is newer, but this node does not own the
        // shard by its own (it may not have learned the newer one yet):
        // waiting on the load is cheaper than both reading the shard.
        assert_eq!(admit(Some(asking(2, 4)), peer(3, 6), || false, true), Admission::Join { promote: true });
        // A load that asks nobody (it converts, or reads remote storage)
        // waits on nobody: always joined.
        let converting = InFlight { asking: None, owned_here: true };
        assert_eq!(admit(Some(converting), peer(3, 99), || false, true), Admission::Join { promote: true });
    }

    #[test]
    fn a_load_asking_on_a_placement_this_node_knows_is_outdated_reads_the_shard_here_for_a_newer_asker() {
        // Seed 136349: this node's load asks B on epoch 6; this node has
        // since learned epoch 11, which names it the owner, and C asks it
        // on epoch 11. Refusing would leave C waiting for a placement that
        // will not move the shard; joining would wait on B. The load stops
        // asking and reads the shard here.
        let stale = InFlight { asking: Some(Asked { addr: addr(2), epoch: 6 }), owned_here: true };
        assert_eq!(admit(Some(stale), peer(3, 11), || false, true), Admission::JoinAndConvert);
        // Even when the asker is the peer the load asks (a two-node cycle).
        assert_eq!(admit(Some(stale), peer(2, 11), || false, true), Admission::JoinAndConvert);
        // An asker on the same or an older placement is not a reason.
        assert_eq!(admit(Some(stale), peer(3, 6), || false, true), Admission::Join { promote: true });
        assert_eq!(admit(Some(stale), peer(2, 6), || false, true), Admission::Refuse);
    }

    #[test]
    fn a_peer_asking_on_a_newer_placement_than_the_load_that_asks_it_is_joined_and_the_load_reads_here() {
        // Seed 187788: B's load asks A on epoch 4 (B has not learned epoch
        // 6 yet); A asks B on epoch 6, which names B. Refusing made both
        // read the shard; B reads it and A waits on B.
        let behind = asking(2, 4);
        assert_eq!(admit(Some(behind), peer(2, 6), || false, true), Admission::JoinAndConvert);
        // A's side of the same cycle: B asks on the older placement: refused.
        assert_eq!(admit(Some(asking(2, 6)), peer(2, 4), || false, true), Admission::Refuse);
        // Same epoch: they disagree about nothing newer; refused.
        assert_eq!(admit(Some(asking(2, 5)), peer(2, 5), || false, true), Admission::Refuse);
    }

    #[test]
    fn a_new_placement_that_names_this_node_stops_a_load_a_peer_waits_on() {
        let a = Some(Asked { addr: addr(2), epoch: 6 });
        assert!(reads_here_after_placement(a, Some(7), true));
        // No peer waits: the former owner's answer hands the shard over.
        assert!(!reads_here_after_placement(a, Some(7), false));
        // Not owned here, or not newer, or not asking: nothing changes.
        assert!(!reads_here_after_placement(a, None, true));
        assert!(!reads_here_after_placement(a, Some(6), true));
        assert!(!reads_here_after_placement(None, Some(7), true));
    }

    #[test]
    fn a_load_that_finished_meanwhile_is_looked_up_again_a_bounded_number_of_times() {
        assert_eq!(admit(None, Asker::Trainer, || true, true), Admission::LookAgain);
        assert_eq!(admit(None, Asker::Trainer, || true, false), Admission::Start);
        let asked = std::cell::Cell::new(false);
        admit(None, Asker::Trainer, || asked.replace(true), false);
        assert!(!asked.get(), "the tiers are not asked on the last attempt");
    }

    #[test]
    fn only_local_requests_are_forwarded() {
        assert!(Asker::Trainer.forwards() && Asker::Ahead.forwards());
        assert!(!peer(1, 0).forwards());
        assert!(Asker::Trainer.wants_now() && peer(1, 0).wants_now() && !Asker::Ahead.wants_now());
    }
}
