//! The engine on a virtual clock: each test drives loads through their
//! commands and asserts the exact list, as openraft's engine tests do.

use super::*;
use crate::route::AskFailure;

const DEADLINE: Duration = Duration::from_secs(30);
const REROUTE: Duration = Duration::from_secs(10);

fn timing() -> Timing {
    Timing { fetch_deadline: DEADLINE, reroute_wait: REROUTE, placement_wait: PLACEMENT_WAIT }
}

fn addr(n: u64) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, n as u8], 7000))
}

fn owner(n: u64, epoch: u64) -> Owner {
    Owner { node: NodeId(n), addr: addr(n), epoch }
}

/// What node 1 knows: one shard's placement and its lease.
#[derive(Clone)]
struct View {
    routes: bool,
    known: bool,
    placed: Option<NodeId>,
    former: Option<NodeId>,
    epoch: u64,
    lease_ok: bool,
}

const ME: NodeId = NodeId(1);

impl View {
    fn alone() -> Self {
        Self { routes: false, known: false, placed: None, former: None, epoch: 0, lease_ok: true }
    }

    fn placed(node: u64, epoch: u64) -> Self {
        Self { routes: true, known: true, placed: Some(NodeId(node)), former: None, epoch, lease_ok: true }
    }
}

impl Placement<u32> for View {
    fn me(&self) -> NodeId {
        ME
    }
    fn routes(&self, _: u32) -> bool {
        self.routes
    }
    fn version_known(&self, _: u32) -> bool {
        self.known
    }
    fn placed_owner(&self, _: u32) -> Option<NodeId> {
        self.placed
    }
    fn owner(&self, _: u32) -> Option<Owner> {
        self.placed.filter(|&o| o != ME).map(|o| owner(o.0, self.epoch))
    }
    fn handed_from(&self, _: u32) -> Option<Owner> {
        self.former.filter(|&f| f != ME && self.placed == Some(ME)).map(|f| owner(f.0, self.epoch))
    }
    fn former_owner(&self, _: u32) -> Option<NodeId> {
        self.former
    }
    fn owner_epoch(&self, _: u32) -> u64 {
        self.epoch
    }
    fn lease_ok(&self, _: Instant) -> bool {
        self.lease_ok
    }
}

type E = Engine<u32, &'static str, String>;

fn start(e: &mut E, asker: Asker, view: &View) -> Admitted {
    e.request(7, asker, true, || false, view, || "shell")
}

fn peer(n: u64, epoch: u64) -> Asker {
    Asker::Peer { addr: addr(n), epoch }
}

#[test]
fn a_node_alone_takes_a_permit_and_reads() {
    let (t0, view) = (Instant::now(), View::alone());
    let mut e = E::new(timing());
    assert_eq!(start(&mut e, Asker::Trainer, &view), Admitted::Started);
    assert_eq!(e.poll(7, t0, &view), Some(Command::AcquirePermit { unless_moved: None }));
    assert_eq!(e.reading(7), None, "queued for a permit: a handoff does not wait on it");
    assert_eq!(e.handle_permit(7, Permit::Granted, t0, &view), AfterPermit::Read);
    assert_eq!(e.poll(7, t0, &view), Some(Command::Read));
    assert_eq!(e.reading(7), Some(&"shell"));
    assert_eq!(e.finish(7), Some("shell"));
    assert_eq!(e.poll(7, t0, &view), None);
    assert!(e.is_empty());
}

#[test]
fn an_owner_that_fails_is_waited_for_asked_again_when_back_then_read_around_when_alive_but_silent() {
    let (t0, view) = (Instant::now(), View::placed(2, 5));
    let mut e = E::new(timing());
    start(&mut e, Asker::Trainer, &view);
    let mut commands = vec![e.poll(7, t0, &view)];
    e.handle_asked(7, Err(AskFailure::Unavailable("reset".into())));
    let t1 = t0 + Duration::from_secs(1);
    commands.push(e.poll(7, t1, &view));
    // It answers a handshake again, and the placement still names it.
    assert_eq!(e.handle_await(7, AwaitOutcome::OwnerBack, &view), Back::AskAgain);
    commands.push(e.poll(7, t1, &view));
    e.handle_asked(7, Err(AskFailure::Alive("stalled".into())));
    commands.push(e.poll(7, t1, &view));
    assert_eq!(
        commands,
        [
            Some(Command::Ask { owner: owner(2, 5), within: DEADLINE }),
            Some(Command::AwaitMove { failed: NodeId(2), addr: addr(2), within: REROUTE }),
            Some(Command::Ask { owner: owner(2, 5), within: DEADLINE - Duration::from_secs(1) }),
            // Not this node's shard: no race against a move, no recheck.
            Some(Command::AcquirePermit { unless_moved: None }),
        ]
    );
    assert_eq!(e.handle_permit(7, Permit::Granted, t1, &view), AfterPermit::Read);
    assert_eq!(e.tried(7).len(), 2, "{:?}", e.tried(7));
}

