//! The relay as a state machine: datagrams in, timed transmits out.
//!
//! [`RelayCore`] holds everything the relay decides with (fault settings,
//! partitions, per-link datagram counters, bandwidth buckets, held-back
//! datagrams, the queue of datagrams waiting for their send time) and no
//! sockets and no clock, in quinn-proto's shape: the shell hands it each
//! datagram with [`RelayCore::handle_datagram`], asks
//! [`RelayCore::poll_transmit`] what is due, and sleeps until
//! [`RelayCore::poll_timeout`]. Time is a `Duration` since the relay started.
//! The payload type is the shell's business (the tests use integers).
//!
//! Order of judgement for a datagram: partition (time), then [`decide`]
//! (index: drop, delay, duplicate, hold), then the bandwidth cap (time). A
//! held datagram is released right after the `after_datagrams`-th later
//! datagram of its link is scheduled, or at its timeout. Datagrams due at the
//! same instant leave in arrival order.

use std::collections::BTreeMap;
use std::time::Duration;

use tracing::debug;

use super::decide::{FaultsError, Link, LinkFaults, PartitionWindow, Partitions, ProcessId, TokenBucket, decide};

/// Bounds on what the core holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoreLimits {
    /// Datagrams waiting for their send time, over all links; one more is
    /// dropped (counted as `overflow`). Default 16,384.
    pub max_queued: usize,
    /// Datagrams held for reordering per link; one more is sent in order.
    /// Default 64.
    pub max_held_per_link: usize,
}

impl Default for CoreLimits {
    fn default() -> Self {
        Self { max_queued: 16_384, max_held_per_link: 64 }
    }
}

/// Counts for one direction of a link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkCounters {
    /// Datagrams that arrived from the sender.
    pub received: u64,
    /// Datagrams handed to the shell to send, copies included.
    pub sent: u64,
    /// Dropped by the drop probability.
    pub dropped: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Given a non-zero extra delay.
    pub delayed: u64,
    /// Held back to be overtaken.
    pub reordered: u64,
    /// Lost to a partition.
    pub partitioned: u64,
    /// Made to wait for the bandwidth cap.
    pub throttled: u64,
    /// Dropped by the bandwidth cap's tail drop.
    pub throttle_dropped: u64,
    /// Dropped because the send queue was full.
    pub overflow: u64,
}

/// A datagram (or copy) due to be sent now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit<T> {
    /// The direction it travels.
    pub link: Link,
    /// Its index on that link.
    pub index: u64,
    /// The shell's payload.
    pub payload: T,
}

#[derive(Debug)]
struct Held<T> {
    index: u64,
    payload: T,
    /// Later datagrams still to pass before it goes.
    remaining: u32,
    /// When it goes if they do not come.
    deadline: Duration,
}

#[derive(Debug)]
struct LinkState<T> {
    next_index: u64,
    bucket: Option<TokenBucket>,
    held: Vec<Held<T>>,
    counters: LinkCounters,
}

impl<T> Default for LinkState<T> {
    fn default() -> Self {
        Self { next_index: 0, bucket: None, held: Vec::new(), counters: LinkCounters::default() }
    }
}

/// The relay's decisions and queues, with no I/O (see the module docs).
#[derive(Debug)]
pub struct RelayCore<T> {
    seed: u64,
    limits: CoreLimits,
    default_faults: LinkFaults,
    faults: BTreeMap<Link, LinkFaults>,
    partitions: Partitions,
    links: BTreeMap<Link, LinkState<T>>,
    /// (due, sequence) → transmit; the sequence keeps arrival order among
    /// equal due times.
    queue: BTreeMap<(Duration, u64), Transmit<T>>,
    sequence: u64,
}

impl<T: Clone> RelayCore<T> {
    /// A core with `default_faults` on every link and the partition
    /// `schedule`, both checked.
    pub fn new(
        seed: u64,
        default_faults: LinkFaults,
        schedule: Vec<PartitionWindow>,
        limits: CoreLimits,
    ) -> Result<Self, FaultsError> {
        default_faults.validate()?;
        Ok(Self {
            seed,
            limits,
            default_faults,
            faults: BTreeMap::new(),
            partitions: Partitions::new(schedule)?,
            links: BTreeMap::new(),
            queue: BTreeMap::new(),
            sequence: 0,
        })
    }

