//! A simulated node's loads: the trainer's requests and peers', admitted
//! by the engine, and each load's commands executed on the simulated
//! clock and network (asks, waits, the permit queue, remote reads), then
//! its chunk handed to whoever waits.

use super::{Ask, Node, Record, SimLoad, View, Waiter, index_of, node_of};
use crate::sim::params::{checksum, down_for, handoff_wait, micros};
use crate::sim::world::{Addr, IDLE_TIMEOUT, Msg, Timer, World, ms};
use granary_node::decide::{
    Admitted, AfterPermit, Asker, AwaitOutcome, Command, Permit, Placement, StallClock, moved_away,
};
use granary_proto::peer::{PEER_PROGRESS_INTERVAL, PEER_STALL_TIMEOUT};

impl Node {
    /// The trainer issues requests up to its window, epoch by epoch.
    pub(super) fn trainer(&mut self, w: &mut World, rec: &mut Record) {
        if w.now < self.busy_until {
            let after = self.busy_until - w.now;
            w.timer(self.idx, self.life, after, Timer::Trainer);
            return;
        }
        while !self.finished() && self.in_flight.len() < w.swarm.window && w.now >= self.busy_until {
            let epoch = &self.plan[self.epoch];
            if self.next_req >= epoch.len() {
                if self.in_flight.is_empty() {
                    w.log(format_args!("n{} trainer finished epoch {}", self.idx, self.epoch));
                    rec.epoch_done(self.idx, self.epoch, w.now);
                    self.epoch += 1;
                    self.next_req = 0;
                    continue;
                }
                break;
            }
            let shard = epoch[self.next_req];
            let req = rec.request_id(self.idx, self.epoch, self.next_req);
            self.next_req += 1;
            if rec.was_delivered(req) {
                continue;
            }
            self.in_flight.insert(req, shard);
            rec.issued_for(self.idx, shard, req, w.now);
            self.request(w, rec, shard, Waiter::Trainer(req), 0);
        }
    }

    /// A request for `shard` from the trainer or a peer (which placement
    /// epoch `epoch` told this node owns it).
    pub(super) fn request(&mut self, w: &mut World, rec: &mut Record, shard: u32, waiter: Waiter, epoch: u64) {
        if self.held.contains_key(&shard) {
            self.hand(w, rec, shard, waiter, checksum(shard));
            return;
        }
        let asker = match waiter {
            Waiter::Trainer(_) => Asker::Trainer,
            Waiter::Peer(p, _) => Asker::Peer { addr: super::addr_of(p), epoch },
        };
        let id = self.next_load + 1;
        let view = View { known: &self.known, lease_ok: self.lease_ok(w) };
        let shell = || SimLoad {
            id,
            started: w.now,
            ask: None,
            asks: 0,
            waiters: vec![waiter],
            failures: Vec::new(),
            permit: false,
            queued: None,
            reading: false,
            lease_timer: false,
            version_timer: false,
        };
        // The simulation's tiers are looked up above, at once: no load can
        // finish in between, so it never has to look again.
        match self.engine.request(shard, asker, true, || false, &view, shell) {
            admitted @ (Admitted::Joined | Admitted::JoinedAndLeftAsk) => {
                if let Some(l) = self.engine.shell_mut(shard) {
                    l.waiters.push(waiter);
                }
                if let Waiter::Peer(p, _) = waiter {
                    rec.joined(self.idx, p, shard);
                }
                self.serve_progress(w, waiter);
                if admitted == Admitted::JoinedAndLeftAsk {
                    let asked = self.engine.shell(shard).and_then(|l| l.ask).map_or(self.idx, |a| a.0);
                    w.log(format_args!(
                        "n{} leaves its ask for s{shard} (of n{asked}): {waiter:?} asks it on epoch {epoch} (this node knows epoch {})",
                        self.idx, self.known.epoch
                    ));
                    self.left_ask(w, rec, shard);
                }
            }
            Admitted::Refused { asking } => {
                if let Waiter::Peer(p, stream) = waiter {
                    rec.refused(self.idx, p, shard, w.now);
                    let (q, e) = asking.map_or((usize::MAX, 0), |a| (index_of(a.addr), a.epoch));
                    w.log(format_args!(
                        "n{} refuses s{shard} to n{p} (epoch {epoch}): its load asks n{q} (epoch {e})",
                        self.idx
                    ));
                    self.send(w, Addr::Node(p), Msg::Refused { stream });
                }
            }
            Admitted::NotOwner(owner) => {
                if let Waiter::Peer(p, stream) = waiter {
                    rec.refused(self.idx, p, shard, w.now);
                    w.log(format_args!(
                        "n{} refuses s{shard} to n{p} (epoch {epoch}): its placement (epoch {}) names {owner}",
                        self.idx, self.known.epoch
                    ));
                    self.send(w, Addr::Node(p), Msg::Refused { stream });
                }
            }
            // Never: `finished` is always false here.
            Admitted::LookAgain => {}
            Admitted::Started => {
                self.next_load = id;
                let view = View { known: &self.known, lease_ok: true };
                let owner = if asker.forwards() { view.owner(shard) } else { None };
                let former = if owner.is_none() { view.handed_from(shard) } else { None };
                w.log(format_args!(
                    "n{} loads s{shard} for {waiter:?}, first from {:?}{}",
                    self.idx,
                    owner.map(|o| index_of(o.addr)),
                    former.map(|f| format!(", handed over from n{}", index_of(f.addr))).unwrap_or_default()
                ));
                self.serve_progress(w, waiter);
                self.drive(w, rec, shard);
            }
        }
    }