#[test]
fn an_owner_back_after_the_placement_moved_its_shard_is_not_asked_the_new_owner_is() {
    let (t0, mut view) = (Instant::now(), View::placed(2, 5));
    let mut e = E::new(timing());
    start(&mut e, Asker::Trainer, &view);
    e.poll(7, t0, &view);
    e.handle_asked(7, Err(AskFailure::Unavailable("reset".into())));
    e.poll(7, t0, &view);
    view = View::placed(3, 6);
    assert_eq!(e.handle_await(7, AwaitOutcome::OwnerBack, &view), Back::Moved);
    assert_eq!(e.poll(7, t0, &view), Some(Command::Ask { owner: owner(3, 6), within: DEADLINE }));
}

#[test]
fn a_node_that_knows_no_placement_of_the_version_waits_for_one_once() {
    let t0 = Instant::now();
    let mut view = View::placed(2, 5);
    view.known = false;
    view.placed = None;
    let mut e = E::new(timing());
    start(&mut e, Asker::Trainer, &view);
    assert_eq!(e.poll(7, t0, &view), Some(Command::AwaitVersion { within: PLACEMENT_WAIT }));
    assert_eq!(e.waiting().collect::<Vec<_>>(), [(7, Waiting::Version)]);
    // Polled again before the wait ends: the same command.
    assert_eq!(e.poll(7, t0, &view), Some(Command::AwaitVersion { within: PLACEMENT_WAIT }));
    let view = View::placed(2, 5);
    e.handle_version_waited(7);
    assert_eq!(e.poll(7, t0, &view), Some(Command::Ask { owner: owner(2, 5), within: DEADLINE }));

    // A wait that runs out routes on what is known: nothing, so it reads.
    let mut unknown = View::placed(2, 5);
    unknown.known = false;
    unknown.placed = None;
    let mut e = E::new(timing());
    start(&mut e, Asker::Trainer, &unknown);
    e.poll(7, t0, &unknown);
    e.handle_version_waited(7);
    assert_eq!(e.poll(7, t0, &unknown), Some(Command::AcquirePermit { unless_moved: None }));
    // A peer's load never waits for it (it is never forwarded).
    let mut e = E::new(timing());
    start(&mut e, peer(2, 1), &unknown);
    assert_eq!(e.poll(7, t0, &unknown), Some(Command::AcquirePermit { unless_moved: None }));
}

#[test]
fn a_load_queued_as_owner_routes_again_when_the_shard_moves_before_its_permit() {
    let (t0, mut view) = (Instant::now(), View::placed(1, 5));
    let mut e = E::new(timing());
    start(&mut e, Asker::Trainer, &view);
    assert_eq!(e.poll(7, t0, &view), Some(Command::AcquirePermit { unless_moved: Some(DEADLINE) }));
    assert_eq!(e.waiting().collect::<Vec<_>>(), [(7, Waiting::PermitUnlessMoved)]);
    view = View::placed(2, 6);
    assert_eq!(e.handle_permit(7, Permit::Moved, t0, &view), AfterPermit::RouteAgain { wait_for_lease: false });
    assert_eq!(e.poll(7, t0, &view), Some(Command::Ask { owner: owner(2, 6), within: DEADLINE }));
    // Once per route: after that ask fails as alive, it reads without
    // racing or rechecking.
    e.handle_asked(7, Err(AskFailure::Alive("corrupt".into())));
    assert_eq!(e.poll(7, t0, &view), Some(Command::AcquirePermit { unless_moved: None }));
    assert_eq!(e.handle_permit(7, Permit::Granted, t0, &view), AfterPermit::Read);
}

