//! Whether a node is ready to serve trainers (issue 48): what `/readyz`
//! answers. A node in a cluster is ready when it is registered, its lease
//! is live, and it knows a placement at least as new as the one the
//! coordinator last reported; before that its trainers would wait on
//! shards it cannot yet name an owner for. A node alone is ready once it
//! serves.

use crate::route::LeaseView;
use std::time::{Duration, Instant};

/// Why a node is not ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotReady {
    /// No registration has been accepted yet (the coordinators are not
    /// reached, or have not answered).
    NotRegistered,
    /// The lease ran out `ago` and no heartbeat renewed it.
    LeaseLapsed {
        /// How long ago it ran out.
        ago: Duration,
    },
    /// No placement is known yet.
    NoPlacement,
    /// The placement known is older than the one the coordinator reported.
    PlacementBehind {
        /// The epoch known here.
        known: u64,
        /// The epoch the coordinator reported.
        reported: u64,
    },
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotRegistered => write!(f, "not registered with the coordinators yet"),
            Self::LeaseLapsed { ago } => {
                write!(f, "the lease ran out {} ms ago and no heartbeat was answered", ago.as_millis())
            }
            Self::NoPlacement => write!(f, "registered, but no placement is known yet"),
            Self::PlacementBehind { known, reported } => {
                write!(f, "the placement known is epoch {known}; the coordinators reported {reported}")
            }
        }
    }
}

/// A node's readiness at `now`: `lease` is its standing (None for a node
/// that is not in a cluster, which is ready), `placement` the epoch of the
/// placement it knows, if any.
pub fn node_readiness(now: Instant, lease: Option<LeaseView>, placement: Option<u64>) -> Result<(), NotReady> {
    let Some(l) = lease else { return Ok(()) };
    let Some(renewed) = l.renewed_at else { return Err(NotReady::NotRegistered) };
    let age = now.saturating_duration_since(renewed);
    if age >= l.lease {
        return Err(NotReady::LeaseLapsed { ago: age - l.lease });
    }
    match placement {
        None => Err(NotReady::NoPlacement),
        Some(known) if known < l.epoch => Err(NotReady::PlacementBehind { known, reported: l.epoch }),
        Some(_) => Ok(()),
    }
}

/// How long the coordinators may go on refusing a node's registration
/// because another daemon holds its identity live before the node gives
/// up and exits: a rescheduled node whose former self's lease has not run
/// out yet is refused for at most a lease (3 s by default); refusals for
/// this long mean two daemons share one identity, a misconfiguration an
/// orchestrator must see (issue 48).
pub const DUPLICATE_FATAL_AFTER: Duration = Duration::from_secs(15);

/// The coordinators' refusals of this node's registration as a second
/// daemon of its identity, as they go on: whether they are fatal yet.
#[derive(Debug, Default)]
pub struct Refusals {
    since: Option<Instant>,
}

impl Refusals {
    /// A registration was refused at `now` because another daemon holds
    /// this identity: true once refusals have gone on for
    /// [`DUPLICATE_FATAL_AFTER`] with no registration accepted between.
    pub fn handle_refused(&mut self, now: Instant) -> bool {
        let since = *self.since.get_or_insert(now);
        now.saturating_duration_since(since) >= DUPLICATE_FATAL_AFTER
    }

    /// A registration was accepted: the refusals start over.
    pub fn handle_registered(&mut self) {
        self.since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_fatal_only_once_they_outlast_a_rescheduled_nodes_lease() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        assert!(!r.handle_refused(t0));
        assert!(!r.handle_refused(t0 + Duration::from_secs(3)), "a former self's lease");
        r.handle_registered();
        assert!(!r.handle_refused(t0 + Duration::from_secs(20)), "accepted between: they start over");
        assert!(!r.handle_refused(t0 + Duration::from_secs(34)));
        assert!(r.handle_refused(t0 + Duration::from_secs(35)), "15 s of refusals");
    }

    #[test]
    fn a_node_is_ready_registered_within_its_lease_and_knowing_the_placement_reported() {
        let t0 = Instant::now();
        let lease = Duration::from_secs(3);
        let view = |renewed, epoch| Some(LeaseView { renewed_at: renewed, lease, epoch });
        assert_eq!(node_readiness(t0, None, None), Ok(()), "alone: ready");
        assert_eq!(node_readiness(t0, view(None, 0), None), Err(NotReady::NotRegistered));
        assert_eq!(node_readiness(t0, view(Some(t0), 1), None), Err(NotReady::NoPlacement));
        assert_eq!(
            node_readiness(t0, view(Some(t0), 4), Some(3)),
            Err(NotReady::PlacementBehind { known: 3, reported: 4 })
        );
        assert_eq!(node_readiness(t0 + Duration::from_secs(2), view(Some(t0), 4), Some(4)), Ok(()));
        assert_eq!(
            node_readiness(t0 + Duration::from_millis(3_500), view(Some(t0), 4), Some(4)),
            Err(NotReady::LeaseLapsed { ago: Duration::from_millis(500) })
        );
        let text = NotReady::LeaseLapsed { ago: Duration::from_millis(500) }.to_string();
        assert_eq!(text, "the lease ran out 500 ms ago and no heartbeat was answered");
    }
}
