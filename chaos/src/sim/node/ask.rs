//! A simulated node's asks of its peers: their answers and failures as
//! the node's link reports them (`PeerError::as_ask_failure`), the stall
//! clock and liveness probe of an ask, the connection's idle timeout, and
//! asks for a held copy.

use super::{Node, Record};
use crate::sim::params::{addr_of, checksum, fabric, fetch_deadline, micros};
use crate::sim::world::{IDLE_TIMEOUT, KEEP_ALIVE, Timer, World};
use granary_node::decide::{Liveness, TimerFired, Verdict};
use granary_node::fabric::{Corruption, LinkFault, PeerError, Stall};
use granary_proto::peer::PEER_STALL_TIMEOUT;
use granary_proto::wire::ErrorKind;
use granary_proto::{ChunkError, ShardId};
use std::time::Duration;

impl Node {
    /// An owner answered `stream`: a chunk with checksum `sum`, or a
    /// refusal (`refused`) or reset (`None`).
    pub(super) fn answered(&mut self, w: &mut World, rec: &mut Record, stream: u64, sum: Option<u64>, refused: bool) {
        if let Some(&(load, _, _)) = self.held_asks.get(&stream) {
            let Some(shard) = self.load_by_id(load) else {
                self.held_asks.remove(&stream);
                return;
            };
            match sum {
                Some(sum) if sum == checksum(shard) => {
                    self.held_asks.remove(&stream);
                    w.log(format_args!("n{} got its s{shard} from the node it was handed over from", self.idx));
                    self.finish(w, rec, shard, sum);
                }
                Some(actual) => {
                    rec.corrupt_caught();
                    let corruption =
                        Corruption::Invalid(ChunkError::PayloadChecksum { expected: checksum(shard), actual });
                    self.held_missing(w, rec, stream, |addr, shard| PeerError::Corrupt { addr, shard, corruption });
                }
                None => {
                    let error = quinn::ReadError::ConnectionLost(quinn::ConnectionError::Reset);
                    let fault = LinkFault::Read { what: "response header", error };
                    self.held_missing(w, rec, stream, |addr, shard| PeerError::Transfer { addr, shard, fault });
                }
            }
            return;
        }
        let Some((load, peer)) = self.asks.get(&stream).map(|a| (a.load, a.peer)) else { return };
        let Some(shard) = self.load_by_id(load) else {
            self.asks.remove(&stream);
            return;
        };
        match sum {
            Some(sum) if sum == checksum(shard) => {
                self.asks.remove(&stream);
                w.log(format_args!("n{} got s{shard} from n{peer}", self.idx));
                self.engine.handle_asked(shard, Ok(()));
                self.finish(w, rec, shard, sum);
            }
            Some(actual) => {
                rec.corrupt_caught();
                let addr = addr_of(peer);
                let corruption = Corruption::Invalid(ChunkError::PayloadChecksum { expected: checksum(shard), actual });
                self.fail_ask(w, rec, stream, |shard| PeerError::Corrupt { addr, shard, corruption });
            }
            None if refused => {
                let (addr, kind) = (addr_of(peer), ErrorKind::Unavailable);
                let message = "a load of the peer asks this node for the shard".to_string();
                self.fail_ask(w, rec, stream, |shard| PeerError::Refused { addr, shard, kind, message });
            }
            None => {
                let addr = addr_of(peer);
                let error = quinn::ReadError::ConnectionLost(quinn::ConnectionError::Reset);
                let fault = LinkFault::Read { what: "response header", error };
                self.fail_ask(w, rec, stream, |shard| PeerError::Transfer { addr, shard, fault });
            }
        }
    }

    /// The ask for a held copy on `stream` gave none, for the peer error
    /// `reason` makes (as the node's link reports it): the load reads
    /// remote storage.
    pub(super) fn held_missing(
        &mut self,
        w: &mut World,
        rec: &mut Record,
        stream: u64,
        reason: impl FnOnce(std::net::SocketAddr, ShardId) -> PeerError,
    ) {
        let Some((load, peer, _)) = self.held_asks.remove(&stream) else { return };
        let Some(shard) = self.load_by_id(load) else { return };
        let reason = reason(addr_of(peer), super::shard_id(shard));
        w.log(format_args!("n{} gets no held copy of s{shard}: {reason}", self.idx));
        self.engine.handle_held(shard, reason);
        self.drive(w, rec, shard);
    }

    /// The load of `shard` left its ask, as the engine said (a newer
    /// placement names this node the owner): its stream is forgotten and
    /// the load routes on.
    pub(super) fn left_ask(&mut self, w: &mut World, rec: &mut Record, shard: u32) {
        if let Some(load) = self.engine.shell_mut(shard) {
            load.ask = None;
        }
        self.engine.handle_ask_left(shard);
        self.drive(w, rec, shard);
    }