    /// Sets the faults of one direction; later datagrams on it use them.
    /// A new bandwidth cap starts with a full bucket.
    pub fn set_link_faults(&mut self, link: Link, faults: LinkFaults) -> Result<(), FaultsError> {
        faults.validate()?;
        self.faults.insert(link, faults);
        if let Some(state) = self.links.get_mut(&link) {
            state.bucket = None;
        }
        Ok(())
    }

    /// Sets the faults of every direction without its own setting.
    pub fn set_default_faults(&mut self, faults: LinkFaults) -> Result<(), FaultsError> {
        faults.validate()?;
        self.default_faults = faults;
        for (link, state) in &mut self.links {
            if !self.faults.contains_key(link) {
                state.bucket = None;
            }
        }
        Ok(())
    }

    /// The faults `link` runs with.
    pub fn link_faults(&self, link: Link) -> LinkFaults {
        self.faults.get(&link).copied().unwrap_or(self.default_faults)
    }

    /// Cuts `a` → `b`, and `b` → `a` unless `oneway`, until [`RelayCore::heal`].
    pub fn partition(&mut self, a: ProcessId, b: ProcessId, oneway: bool) {
        debug!(%a, %b, oneway, "relay: partition");
        self.partitions.cut(a, b, oneway);
    }

    /// Ends every partition, scheduled or not (fault rates stay).
    pub fn heal(&mut self) {
        debug!("relay: heal");
        self.partitions.heal();
    }

    /// Every link's counters, by link.
    pub fn counters(&self) -> BTreeMap<Link, LinkCounters> {
        self.links.iter().map(|(link, s)| (*link, s.counters)).collect()
    }

    /// Takes one datagram of `len` bytes that arrived on `link` at `now`.
    pub fn handle_datagram(&mut self, now: Duration, link: Link, len: usize, payload: T) {
        let faults = self.link_faults(link);
        let state = self.links.entry(link).or_default();
        let index = state.next_index;
        state.next_index += 1;
        state.counters.received += 1;
        if self.partitions.cuts(link, now) {
            state.counters.partitioned += 1;
            debug!(%link, index, len, "relay: partitioned");
            return;
        }
        let d = decide(self.seed, link, index, &faults);
        if d.drop {
            state.counters.dropped += 1;
            debug!(%link, index, len, "relay: dropped");
            return;
        }
        let wait = match faults.bandwidth {
            None => Duration::ZERO,
            Some(cap) => match state.bucket.get_or_insert_with(|| TokenBucket::new(cap)).admit(now, len) {
                Some(wait) => wait,
                None => {
                    state.counters.throttle_dropped += 1;
                    debug!(%link, index, len, "relay: dropped by the bandwidth cap");
                    return;
                }
            },
        };
        if wait > Duration::ZERO {
            state.counters.throttled += 1;
            debug!(%link, index, len, wait_us = wait.as_micros() as u64, "relay: throttled");
        }
        if d.delay > Duration::ZERO {
            state.counters.delayed += 1;
            debug!(%link, index, len, delay_us = d.delay.as_micros() as u64, "relay: delayed");
        }
        let due = now + wait + d.delay;
        if let Some(copy_delay) = d.duplicate {
            state.counters.duplicated += 1;
            debug!(%link, index, len, copy_delay_us = copy_delay.as_micros() as u64, "relay: duplicated");
        }
        let copy = d.duplicate.map(|copy_delay| (now + wait + copy_delay, payload.clone()));
        let reorder = faults.reorder.filter(|_| state.held.len() < self.limits.max_held_per_link);
        match (d.hold_for, reorder) {
            (Some(remaining), Some(r)) => {
                state.counters.reordered += 1;
                debug!(%link, index, len, after = remaining, "relay: held for reordering");
                state.held.push(Held { index, payload, remaining, deadline: due + r.timeout });
            }
            _ => {
                // Later datagrams that pass count down the held ones; those
                // at zero go right after this one.
                let mut released = Vec::new();
                state.held.retain_mut(|h| {
                    h.remaining -= 1;
                    if h.remaining == 0 {
                        released.push((h.index, h.payload.clone()));
                    }
                    h.remaining > 0
                });
                self.enqueue(due, link, index, payload);
                for (held_index, held) in released {
                    self.enqueue(due, link, held_index, held);
                }
            }
        }
        if let Some((copy_due, copy)) = copy {
            self.enqueue(copy_due, link, index, copy);
        }
    }