    pub(super) fn serve_progress(&mut self, w: &mut World, waiter: Waiter) {
        if let Waiter::Peer(p, stream) = waiter
            && self.serving.insert((p, stream))
        {
            w.timer(self.idx, self.life, micros(PEER_PROGRESS_INTERVAL), Timer::Progress(p, stream));
        }
    }

    /// Executes the engine's commands for the load of `shard` until one
    /// waits on the simulated world.
    pub(super) fn drive(&mut self, w: &mut World, rec: &mut Record, shard: u32) {
        loop {
            let now = w.instant_now();
            let lease_ok = self.lease_ok(w);
            let view = View { known: &self.known, lease_ok };
            let Some(command) = self.engine.poll(shard, now, &view) else { return };
            let Some(load) = self.engine.shell_mut(shard) else { return };
            match command {
                Command::Ask { owner, within } => {
                    let peer = index_of(owner.addr);
                    load.asks += 1;
                    rec.asked(self.idx, shard, load.asks, w.now, load.started);
                    let stream = rec.new_stream();
                    load.ask = Some((peer, stream));
                    let clock = StallClock::new(now, PEER_STALL_TIMEOUT);
                    let stall_at = w.micros(clock.deadline()) - w.now;
                    self.asks.insert(stream, Ask { load: load.id, peer, clock, probe: None });
                    w.log(format_args!("n{} asks n{peer} for s{shard} (stream {stream})", self.idx));
                    self.send(w, Addr::Node(peer), Msg::Ask { stream, shard, epoch: owner.epoch });
                    w.timer(self.idx, self.life, stall_at, Timer::Stall(stream));
                    // The connection closes once it has heard nothing for
                    // the idle timeout, and the stream with it.
                    let idle_at = (self.last_heard[peer] + IDLE_TIMEOUT).max(w.now) - w.now;
                    w.timer(self.idx, self.life, idle_at, Timer::Idle(stream));
                    w.timer(self.idx, self.life, micros(within), Timer::AskDeadline(stream));
                    return;
                }
                Command::AskHeld { former, within } => {
                    let peer = index_of(former.addr);
                    let stream = rec.new_stream();
                    self.held_asks.insert(stream, (load.id, peer, None));
                    w.log(format_args!("n{} asks n{peer} for a held copy of s{shard} (stream {stream})", self.idx));
                    self.send(w, Addr::Node(peer), Msg::AskHeld { stream, shard });
                    let wait = handoff_wait().min(micros(within));
                    w.timer(self.idx, self.life, wait, Timer::HeldDeadline(stream));
                    return;
                }
                Command::AwaitMove { failed, within, .. } => {
                    let (id, asks) = (load.id, load.asks);
                    // The placement may have moved already.
                    if moved_away(self.known.placed(shard), failed) {
                        let owner = view.owner(shard);
                        self.engine.handle_await(shard, AwaitOutcome::Moved(owner), &view);
                        continue;
                    }
                    w.log(format_args!("n{} waits up to {within:?} for s{shard} to move from {failed}", self.idx));
                    w.timer(self.idx, self.life, micros(within), Timer::Await(id, asks));
                    w.timer(self.idx, self.life, down_for(), Timer::Redial(id, asks));
                    return;
                }
                Command::AwaitVersion { within } => {
                    if view.version_known(shard) {
                        self.engine.handle_version_waited(shard);
                        continue;
                    }
                    if !std::mem::replace(&mut load.version_timer, true) {
                        w.timer(self.idx, self.life, micros(within), Timer::VersionWait(load.id));
                    }
                    return;
                }
                Command::AwaitLease { within } => {
                    if lease_ok {
                        self.engine.handle_lease_settled(shard, &view);
                        continue;
                    }
                    if !std::mem::replace(&mut load.lease_timer, true) {
                        w.log(format_args!("n{} holds its read of s{shard} as owner: its lease is in doubt", self.idx));
                        w.timer(self.idx, self.life, micros(within), Timer::LeaseWait(load.id));
                    }
                    return;
                }
                Command::AcquirePermit { unless_moved } => {
                    if load.queued.is_some() {
                        return;
                    }
                    let moved = unless_moved.is_some() && moved_away(self.known.placed(shard), node_of(self.idx));
                    let permit = if moved {
                        Permit::Moved
                    } else if self.permits > 0 {
                        self.permits -= 1;
                        load.permit = true;
                        Permit::Granted
                    } else {
                        // Until this time, the shard moving away ends the
                        // wait (`unless_moved`); then only a permit does.
                        load.queued = Some(w.now + unless_moved.map_or(0, micros));
                        self.queue.push_back(shard);
                        w.log(format_args!("n{} queues s{shard} for a load permit", self.idx));
                        return;
                    };
                    match self.engine.handle_permit(shard, permit, now, &view) {
                        AfterPermit::Read => {}
                        after => {
                            w.log(format_args!("n{} takes s{shard} back from its permit: {after:?}", self.idx));
                            self.give_back_permit(w, rec, shard);
                        }
                    }
                }
                Command::Read => {
                    if std::mem::replace(&mut load.reading, true) {
                        return;
                    }
                    let id = load.id;
                    let failures = load.failures.clone();
                    rec.remote_read(self.idx, shard, w.now, failures);
                    let (lo, hi) = w.swarm.remote_ms;
                    let mut took = w.between(ms(lo), ms(hi));
                    if w.odds(w.swarm.slow_remote_per_mille) {
                        took *= 10;
                    }
                    w.log(format_args!("n{} reads s{shard} from remote storage ({} ms)", self.idx, took / 1000));
                    w.timer(self.idx, self.life, took, Timer::RemoteDone(id));
                    return;
                }
                Command::NotOwner(owner) => {
                    w.log(format_args!("n{} tells s{shard}'s askers to ask {owner}: the shard moved on", self.idx));
                    let Some(load) = self.end(w, rec, shard) else { return };
                    for waiter in load.waiters {
                        match waiter {
                            Waiter::Peer(p, stream) => {
                                self.serving.remove(&(p, stream));
                                rec.refused(self.idx, p, shard, w.now);
                                self.send(w, Addr::Node(p), Msg::Refused { stream });
                            }
                            // The engine reads for a load a request of this
                            // node's own waits on; were one there, it asks
                            // again.
                            Waiter::Trainer(_) => self.request(w, rec, shard, waiter, 0),
                        }
                    }
                    return;
                }
            }
        }
    }