    /// The ask on `stream` failed with the peer error `error` makes for its
    /// shard; the engine takes it as the node's link reports it
    /// ([`PeerError::as_ask_failure`]).
    pub(super) fn fail_ask(
        &mut self,
        w: &mut World,
        rec: &mut Record,
        stream: u64,
        error: impl FnOnce(ShardId) -> PeerError,
    ) {
        let Some(ask) = self.asks.remove(&stream) else { return };
        let Some(shard) = self.load_by_id(ask.load) else { return };
        let failure = error(super::shard_id(shard)).into_ask_failure();
        let Some(load) = self.engine.shell_mut(shard) else { return };
        if load.ask.map(|(_, s)| s) != Some(stream) {
            return;
        }
        w.log(format_args!("n{} ask of n{} for s{shard} failed: {failure:?}", self.idx, ask.peer));
        load.ask = None;
        load.failures.push(format!("n{}: {failure:?}", ask.peer));
        self.engine.handle_asked(shard, Err(failure));
        self.drive(w, rec, shard);
    }

    /// The idle timer of the connection `stream` runs on.
    pub(super) fn idle(&mut self, w: &mut World, rec: &mut Record, stream: u64, timer: Timer) {
        let Some(peer) = self.asks.get(&stream).map(|a| a.peer) else { return };
        let deadline = self.last_heard[peer] + IDLE_TIMEOUT;
        if w.now >= deadline {
            let addr = addr_of(peer);
            let error = quinn::ReadError::ConnectionLost(quinn::ConnectionError::TimedOut);
            let fault = LinkFault::Read { what: "chunk bytes", error };
            self.fail_ask(w, rec, stream, |shard| PeerError::Transfer { addr, shard, fault });
        } else {
            w.timer(self.idx, self.life, deadline - w.now, timer);
        }
    }

    /// The handoff wait of the ask for a held copy on `stream`.
    pub(super) fn held_deadline(&mut self, w: &mut World, rec: &mut Record, stream: u64, timer: Timer) {
        // Once the node asked says it is reading the shard, its progress
        // frames keep the ask alive (the stall clock).
        let stall = micros(PEER_STALL_TIMEOUT);
        match self.held_asks.get(&stream).and_then(|a| a.2) {
            Some(at) if w.now < at + stall => w.timer(self.idx, self.life, at + stall - w.now, timer),
            Some(_) => {
                let stall = Stall { idle: PEER_STALL_TIMEOUT, what: "chunk bytes", got: 0, len: 1 };
                self.held_missing(w, rec, stream, |addr, shard| PeerError::Stalled { addr, shard, stall });
            }
            None => {
                let deadline = fabric().handoff_wait;
                self.held_missing(w, rec, stream, |addr, shard| PeerError::Timeout { addr, shard, deadline });
            }
        }
    }

    /// The fetch deadline of the ask on `stream`.
    pub(super) fn ask_deadline(&mut self, w: &mut World, rec: &mut Record, stream: u64) {
        if let Some(peer) = self.asks.get(&stream).map(|a| a.peer) {
            let deadline = fetch_deadline();
            self.fail_ask(w, rec, stream, |shard| PeerError::Timeout { addr: addr_of(peer), shard, deadline });
        }
    }

    pub(super) fn stall_timer(&mut self, w: &mut World, rec: &mut Record, stream: u64) {
        let now = w.instant_now();
        let Some(ask) = self.asks.get_mut(&stream) else { return };
        if ask.probe.is_some() {
            return;
        }
        match ask.clock.handle_timer(now) {
            TimerFired::Rearm(at) => {
                let after = w.micros(at) - w.now;
                w.timer(self.idx, self.life, after, Timer::Stall(stream));
            }
            TimerFired::Stalled => {
                ask.probe = Some(Liveness::new(now, self.heard[ask.peer], Duration::from_micros(KEEP_ALIVE)));
                self.probe(w, rec, stream);
            }
        }
    }

    pub(super) fn probe(&mut self, w: &mut World, rec: &mut Record, stream: u64) {
        let now = w.instant_now();
        let Some(ask) = self.asks.get(&stream) else { return };
        let Some(probe) = ask.probe else { return };
        let closed = w.now.saturating_sub(self.last_heard[ask.peer]) > IDLE_TIMEOUT;
        let (addr, idle) = (addr_of(ask.peer), PEER_STALL_TIMEOUT);
        let stall = Stall { idle, what: "chunk bytes", got: 0, len: 1 };
        match probe.sample(now, self.heard[ask.peer], closed) {
            Verdict::Answers => self.fail_ask(w, rec, stream, |shard| PeerError::Stalled { addr, shard, stall }),
            Verdict::Silent => {
                let fault = LinkFault::Gone(stall);
                self.fail_ask(w, rec, stream, |shard| PeerError::Transfer { addr, shard, fault })
            }
            Verdict::SampleIn(after) => w.timer(self.idx, self.life, micros(after), Timer::Probe(stream)),
        }
    }
}
