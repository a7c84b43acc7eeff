//! What happens to each datagram on a link: the pure decisions.
//!
//! [`decide`] draws a datagram's fate (drop, delay, duplicate, hold for
//! reordering) from a generator seeded by (relay seed, source, destination,
//! datagram index) alone. One link's traffic therefore cannot change another
//! link's decisions, and the n-th datagram on a link meets the same fate in
//! every run with the same seed, however the processes' timing differs. Every
//! draw is made whatever the fault rates, in a fixed order, so changing one
//! rate (say, duplication) leaves the other decisions (drops, delays) as they
//! were.
//!
//! Partitions and the bandwidth cap depend on time, not on the index:
//! [`Partitions`] answers whether a link is cut at an instant (a schedule
//! relative to the relay's start, plus cuts made at runtime), and
//! [`TokenBucket`] says how long a datagram waits for its share of the
//! link. Both take the time as an argument and read no clock.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use granary_proto::rng::{Rng, seed_of};
use thiserror::Error;

/// A process behind the relay: its index in the relay's process list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcessId(pub u32);

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}

/// One direction between two processes: datagrams `from` sends to `to`.
/// Faults, partitions and counters are all per direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Link {
    /// The sender.
    pub from: ProcessId,
    /// The receiver.
    pub to: ProcessId,
}

impl Link {
    /// The direction `from` → `to`.
    pub const fn new(from: u32, to: u32) -> Self {
        Self { from: ProcessId(from), to: ProcessId(to) }
    }

    /// The opposite direction.
    pub const fn reversed(self) -> Self {
        Self { from: self.to, to: self.from }
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}->{}", self.from, self.to)
    }
}

/// A uniform range of extra one-way delay. `min == max` is a fixed delay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DelayRange {
    /// The least delay added.
    pub min: Duration,
    /// The most delay added (inclusive).
    pub max: Duration,
}

/// Reordering: a chosen datagram is held back until `after_datagrams` later
/// datagrams on its link have been passed on, or until `timeout` (counted
/// from when it would otherwise have gone) if they do not come.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Reorder {
    /// Chance that a datagram is held, 0.0 to 1.0.
    pub probability: f64,
    /// How many later datagrams overtake it; at least 1.
    pub after_datagrams: u32,
    /// The longest it is held.
    pub timeout: Duration,
}

/// A bandwidth cap: a token bucket that queues datagrams (never reorders
/// them) and drops one that would wait longer than `max_queue`, as a
/// router's tail drop would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bandwidth {
    /// Sustained rate; non-zero.
    pub bytes_per_sec: u64,
    /// Bytes that may go at once after an idle spell.
    pub burst_bytes: u64,
    /// The longest a datagram may wait for the link before it is dropped.
    pub max_queue: Duration,
}

/// The faults of one direction of one link. The default is none.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct LinkFaults {
    /// Chance that a datagram is dropped, 0.0 to 1.0.
    pub drop: f64,
    /// Chance that a datagram is sent twice, 0.0 to 1.0; the copy draws its
    /// own delay from [`LinkFaults::delay`].
    pub duplicate: f64,
    /// Extra one-way delay of every datagram.
    pub delay: DelayRange,
    /// Reordering, if any.
    pub reorder: Option<Reorder>,
    /// Bandwidth cap, if any.
    pub bandwidth: Option<Bandwidth>,
}

/// A fault setting the relay refuses.
#[derive(Debug, Error, PartialEq)]
pub enum FaultsError {
    /// A probability outside 0.0..=1.0 (or NaN).
    #[error("{field} probability {value} is outside 0.0..=1.0")]
    Probability {
        /// Which setting.
        field: &'static str,
        /// Its value.
        value: f64,
    },
    /// A delay range whose minimum exceeds its maximum.
    #[error("delay range min {min:?} exceeds max {max:?}")]
    DelayRange {
        /// The minimum given.
        min: Duration,
        /// The maximum given.
        max: Duration,
    },
    /// Reordering that lets no datagram overtake.
    #[error("reorder after_datagrams must be at least 1")]
    ReorderAfterZero,
    /// A bandwidth cap of zero bytes per second.
    #[error("bandwidth bytes_per_sec must be non-zero")]
    ZeroBandwidth,
    /// A partition window that ends before it starts.
    #[error("partition window {link} ends at {end:?}, before its start {start:?}")]
    PartitionWindow {
        /// One direction the window cuts.
        link: Link,
        /// Its start.
        start: Duration,
        /// Its end.
        end: Duration,
    },
}

