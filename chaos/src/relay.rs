//! A seeded userspace UDP fault relay between real processes.
//!
//! This kernel has no netem, so chaos runs put this relay between every
//! pair of processes that speak QUIC (design: `shared/research/simulation.md`
//! §4). Each process `d` gets one *front* socket; every other process is
//! configured to send to `d`'s front instead of to `d`. A datagram from
//! process `s` arriving at `d`'s front goes on to `d` from a *back* socket
//! kept for the pair (`s`'s address, `d`), so `d` sees one stable source
//! address per sender (QUIC would take a changing one for a path migration);
//! `d`'s replies arrive on that back socket and go back to `s` from `d`'s
//! front, which is the address `s` sent to.
//!
//! Everything the relay decides is in [`core`] and [`decide`](mod@decide), pure and
//! tested without sockets: the fate of the n-th datagram of a direction is a
//! function of (seed, source, destination, n) only, so one link's timing
//! cannot change another's faults and a seed's fault schedule replays (the
//! processes' interleaving does not). This file is the tokio shell: it reads
//! sockets into the core, sends what the core says is due, and sleeps until
//! the core's next deadline.
//!
//! Datagrams are read into 64 KiB buffers, larger than any UDP payload, so
//! none is truncated. A datagram from an address the relay does not know is
//! dropped and counted (`unknown_source`): passing it would leak through
//! partitions, and giving it a link id by arrival order would not replay.
//! List every address a process sends from in [`ProcessSpec::sends_from`]
//! (a client-only QUIC endpoint bound to a fixed port, say). The one
//! exception is [`RelayConfig::pass_outsiders`]: an operator's tools
//! (`granary status`, `dataset add`) that dial a front from a port of the
//! moment are relayed as they are, without faults and never cut off, so
//! they see the cluster as a client outside the fault domain would.

pub mod core;
pub mod decide;

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use thiserror::Error;
use tokio::net::UdpSocket;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::debug;

pub use self::core::{CoreLimits, LinkCounters, RelayCore, Transmit};
pub use self::decide::{
    Bandwidth, Decision, DelayRange, FaultsError, Link, LinkFaults, PartitionWindow, ProcessId, Reorder, decide,
};

/// Receive buffer size: above the largest UDP payload (65,527 bytes over
/// IPv6), so a datagram is never truncated.
const DATAGRAM_BUFFER_BYTES: usize = 64 * 1024;

/// One process behind the relay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSpec {
    /// The address it receives on; the relay forwards its traffic here.
    pub listen: SocketAddr,
    /// Other addresses it sends from (its `listen` is always one).
    pub sends_from: Vec<SocketAddr>,
}

/// What the relay starts with. Build with [`RelayConfig::new`] and adjust
/// the fields.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// The seed every fault decision derives from.
    pub seed: u64,
    /// Where front and back sockets are bound (port 0). Default 127.0.0.1.
    pub bind_ip: IpAddr,
    /// The processes; [`ProcessId`] `i` is the `i`-th.
    pub processes: Vec<ProcessSpec>,
    /// Faults of every direction without its own entry. Default none.
    pub default_faults: LinkFaults,
    /// Faults of particular directions.
    pub link_faults: BTreeMap<Link, LinkFaults>,
    /// Partition windows, relative to the relay's start.
    pub partitions: Vec<PartitionWindow>,
    /// Queue bounds of the core.
    pub limits: CoreLimits,
    /// Back sockets (source address, destination pairs) at most; a datagram
    /// that would need one more is dropped and counted. Default 1,024.
    pub max_pairs: usize,
    /// Relay datagrams from unknown addresses too, fault-free and never
    /// cut (counted as `outsiders`). Default false: dropped.
    pub pass_outsiders: bool,
}