#[test]
fn a_load_whose_shard_moved_while_it_queued_asks_the_new_owner_once_it_has_a_permit() {
    let (t0, mut view) = (Instant::now(), View::placed(1, 5));
    let mut e = E::new(timing());
    start(&mut e, Asker::Trainer, &view);
    e.poll(7, t0, &view);
    view = View::placed(3, 6);
    assert_eq!(e.handle_permit(7, Permit::Granted, t0, &view), AfterPermit::RouteAgain { wait_for_lease: false });
    assert_eq!(e.poll(7, t0, &view), Some(Command::Ask { owner: owner(3, 6), within: DEADLINE }));
}

#[test]
fn a_read_as_owner_with_the_lease_in_doubt_waits_for_the_lease_then_routes_again() {
    let t0 = Instant::now();
    let mut view = View::placed(1, 5);
    view.lease_ok = false;
    let mut e = E::new(timing());
    start(&mut e, Asker::Trainer, &view);
    let mut commands = vec![e.poll(7, t0, &view)];
    assert_eq!(e.handle_permit(7, Permit::Granted, t0, &view), AfterPermit::RouteAgain { wait_for_lease: true });
    commands.push(e.poll(7, t0, &view));
    assert_eq!(e.waiting().collect::<Vec<_>>(), [(7, Waiting::Lease)]);
    // Renewed with a placement that hands the shard over from node 2.
    view = View::placed(1, 7);
    view.former = Some(NodeId(2));
    e.handle_lease_settled(7, &view);
    commands.push(e.poll(7, t0, &view));
    e.handle_held(7, "it does not hold it".into());
    commands.push(e.poll(7, t0, &view));
    assert_eq!(
        commands,
        [
            Some(Command::AcquirePermit { unless_moved: Some(DEADLINE) }),
            Some(Command::AwaitLease { within: REROUTE }),
            Some(Command::AskHeld { former: owner(2, 7), within: DEADLINE }),
            Some(Command::AcquirePermit { unless_moved: None }),
        ]
    );
    // Rechecked once already: even with the lease in doubt again, it reads.
    view.lease_ok = false;
    assert_eq!(e.handle_permit(7, Permit::Granted, t0, &view), AfterPermit::Read);
}

#[test]
fn a_peers_load_whose_shard_moved_while_it_queued_tells_the_peer_the_new_owner() {
    let (t0, mut view) = (Instant::now(), View::placed(1, 5));
    let mut e = E::new(timing());
    assert_eq!(start(&mut e, peer(2, 5), &view), Admitted::Started);
    assert_eq!(e.poll(7, t0, &view), Some(Command::AcquirePermit { unless_moved: None }));
    view = View::placed(3, 6);
    assert_eq!(e.handle_permit(7, Permit::Granted, t0, &view), AfterPermit::NotOwner(NodeId(3)));
    assert_eq!(e.poll(7, t0, &view), Some(Command::NotOwner(NodeId(3))));

    // With a request of this node's own on it, it reads instead.
    let mut e = E::new(timing());
    let view = View::placed(1, 5);
    start(&mut e, peer(2, 5), &view);
    assert_eq!(start(&mut e, Asker::Trainer, &view), Admitted::Joined);
    e.poll(7, t0, &view);
    assert_eq!(e.handle_permit(7, Permit::Granted, t0, &View::placed(3, 6)), AfterPermit::Read);
}

#[test]
fn single_flight_joins_refuses_a_cycle_and_leaves_an_outdated_ask() {
    let (t0, view) = (Instant::now(), View::placed(2, 4));
    let mut e = E::new(timing());
    assert_eq!(start(&mut e, Asker::Ahead, &view), Admitted::Started);
    assert!(!e.wanted_now(7));
    assert_eq!(e.poll(7, t0, &view), Some(Command::Ask { owner: owner(2, 4), within: DEADLINE }));
    assert_eq!(e.asking(7), Some(Asked { addr: addr(2), epoch: 4 }));
    // A trainer joins and promotes the load.
    assert_eq!(start(&mut e, Asker::Trainer, &view), Admitted::Joined);
    assert!(e.wanted_now(7));
    // The peer the load asks asks for the shard too, on the same epoch: a
    // wait cycle, refused at once.
    assert_eq!(start(&mut e, peer(2, 4), &view), Admitted::Refused { asking: Some(Asked { addr: addr(2), epoch: 4 }) });
    // Node 3 asks on epoch 6 and this node learned epoch 6 names it: the
    // load leaves its ask and reads here.
    let newer = View::placed(1, 6);
    assert_eq!(start(&mut e, peer(3, 6), &newer), Admitted::JoinedAndLeftAsk);
    assert_eq!(e.asking(7), None);
    e.handle_ask_left(7);
    assert_eq!(e.poll(7, t0, &newer), Some(Command::AcquirePermit { unless_moved: Some(DEADLINE) }));
    assert_eq!(e.tried(7).len(), 1);
}