impl LinkFaults {
    /// No faults: every datagram passes at once.
    pub const NONE: LinkFaults = LinkFaults {
        drop: 0.0,
        duplicate: 0.0,
        delay: DelayRange { min: Duration::ZERO, max: Duration::ZERO },
        reorder: None,
        bandwidth: None,
    };

    /// Drops each datagram with probability `p`, nothing else.
    pub fn lossy(p: f64) -> Self {
        Self { drop: p, ..Self::NONE }
    }

    /// Checks every setting is in range.
    pub fn validate(&self) -> Result<(), FaultsError> {
        let probability = |field, value: f64| {
            if (0.0..=1.0).contains(&value) { Ok(()) } else { Err(FaultsError::Probability { field, value }) }
        };
        probability("drop", self.drop)?;
        probability("duplicate", self.duplicate)?;
        if self.delay.min > self.delay.max {
            return Err(FaultsError::DelayRange { min: self.delay.min, max: self.delay.max });
        }
        if let Some(r) = self.reorder {
            probability("reorder", r.probability)?;
            if r.after_datagrams == 0 {
                return Err(FaultsError::ReorderAfterZero);
            }
        }
        if self.bandwidth.is_some_and(|b| b.bytes_per_sec == 0) {
            return Err(FaultsError::ZeroBandwidth);
        }
        Ok(())
    }
}

/// What [`decide`] chose for one datagram (before partitions and the
/// bandwidth cap, which depend on time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The datagram is lost.
    pub drop: bool,
    /// Extra delay before it is sent.
    pub delay: Duration,
    /// A second copy is sent after this delay.
    pub duplicate: Option<Duration>,
    /// It is held until this many later datagrams have passed.
    pub hold_for: Option<u32>,
}

/// Domain tag so these draws never coincide with another use of the seed.
const DOMAIN: u64 = u64::from_le_bytes(*b"relay\0v1");

/// The fate of datagram number `index` (from 0) on `link`, a pure function
/// of its arguments.
pub fn decide(seed: u64, link: Link, index: u64, faults: &LinkFaults) -> Decision {
    let mut rng = Rng::new(seed_of(&[DOMAIN, seed, u64::from(link.from.0), u64::from(link.to.0), index]));
    // Always five draws in this order, whatever the rates (see module docs).
    let (u_drop, u_dup, u_delay, u_dup_delay, u_reorder) =
        (rng.next_u64(), rng.next_u64(), rng.next_u64(), rng.next_u64(), rng.next_u64());
    let drop = chance(u_drop, faults.drop);
    Decision {
        drop,
        delay: within(u_delay, faults.delay),
        duplicate: (!drop && chance(u_dup, faults.duplicate)).then(|| within(u_dup_delay, faults.delay)),
        hold_for: faults.reorder.filter(|r| !drop && chance(u_reorder, r.probability)).map(|r| r.after_datagrams),
    }
}

/// True with probability `p` for a uniform `u`.
fn chance(u: u64, p: f64) -> bool {
    // 53 uniform bits as a float in [0, 1): p = 1.0 is always true, 0.0 never.
    ((u >> 11) as f64 / (1u64 << 53) as f64) < p
}

/// A point of `range` for a uniform `u`, to the nanosecond.
fn within(u: u64, range: DelayRange) -> Duration {
    let span = range.max.saturating_sub(range.min).as_nanos().min(u128::from(u64::MAX)) as u64;
    // Multiply-high maps u onto 0..=span with a bias below 2^-64 per value
    // and, unlike rejection, always takes exactly one draw.
    let offset = ((u128::from(u) * (u128::from(span) + 1)) >> 64) as u64;
    range.min + Duration::from_nanos(offset)
}