impl RelayConfig {
    /// A fault-free relay with `seed` in front of processes listening on
    /// `listens`, each sending only from its listening address.
    pub fn new(seed: u64, listens: impl IntoIterator<Item = SocketAddr>) -> Self {
        Self {
            seed,
            bind_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            processes: listens.into_iter().map(|listen| ProcessSpec { listen, sends_from: Vec::new() }).collect(),
            default_faults: LinkFaults::NONE,
            link_faults: BTreeMap::new(),
            partitions: Vec::new(),
            limits: CoreLimits::default(),
            max_pairs: 1024,
            pass_outsiders: false,
        }
    }
}

/// Why the relay could not start or take a setting.
#[derive(Debug, Error)]
pub enum RelayError {
    /// A front socket could not be bound.
    #[error("binding the front socket of process {process} on {ip}: {source}")]
    Bind {
        /// Whose front.
        process: ProcessId,
        /// Where.
        ip: IpAddr,
        /// Why.
        source: io::Error,
    },
    /// Two processes claim one source address.
    #[error("address {addr} is listed for both process {first} and process {second}")]
    DuplicateAddress {
        /// The address.
        addr: SocketAddr,
        /// The process listed first.
        first: ProcessId,
        /// The process listed second.
        second: ProcessId,
    },
    /// A setting names a process the relay does not have.
    #[error("{link} names a process the relay does not have ({count} processes)")]
    UnknownProcess {
        /// The direction named.
        link: Link,
        /// How many processes the relay has.
        count: usize,
    },
    /// A fault setting is out of range.
    #[error("faults for {}: {source}", link.map_or("every link".to_string(), |l| l.to_string()))]
    Faults {
        /// The direction, or `None` for the default.
        link: Option<Link>,
        /// What is wrong.
        source: FaultsError,
    },
}

/// A snapshot of the relay's counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Per direction, by kind of fault.
    pub links: BTreeMap<Link, LinkCounters>,
    /// Datagrams from addresses the relay does not know, dropped.
    pub unknown_source: u64,
    /// Datagrams from and to addresses the relay does not know, relayed
    /// without faults ([`RelayConfig::pass_outsiders`]).
    pub outsiders: u64,
    /// Datagrams dropped because [`RelayConfig::max_pairs`] back sockets
    /// existed already, or a new one could not be bound.
    pub no_back_socket: u64,
    /// Sends the OS refused.
    pub send_errors: u64,
    /// Receives the OS failed.
    pub recv_errors: u64,
}

impl RelayStats {
    /// The counters of `link`, zero if it carried nothing.
    pub fn link(&self, link: Link) -> LinkCounters {
        self.links.get(&link).copied().unwrap_or_default()
    }
}

/// What the core queues: the bytes, and the socket and address to send
/// them with.
#[derive(Clone, Debug)]
struct Packet {
    via: Arc<UdpSocket>,
    to: SocketAddr,
    bytes: Arc<[u8]>,
}

#[derive(Default)]
struct ShellCounters {
    unknown_source: AtomicU64,
    outsiders: AtomicU64,
    no_back_socket: AtomicU64,
    send_errors: AtomicU64,
    recv_errors: AtomicU64,
}

struct Shared {
    core: Mutex<RelayCore<Packet>>,
    /// Wakes the dispatcher when the core got a datagram.
    wake: Notify,
    start: Instant,
    bind_ip: IpAddr,
    max_pairs: usize,
    pass_outsiders: bool,
    /// Every address a known process sends from.
    sources: BTreeMap<SocketAddr, ProcessId>,
    listens: Vec<SocketAddr>,
    fronts: Vec<Arc<UdpSocket>>,
    /// (source address, destination) → back socket. Bounded by `max_pairs`.
    pairs: Mutex<BTreeMap<(SocketAddr, ProcessId), Arc<UdpSocket>>>,
    back_tasks: Mutex<Vec<JoinHandle<()>>>,
    stop: watch::Receiver<bool>,
    counters: ShellCounters,
}

