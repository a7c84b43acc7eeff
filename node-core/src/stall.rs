//! The stall clock and the liveness probe: how a node tells a slow owner
//! from a stalled one, and a stalled owner from a dead one. Pure: the
//! shell in `read.rs` feeds the times bytes arrive and the datagram
//! counts of the connection; no timer lives here.
//!
//! - [`StallClock`]: an owner answering a request sends something (chunk
//!   bytes, or a progress frame every progress interval (the fabric's `progress_interval`)) at least
//!   every stall timeout. A transfer that keeps moving, however slowly, is
//!   not a stall (the fetch deadline bounds it). One timer per quiet
//!   period, not one per read: each read notes the time, and a timer that
//!   fires after bytes came is set again from the last of them.
//! - [`Liveness`]: after a stream stalled, whether the other end still
//!   answers. A live peer acknowledges the keep-alive this side sends every
//!   keep-alive interval while nothing else is sent, so some datagram
//!   arrives within two intervals; a dead peer (SIGKILL, a lost host) sends
//!   nothing. A stalled owner is alive and keeps its lease (the asker reads
//!   elsewhere at once); a dead owner's shards move to one survivor (the
//!   asker waits for it).

use std::time::{Duration, Instant};

/// How often the probe looks at the connection's counters.
pub const LIVENESS_SAMPLE: Duration = Duration::from_millis(50);
/// Slack on top of two keep-alive intervals before a silent peer is gone.
pub const LIVENESS_SLACK: Duration = Duration::from_millis(100);

/// The time since the last byte of one stream.
#[derive(Debug, Clone, Copy)]
pub struct StallClock {
    last: Instant,
    timeout: Duration,
}

/// What a stall timer that fired means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerFired {
    /// Bytes came since the timer was set: set it again for this instant.
    Rearm(Instant),
    /// Nothing came for the whole timeout: the stream stalled.
    Stalled,
}

impl StallClock {
    /// A clock started at `now` (the request was sent, or reading began).
    pub fn new(now: Instant, timeout: Duration) -> Self {
        Self { last: now, timeout }
    }

    /// Bytes arrived at `now`.
    pub fn handle_progress(&mut self, now: Instant) {
        self.last = self.last.max(now);
    }

    /// When the stream counts as stalled if nothing more arrives.
    pub fn deadline(&self) -> Instant {
        self.last + self.timeout
    }

    /// The timer set for [`StallClock::deadline`] fired at `now`.
    pub fn handle_timer(&self, now: Instant) -> TimerFired {
        if self.deadline() > now { TimerFired::Rearm(self.deadline()) } else { TimerFired::Stalled }
    }

    /// The stall timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// The probe of whether a connection's other end still answers.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    heard: u64,
    until: Instant,
}

/// The probe's verdict at one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A datagram arrived since the probe began: the peer is alive.
    Answers,
    /// The connection closed, or stayed silent for the whole probe.
    Silent,
    /// Nothing yet: sample again after this long.
    SampleIn(Duration),
}

impl Liveness {
    /// A probe begun at `now`, when `heard` datagrams had been received on
    /// the connection, whose keep-alive interval is `keep_alive`.
    pub fn new(now: Instant, heard: u64, keep_alive: Duration) -> Self {
        Self { heard, until: now + 2 * keep_alive + LIVENESS_SLACK }
    }

    /// A sample at `now`: `heard` datagrams received so far, `closed` when
    /// the connection has closed.
    pub fn sample(&self, now: Instant, heard: u64, closed: bool) -> Verdict {
        if closed {
            Verdict::Silent
        } else if heard > self.heard {
            Verdict::Answers
        } else if now >= self.until {
            Verdict::Silent
        } else {
            Verdict::SampleIn(LIVENESS_SAMPLE.min(self.until - now))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALL: Duration = Duration::from_secs(5);

    #[test]
    fn a_quiet_stream_stalls_after_the_timeout_and_not_before() {
        let t0 = Instant::now();
        let c = StallClock::new(t0, STALL);
        assert_eq!(c.deadline(), t0 + STALL);
        assert_eq!(c.handle_timer(t0 + STALL), TimerFired::Stalled);
        assert_eq!(c.handle_timer(t0 + STALL - Duration::from_millis(1)), TimerFired::Rearm(t0 + STALL));
    }

    #[test]
    fn a_slow_stream_that_keeps_moving_never_stalls() {
        let t0 = Instant::now();
        let mut c = StallClock::new(t0, STALL);
        // A byte every 4.9 s for a minute: each timer finds progress.
        let mut now = t0;
        for _ in 0..12 {
            now += Duration::from_millis(4900);
            c.handle_progress(now);
            assert_eq!(c.handle_timer(now), TimerFired::Rearm(now + STALL));
        }
        assert_eq!(c.handle_timer(now + STALL), TimerFired::Stalled);
    }

    #[test]
    fn one_timer_per_quiet_period_is_set_again_from_the_last_byte() {
        let t0 = Instant::now();
        let mut c = StallClock::new(t0, STALL);
        c.handle_progress(t0 + Duration::from_secs(1));
        c.handle_progress(t0 + Duration::from_secs(3));
        // The first timer fires at t0 + 5 s; bytes came at 3 s.
        assert_eq!(c.handle_timer(t0 + STALL), TimerFired::Rearm(t0 + Duration::from_secs(8)));
        assert_eq!(c.handle_timer(t0 + Duration::from_secs(8)), TimerFired::Stalled);
        // Progress reported out of order never moves the clock back.
        c.handle_progress(t0);
        assert_eq!(c.deadline(), t0 + Duration::from_secs(8));
    }

    #[test]
    fn a_peer_that_acknowledges_anything_is_alive() {
        let t0 = Instant::now();
        let p = Liveness::new(t0, 100, Duration::from_secs(1));
        assert_eq!(p.sample(t0 + Duration::from_millis(50), 100, false), Verdict::SampleIn(LIVENESS_SAMPLE));
        assert_eq!(p.sample(t0 + Duration::from_millis(900), 101, false), Verdict::Answers);
    }

    #[test]
    fn a_peer_silent_for_two_keep_alives_is_gone() {
        let t0 = Instant::now();
        let p = Liveness::new(t0, 100, Duration::from_secs(1));
        let end = t0 + Duration::from_millis(2100);
        assert_eq!(p.sample(end - Duration::from_millis(20), 100, false), Verdict::SampleIn(Duration::from_millis(20)));
        assert_eq!(p.sample(end, 100, false), Verdict::Silent);
    }

    #[test]
    fn a_closed_connection_is_gone_at_once() {
        let t0 = Instant::now();
        let p = Liveness::new(t0, 100, Duration::from_secs(1));
        assert_eq!(p.sample(t0, 100, true), Verdict::Silent);
        assert_eq!(p.sample(t0, 101, true), Verdict::Silent, "closed wins over late datagrams");
    }
}
