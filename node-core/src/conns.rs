//! The local socket's connection table as a pure core: which connections
//! the node holds, which of them wait idle for their next request, and
//! what to do when one more arrives at the cap. No tokio, no clock: every
//! input carries `now`, and the tests drive it on a virtual clock.
//!
//! The rule at the cap (`max_connections`): a new connection is accepted
//! and the connection idle the longest is closed to make room; only when
//! every connection is busy (inside a request) is the new one refused. So
//! a process that opens connections and sends nothing cannot lock a
//! trainer out: its connections are the idle ones, closed first (a trainer
//! whose idle connection is closed reconnects and announces its plan
//! again: `granary_client`'s reconnect). Idle and write deadlines are the
//! shell's timers (`granary_node::daemon`); this table only orders.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The local socket's limits (`max_connections`, `idle_timeout_ms`,
/// `write_timeout_ms` in node.toml).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketLimits {
    /// Connections held at once.
    pub max_connections: usize,
    /// A connection that sends no request for this long is closed (the
    /// client reconnects when it next needs the node).
    pub idle_timeout: Duration,
    /// A reply the client does not read within this long closes the
    /// connection.
    pub write_timeout: Duration,
}

impl Default for SocketLimits {
    fn default() -> Self {
        Self { max_connections: 1024, idle_timeout: Duration::from_secs(600), write_timeout: Duration::from_secs(30) }
    }
}

/// A connection's number in the table, unique for the node's life.
pub type ConnId = u64;

/// What to do with a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Serve it as `id`; first close `evict` (the longest idle), if any.
    Accepted {
        /// The new connection's id.
        id: ConnId,
        /// The connection to close to make room.
        evict: Option<ConnId>,
    },
    /// Every one of the `open` connections is inside a request: refuse it.
    Refused {
        /// Connections held.
        open: usize,
    },
}

/// The table. See the module docs for the rule.
#[derive(Debug)]
pub struct ConnTable {
    cap: usize,
    next: ConnId,
    /// Each connection, with when it began to wait idle (`None`: inside a
    /// request).
    conns: BTreeMap<ConnId, Option<Instant>>,
}

impl ConnTable {
    /// An empty table holding at most `cap` connections (at least one).
    pub fn new(cap: usize) -> Self {
        Self { cap: cap.max(1), next: 0, conns: BTreeMap::new() }
    }

    /// Connections held.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether no connection is held.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// A connection arrived at `now`: accepted (waiting idle for its first
    /// request), possibly in place of the longest-idle one, or refused.
    pub fn handle_open(&mut self, now: Instant) -> Admit {
        let mut evict = None;
        if self.conns.len() >= self.cap {
            // The longest idle; ties go to the older connection.
            let idlest = self.conns.iter().filter_map(|(&id, &since)| since.map(|s| (s, id))).min();
            match idlest {
                Some((_, id)) => {
                    self.conns.remove(&id);
                    evict = Some(id);
                }
                None => return Admit::Refused { open: self.conns.len() },
            }
        }
        let id = self.next;
        self.next += 1;
        self.conns.insert(id, Some(now));
        Admit::Accepted { id, evict }
    }

    /// Connection `id` read a request and is serving it.
    pub fn handle_busy(&mut self, id: ConnId) {
        if let Some(since) = self.conns.get_mut(&id) {
            *since = None;
        }
    }

    /// Connection `id` answered and waits for its next request from `now`.
    pub fn handle_idle(&mut self, id: ConnId, now: Instant) {
        if let Some(since) = self.conns.get_mut(&id) {
            *since = Some(now);
        }
    }

    /// Connection `id` ended (or was evicted: then it is already gone).
    pub fn handle_closed(&mut self, id: ConnId) {
        self.conns.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepted(a: Admit) -> (ConnId, Option<ConnId>) {
        match a {
            Admit::Accepted { id, evict } => (id, evict),
            other => panic!("refused: {other:?}"),
        }
    }

    /// Up to the cap every connection is accepted; past it the one idle
    /// the longest makes room, a busy one never does, and with every
    /// connection busy the new one is refused.
    #[test]
    fn at_the_cap_the_longest_idle_connection_makes_room_and_busy_ones_never_do() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut table = ConnTable::new(3);
        let ids: Vec<ConnId> = (0..3).map(|i| accepted(table.handle_open(at(i))).0).collect();
        assert_eq!(ids, [0, 1, 2]);
        // Three more: each takes the place of the idlest, 0, 1, 2 in turn.
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(accepted(table.handle_open(at(10 + i as u64))), (3 + id, Some(id)));
        }
        assert_eq!(table.len(), 3);
        let mut table = ConnTable::new(3);
        let (a, _) = accepted(table.handle_open(at(0)));
        let (b, _) = accepted(table.handle_open(at(1)));
        let (c, _) = accepted(table.handle_open(at(2)));
        // a is serving a request; b answered last at 50, c at 40.
        table.handle_busy(a);
        table.handle_busy(b);
        table.handle_idle(b, at(50));
        table.handle_busy(c);
        table.handle_idle(c, at(40));
        assert_eq!(accepted(table.handle_open(at(60))), (3, Some(c)), "c idle the longest");
        assert_eq!(accepted(table.handle_open(at(61))), (4, Some(b)), "then b");
        // Now a (busy) and 3 and 4 (idle since 60, 61).
        table.handle_busy(3);
        table.handle_busy(4);
        assert_eq!(table.handle_open(at(70)), Admit::Refused { open: 3 }, "every connection busy");
        table.handle_closed(a);
        assert_eq!(accepted(table.handle_open(at(71))), (5, None), "a slot came back");
        assert_eq!(table.len(), 3);
    }

    /// A flood of idle connections never holds the table: each new one is
    /// accepted, and the table stays at the cap.
    #[test]
    fn a_flood_of_idle_connections_stays_at_the_cap() {
        let t0 = Instant::now();
        let mut table = ConnTable::new(16);
        for i in 0..10_000u64 {
            let (id, evict) = accepted(table.handle_open(t0 + Duration::from_micros(i)));
            assert_eq!(id, i);
            assert_eq!(evict, i.checked_sub(16), "the oldest idle goes first");
            assert!(table.len() <= 16);
        }
    }
}
