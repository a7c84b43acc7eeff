//! How often one node may make the leader commit, as a pure token bucket
//! per node: no clock of its own, every call carries `now`, so the tests
//! drive it on a virtual clock.
//!
//! A node's registrations and version holds commit a log entry each (a
//! repeat commits nothing and is not counted). A healthy node commits a
//! handful in its life: once per start, once when its trainers change
//! versions. A node in a restart loop, or a forged one, could otherwise
//! make every voter fsync as fast as it can ask; past its bucket it is
//! answered "unavailable, retry in N ms" and its client backs off.
//!
//! The table is bounded: past [`CommitRate::MAX_TRACKED`] nodes it forgets
//! those whose buckets are full again (they would be admitted anyway).

use granary_proto::NodeId;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One node's bucket.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// Tokens at `at`.
    tokens: f64,
    at: Instant,
}

/// A commit refused: when the next one would be admitted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Slowed {
    /// How long until one token is back.
    pub retry_in: Duration,
}

/// Per-node token buckets of committing requests.
#[derive(Debug)]
pub struct CommitRate {
    /// Tokens a second.
    rate: f64,
    /// Tokens a bucket holds at most (the burst).
    burst: f64,
    buckets: HashMap<NodeId, Bucket>,
}

impl CommitRate {
    /// Nodes tracked before full buckets are forgotten.
    pub const MAX_TRACKED: usize = 16_384;

    /// `per_second` commits a second per node, after a burst of `burst`.
    pub fn new(per_second: f64, burst: u32) -> Self {
        Self { rate: per_second.max(f64::MIN_POSITIVE), burst: f64::from(burst.max(1)), buckets: HashMap::new() }
    }

    /// The default: a burst of 8 commits, then 1 a second.
    pub fn default_rate() -> Self {
        Self::new(1.0, 8)
    }

    /// Takes a token for `node` at `now`, or says when one is back.
    pub fn admit(&mut self, node: NodeId, now: Instant) -> Result<(), Slowed> {
        if self.buckets.len() >= Self::MAX_TRACKED && !self.buckets.contains_key(&node) {
            self.forget_full(now);
        }
        let (rate, burst) = (self.rate, self.burst);
        let b = self.buckets.entry(node).or_insert(Bucket { tokens: burst, at: now });
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * rate).min(burst);
        b.at = b.at.max(now);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Slowed { retry_in: Duration::from_secs_f64((1.0 - b.tokens) / rate) })
        }
    }

    /// Nodes with a bucket now.
    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }

    fn forget_full(&mut self, now: Instant) {
        let (rate, burst) = (self.rate, self.burst);
        self.buckets.retain(|_, b| b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * rate < burst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut r = CommitRate::new(2.0, 3);
        for _ in 0..3 {
            assert_eq!(r.admit(NodeId(1), t0), Ok(()));
        }
        assert_eq!(r.admit(NodeId(1), t0), Err(Slowed { retry_in: 500 * MS }));
        assert_eq!(r.admit(NodeId(2), t0), Ok(()), "another node has its own bucket");
        assert_eq!(r.admit(NodeId(1), t0 + 499 * MS).map_err(|s| s.retry_in > Duration::ZERO), Err(true));
        assert_eq!(r.admit(NodeId(1), t0 + 500 * MS), Ok(()), "one token back after half a second");
        assert!(r.admit(NodeId(1), t0 + 500 * MS).is_err());
        // Idle long enough: the whole burst again, no more.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(r.admit(NodeId(1), later), Ok(()));
        }
        assert!(r.admit(NodeId(1), later).is_err());
    }

    #[test]
    fn a_clock_that_goes_back_refills_nothing() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut r = CommitRate::new(1.0, 1);
        assert_eq!(r.admit(NodeId(1), t0), Ok(()));
        assert!(r.admit(NodeId(1), t0 - Duration::from_secs(5)).is_err());
        assert!(r.admit(NodeId(1), t0 + 999 * MS).is_err());
        assert_eq!(r.admit(NodeId(1), t0 + Duration::from_secs(1)), Ok(()));
    }

    #[test]
    fn the_table_forgets_full_buckets_past_its_bound() {
        let t0 = Instant::now();
        let mut r = CommitRate::new(1.0, 2);
        for n in 0..CommitRate::MAX_TRACKED as u64 {
            r.admit(NodeId(n), t0).unwrap();
        }
        assert_eq!(r.tracked(), CommitRate::MAX_TRACKED);
        // A second later every bucket is full again: a new node makes room.
        r.admit(NodeId(u64::MAX), t0 + Duration::from_secs(1)).unwrap();
        assert_eq!(r.tracked(), 1);
    }
}