/// A scheduled cut between two processes: from `start` (inclusive) to `end`
/// (exclusive), measured from the relay's start. Both directions unless
/// `oneway`, which cuts only `a` → `b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionWindow {
    /// One side (the sender, if `oneway`).
    pub a: ProcessId,
    /// The other side.
    pub b: ProcessId,
    /// Cut only `a` → `b`.
    pub oneway: bool,
    /// When the cut begins.
    pub start: Duration,
    /// When it heals.
    pub end: Duration,
}

impl PartitionWindow {
    /// Whether this window cuts `link` at `elapsed`.
    pub fn cuts(&self, link: Link, elapsed: Duration) -> bool {
        let forward = link.from == self.a && link.to == self.b;
        let backward = !self.oneway && link.from == self.b && link.to == self.a;
        (forward || backward) && self.start <= elapsed && elapsed < self.end
    }
}

/// Every cut in force: a schedule fixed at start, and cuts made at runtime.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Partitions {
    schedule: Vec<PartitionWindow>,
    manual: BTreeSet<Link>,
}

impl Partitions {
    /// The scheduled windows, checked.
    pub fn new(schedule: Vec<PartitionWindow>) -> Result<Self, FaultsError> {
        if let Some(w) = schedule.iter().find(|w| w.end < w.start) {
            return Err(FaultsError::PartitionWindow { link: Link { from: w.a, to: w.b }, start: w.start, end: w.end });
        }
        Ok(Self { schedule, manual: BTreeSet::new() })
    }

    /// Cuts `a` → `b`, and `b` → `a` unless `oneway`, until [`Partitions::heal`].
    pub fn cut(&mut self, a: ProcessId, b: ProcessId, oneway: bool) {
        self.manual.insert(Link { from: a, to: b });
        if !oneway {
            self.manual.insert(Link { from: b, to: a });
        }
    }

    /// Ends every cut: the runtime ones and the rest of the schedule.
    pub fn heal(&mut self) {
        self.manual.clear();
        self.schedule.clear();
    }

    /// Whether `link` is cut at `elapsed`.
    pub fn cuts(&self, link: Link, elapsed: Duration) -> bool {
        self.manual.contains(&link) || self.schedule.iter().any(|w| w.cuts(link, elapsed))
    }
}

/// A token bucket in virtual time. Tokens may go negative: the debt is the
/// queue ahead of the next datagram, so datagrams leave in arrival order at
/// the capped rate.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenBucket {
    cap: Bandwidth,
    /// Bytes available at `at` (negative: queued bytes not yet sent).
    tokens: f64,
    at: Duration,
}

impl TokenBucket {
    /// A full bucket at time zero.
    pub fn new(cap: Bandwidth) -> Self {
        Self { cap, tokens: cap.burst_bytes as f64, at: Duration::ZERO }
    }

