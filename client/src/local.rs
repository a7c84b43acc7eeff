//! The node on this host, over a Unix socket.
//!
//! Requests and replies are length-prefixed rkyv frames
//! ([`granary_proto::wire`]). A chunk reply carries a memory file descriptor
//! (SCM_RIGHTS); the client checks that the file is sealed against writes
//! and resizing, maps it read-only and validates the chunk header. The
//! payload was checksummed by the node before it sealed the file, and the
//! seals guarantee nobody can change it since, so by default the client does
//! not checksum it again ([`Verify::HeaderOnly`]); [`LocalSource::verify`]
//! can ask for the full check.
//!
//! Mapping a chunk costs a page-table entry per 4 KiB page on map and unmap:
//! for a 7.5 MB chunk that is about as much CPU as assembling a fifth of its
//! rows. Chunks never change, so the source keeps recently used mappings
//! ([`LocalSource::mapping_cache`], default 1 GiB, least recently used
//! first out) and a later epoch that needs the chunk again maps nothing. A
//! kept mapping keeps its memory file alive after the node evicts it, so the
//! budget bounds how much memory a trainer can hold on to that way; while
//! the node also holds the chunk, the pages are shared and cost nothing.
//! Those pages are charged to the node (in its cgroup), so the node sends
//! its advice with every dataset description (`mapping_budget_bytes`: the
//! memory it has left, shared among the ranks it expects) and the cache
//! takes the lower of that and its own budget.