/// Locks `m`, ignoring poisoning: every critical section here leaves the
/// data consistent before anything that could panic.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Resolves when the handle asks the tasks to stop or is dropped.
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|&s| s).await;
}

impl Shared {
    fn now(&self) -> Duration {
        Instant::now().saturating_duration_since(self.start)
    }

    fn handle(&self, link: Link, packet: Packet) {
        let len = packet.bytes.len();
        lock(&self.core).handle_datagram(self.now(), link, len, packet);
        self.wake.notify_one();
    }

    /// The back socket of (`source`, `to`), bound and served on first use.
    /// `from` is None for an outsider.
    fn back_socket(
        self: &Arc<Self>,
        source: SocketAddr,
        from: Option<ProcessId>,
        to: ProcessId,
    ) -> io::Result<Arc<UdpSocket>> {
        let mut pairs = lock(&self.pairs);
        if let Some(s) = pairs.get(&(source, to)) {
            return Ok(s.clone());
        }
        if pairs.len() >= self.max_pairs {
            return Err(io::Error::other(format!("{} back sockets exist already", self.max_pairs)));
        }
        let std_socket = std::net::UdpSocket::bind(SocketAddr::new(self.bind_ip, 0))?;
        std_socket.set_nonblocking(true)?;
        let socket = Arc::new(UdpSocket::from_std(std_socket)?);
        pairs.insert((source, to), socket.clone());
        debug!(%source, ?from, %to, back = ?socket.local_addr().ok(), "relay: new back socket");
        let task = tokio::spawn(serve_back(self.clone(), socket.clone(), source, from, to));
        lock(&self.back_tasks).push(task);
        Ok(socket)
    }
}

/// Reads what processes send to `to`'s front and hands it to the core.
async fn serve_front(shared: Arc<Shared>, to: ProcessId) {
    let socket = shared.fronts[to.0 as usize].clone();
    let mut buf = vec![0u8; DATAGRAM_BUFFER_BYTES];
    loop {
        let (n, source) = tokio::select! {
            _ = stopped(shared.stop.clone()) => return,
            r = socket.recv_from(&mut buf) => match r {
                Ok(got) => got,
                Err(error) => {
                    shared.counters.recv_errors.fetch_add(1, Ordering::Relaxed);
                    debug!(%to, %error, "relay: front receive failed");
                    continue;
                }
            },
        };
        let from = shared.sources.get(&source).copied();
        if from.is_none() && !shared.pass_outsiders {
            shared.counters.unknown_source.fetch_add(1, Ordering::Relaxed);
            debug!(%to, %source, "relay: datagram from an unknown address dropped");
            continue;
        }
        let back = match shared.back_socket(source, from, to) {
            Ok(back) => back,
            Err(error) => {
                shared.counters.no_back_socket.fetch_add(1, Ordering::Relaxed);
                debug!(?from, %to, %error, "relay: no back socket, datagram dropped");
                continue;
            }
        };
        let Some(from) = from else {
            // An outsider: straight on, no faults.
            shared.counters.outsiders.fetch_add(1, Ordering::Relaxed);
            if back.send_to(&buf[..n], shared.listens[to.0 as usize]).await.is_err() {
                shared.counters.send_errors.fetch_add(1, Ordering::Relaxed);
            }
            continue;
        };
        let packet = Packet { via: back, to: shared.listens[to.0 as usize], bytes: Arc::from(&buf[..n]) };
        shared.handle(Link { from, to }, packet);
    }
}

