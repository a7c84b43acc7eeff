//! Chunks in sealed memory files.
//!
//! The RAM tier keeps each chunk in its own memory file (memfd). The
//! converter writes the chunk once into a writable mapping; the node then
//! seals the file against writes, shrinking and growing, and keeps a
//! read-only mapping. Handing a chunk to a trainer is passing a duplicate of
//! the descriptor over the Unix socket: the trainer maps the same pages, so
//! no byte is copied, and the seals let it trust that the bytes it validated
//! cannot change underneath it.

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{Advice, MapFlags, ProtFlags};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// Size of a PMD-mapped transparent huge page on x86-64 and arm64 with 4 KiB
/// base pages.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Attempts at sealing a memory file that the kernel finds busy.
const SEAL_ATTEMPTS: u32 = 10;
/// Pause between those attempts.
const SEAL_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// Seals `fd` against writes and resizes. The kernel refuses the write seal
/// with EBUSY while any page of the file holds an extra reference, and a
/// page just written can hold one for a moment in another CPU's LRU batch
/// (the kernel drains only its own CPU's before it gives up): seen once in
/// `bench cluster` as a peer chunk that could not be sealed. A few short
/// retries outlast that batch; a file still busy after them is an error.
fn seal_fd(fd: &OwnedFd) -> io::Result<()> {
    retry_busy(SEAL_ATTEMPTS, || {
        rustix::fs::fcntl_add_seals(fd, SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(io::Error::from)
    })
}

/// Calls `f` up to `attempts` times while it fails with EBUSY, pausing
/// [`SEAL_RETRY_PAUSE`] between calls.
fn retry_busy(attempts: u32, mut f: impl FnMut() -> io::Result<()>) -> io::Result<()> {
    let mut left = attempts.max(1);
    loop {
        match f() {
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) && left > 1 => {
                left -= 1;
                std::thread::sleep(SEAL_RETRY_PAUSE);
            }
            other => return other,
        }
    }
}

/// Bytes held by live sealed chunks in this process.
static LIVE_CHUNK_BYTES: AtomicU64 = AtomicU64::new(0);

/// Bytes of memory files this process holds chunks in. These pages are
/// shared memory: they count against the node's memory even when the node
/// itself never touches them, so budgets include them.
pub fn live_chunk_bytes() -> u64 {
    LIVE_CHUNK_BYTES.load(Ordering::Relaxed)
}

/// A sealed, read-only memory file holding one chunk.
pub struct SealedChunk {
    fd: OwnedFd,
    ptr: *mut std::ffi::c_void,
    len: usize,
}

// SAFETY: the mapping is read-only over a write-sealed file: the bytes never
// change, so shared access from any thread is sound.
unsafe impl Send for SealedChunk {}
// SAFETY: as above.
unsafe impl Sync for SealedChunk {}

impl std::fmt::Debug for SealedChunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedChunk").field("len", &self.len).finish()
    }
}

/// A writable memory file being filled; becomes a [`SealedChunk`].
pub(crate) struct ChunkWriter {
    fd: OwnedFd,
    ptr: *mut std::ffi::c_void,
    len: usize,
}

// SAFETY: the writer exclusively owns its mapping; moving it to another
// thread (the converter pool) moves that ownership.
unsafe impl Send for ChunkWriter {}

/// A memory file for one chunk: close-on-exec, sealable, and, where the
/// kernel knows `MFD_NOEXEC_SEAL` (Linux 6.3), never executable (its exec
/// bits cleared and sealed, so no process that receives it can map it
/// executable); older kernels refuse the flag, and get the file without it.
fn chunk_memfd() -> io::Result<rustix::fd::OwnedFd> {
    let base = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    match rustix::fs::memfd_create("granary-chunk", base | MemfdFlags::NOEXEC_SEAL) {
        Err(rustix::io::Errno::INVAL) => Ok(rustix::fs::memfd_create("granary-chunk", base)?),
        other => Ok(other?),
    }
}