    /// Takes the load of `shard` out of the permit queue if it still races
    /// the shard moving away (its race has not run out).
    pub(super) fn unqueue_racing(&mut self, w: &World, shard: u32) -> bool {
        let Some(load) = self.engine.shell_mut(shard) else { return false };
        if load.queued.is_none_or(|until| w.now > until) {
            return false;
        }
        load.queued = None;
        self.queue.retain(|&s| s != shard);
        true
    }

    /// The load of `shard` gives its permit back.
    fn give_back_permit(&mut self, w: &mut World, rec: &mut Record, shard: u32) {
        if let Some(load) = self.engine.shell_mut(shard)
            && std::mem::replace(&mut load.permit, false)
        {
            self.permits += 1;
            self.grant_queued(w, rec);
        }
    }

    /// Free permits go to the loads queued for one, in order.
    fn grant_queued(&mut self, w: &mut World, rec: &mut Record) {
        while self.permits > 0 {
            let Some(next) = self.queue.pop_front() else { return };
            if let Some(l) = self.engine.shell_mut(next)
                && l.queued.take().is_some()
            {
                self.drive(w, rec, next);
            }
        }
    }

    /// Ends the load of `shard`: out of the engine and the queue, its
    /// permit to the next queued load.
    fn end(&mut self, w: &mut World, rec: &mut Record, shard: u32) -> Option<SimLoad> {
        let load = self.engine.finish(shard)?;
        self.queue.retain(|&s| s != shard);
        if load.permit {
            self.permits += 1;
            self.grant_queued(w, rec);
        }
        Some(load)
    }

    /// The load of `shard` produced its chunk.
    pub(super) fn finish(&mut self, w: &mut World, rec: &mut Record, shard: u32, sum: u64) {
        let Some(load) = self.end(w, rec, shard) else { return };
        let owned = self.known.placed(shard) == Some(node_of(self.idx));
        self.held.insert(shard, !owned);
        rec.held(self.idx, shard);
        for waiter in load.waiters {
            self.hand(w, rec, shard, waiter, sum);
        }
    }

    pub(super) fn hand(&mut self, w: &mut World, rec: &mut Record, shard: u32, waiter: Waiter, sum: u64) {
        match waiter {
            Waiter::Trainer(req) => {
                // Every hand counts, before the trainer's own bookkeeping:
                // a request handed twice is a violation, not a no-op.
                rec.delivered(self.idx, req, shard, sum, w.now);
                if self.in_flight.remove(&req).is_some() {
                    let step = ms(w.swarm.step_ms);
                    self.busy_until = self.busy_until.max(w.now) + step;
                    let after = self.busy_until - w.now;
                    w.timer(self.idx, self.life, after, Timer::Trainer);
                }
            }
            Waiter::Peer(p, stream) => {
                self.serving.remove(&(p, stream));
                let sum = if w.odds(w.swarm.corrupt_per_mille) { sum ^ 1 } else { sum };
                self.send(w, Addr::Node(p), Msg::Chunk { stream, sum });
            }
        }
    }
}