/// Reads `to`'s replies to `source` (a sender address of process `from`)
/// and hands them to the core, to go back from `to`'s front; an
/// outsider's (`from` None) go back at once.
async fn serve_back(
    shared: Arc<Shared>,
    socket: Arc<UdpSocket>,
    source: SocketAddr,
    from: Option<ProcessId>,
    to: ProcessId,
) {
    let mut buf = vec![0u8; DATAGRAM_BUFFER_BYTES];
    let expected = shared.listens[to.0 as usize];
    loop {
        let (n, replier) = tokio::select! {
            _ = stopped(shared.stop.clone()) => return,
            r = socket.recv_from(&mut buf) => match r {
                Ok(got) => got,
                Err(error) => {
                    shared.counters.recv_errors.fetch_add(1, Ordering::Relaxed);
                    debug!(?from, %to, %error, "relay: back receive failed");
                    continue;
                }
            },
        };
        if replier != expected {
            shared.counters.unknown_source.fetch_add(1, Ordering::Relaxed);
            debug!(?from, %to, %replier, "relay: datagram on a back socket from a stranger dropped");
            continue;
        }
        let Some(from) = from else {
            shared.counters.outsiders.fetch_add(1, Ordering::Relaxed);
            if shared.fronts[to.0 as usize].send_to(&buf[..n], source).await.is_err() {
                shared.counters.send_errors.fetch_add(1, Ordering::Relaxed);
            }
            continue;
        };
        let packet = Packet { via: shared.fronts[to.0 as usize].clone(), to: source, bytes: Arc::from(&buf[..n]) };
        shared.handle(Link { from: to, to: from }, packet);
    }
}

/// Sends whatever the core says is due, then sleeps until its next deadline
/// or a new datagram.
async fn dispatch(shared: Arc<Shared>) {
    loop {
        let (due, next) = {
            let mut core = lock(&shared.core);
            let now = shared.now();
            let due: Vec<_> = std::iter::from_fn(|| core.poll_transmit(now)).collect();
            (due, core.poll_timeout())
        };
        for t in due {
            if let Err(error) = t.payload.via.send_to(&t.payload.bytes, t.payload.to).await {
                shared.counters.send_errors.fetch_add(1, Ordering::Relaxed);
                debug!(link = %t.link, index = t.index, %error, "relay: send failed");
            }
        }
        let deadline = next.map(|d| shared.start + d);
        tokio::select! {
            _ = stopped(shared.stop.clone()) => return,
            _ = shared.wake.notified() => {}
            _ = async { if let Some(at) = deadline { tokio::time::sleep_until(at).await } else { std::future::pending().await } } => {}
        }
    }
}

