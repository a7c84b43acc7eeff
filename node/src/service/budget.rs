//! The load budget follows the node's own memory (issue 42): once a
//! second, the node measures what its own structures take
//! ([`load::measured_overhead`]) and moves the budget of loads in progress
//! to what is left ([`load::load_budget_now`], [`load::resize`]). A
//! configured `load_memory_bytes` stays as set.

use super::{Inner, Node};
use crate::load;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// How often the budget is reckoned again.
const EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl Node {
    /// The budget of loads in progress now, in bytes.
    pub fn load_budget(&self) -> u64 {
        self.inner.load_memory_bytes.load(Ordering::Relaxed)
    }

    /// Reserves `kib` KiB of the load budget for a load, or the whole
    /// budget where it has shrunk below that since the load was admitted
    /// (as a chunk larger than a peer's byte budget takes all of it): a
    /// load waits for memory, never for a budget that may not come back.
    pub(super) async fn reserve_load_memory(
        &self,
        kib: u32,
    ) -> Result<tokio::sync::SemaphorePermit<'_>, tokio::sync::AcquireError> {
        let clamp = || kib.min(u32::try_from(self.load_budget().div_ceil(1024)).unwrap_or(u32::MAX)).max(1);
        loop {
            let want = clamp();
            let acquire = self.inner.load_memory.acquire_many(want);
            tokio::pin!(acquire);
            loop {
                tokio::select! {
                    permit = &mut acquire => return permit,
                    _ = tokio::time::sleep(EVERY) => if clamp() < want { break },
                }
            }
        }
    }

    /// Starts the loop that moves the load budget with the node's own
    /// memory, for as long as the node lives.
    pub(super) fn spawn_budget_loop(&self) {
        if !self.inner.load_budget_follows_memory || self.inner.advice.memory.is_none() {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                Node { inner }.follow_own_memory();
            }
        });
    }

    /// Moves the load budget to what the node's memory allows now; returns
    /// it.
    pub fn follow_own_memory(&self) -> u64 {
        let inner: &Inner = &self.inner;
        let Some(memory) = inner.advice.memory else { return self.load_budget() };
        let current_kib = self.load_budget().div_ceil(1024);
        let available = inner.load_memory.available_permits() as u64;
        let taken = current_kib.saturating_sub(available).saturating_mul(1024);
        let Some(overhead) =
            std::fs::read_to_string("/proc/self/status").ok().and_then(|s| load::measured_overhead(&s, taken))
        else {
            return self.load_budget();
        };
        let target_kib = load::load_budget_now(memory, inner.advice.tiers_bytes, overhead).div_ceil(1024);
        let r = load::resize(current_kib, target_kib, available);
        if r.add > 0 {
            let add = usize::try_from(r.add).unwrap_or(0).min(tokio::sync::Semaphore::MAX_PERMITS - available as usize);
            inner.load_memory.add_permits(add);
            inner.load_memory_bytes.store((current_kib + add as u64) * 1024, Ordering::Relaxed);
        } else if r.forget > 0 {
            let forgotten = inner.load_memory.forget_permits(usize::try_from(r.forget).unwrap_or(0)) as u64;
            inner.load_memory_bytes.store(current_kib.saturating_sub(forgotten) * 1024, Ordering::Relaxed);
            tracing::info!(
                budget_mib = (current_kib - forgotten) >> 10,
                own_mib = overhead >> 20,
                "the node's own memory grew: less memory for loads in progress"
            );
        }
        self.load_budget()
    }
}