use crate::error::{ClientError, ProtocolError};
use crate::source::{Chunk, ChunkBytes, ChunkSource};
use granary_proto::chunk::Verify;
use granary_proto::frame;
use granary_proto::version;
use granary_proto::wire::{self, DatasetInfo, LocalRequest, LocalResponse, MAX_FRAME_LEN, NodeStats};
use granary_proto::{DatasetVersion, ShardId, Walk};
use rustix::fd::OwnedFd;
use rustix::fs::SealFlags;
use rustix::mm::{MapFlags, ProtFlags};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use std::collections::HashMap;
use std::io::{IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Default budget of kept chunk mappings.
pub const DEFAULT_MAPPING_CACHE_BYTES: u64 = 1 << 30;

/// A connection to the local node.
pub struct LocalSource {
    path: PathBuf,
    /// The connection; `None` once an error left it out of step with the
    /// node (a reply not read to its end), after which every call fails.
    stream: Mutex<Option<UnixStream>>,
    verify: Verify,
    mappings: Mutex<MappingCache>,
    /// Every chunk's length by version and shard, from the descriptions
    /// this source received: a chunk reply of another length is refused
    /// before its memory file is mapped.
    chunk_lens: Mutex<HashMap<DatasetVersion, HashMap<ShardId, u64>>>,
    /// The local protocol versions this source offers.
    speaks: version::Speaks,
    /// The version the node agreed to on the current connection.
    agreed: std::sync::atomic::AtomicU16,
    /// Register every chunk mapping with this CUDA context as page-locked
    /// memory (feature `cuda`).
    #[cfg(feature = "cuda")]
    page_lock: Option<Arc<cudarc::driver::CudaContext>>,
    /// The driver refused a registration: stop asking.
    #[cfg(feature = "cuda")]
    page_lock_refused: std::sync::atomic::AtomicBool,
    /// How long to keep reconnecting to a node that closed the connection
    /// (it restarts) before giving up; zero: never reconnect.
    reconnect: Duration,
    /// The last plan announced, announced again on a new connection (the
    /// node keeps a trainer's plan per connection, to prefetch along it).
    last_follow: Mutex<Option<(DatasetVersion, Walk)>>,
    /// Reconnects so far, and the nanoseconds they waited (issue 48).
    reconnects: std::sync::atomic::AtomicU64,
    reconnect_waited_ns: std::sync::atomic::AtomicU64,
    /// A reply this client could not read left the connection out of step:
    /// it is not used again, nor replaced (the next reply would be no
    /// better understood).
    out_of_step: std::sync::atomic::AtomicBool,
}

/// How long a [`LocalSource`] keeps reconnecting to a node that went away,
/// by default: a node restart (its SSD tier reopened, its datasets opened
/// again) takes seconds.
pub const DEFAULT_RECONNECT: Duration = Duration::from_secs(30);

/// True when `e` means the connection is gone (the node exited or
/// restarted), not that the node answered with an error.
fn connection_lost(e: &ClientError) -> bool {
    use std::io::ErrorKind as K;
    match e {
        ClientError::Io(io) => matches!(
            io.kind(),
            K::BrokenPipe | K::ConnectionReset | K::ConnectionAborted | K::UnexpectedEof | K::NotConnected
        ),
        _ => false,
    }
}

/// How long a node has to answer a hello (it answers at once; a node of
/// local protocol 1 answers with a refusal of the hello as a frame).
const HELLO_WAIT: Duration = Duration::from_secs(10);

/// Connects to the node at `path` and agrees on a version of the local
/// protocol ([`version`]): a hello, or, with a node of protocol 1 (which
/// refuses the hello as an oversized frame and closes), a new connection
/// without one. Returns the stream and the version agreed. Every version
/// this build speaks sends the same frames but for the requests a version
/// added (`Counters`: 3).
fn open(path: &Path, speaks: version::Speaks) -> Result<(UnixStream, u16), ClientError> {
    let connect =
        || UnixStream::connect(path).map_err(|source| ClientError::Connect { path: path.to_path_buf(), source });
    let mut stream = connect()?;
    stream.set_read_timeout(Some(HELLO_WAIT))?;
    stream.write_all(&version::encode_hello(speaks))?;
    let mut reply = [0u8; version::HELLO_REPLY_LEN];
    stream.read_exact(&mut reply)?;
    stream.set_read_timeout(None)?;
    let node = match version::decode_hello_reply(reply, speaks) {
        version::HelloReply::Speak { version, .. } => return Ok((stream, version)),
        version::HelloReply::Refused { node } => node,
        version::HelloReply::Legacy => {
            let one = version::Speaks { oldest: 1, current: 1 };
            if speaks.negotiate(one).is_ok() {
                return Ok((connect()?, 1));
            }
            one
        }
    };
    Err(ClientError::Version { path: path.to_path_buf(), client: speaks, node })
}

mod mappings;
use mappings::MappingCache;

/// The largest chunk mapped when its dataset was not described through
/// this source (the bound on a chunk from a peer).
const MAX_UNDESCRIBED_CHUNK_LEN: u64 = granary_proto::peer::MAX_PEER_CHUNK_LEN;

impl LocalSource {
    /// Connects to the node listening at `path`.
    pub fn connect(path: impl AsRef<Path>) -> Result<Self, ClientError> {
        Self::connect_speaking(path, version::LOCAL)
    }

    /// [`LocalSource::connect`] speaking only `speaks` of the local
    /// protocol ([`version::LOCAL`] in `connect`): how a trainer of an
    /// older build meets the node, for tests of a rolling upgrade.
    pub fn connect_speaking(path: impl AsRef<Path>, speaks: version::Speaks) -> Result<Self, ClientError> {
        let path = path.as_ref().to_path_buf();
        let (stream, agreed) = open(&path, speaks)?;
        let mappings = MappingCache {
            own_bytes: DEFAULT_MAPPING_CACHE_BYTES,
            budget_bytes: DEFAULT_MAPPING_CACHE_BYTES,
            bytes: 0,
            tick: 0,
            entries: HashMap::new(),
        };
        Ok(Self {
            path,
            stream: Mutex::new(Some(stream)),
            verify: Verify::HeaderOnly,
            mappings: Mutex::new(mappings),
            chunk_lens: Mutex::new(HashMap::new()),
            #[cfg(feature = "cuda")]
            page_lock: None,
            #[cfg(feature = "cuda")]
            page_lock_refused: std::sync::atomic::AtomicBool::new(false),
            reconnect: DEFAULT_RECONNECT,
            speaks,
            agreed: std::sync::atomic::AtomicU16::new(agreed),
            last_follow: Mutex::new(None),
            reconnects: std::sync::atomic::AtomicU64::new(0),
            reconnect_waited_ns: std::sync::atomic::AtomicU64::new(0),
            out_of_step: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Keeps reconnecting for up to `within` when the node closes the
    /// connection (it was restarted), then repeats the request; zero turns
    /// reconnecting off (the error comes at once). Default
    /// [`DEFAULT_RECONNECT`].
    pub fn reconnect_within(mut self, within: Duration) -> Self {
        self.reconnect = within;
        self
    }

    /// Registers every chunk this source maps with `ctx` as page-locked,
    /// read-only memory, once per mapping (kept while the mapping cache
    /// keeps the mapping), so that a [`crate::cuda::GpuStream`] copies a
    /// batch that is a view into a chunk straight from chunk memory. Where
    /// the driver refuses (read-only registration needs a device and driver
    /// that support it), the chunk is used unregistered and the feed packs
    /// views into its staging buffer as before (logged; this source then
    /// stops trying). Registering pays off with a block shuffle, whose
    /// batches are mostly views; an assembled batch gains nothing from it.
    #[cfg(feature = "cuda")]
    pub fn page_lock_for(mut self, ctx: Arc<cudarc::driver::CudaContext>) -> Self {
        self.page_lock = Some(ctx);
        self
    }

    /// Keeps up to `bytes` of recently used chunk mappings (0 disables).
    pub fn mapping_cache(self, bytes: u64) -> Self {
        if let Ok(mut m) = self.mappings.lock() {
            m.own_bytes = bytes;
            m.budget_bytes = bytes;
            m.entries.clear();
            m.bytes = 0;
        }
        self
    }

    /// The budget of kept chunk mappings now: the lower of the one set
    /// and the node's latest advice (sent with each description, and read
    /// again each time a plan is announced: issue 42).
    pub fn mapping_budget(&self) -> u64 {
        self.mappings.lock().map_or(0, |m| m.budget_bytes)
    }

    /// Also checksum every chunk payload on receipt.
    pub fn verify(mut self, verify: Verify) -> Self {
        self.verify = verify;
        self
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The node's counters.
    pub fn stats(&self) -> Result<NodeStats, ClientError> {
        match self.call(&LocalRequest::Stats)?.0 {
            LocalResponse::Stats(s) => Ok(s),
            other => Err(unexpected("Stats", &other)),
        }
    }

    /// The node's counters beyond [`NodeStats`], by name (`chunks_reused`),
    /// from a node of local protocol 3 or newer; from an older node, a
    /// [`ClientError::Version`] saying to upgrade it.
    pub fn counters(&self) -> Result<Vec<(String, u64)>, ClientError> {
        let agreed = self.agreed.load(std::sync::atomic::Ordering::Relaxed);
        if agreed < 3 {
            let node = version::Speaks { oldest: 1, current: agreed };
            let client = version::Speaks { oldest: 3, current: self.speaks.current };
            return Err(ClientError::Version { path: self.path.clone(), client, node });
        }
        match self.call(&LocalRequest::Counters)?.0 {
            LocalResponse::Counters(c) => Ok(c.into_iter().map(|c| (c.name, c.value)).collect()),
            other => Err(unexpected("Counters", &other)),
        }
    }

    /// Reads the node's mapping advice again (issue 42: it moves as the
    /// node's own memory grows and as loaders come and go; a trainer
    /// describes a dataset once), from a node of local protocol 3 that
    /// reports it as a counter; otherwise the advice stands as described.
    fn refresh_advice(&self) {
        if self.agreed.load(std::sync::atomic::Ordering::Relaxed) < 3 {
            return;
        }
        match self.counters() {
            Ok(c) => {
                if let Some((_, advice)) = c.iter().find(|(n, _)| n == "mapping_advice_bytes") {
                    self.mappings.lock().unwrap_or_else(|p| p.into_inner()).cap(*advice);
                }
            }
            Err(e) => tracing::debug!(path = %self.path.display(), error = %e, "the node's advice was not read again"),
        }
    }

    /// The node's stage clocks and its ranks' last reports (`granary doctor`).
    pub fn doctor(&self) -> Result<granary_proto::doctor::DoctorSnapshot, ClientError> {
        match self.call(&LocalRequest::Doctor)?.0 {
            LocalResponse::Doctor(s) => Ok(s),
            other => Err(unexpected("Doctor", &other)),
        }
    }

    /// Sends one request and reads its reply (and any attached descriptor).
    /// When the connection is gone (the node restarted), reconnects for up
    /// to the reconnect time, announces the last plan again and repeats
    /// the request (every request may be repeated: none changes the node's
    /// state beyond the connection's own).
    fn call(&self, req: &LocalRequest) -> Result<(LocalResponse, Option<OwnedFd>), ClientError> {
        // A poisoned lock only means another thread panicked mid-call; the
        // stream may hold half a frame, so refuse rather than desynchronise.
        let mut guard = self.stream.lock().map_err(|_| ProtocolError::Poisoned)?;
        match self.exchange_on(&mut guard, req) {
            Err(e) if !self.reconnect.is_zero() && connection_lost(&e) => {
                self.reconnect_on(&mut guard, e)?;
                self.exchange_on(&mut guard, req)
            }
            answered => answered,
        }
    }

    /// Connects again (after `lost`), retrying with growing pauses until
    /// the reconnect time is spent, and announces the last plan on the new
    /// connection.
    fn reconnect_on(
        &self,
        guard: &mut std::sync::MutexGuard<'_, Option<UnixStream>>,
        lost: ClientError,
    ) -> Result<(), ClientError> {
        **guard = None;
        tracing::warn!(path = %self.path.display(), error = %lost, "the node closed the connection; reconnecting");
        let started = std::time::Instant::now();
        self.reconnects.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The time waited is counted however the wait ends.
        struct Waited<'a>(&'a std::sync::atomic::AtomicU64, std::time::Instant);
        impl Drop for Waited<'_> {
            fn drop(&mut self) {
                let ns = u64::try_from(self.1.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.0.fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let _waited = Waited(&self.reconnect_waited_ns, started);
        let mut pause = Duration::from_millis(50);
        let mut last = match lost {
            ClientError::Io(e) => e,
            other => std::io::Error::other(other.to_string()),
        };
        loop {
            if started.elapsed() >= self.reconnect {
                return Err(ClientError::NodeGone { path: self.path.clone(), waited: self.reconnect, source: last });
            }
            std::thread::sleep(pause.min(self.reconnect.saturating_sub(started.elapsed())));
            pause = (pause * 2).min(Duration::from_secs(1));
            let stream = match open(&self.path, self.speaks) {
                Ok((s, agreed)) => {
                    self.agreed.store(agreed, std::sync::atomic::Ordering::Relaxed);
                    s
                }
                Err(ClientError::Connect { source, .. }) => {
                    last = source;
                    continue;
                }
                Err(e) if connection_lost(&e) => {
                    last = std::io::Error::other(e.to_string());
                    continue;
                }
                Err(e) => return Err(e),
            };
            **guard = Some(stream);
            let follow = *self.last_follow.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((version, walk)) = follow {
                match self.exchange_on(guard, &LocalRequest::FollowWalk { version, walk }) {
                    Ok((LocalResponse::Following, _)) => {}
                    Ok((other, _)) => return Err(unexpected("Follow", &other)),
                    // A cluster node takes connections before the
                    // coordinator's placement has told it its datasets: it
                    // does not know the version yet. Not back yet; the
                    // reconnect time bounds the wait.
                    Err(e) if connection_lost(&e) || matches!(e, ClientError::Node { .. }) => {
                        last = std::io::Error::other(e.to_string());
                        **guard = None;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            tracing::warn!(path = %self.path.display(), after = ?started.elapsed(), "reconnected to the node");
            return Ok(());
        }
    }

    /// [`Self::call`] if the connection is free now; `None` (nothing sent)
    /// while another thread's request is under way.
    fn try_call(&self, req: &LocalRequest) -> Result<Option<(LocalResponse, Option<OwnedFd>)>, ClientError> {
        match self.stream.try_lock() {
            Ok(mut guard) => self.exchange_on(&mut guard, req).map(Some),
            Err(std::sync::TryLockError::WouldBlock) => Ok(None),
            Err(std::sync::TryLockError::Poisoned(_)) => Err(ProtocolError::Poisoned.into()),
        }
    }

    /// One request and its reply on the connection `guard` holds; an
    /// error before the reply was read whole drops the connection.
    fn exchange_on(
        &self,
        guard: &mut std::sync::MutexGuard<'_, Option<UnixStream>>,
        req: &LocalRequest,
    ) -> Result<(LocalResponse, Option<OwnedFd>), ClientError> {
        let body = wire::encode(req);
        let Some(stream) = guard.as_mut() else {
            if self.out_of_step.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(ProtocolError::OutOfStep { path: self.path.clone() }.into());
            }
            // Lost before (another thread's request saw it go).
            return Err(ClientError::Io(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the connection to the node was lost",
            )));
        };
        let frame =
            frame::encode(&body, MAX_FRAME_LEN).map_err(|error| ProtocolError::Frame { what: "request", error })?;
        // Until the whole reply is read, an error leaves the stream out of
        // step (the next reply would be read from the middle of this one).
        let exchange = (|| -> Result<(Vec<u8>, Option<OwnedFd>), ClientError> {
            stream.write_all(&frame)?;
            let (header, fd) = read_prefix_with_fd(stream)?;
            let len = frame::decode_len(header, MAX_FRAME_LEN)
                .map_err(|error| ProtocolError::Frame { what: "reply", error })?;
            let mut reply = vec![0u8; len];
            stream.read_exact(&mut reply)?;
            Ok((reply, fd))
        })();
        let (reply, fd) = match exchange {
            Ok(r) => r,
            Err(e) => {
                if !connection_lost(&e) {
                    self.out_of_step.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                **guard = None;
                return Err(e);
            }
        };
        let resp = wire::decode::<LocalResponse>(&reply).map_err(ProtocolError::Decode)?;
        if let LocalResponse::Failed { kind, message } = resp {
            return Err(ClientError::Node { kind, message });
        }
        Ok((resp, fd))
    }
}

/// A reply of the wrong kind to the request `asked`.
fn unexpected(asked: &'static str, resp: &LocalResponse) -> ClientError {
    let replied = match resp {
        LocalResponse::Described(_) => "Described",
        LocalResponse::Following => "Following",
        LocalResponse::Chunk { .. } => "Chunk",
        LocalResponse::Stats(_) => "Stats",
        LocalResponse::Touched => "Touched",
        LocalResponse::Reported => "Reported",
        LocalResponse::Doctor(_) => "Doctor",
        LocalResponse::NotServed { .. } => "NotServed",
        LocalResponse::Failed { .. } => "Failed",
        LocalResponse::Counters(_) => "Counters",
    };
    ProtocolError::Unexpected { asked, replied }.into()
}

/// Reads the 4-byte length prefix, collecting a descriptor sent with it.
fn read_prefix_with_fd(stream: &UnixStream) -> Result<([u8; frame::HEADER_LEN], Option<OwnedFd>), ClientError> {
    let mut prefix = [0u8; frame::HEADER_LEN];
    let mut got = 0;
    let mut fd = None;
    while got < frame::HEADER_LEN {
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut cmsg = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [IoSliceMut::new(&mut prefix[got..])];
        // A signal (a Python process's SIGCHLD, say) interrupts the wait:
        // nothing was received, so wait again.
        let r = match rustix::net::recvmsg(stream, &mut iov, &mut cmsg, RecvFlags::CMSG_CLOEXEC) {
            Err(rustix::io::Errno::INTR) => continue,
            r => r.map_err(std::io::Error::from)?,
        };
        for msg in cmsg.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = msg {
                for f in fds {
                    // Keep the first descriptor; extra ones are closed on drop.
                    if fd.is_none() {
                        fd = Some(f);
                    }
                }
            }
        }
        if r.bytes == 0 {
            return Err(ClientError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "node closed the connection",
            )));
        }
        got += r.bytes;
    }
    Ok((prefix, fd))
}

/// A read-only mapping of a sealed memory file.
struct MappedChunk {
    ptr: *mut std::ffi::c_void,
    len: usize,
    /// The CUDA context the mapping is registered with as page-locked
    /// memory, if any (unregistered before it is unmapped).
    #[cfg(feature = "cuda")]
    registered: Option<Arc<cudarc::driver::CudaContext>>,
}

// SAFETY: the mapping is read-only and the file is sealed against writes, so
// the bytes never change; sharing `&[u8]` views across threads is sound.
unsafe impl Send for MappedChunk {}
// SAFETY: as above.
unsafe impl Sync for MappedChunk {}

impl MappedChunk {
    fn map(fd: &OwnedFd, shard: ShardId, announced: u64) -> Result<Self, ClientError> {
        let len = announced as usize;
        let seals = rustix::fs::fcntl_get_seals(fd).map_err(std::io::Error::from)?;
        let needed = SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW;
        if !seals.contains(needed) {
            return Err(ProtocolError::Unsealed { shard, seals: seals.bits() }.into());
        }
        let size = rustix::fs::fstat(fd).map_err(std::io::Error::from)?.st_size;
        if size != len as i64 || len == 0 {
            return Err(ProtocolError::FileSize { shard, size, len: announced }.into());
        }
        // SAFETY: mapping a sealed file read-only; the region is owned by
        // this value and unmapped exactly once in Drop. The file cannot
        // shrink (SEAL_SHRINK), so no access past its end can fault.
        // POPULATE maps every page up front: one kernel call instead of a
        // page fault per 4 KiB when the batch assembler first reads it.
        let ptr = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ, MapFlags::SHARED | MapFlags::POPULATE, fd, 0)
        }
        .map_err(std::io::Error::from)?;
        Ok(Self {
            ptr,
            len,
            #[cfg(feature = "cuda")]
            registered: None,
        })
    }
}

impl ChunkBytes for MappedChunk {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes for the lifetime of self,
        // and their content never changes (sealed file).
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }

    #[cfg(feature = "cuda")]
    fn page_locked(&self) -> bool {
        self.registered.is_some()
    }
}

impl Drop for MappedChunk {
    fn drop(&mut self) {
        // A device copy that read this mapping is finished by now: a GPU
        // feed holds the batch (and so this chunk) until its copy is done.
        #[cfg(feature = "cuda")]
        if let Some(ctx) = self.registered.take()
            && !crate::cuda::unregister_host(&ctx, self.ptr)
        {
            // Unmapping pages the driver still holds pinned would leak them
            // and leave the range registered: keep the mapping instead.
            return;
        }
        // SAFETY: unmapping the region mapped in `map`, once.
        let _ = unsafe { rustix::mm::munmap(self.ptr, self.len) };
    }
}

impl ChunkSource for LocalSource {
    fn stalls(&self) -> crate::Stalls {
        use std::sync::atomic::Ordering::Relaxed;
        crate::Stalls {
            reconnects: self.reconnects.load(Relaxed),
            waited: Duration::from_nanos(self.reconnect_waited_ns.load(Relaxed)),
        }
    }

    fn report(&self, report: &granary_proto::doctor::RankReport) -> Result<bool, ClientError> {
        // Never wait behind a chunk fetch: a busy connection sends nothing
        // now (the loader tries again at its next batch).
        match self.try_call(&LocalRequest::Report(report.clone()))? {
            None => Ok(false),
            Some((LocalResponse::Reported, _)) => Ok(true),
            Some((other, _)) => Err(unexpected("Reported", &other)),
        }
    }

    fn describe(&self, dataset: &str, version: Option<DatasetVersion>) -> Result<DatasetInfo, ClientError> {
        match self.call(&LocalRequest::Describe { dataset: dataset.to_string(), version })?.0 {
            LocalResponse::Described(info) if info.name != dataset => {
                Err(ProtocolError::WrongDataset { asked: dataset.to_string(), described: info.name }.into())
            }
            LocalResponse::NotServed { dataset, version: Some(version), current: Some(current), .. } => {
                Err(ClientError::VersionGone { dataset, version, current: Some(current) })
            }
            LocalResponse::NotServed { dataset, served, .. } => Err(ClientError::UnknownDataset { dataset, served }),
            LocalResponse::Described(info) => {
                if let Some(asked) = version
                    && asked != info.version
                {
                    return Err(
                        ProtocolError::WrongVersion { dataset: info.name, asked, described: info.version }.into()
                    );
                }
                // The node's memory bounds what its trainers keep mapped.
                self.mappings.lock().unwrap_or_else(|p| p.into_inner()).cap(info.mapping_budget_bytes);
                // A layout that cannot be computed leaves those shards
                // bounded by MAX_UNDESCRIBED_CHUNK_LEN only.
                let lens = info
                    .shards
                    .iter()
                    .filter_map(|s| {
                        granary_proto::ChunkLayout::new(info.version, s.shard, s.rows, &info.tensors)
                            .ok()
                            .map(|l| (s.shard, l.total_len() as u64))
                    })
                    .collect();
                if let Ok(mut m) = self.chunk_lens.lock() {
                    m.insert(info.version, lens);
                }
                Ok(info)
            }
            other => Err(unexpected("Describe", &other)),
        }
    }

    fn follow(&self, version: DatasetVersion, walk: &Walk) -> Result<(), ClientError> {
        match self.call(&LocalRequest::FollowWalk { version, walk: *walk })?.0 {
            LocalResponse::Following => {
                *self.last_follow.lock().unwrap_or_else(|p| p.into_inner()) = Some((version, *walk));
                self.refresh_advice();
                Ok(())
            }
            other => Err(unexpected("Follow", &other)),
        }
    }

    fn fetch(&self, version: DatasetVersion, shard: ShardId) -> Result<Chunk, ClientError> {
        // A poisoned cache lock only loses the cache, never correctness.
        if let Some(chunk) = self.mappings.lock().ok().and_then(|mut m| m.get((version, shard))) {
            // The node still learns where the rank is, for its prefetch.
            return match self.call(&LocalRequest::Touch { version, shard })?.0 {
                LocalResponse::Touched => Ok(chunk),
                other => Err(unexpected("Touch", &other)),
            };
        }
        match self.call(&LocalRequest::FetchChunk { version, shard })? {
            (LocalResponse::Chunk { len }, Some(fd)) => {
                let expected = self.chunk_lens.lock().ok().and_then(|m| m.get(&version)?.get(&shard).copied());
                match expected {
                    Some(expected) if expected != len => {
                        return Err(ProtocolError::ChunkLength { shard, announced: len, expected }.into());
                    }
                    None if len > MAX_UNDESCRIBED_CHUNK_LEN => {
                        return Err(ProtocolError::ChunkTooLarge {
                            shard,
                            announced: len,
                            cap: MAX_UNDESCRIBED_CHUNK_LEN,
                        }
                        .into());
                    }
                    _ => {}
                }
                #[allow(unused_mut)]
                let mut mapped = MappedChunk::map(&fd, shard, len)?;
                #[cfg(feature = "cuda")]
                if let Some(ctx) = &self.page_lock
                    && !self.page_lock_refused.load(std::sync::atomic::Ordering::Relaxed)
                {
                    match crate::cuda::register_host_read_only(ctx, mapped.ptr, mapped.len) {
                        Ok(()) => mapped.registered = Some(ctx.clone()),
                        Err(e) => {
                            // Once refused, not tried again by this source.
                            self.page_lock_refused.store(true, std::sync::atomic::Ordering::Relaxed);
                            tracing::warn!(error = %e, "chunk memory stays pageable: views will be staged");
                        }
                    }
                }
                let chunk = Chunk::new(Arc::new(mapped), version, shard, self.verify)?;
                if let Ok(mut m) = self.mappings.lock() {
                    m.insert((version, shard), chunk.clone());
                }
                Ok(chunk)
            }
            (LocalResponse::Chunk { .. }, None) => Err(ProtocolError::NoDescriptor { shard }.into()),
            (other, _) => Err(unexpected("FetchChunk", &other)),
        }
    }
}