/// A running relay. Dropping it stops its tasks (at their next wake-up);
/// [`RelayHandle::shutdown`] stops them and waits.
pub struct RelayHandle {
    shared: Arc<Shared>,
    front_addrs: Vec<SocketAddr>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl RelayHandle {
    /// Binds a front socket per process and starts relaying. Must be called
    /// inside a tokio runtime.
    pub async fn start(config: RelayConfig) -> Result<RelayHandle, RelayError> {
        let count = config.processes.len();
        let check_link = |link: Link| {
            if link.from.0 as usize >= count || link.to.0 as usize >= count {
                return Err(RelayError::UnknownProcess { link, count });
            }
            Ok(())
        };
        let mut core = RelayCore::new(config.seed, config.default_faults, config.partitions.clone(), config.limits)
            .map_err(|source| RelayError::Faults { link: None, source })?;
        for w in &config.partitions {
            check_link(Link { from: w.a, to: w.b })?;
        }
        for (&link, &faults) in &config.link_faults {
            check_link(link)?;
            core.set_link_faults(link, faults).map_err(|source| RelayError::Faults { link: Some(link), source })?;
        }
        let mut sources = BTreeMap::new();
        for (i, p) in config.processes.iter().enumerate() {
            let id = ProcessId(i as u32);
            for &addr in std::iter::once(&p.listen).chain(&p.sends_from) {
                if let Some(&first) = sources.get(&addr)
                    && first != id
                {
                    return Err(RelayError::DuplicateAddress { addr, first, second: id });
                }
                sources.insert(addr, id);
            }
        }
        let mut fronts = Vec::with_capacity(count);
        for i in 0..count {
            let bind = |source| RelayError::Bind { process: ProcessId(i as u32), ip: config.bind_ip, source };
            let socket = UdpSocket::bind(SocketAddr::new(config.bind_ip, 0)).await.map_err(bind)?;
            fronts.push(Arc::new(socket));
        }
        let front_addrs = fronts
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.local_addr().map_err(|source| RelayError::Bind {
                    process: ProcessId(i as u32),
                    ip: config.bind_ip,
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (stop, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            wake: Notify::new(),
            start: Instant::now(),
            bind_ip: config.bind_ip,
            max_pairs: config.max_pairs,
            pass_outsiders: config.pass_outsiders,
            sources,
            listens: config.processes.iter().map(|p| p.listen).collect(),
            fronts,
            pairs: Mutex::new(BTreeMap::new()),
            back_tasks: Mutex::new(Vec::new()),
            stop: stop_rx,
            counters: ShellCounters::default(),
        });
        let mut tasks: Vec<_> =
            (0..count).map(|i| tokio::spawn(serve_front(shared.clone(), ProcessId(i as u32)))).collect();
        tasks.push(tokio::spawn(dispatch(shared.clone())));
        debug!(seed = config.seed, processes = count, fronts = ?front_addrs, "relay: started");
        Ok(RelayHandle { shared, front_addrs, stop, tasks })
    }

    /// The address peers must send to in order to reach `process`.
    pub fn front(&self, process: ProcessId) -> Option<SocketAddr> {
        self.front_addrs.get(process.0 as usize).copied()
    }

    /// Every front address, by process.
    pub fn fronts(&self) -> &[SocketAddr] {
        &self.front_addrs
    }

    fn check_link(&self, link: Link) -> Result<(), RelayError> {
        let count = self.front_addrs.len();
        if link.from.0 as usize >= count || link.to.0 as usize >= count {
            return Err(RelayError::UnknownProcess { link, count });
        }
        Ok(())
    }

    /// Sets the faults of one direction from now on.
    pub fn set_link_faults(&self, link: Link, faults: LinkFaults) -> Result<(), RelayError> {
        self.check_link(link)?;
        lock(&self.shared.core)
            .set_link_faults(link, faults)
            .map_err(|source| RelayError::Faults { link: Some(link), source })
    }

    /// Sets the faults of every direction without its own setting.
    pub fn set_default_faults(&self, faults: LinkFaults) -> Result<(), RelayError> {
        lock(&self.shared.core).set_default_faults(faults).map_err(|source| RelayError::Faults { link: None, source })
    }

    /// Cuts `a` → `b`, and `b` → `a` unless `oneway`, until [`RelayHandle::heal`].
    pub fn partition(&self, a: ProcessId, b: ProcessId, oneway: bool) -> Result<(), RelayError> {
        self.check_link(Link { from: a, to: b })?;
        lock(&self.shared.core).partition(a, b, oneway);
        Ok(())
    }

    /// Ends every partition, the scheduled ones included; fault rates stay.
    pub fn heal(&self) {
        lock(&self.shared.core).heal();
    }

    /// The counts so far.
    pub fn stats(&self) -> RelayStats {
        let c = &self.shared.counters;
        RelayStats {
            links: lock(&self.shared.core).counters(),
            unknown_source: c.unknown_source.load(Ordering::Relaxed),
            outsiders: c.outsiders.load(Ordering::Relaxed),
            no_back_socket: c.no_back_socket.load(Ordering::Relaxed),
            send_errors: c.send_errors.load(Ordering::Relaxed),
            recv_errors: c.recv_errors.load(Ordering::Relaxed),
        }
    }

    /// Stops every task and waits for them; datagrams still queued are lost.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        let backs = std::mem::take(&mut *lock(&self.shared.back_tasks));
        for task in self.tasks.drain(..).chain(backs) {
            // A task that panicked has stopped too; nothing else to do.
            let _ = task.await;
        }
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}