    fn enqueue(&mut self, due: Duration, link: Link, index: u64, payload: T) {
        let state = self.links.entry(link).or_default();
        if self.queue.len() >= self.limits.max_queued {
            state.counters.overflow += 1;
            debug!(%link, index, "relay: send queue full, dropped");
            return;
        }
        self.sequence += 1;
        self.queue.insert((due, self.sequence), Transmit { link, index, payload });
    }

    /// Releases held datagrams whose timeout has passed at `now`.
    fn expire_held(&mut self, now: Duration) {
        let mut released = Vec::new();
        for (link, state) in &mut self.links {
            state.held.retain_mut(|h| {
                let expired = h.deadline <= now;
                if expired {
                    released.push((h.deadline, *link, h.index, h.payload.clone()));
                }
                !expired
            });
        }
        for (deadline, link, index, payload) in released {
            self.enqueue(deadline, link, index, payload);
        }
    }

    /// The next datagram due at or before `now`, if any.
    pub fn poll_transmit(&mut self, now: Duration) -> Option<Transmit<T>> {
        self.expire_held(now);
        let entry = self.queue.first_entry()?;
        if entry.key().0 > now {
            return None;
        }
        let t = entry.remove();
        if let Some(state) = self.links.get_mut(&t.link) {
            state.counters.sent += 1;
        }
        Some(t)
    }

    /// When [`RelayCore::poll_transmit`] next has something to give, if ever
    /// (without more datagrams).
    pub fn poll_timeout(&self) -> Option<Duration> {
        let queued = self.queue.first_key_value().map(|((due, _), _)| *due);
        let held = self.links.values().flat_map(|s| s.held.iter().map(|h| h.deadline)).min();
        queued.into_iter().chain(held).min()
    }
}

#[cfg(test)]
mod tests {
    use super::super::decide::{Bandwidth, DelayRange, Reorder};
    use super::*;

    const AB: Link = Link::new(0, 1);
    const BA: Link = Link::new(1, 0);

    fn core(faults: LinkFaults) -> RelayCore<u64> {
        RelayCore::new(9, faults, Vec::new(), CoreLimits::default()).expect("valid faults")
    }

    /// Everything due by `now`, as (link, payload).
    fn drain(c: &mut RelayCore<u64>, now: Duration) -> Vec<(Link, u64)> {
        std::iter::from_fn(|| c.poll_transmit(now)).map(|t| (t.link, t.payload)).collect()
    }

    #[test]
    fn no_faults_pass_everything_at_once_in_order() {
        let mut c = core(LinkFaults::NONE);
        for i in 0..100 {
            c.handle_datagram(Duration::ZERO, AB, 10, i);
        }
        assert_eq!(drain(&mut c, Duration::ZERO), (0..100).map(|i| (AB, i)).collect::<Vec<_>>());
        assert_eq!(c.poll_timeout(), None);
        let n = c.counters()[&AB];
        assert_eq!((n.received, n.sent), (100, 100));
    }

    #[test]
    fn delay_holds_until_due() {
        let ms = Duration::from_millis;
        let mut c = core(LinkFaults { delay: DelayRange { min: ms(20), max: ms(20) }, ..LinkFaults::NONE });
        c.handle_datagram(ms(5), AB, 10, 1);
        assert_eq!(c.poll_timeout(), Some(ms(25)));
        assert_eq!(drain(&mut c, ms(24)), []);
        assert_eq!(drain(&mut c, ms(25)), [(AB, 1)]);
        assert_eq!(c.counters()[&AB].delayed, 1);
    }

    #[test]
    fn duplicates_are_extra_copies() {
        let mut c = core(LinkFaults { duplicate: 1.0, ..LinkFaults::NONE });
        for i in 0..5 {
            c.handle_datagram(Duration::ZERO, AB, 10, i);
        }
        let got = drain(&mut c, Duration::ZERO);
        assert_eq!(got.len(), 10);
        assert_eq!(c.counters()[&AB].duplicated, 5);
        assert_eq!(c.counters()[&AB].sent, 10);
    }

