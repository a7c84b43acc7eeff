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

use crate::error::ClientError;
use crate::source::{Chunk, ChunkBytes, ChunkSource};
use granary_proto::chunk::Verify;
use granary_proto::wire::{self, DatasetInfo, LocalRequest, LocalResponse, MAX_FRAME_LEN, NodeStats};
use granary_proto::{DatasetVersion, PlanParams, ShardId};
use rustix::fd::OwnedFd;
use rustix::fs::SealFlags;
use rustix::mm::{MapFlags, ProtFlags};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use std::io::{IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A connection to the local node.
pub struct LocalSource {
    path: PathBuf,
    stream: Mutex<UnixStream>,
    verify: Verify,
}

impl LocalSource {
    /// Connects to the node listening at `path`.
    pub fn connect(path: impl AsRef<Path>) -> Result<Self, ClientError> {
        let path = path.as_ref().to_path_buf();
        let stream =
            UnixStream::connect(&path).map_err(|source| ClientError::Connect { path: path.clone(), source })?;
        Ok(Self { path, stream: Mutex::new(stream), verify: Verify::HeaderOnly })
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
            other => Err(unexpected(other)),
        }
    }

    /// Sends one request and reads its reply (and any attached descriptor).
    fn call(&self, req: &LocalRequest) -> Result<(LocalResponse, Option<OwnedFd>), ClientError> {
        let body = wire::encode(req);
        // A poisoned lock only means another thread panicked mid-call; the
        // stream may hold half a frame, so refuse rather than desynchronise.
        let mut stream = self.stream.lock().map_err(|_| ClientError::Protocol("connection poisoned".into()))?;
        let mut frame = Vec::with_capacity(4 + body.len());
        frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
        frame.extend_from_slice(&body);
        stream.write_all(&frame)?;
        let (len, fd) = read_prefix_with_fd(&stream)?;
        if len > MAX_FRAME_LEN {
            return Err(ClientError::Protocol(format!("reply frame of {len} bytes is over the limit")));
        }
        let mut reply = vec![0u8; len];
        stream.read_exact(&mut reply)?;
        let resp = wire::decode::<LocalResponse>(&reply).map_err(|e| ClientError::Protocol(e.to_string()))?;
        if let LocalResponse::Failed { kind, message } = resp {
            return Err(ClientError::Node { kind, message });
        }
        Ok((resp, fd))
    }
}

fn unexpected(resp: LocalResponse) -> ClientError {
    ClientError::Protocol(format!("unexpected reply {resp:?}"))
}

/// Reads the 4-byte length prefix, collecting a descriptor sent with it.
fn read_prefix_with_fd(stream: &UnixStream) -> Result<(usize, Option<OwnedFd>), ClientError> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    let mut fd = None;
    while got < 4 {
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut cmsg = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [IoSliceMut::new(&mut prefix[got..])];
        let r =
            rustix::net::recvmsg(stream, &mut iov, &mut cmsg, RecvFlags::CMSG_CLOEXEC).map_err(std::io::Error::from)?;
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
    Ok((u32::from_le_bytes(prefix) as usize, fd))
}

/// A read-only mapping of a sealed memory file.
struct MappedChunk {
    ptr: *mut std::ffi::c_void,
    len: usize,
}

// SAFETY: the mapping is read-only and the file is sealed against writes, so
// the bytes never change; sharing `&[u8]` views across threads is sound.
unsafe impl Send for MappedChunk {}
// SAFETY: as above.
unsafe impl Sync for MappedChunk {}

impl MappedChunk {
    fn map(fd: &OwnedFd, len: usize) -> Result<Self, ClientError> {
        let seals = rustix::fs::fcntl_get_seals(fd).map_err(std::io::Error::from)?;
        let needed = SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW;
        if !seals.contains(needed) {
            return Err(ClientError::Protocol(format!("chunk file is not sealed (seals {seals:?})")));
        }
        let size = rustix::fs::fstat(fd).map_err(std::io::Error::from)?.st_size;
        if size != len as i64 || len == 0 {
            return Err(ClientError::Protocol(format!("chunk file is {size} bytes, reply said {len}")));
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
        Ok(Self { ptr, len })
    }
}

impl ChunkBytes for MappedChunk {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes for the lifetime of self,
        // and their content never changes (sealed file).
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for MappedChunk {
    fn drop(&mut self) {
        // SAFETY: unmapping the region mapped in `map`, once.
        let _ = unsafe { rustix::mm::munmap(self.ptr, self.len) };
    }
}

impl ChunkSource for LocalSource {
    fn describe(&self, dataset: &str) -> Result<DatasetInfo, ClientError> {
        match self.call(&LocalRequest::Describe { dataset: dataset.to_string() })?.0 {
            LocalResponse::Described(info) => Ok(info),
            other => Err(unexpected(other)),
        }
    }

    fn follow(&self, version: DatasetVersion, params: &PlanParams) -> Result<(), ClientError> {
        match self.call(&LocalRequest::Follow { version, params: *params })?.0 {
            LocalResponse::Following => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    fn fetch(&self, version: DatasetVersion, shard: ShardId) -> Result<Chunk, ClientError> {
        match self.call(&LocalRequest::FetchChunk { version, shard })? {
            (LocalResponse::Chunk { len }, Some(fd)) => {
                let mapped = MappedChunk::map(&fd, len as usize)?;
                Chunk::new(Arc::new(mapped), version, shard, self.verify)
            }
            (LocalResponse::Chunk { .. }, None) => {
                Err(ClientError::Protocol(format!("chunk reply for {shard} carried no descriptor")))
            }
            (other, _) => Err(unexpected(other)),
        }
    }
}