impl ChunkWriter {
    /// A zero-filled memory file of `len` bytes, mapped writable.
    pub(crate) fn new(len: usize) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty chunk"));
        }
        let fd = chunk_memfd()?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        // SAFETY: a fresh shared mapping of a file we own, `len` bytes long;
        // unmapped exactly once (in `seal` or Drop).
        let ptr = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &fd, 0)
        }?;
        // Huge pages for the whole 2 MiB extents of the chunk, where the host
        // allows them for shared memory (transparent_hugepage/shmem_enabled
        // `advise`; elsewhere this is refused or ignored, harmlessly): one
        // page to allocate, clear and map here per 2 MiB instead of 512
        // (trainers map the same pages; without advice of their own, with
        // small entries). The tail stays in small pages, so no memory is
        // allocated past the chunk's end.
        let huge = len / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
        if huge > 0 {
            // SAFETY: advice on the first `huge` bytes of our own mapping.
            let _ = unsafe { rustix::mm::madvise(ptr, huge, Advice::LinuxHugepage) };
        }
        // Populated up front: one kernel pass allocates every page, instead
        // of a fault per page while the converter writes the chunk. (A
        // peer's chunk goes into a [`ChunkFile`] instead, which needs no
        // cleared pages.) Kernels before 5.14 refuse the advice; their
        // pages are allocated on first write instead.
        // SAFETY: advice on our own mapping of `len` bytes.
        let _ = unsafe { rustix::mm::madvise(ptr, len, Advice::LinuxPopulateWrite) };
        Ok(Self { fd, ptr, len })
    }

    /// The bytes to fill.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` maps `len` writable bytes owned by self; the borrow
        // is unique through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<u8>(), self.len) }
    }

    /// Drops write access and seals the file.
    pub(crate) fn seal(mut self) -> io::Result<SealedChunk> {
        // SAFETY: unmapping our own writable mapping; the pointer is nulled
        // so Drop does not unmap it again.
        unsafe { rustix::mm::munmap(self.ptr, self.len) }?;
        self.ptr = std::ptr::null_mut();
        seal_fd(&self.fd)?;
        // SAFETY: a read-only mapping of the now-sealed file, unmapped once
        // in SealedChunk's Drop.
        let ptr = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), self.len, ProtFlags::READ, MapFlags::SHARED, &self.fd, 0)
        }?;
        let fd = self.fd.try_clone()?;
        LIVE_CHUNK_BYTES.fetch_add(self.len as u64, Ordering::Relaxed);
        Ok(SealedChunk { fd, ptr, len: self.len })
    }
}

impl Drop for ChunkWriter {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: unmapping our own mapping once.
            let _ = unsafe { rustix::mm::munmap(self.ptr, self.len) };
        }
    }
}

/// A memory file filled by writes, with no mapping while it is filled: the
/// kernel takes each page as bytes are written into it, so unlike
/// [`ChunkWriter`] (which maps the file and populates it first) no page is
/// cleared before it is filled. For bytes that arrive in pieces from
/// elsewhere (a peer's chunk): one copy, from the pieces into the file.
pub(crate) struct ChunkFile {
    fd: OwnedFd,
    len: usize,
    written: usize,
}

impl ChunkFile {
    /// An empty memory file of `len` bytes.
    pub(crate) fn new(len: usize) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty chunk"));
        }
        let fd = chunk_memfd()?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        Ok(Self { fd, len, written: 0 })
    }

    /// The file's length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes written so far, from the start.
    pub(crate) fn written(&self) -> usize {
        self.written
    }

    /// Writes `pieces`, in order, after what was written. More bytes than
    /// the file has room for are refused, and nothing of them is written.
    pub(crate) fn append(&mut self, pieces: &[bytes::Bytes]) -> io::Result<()> {
        let total: usize = pieces.iter().map(bytes::Bytes::len).sum();
        if total > self.len - self.written {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{total} more bytes after {} of {}", self.written, self.len),
            ));
        }
        let mut slices: Vec<io::IoSlice<'_>> = pieces.iter().map(|p| io::IoSlice::new(p)).collect();
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let n = rustix::io::pwritev(&self.fd, rest, self.written as u64)?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "the memory file took no bytes"));
            }
            self.written += n;
            io::IoSlice::advance_slices(&mut rest, n);
        }
        Ok(())
    }

    /// Seals the file (it must be full) and maps it read-only.
    pub(crate) fn seal(self) -> io::Result<SealedChunk> {
        if self.written != self.len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{} of {} bytes written", self.written, self.len),
            ));
        }
        seal_fd(&self.fd)?;
        // Populated: every page exists already (the writes made them), so
        // this maps them in one pass instead of a fault per page when the
        // chunk is first read (its checksum is checked next).
        // SAFETY: a read-only mapping of a sealed file we own, unmapped once
        // in SealedChunk's Drop.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                self.len,
                ProtFlags::READ,
                MapFlags::SHARED | MapFlags::POPULATE,
                &self.fd,
                0,
            )
        }?;
        LIVE_CHUNK_BYTES.fetch_add(self.len as u64, Ordering::Relaxed);
        Ok(SealedChunk { fd: self.fd, ptr, len: self.len })
    }
}

impl SealedChunk {
    /// A sealed copy of `bytes` (used when a chunk comes back from SSD).
    pub fn copy_of(bytes: &[u8]) -> io::Result<Self> {
        let mut w = ChunkWriter::new(bytes.len())?;
        w.as_mut_slice().copy_from_slice(bytes);
        w.seal()
    }