#[test]
fn a_placement_that_names_this_node_stops_only_asks_a_peer_waits_on() {
    let (t0, view) = (Instant::now(), View::placed(2, 4));
    let mut e = E::new(timing());
    e.request(7, Asker::Trainer, true, || false, &view, || "a");
    e.request(8, Asker::Trainer, true, || false, &view, || "b");
    e.poll(7, t0, &view);
    e.poll(8, t0, &view);
    // A peer on an older placement joins the load of 8 (it asks node 2,
    // not the peer): it waits on it.
    assert_eq!(e.request(8, peer(3, 3), true, || false, &view, || "c"), Admitted::Joined);
    let newer = View::placed(1, 6);
    assert_eq!(e.placement_changed(&newer), [8], "no peer waits on 7: its ask hands the shard over");
    assert_eq!(e.placement_changed(&newer), Vec::<u32>::new(), "left once");
}

#[test]
fn a_peer_is_refused_a_read_where_the_placement_names_another_node() {
    let mut e = E::new(timing());
    let view = View::placed(2, 5);
    assert_eq!(start(&mut e, peer(3, 5), &view), Admitted::NotOwner(NodeId(2)));
    assert!(e.is_empty());
    // On a newer placement than this node knows, it may own it there.
    assert_eq!(start(&mut e, peer(3, 6), &view), Admitted::Started);
    // The rule does not wait on the load being routable (a version this
    // node has not opened, or closed): the placement decides.
    let mut e = E::new(timing());
    let unopened = View { routes: false, ..View::placed(2, 5) };
    assert_eq!(start(&mut e, peer(3, 5), &unopened), Admitted::NotOwner(NodeId(2)));
}

#[test]
fn a_load_that_finished_meanwhile_is_looked_up_again() {
    let mut e = E::new(timing());
    let view = View::alone();
    assert_eq!(e.request(7, Asker::Trainer, true, || true, &view, || "x"), Admitted::LookAgain);
    assert_eq!(e.request(7, Asker::Trainer, false, || true, &view, || "x"), Admitted::Started);
}

#[test]
fn reports_out_of_turn_change_nothing() {
    let (t0, view) = (Instant::now(), View::placed(2, 4));
    let mut e = E::new(timing());
    start(&mut e, Asker::Trainer, &view);
    e.handle_version_waited(7);
    e.handle_held(7, "late".into());
    assert_eq!(e.handle_await(7, AwaitOutcome::OwnerBack, &view), Back::NotBack);
    assert_eq!(e.handle_permit(7, Permit::Granted, t0, &view), AfterPermit::Read);
    e.handle_lease_settled(7, &view);
    assert_eq!(e.poll(7, t0, &view), Some(Command::Ask { owner: owner(2, 4), within: DEADLINE }));
    // And about a load that does not exist, nothing at all.
    e.handle_asked(9, Ok(()));
    assert_eq!(e.poll(9, t0, &view), None);
}

#[test]
fn the_wait_for_a_move_is_ended_by_the_placement_or_the_deadline() {
    let (t0, view) = (Instant::now(), View::placed(2, 4));
    let mut e = E::new(timing());
    start(&mut e, Asker::Trainer, &view);
    e.poll(7, t0, &view);
    e.handle_asked(7, Err(AskFailure::Unavailable("gone".into())));
    e.poll(7, t0, &view);
    assert_eq!(e.waiting().collect::<Vec<_>>(), [(7, Waiting::Move(NodeId(2)))]);
    assert!(!moved_away(Some(NodeId(2)), NodeId(2)) && !moved_away(None, NodeId(2)));
    assert!(moved_away(Some(NodeId(3)), NodeId(2)));
    e.handle_await(7, AwaitOutcome::NotMoved, &view);
    let t1 = t0 + REROUTE;
    assert_eq!(e.poll(7, t1, &view), Some(Command::AcquirePermit { unless_moved: None }));
}