    #[test]
    fn reordered_datagram_is_overtaken_by_n_later_ones() {
        let reorder = Some(Reorder { probability: 1.0, after_datagrams: 2, timeout: Duration::from_secs(1) });
        let mut c = core(LinkFaults { reorder, ..LinkFaults::NONE });
        // With probability 1 every datagram is held while there is room, so
        // use a held limit of one: the first is held, the rest pass it.
        c.limits.max_held_per_link = 1;
        for i in 0..4 {
            c.handle_datagram(Duration::ZERO, AB, 10, i);
        }
        assert_eq!(drain(&mut c, Duration::ZERO), [(AB, 1), (AB, 2), (AB, 0)]);
        assert_eq!(c.counters()[&AB].reordered, 2, "0 and then 3 were held");
        // 3 is held, nothing overtakes it: it goes at its timeout.
        assert_eq!(c.poll_timeout(), Some(Duration::from_secs(1)));
        assert_eq!(drain(&mut c, Duration::from_secs(1)), [(AB, 3)]);
    }

    #[test]
    fn partitions_cut_by_schedule_and_at_runtime() {
        let ms = Duration::from_millis;
        let window = PartitionWindow { a: ProcessId(0), b: ProcessId(1), oneway: true, start: ms(10), end: ms(20) };
        let mut c = RelayCore::new(1, LinkFaults::NONE, vec![window], CoreLimits::default()).expect("valid");
        for t in [9, 10, 19, 20] {
            c.handle_datagram(ms(t), AB, 10, t);
            c.handle_datagram(ms(t), BA, 10, t);
        }
        assert_eq!(drain(&mut c, ms(20)), [(AB, 9), (BA, 9), (BA, 10), (BA, 19), (AB, 20), (BA, 20)]);
        assert_eq!(c.counters()[&AB].partitioned, 2);
        c.partition(ProcessId(1), ProcessId(0), false);
        c.handle_datagram(ms(30), BA, 10, 30);
        c.handle_datagram(ms(30), AB, 10, 30);
        assert_eq!(drain(&mut c, ms(30)), []);
        c.heal();
        c.handle_datagram(ms(40), AB, 10, 40);
        assert_eq!(drain(&mut c, ms(40)), [(AB, 40)]);
    }

    #[test]
    fn bandwidth_cap_spaces_datagrams() {
        let cap = Bandwidth { bytes_per_sec: 100_000, burst_bytes: 1000, max_queue: Duration::from_millis(25) };
        let mut c = core(LinkFaults { bandwidth: Some(cap), ..LinkFaults::NONE });
        for i in 0..5 {
            c.handle_datagram(Duration::ZERO, AB, 1000, i);
        }
        // 1000 bytes at 100 kB/s is 10 ms each: 0 now, 1 at 10 ms, 2 at 20,
        // 3 would wait 30 ms > 25 and is dropped, and so is 4.
        assert_eq!(drain(&mut c, Duration::ZERO), [(AB, 0)]);
        assert_eq!(drain(&mut c, Duration::from_millis(20)), [(AB, 1), (AB, 2)]);
        let n = c.counters()[&AB];
        assert_eq!((n.throttled, n.throttle_dropped), (2, 2));
    }

    #[test]
    fn full_queue_drops_and_counts() {
        let mut c = RelayCore::new(1, LinkFaults::NONE, Vec::new(), CoreLimits { max_queued: 3, max_held_per_link: 1 })
            .expect("valid");
        for i in 0..5 {
            c.handle_datagram(Duration::ZERO, AB, 10, i);
        }
        assert_eq!(drain(&mut c, Duration::ZERO).len(), 3);
        assert_eq!(c.counters()[&AB].overflow, 2);
    }

    #[test]
    fn one_links_traffic_does_not_change_anothers_fate() {
        let faults = LinkFaults {
            drop: 0.2,
            duplicate: 0.1,
            delay: DelayRange { min: Duration::ZERO, max: Duration::from_millis(10) },
            ..LinkFaults::NONE
        };
        let fate_of_ab = |other_traffic: u64| {
            let mut c = core(faults);
            for i in 0..200 {
                for j in 0..other_traffic {
                    c.handle_datagram(Duration::from_micros(i * 100 + j), BA, 10, 1000 + j);
                }
                c.handle_datagram(Duration::from_micros(i * 100), AB, 10, i);
            }
            let mut got = drain(&mut c, Duration::from_secs(1));
            got.retain(|(link, _)| *link == AB);
            got
        };
        assert_eq!(fate_of_ab(0), fate_of_ab(3));
    }
}
