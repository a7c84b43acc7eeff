//! Single flight: who may join a load in flight, as a pure decision.
//!
//! Concurrent requests for one shard share one load: the first starts it,
//! later ones wait on its result. Who asks matters ([`Asker`]): a trainer's
//! request (or prefetch for the epoch in progress) may be forwarded to the
//! shard's owner; prefetch for a later epoch keeps a guest copy it brings
//! at low priority until something needs it now; a peer's request is never
//! forwarded, and is refused at once when it meets a load of this node that
//! is asking that very peer. The two nodes then disagree about the owner
//! (their placements differ for a moment), and joining would wait on a
//! cycle (A waits on B, which waits on A) until the fetch deadline.

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
    /// Another node, at this address: never forwarded to a third node.
    Peer(SocketAddr),
}

impl Asker {
    /// Whether a load started for this asker may ask the shard's owner.
    pub fn forwards(self) -> bool {
        !matches!(self, Asker::Peer(_))
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
    pub asking: Option<SocketAddr>,
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
    /// Refuse at once: the load in flight is asking the very peer that asks
    /// (see the module doc).
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
        Some(load) => match asker {
            Asker::Peer(peer) if load.asking == Some(peer) => Admission::Refuse,
            _ => Admission::Join { promote: asker.wants_now() },
        },
        None if may_look_again && finished() => Admission::LookAgain,
        None => Admission::Start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    #[test]
    fn the_first_request_starts_a_load_and_later_ones_join_it() {
        assert_eq!(admit(None, Asker::Trainer, || false, true), Admission::Start);
        let load = InFlight { asking: None };
        assert_eq!(admit(Some(load), Asker::Trainer, || false, true), Admission::Join { promote: true });
        assert_eq!(admit(Some(load), Asker::Peer(addr(1)), || false, true), Admission::Join { promote: true });
    }

    #[test]
    fn prefetch_for_a_later_epoch_does_not_promote_a_load() {
        let load = InFlight { asking: Some(addr(2)) };
        assert_eq!(admit(Some(load), Asker::Ahead, || false, true), Admission::Join { promote: false });
    }

    #[test]
    fn disagreeing_placements_are_refused_at_once_not_waited_on() {
        // This node's load asks peer 2 for the shard; peer 2 asks this node
        // for the same shard (each thinks the other owns it).
        let load = InFlight { asking: Some(addr(2)) };
        assert_eq!(admit(Some(load), Asker::Peer(addr(2)), || false, true), Admission::Refuse);
        // A load asking a third node (say, a dead owner) is joined.
        assert_eq!(admit(Some(load), Asker::Peer(addr(3)), || false, true), Admission::Join { promote: true });
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
        assert!(!Asker::Peer(addr(1)).forwards());
        assert!(Asker::Trainer.wants_now() && Asker::Peer(addr(1)).wants_now() && !Asker::Ahead.wants_now());
    }
}