    /// The chunk bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes of a sealed file for the
        // lifetime of self.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty chunk (never: chunks have a header).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The descriptor, to send to a trainer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A shared chunk as [`bytes::Bytes`] without copying: the `Bytes` keeps the
/// mapping alive, so QUIC can send from it while the tier evicts.
#[derive(Debug)]
struct SharedChunkBytes(std::sync::Arc<SealedChunk>);

impl AsRef<[u8]> for SharedChunkBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

impl SealedChunk {
    /// The chunk's bytes as `Bytes` that share this mapping (no copy).
    pub fn shared_bytes(self: &std::sync::Arc<Self>) -> bytes::Bytes {
        bytes::Bytes::from_owner(SharedChunkBytes(self.clone()))
    }
}

impl Drop for SealedChunk {
    fn drop(&mut self) {
        LIVE_CHUNK_BYTES.fetch_sub(self.len as u64, Ordering::Relaxed);
        // SAFETY: unmapping our own read-only mapping once.
        let _ = unsafe { rustix::mm::munmap(self.ptr, self.len) };
    }
}

impl granary_client::ChunkBytes for SealedChunk {
    fn bytes(&self) -> &[u8] {
        SealedChunk::bytes(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_files_are_never_executable_where_the_kernel_can_seal_that() {
        let fd = chunk_memfd().expect("memfd");
        let seals = rustix::fs::fcntl_get_seals(&fd).expect("seals");
        if !seals.contains(SealFlags::EXEC) {
            // A kernel before 6.3 refused MFD_NOEXEC_SEAL.
            granary_testkit::skip::skipped("this kernel has no MFD_NOEXEC_SEAL");
            return;
        }
        let mode = rustix::fs::fstat(&fd).expect("fstat").st_mode;
        assert_eq!(mode & 0o111, 0, "no exec bit: {mode:o}");
    }

    #[test]
    fn a_busy_seal_is_retried_a_bounded_number_of_times() {
        let busy = || io::Error::from_raw_os_error(rustix::io::Errno::BUSY.raw_os_error());
        let mut calls = 0;
        assert!(
            retry_busy(3, || {
                calls += 1;
                if calls < 3 { Err(busy()) } else { Ok(()) }
            })
            .is_ok()
        );
        assert_eq!(calls, 3);
        let mut calls = 0;
        let err = retry_busy(3, || {
            calls += 1;
            Err(busy())
        })
        .expect_err("still busy");
        assert_eq!((calls, err.raw_os_error()), (3, Some(rustix::io::Errno::BUSY.raw_os_error())));
        let mut calls = 0;
        assert!(
            retry_busy(3, || {
                calls += 1;
                Err(io::Error::from(io::ErrorKind::PermissionDenied))
            })
            .is_err()
        );
        assert_eq!(calls, 1, "other errors are not retried");
    }

    #[test]
    fn sealed_files_refuse_writes_and_keep_their_bytes() {
        let mut w = ChunkWriter::new(4096).unwrap();
        w.as_mut_slice()[..3].copy_from_slice(b"abc");
        let s = w.seal().unwrap();
        assert_eq!(&s.bytes()[..3], b"abc");
        assert_eq!(s.bytes().as_ptr() as usize % 4096, 0);
        let seals = rustix::fs::fcntl_get_seals(s.fd()).unwrap();
        assert!(seals.contains(SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW));
        assert!(rustix::io::write(s.fd(), b"x").is_err());
        assert!(rustix::fs::ftruncate(s.fd(), 10).is_err());
    }

    #[test]
    fn a_chunk_file_takes_pieces_in_order_and_refuses_overflow_and_short_fills() {
        let mut f = ChunkFile::new(10).unwrap();
        f.append(&[bytes::Bytes::from_static(b"abc"), bytes::Bytes::from_static(b"defg")]).unwrap();
        assert_eq!(f.written(), 7);
        assert!(f.append(&[bytes::Bytes::from_static(b"hijk")]).is_err(), "past the end");
        assert_eq!(f.written(), 7, "nothing of a refused append is written");
        let short = ChunkFile::new(4).unwrap();
        assert!(short.seal().is_err(), "a file not filled is not sealed");
        f.append(&[bytes::Bytes::from_static(b"hij")]).unwrap();
        let s = f.seal().unwrap();
        assert_eq!(s.bytes(), b"abcdefghij");
        let seals = rustix::fs::fcntl_get_seals(s.fd()).unwrap();
        assert!(seals.contains(SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW));
        assert!(rustix::io::write(s.fd(), b"x").is_err());
    }
}
