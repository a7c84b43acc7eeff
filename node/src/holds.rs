//! Which dataset versions this node's trainers use: the set a cluster node
//! holds at the coordinator, so that a version a job pinned keeps its
//! placement (one remote read per cluster) after a newer one is registered,
//! and is never collected while in use.
//!
//! [`Holds`] is the pure core: uses counted per version, each released use
//! kept for a linger (a trainer that reconnects between epochs, or a rank
//! restarting from its checkpoint, does not drop and re-place the
//! version), all on a clock passed in. [`HoldRegistry`] shares it between
//! the node's sessions and the loop that reports it
//! (`crate::fabric::holds`); a [`VersionUse`] is one session's use.

use granary_proto::DatasetVersion;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A (dataset, version) pair.
pub(crate) type Held = (String, DatasetVersion);

#[derive(Clone, Copy, Debug, Default)]
struct Uses {
    /// Sessions using the version now.
    open: usize,
    /// When the last one ended, while none is open.
    released_at: Option<Instant>,
}

/// Uses per version (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct Holds {
    uses: BTreeMap<Held, Uses>,
}

impl Holds {
    /// A session starts using `held`.
    pub(crate) fn acquire(&mut self, held: Held) {
        let u = self.uses.entry(held).or_default();
        u.open += 1;
        u.released_at = None;
    }

    /// A session using `held` ended at `now`.
    pub(crate) fn release(&mut self, held: &Held, now: Instant) {
        if let Some(u) = self.uses.get_mut(held) {
            u.open = u.open.saturating_sub(1);
            if u.open == 0 {
                u.released_at = Some(now);
            }
        }
    }

    /// The versions held at `now`: in use, or released less than `linger`
    /// ago. Forgets those released longer ago.
    pub(crate) fn held(&mut self, now: Instant, linger: Duration) -> BTreeSet<Held> {
        self.uses.retain(|_, u| u.open > 0 || u.released_at.is_some_and(|at| now.duration_since(at) < linger));
        self.uses.keys().cloned().collect()
    }

    /// Whether a session uses `held` now.
    pub(crate) fn in_use(&self, held: &Held) -> bool {
        self.uses.get(held).is_some_and(|u| u.open > 0)
    }

    /// When [`Holds::held`] next changes on its own (a linger ends), if
    /// ever.
    pub(crate) fn next_change(&self, linger: Duration) -> Option<Instant> {
        self.uses.values().filter(|u| u.open == 0).filter_map(|u| u.released_at).min().map(|at| at + linger)
    }
}

/// [`Holds`] shared by a node's sessions, with a signal for the reporting
/// loop.
#[derive(Debug)]
pub(crate) struct HoldRegistry {
    holds: Mutex<Holds>,
    changed: tokio::sync::Notify,
}

impl Default for HoldRegistry {
    fn default() -> Self {
        Self { holds: Mutex::new(Holds::default()), changed: tokio::sync::Notify::new() }
    }
}

impl HoldRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Holds> {
        // Holds' methods leave it consistent at every step.
        self.holds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One session's use of `held`, until the returned guard drops.
    pub(crate) fn use_version(self: &Arc<Self>, held: Held) -> VersionUse {
        self.lock().acquire(held.clone());
        self.changed.notify_one();
        VersionUse { registry: self.clone(), held }
    }

    /// [`Holds::held`] now.
    pub(crate) fn held(&self, now: Instant, linger: Duration) -> BTreeSet<Held> {
        self.lock().held(now, linger)
    }

    /// [`Holds::in_use`].
    pub(crate) fn in_use(&self, held: &Held) -> bool {
        self.lock().in_use(held)
    }

    /// [`Holds::next_change`].
    pub(crate) fn next_change(&self, linger: Duration) -> Option<Instant> {
        self.lock().next_change(linger)
    }

    /// Resolves after a use started or ended (at least once per change
    /// since the last call).
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }
}

/// One session's use of a version (see [`HoldRegistry::use_version`]).
#[derive(Debug)]
pub(crate) struct VersionUse {
    registry: Arc<HoldRegistry>,
    held: Held,
}

impl Drop for VersionUse {
    fn drop(&mut self) {
        self.registry.lock().release(&self.held, Instant::now());
        self.registry.changed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: u8) -> Held {
        ("d".into(), DatasetVersion([n; 16]))
    }

    #[test]
    fn a_version_is_held_while_used_and_for_the_linger_after_its_last_use() {
        let linger = Duration::from_secs(30);
        let t0 = Instant::now();
        let mut h = Holds::default();
        h.acquire(v(1));
        h.acquire(v(1));
        h.acquire(v(2));
        assert!(h.in_use(&v(1)) && !h.in_use(&v(3)));
        assert_eq!(h.held(t0, linger), BTreeSet::from([v(1), v(2)]));
        assert_eq!(h.next_change(linger), None, "nothing released");
        h.release(&v(1), t0 + Duration::from_secs(1));
        assert_eq!(h.next_change(linger), None, "one use of v1 is still open");
        h.release(&v(1), t0 + Duration::from_secs(2));
        assert!(!h.in_use(&v(1)), "released, though still held for the linger");
        assert_eq!(h.next_change(linger), Some(t0 + Duration::from_secs(32)));
        assert_eq!(h.held(t0 + Duration::from_secs(31), linger), BTreeSet::from([v(1), v(2)]));
        // Used again within the linger: held on.
        h.acquire(v(1));
        assert_eq!(h.held(t0 + Duration::from_secs(100), linger), BTreeSet::from([v(1), v(2)]));
        h.release(&v(1), t0 + Duration::from_secs(100));
        h.release(&v(2), t0 + Duration::from_secs(110));
        assert_eq!(h.held(t0 + Duration::from_secs(130), linger), BTreeSet::from([v(2)]));
        assert_eq!(h.held(t0 + Duration::from_secs(140), linger), BTreeSet::new());
        assert_eq!(h.next_change(linger), None, "forgotten");
    }

    #[test]
    fn a_use_guard_releases_on_drop() {
        let r = Arc::new(HoldRegistry::default());
        let u = r.use_version(v(3));
        assert_eq!(r.held(Instant::now(), Duration::ZERO), BTreeSet::from([v(3)]));
        drop(u);
        assert_eq!(r.held(Instant::now() + Duration::from_millis(1), Duration::ZERO), BTreeSet::new());
    }
}
