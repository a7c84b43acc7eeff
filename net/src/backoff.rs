//! Pauses between retries, pure: exponential in the rounds that failed in
//! a row, with jitter, so that clients refused together (a voter's
//! connection budget spent, a leader gone) do not all come back together.
//!
//! The pause after the `n`th failed round in a row is `base * 2^(n-1)`,
//! at most [`MAX_DOUBLINGS`] doublings, scaled by a factor drawn uniformly
//! from [0.5, 1.5): on average what a fixed pause would be, spread over a
//! whole pause's width.

use std::time::Duration;

/// Doublings of the base pause at most: with the default 100 ms, the
/// pauses grow to 0.8 s on average (0.4 s to 1.2 s).
pub const MAX_DOUBLINGS: u32 = 3;

/// The pause after `failed_rounds` failed rounds in a row (0 is taken as
/// 1), with `unit` in [0, 1) drawn by the caller ([`jitter_unit`]).
pub fn pause(base: Duration, failed_rounds: u32, unit: f64) -> Duration {
    let doublings = failed_rounds.saturating_sub(1).min(MAX_DOUBLINGS);
    let unit = if unit.is_finite() { unit.clamp(0.0, 1.0) } else { 0.5 };
    (base * (1u32 << doublings)).mul_f64(0.5 + unit)
}

/// A number in [0, 1), different in every call and every process (from
/// the standard library's randomly keyed hasher; not for secrets).
pub fn jitter_unit() -> f64 {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    let h = std::collections::hash_map::RandomState::new().hash_one(n);
    // 53 bits: every value exactly representable, strictly below 1.
    (h >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_per_failed_round_up_to_a_bound_and_spread_around_it() {
        let base = Duration::from_millis(100);
        assert_eq!(pause(base, 1, 0.5), base);
        assert_eq!(pause(base, 0, 0.5), base, "no failed round counts as one");
        assert_eq!(pause(base, 2, 0.5), 2 * base);
        assert_eq!(pause(base, 4, 0.5), 8 * base);
        assert_eq!(pause(base, 40, 0.5), 8 * base, "at most {MAX_DOUBLINGS} doublings");
        assert_eq!(pause(base, 1, 0.0), base / 2);
        assert!(pause(base, 1, 0.999_999) < base * 3 / 2);
        assert_eq!(pause(base, 1, f64::NAN), base, "a unit that is no number is the middle");
        assert_eq!(pause(base, 1, 7.0), base * 3 / 2, "a unit out of range is clamped");
    }

    #[test]
    fn jitter_units_are_spread_over_the_interval() {
        let units: Vec<f64> = (0..2000).map(|_| jitter_unit()).collect();
        assert!(units.iter().all(|u| (0.0..1.0).contains(u)));
        // Each tenth of the interval gets some: 2,000 draws leave a tenth
        // empty with probability 10 * 0.9^2000, nil.
        for tenth in 0..10 {
            let (lo, hi) = (tenth as f64 / 10.0, (tenth + 1) as f64 / 10.0);
            assert!(units.iter().any(|u| (lo..hi).contains(u)), "no draw in [{lo}, {hi})");
        }
    }
}