    /// How long a datagram of `len` bytes arriving at `now` waits for the
    /// link, or `None` if that is longer than the cap's `max_queue` (the
    /// datagram is then dropped and takes no share of the link).
    pub fn admit(&mut self, now: Duration, len: usize) -> Option<Duration> {
        let rate = self.cap.bytes_per_sec as f64;
        if now > self.at {
            self.tokens = (self.tokens + (now - self.at).as_secs_f64() * rate).min(self.cap.burst_bytes as f64);
            self.at = now;
        }
        let after = self.tokens - len as f64;
        let wait = if after >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-after / rate) };
        if wait > self.cap.max_queue {
            return None;
        }
        self.tokens = after;
        Some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lots() -> LinkFaults {
        LinkFaults {
            drop: 0.1,
            duplicate: 0.05,
            delay: DelayRange { min: Duration::from_millis(5), max: Duration::from_millis(15) },
            reorder: Some(Reorder { probability: 0.02, after_datagrams: 3, timeout: Duration::from_millis(50) }),
            bandwidth: None,
        }
    }

    #[test]
    fn same_seed_same_decisions() {
        let f = lots();
        let run = |seed| (0..1000).map(|i| decide(seed, Link::new(0, 1), i, &f)).collect::<Vec<_>>();
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn links_and_directions_draw_independently() {
        let f = lots();
        let on = |link| (0..200).map(|i| decide(3, link, i, &f)).collect::<Vec<_>>();
        assert_ne!(on(Link::new(0, 1)), on(Link::new(1, 0)));
        assert_ne!(on(Link::new(0, 1)), on(Link::new(0, 2)));
    }

    #[test]
    fn changing_one_rate_keeps_the_other_decisions() {
        let base = lots();
        let more_dups = LinkFaults { duplicate: 0.5, ..base };
        for i in 0..1000 {
            let (a, b) = (decide(1, Link::new(2, 3), i, &base), decide(1, Link::new(2, 3), i, &more_dups));
            assert_eq!((a.drop, a.delay, a.hold_for), (b.drop, b.delay, b.hold_for), "datagram {i}");
        }
    }

    #[test]
    fn rates_are_honoured_over_10k_datagrams() {
        let f = lots();
        let n = 10_000u64;
        let d: Vec<_> = (0..n).map(|i| decide(42, Link::new(0, 1), i, &f)).collect();
        let frac = |count: usize| count as f64 / n as f64;
        let drops = frac(d.iter().filter(|d| d.drop).count());
        // Duplication and holding are drawn only for datagrams not dropped.
        let kept = d.iter().filter(|d| !d.drop).count() as f64;
        let dups = d.iter().filter(|d| d.duplicate.is_some()).count() as f64 / kept;
        let holds = d.iter().filter(|d| d.hold_for.is_some()).count() as f64 / kept;
        // Four standard deviations of a binomial at n = 10,000.
        assert!((drops - 0.1).abs() < 0.012, "drop rate {drops}");
        assert!((dups - 0.05).abs() < 0.01, "duplicate rate {dups}");
        assert!((holds - 0.02).abs() < 0.006, "hold rate {holds}");
        let (min, max) = (Duration::from_millis(5), Duration::from_millis(15));
        assert!(d.iter().all(|d| (min..=max).contains(&d.delay)));
        let mean = d.iter().map(|d| d.delay.as_secs_f64()).sum::<f64>() / n as f64;
        assert!((mean - 0.010).abs() < 0.0002, "mean delay {mean}");
        assert!(d.iter().all(|d| d.hold_for.is_none_or(|n| n == 3)));
    }

    #[test]
    fn extremes_are_exact() {
        let all = LinkFaults { drop: 1.0, ..LinkFaults::NONE };
        let none = LinkFaults { duplicate: 1.0, ..LinkFaults::NONE };
        for i in 0..1000 {
            assert!(decide(5, Link::new(0, 1), i, &all).drop);
            let d = decide(5, Link::new(0, 1), i, &none);
            assert_eq!(
                d,
                Decision { drop: false, delay: Duration::ZERO, duplicate: Some(Duration::ZERO), hold_for: None }
            );
            assert_eq!(
                decide(5, Link::new(0, 1), i, &LinkFaults::NONE),
                Decision { drop: false, delay: Duration::ZERO, duplicate: None, hold_for: None }
            );
        }
    }

    #[test]
    fn decisions_are_frozen() {
        // If this fails, every recorded chaos seed replays differently.
        let d: Vec<bool> = (0..16).map(|i| decide(2026, Link::new(1, 2), i, &LinkFaults::lossy(0.5)).drop).collect();
        let bits: u16 = d.iter().enumerate().map(|(i, &b)| u16::from(b) << i).sum();
        assert_eq!(bits, FROZEN_DROPS_2026, "{bits:#06x}");
    }

    const FROZEN_DROPS_2026: u16 = 0xba28;

    #[test]
    fn invalid_settings_are_refused() {
        assert_eq!(LinkFaults::lossy(1.5).validate(), Err(FaultsError::Probability { field: "drop", value: 1.5 }));
        assert!(matches!(LinkFaults::lossy(f64::NAN).validate(), Err(FaultsError::Probability { .. })));
        let backwards = DelayRange { min: Duration::from_millis(2), max: Duration::from_millis(1) };
        assert!(matches!(
            LinkFaults { delay: backwards, ..LinkFaults::NONE }.validate(),
            Err(FaultsError::DelayRange { .. })
        ));
        let reorder = Some(Reorder { probability: 0.1, after_datagrams: 0, timeout: Duration::ZERO });
        assert_eq!(LinkFaults { reorder, ..LinkFaults::NONE }.validate(), Err(FaultsError::ReorderAfterZero));
        let bandwidth = Some(Bandwidth { bytes_per_sec: 0, burst_bytes: 1, max_queue: Duration::ZERO });
        assert_eq!(LinkFaults { bandwidth, ..LinkFaults::NONE }.validate(), Err(FaultsError::ZeroBandwidth));
        assert_eq!(lots().validate(), Ok(()));
        let w = PartitionWindow {
            a: ProcessId(0),
            b: ProcessId(1),
            oneway: false,
            start: Duration::from_secs(2),
            end: Duration::from_secs(1),
        };
        assert!(matches!(Partitions::new(vec![w]), Err(FaultsError::PartitionWindow { .. })));
    }

    #[test]
    fn partition_windows_are_exact() {
        let ms = Duration::from_millis;
        let both = PartitionWindow { a: ProcessId(0), b: ProcessId(1), oneway: false, start: ms(100), end: ms(200) };
        let oneway = PartitionWindow { a: ProcessId(2), b: ProcessId(0), oneway: true, start: ms(150), end: ms(151) };
        let p = Partitions::new(vec![both, oneway]).expect("valid windows");
        for link in [Link::new(0, 1), Link::new(1, 0)] {
            assert!(!p.cuts(link, ms(100) - Duration::from_nanos(1)));
            assert!(p.cuts(link, ms(100)));
            assert!(p.cuts(link, ms(200) - Duration::from_nanos(1)));
            assert!(!p.cuts(link, ms(200)));
        }
        assert!(!p.cuts(Link::new(0, 2), ms(150)));
        assert!(!p.cuts(Link::new(2, 1), ms(150)));
        assert!(p.cuts(Link::new(2, 0), ms(150)));
        assert!(!p.cuts(Link::new(0, 2), ms(150)));
        assert!(!p.cuts(Link::new(2, 0), ms(151)));
    }

    #[test]
    fn runtime_cuts_and_heal() {
        let window = PartitionWindow {
            a: ProcessId(0),
            b: ProcessId(1),
            oneway: false,
            start: Duration::ZERO,
            end: Duration::from_secs(60),
        };
        let mut p = Partitions::new(vec![window]).expect("valid window");
        p.cut(ProcessId(1), ProcessId(2), true);
        assert!(p.cuts(Link::new(1, 2), Duration::from_secs(1000)));
        assert!(!p.cuts(Link::new(2, 1), Duration::from_secs(1000)));
        p.cut(ProcessId(3), ProcessId(4), false);
        assert!(p.cuts(Link::new(4, 3), Duration::ZERO));
        p.heal();
        for link in [Link::new(0, 1), Link::new(1, 2), Link::new(4, 3)] {
            assert!(!p.cuts(link, Duration::from_secs(1)), "{link}");
        }
    }

    #[test]
    fn token_bucket_spaces_datagrams_at_the_rate_and_tail_drops() {
        let cap = Bandwidth { bytes_per_sec: 1_000_000, burst_bytes: 3000, max_queue: Duration::from_millis(10) };
        let mut b = TokenBucket::new(cap);
        let at0: Vec<_> = (0..14).map(|_| b.admit(Duration::ZERO, 1000)).collect();
        // Three go at once (the burst), then one per millisecond, up to 10 ms.
        let ms = |n| Some(Duration::from_millis(n));
        assert_eq!(&at0[..3], &[ms(0), ms(0), ms(0)]);
        for (i, wait) in at0[3..13].iter().enumerate() {
            let want = Duration::from_millis(i as u64 + 1);
            assert!(wait.is_some_and(|w| w.abs_diff(want) < Duration::from_micros(1)), "{i}: {wait:?}");
        }
        assert_eq!(at0[13], None, "an 11 ms wait exceeds max_queue and is dropped");
        // After an idle second the bucket is full again, not fuller.
        let later = Duration::from_secs(1);
        assert_eq!(
            (0..4).map(|_| b.admit(later, 1000).map(|w| w > Duration::ZERO)).collect::<Vec<_>>(),
            [Some(false), Some(false), Some(false), Some(true)]
        );
    }
}
