//! The FUSE side of the power-losing filesystem: kernel requests go to the
//! shared [`Tree`], and a [`Trap`] can hold the answer to the next write,
//! catching the process between a write and the sync that would follow.

use super::tree::{Node, Tree};
use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    Request, TimeOrNow, WriteFlags,
};
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// How long the kernel may cache names and attributes (every change comes
/// through this filesystem, so its caches stay true).
const TTL: Duration = Duration::from_secs(1);
/// The filesystem's size as `statfs` reports it.
const SIZE: u64 = 1 << 30;

/// A trap for the next write: once armed, the write that follows is made
/// (to what the process sees, not synced) and its answer held back, so
/// the process is caught between a write and the sync that would follow
/// it, the moment a power cut costs most.
#[derive(Debug, Default)]
pub(super) struct Trap {
    state: Mutex<TrapState>,
    changed: std::sync::Condvar,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum TrapState {
    #[default]
    Off,
    Armed,
    /// A write was made and waits for its answer.
    Holding,
}

impl Trap {
    fn lock(&self) -> MutexGuard<'_, TrapState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called after a write was made: holds its answer while armed.
    fn after_write(&self) {
        let mut s = self.lock();
        if *s != TrapState::Armed {
            return;
        }
        *s = TrapState::Holding;
        self.changed.notify_all();
        while *s == TrapState::Holding {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub(super) fn set(&self, to: TrapState) {
        *self.lock() = to;
        self.changed.notify_all();
    }

    /// Waits up to `within` for a write to be caught.
    pub(super) fn caught(&self, within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        let mut s = self.lock();
        while *s != TrapState::Holding {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self.changed.wait_timeout(s, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        true
    }
}

/// The FUSE side: requests go to the shared tree.
pub(super) struct Served(pub(super) Arc<Mutex<Tree>>, pub(super) Arc<Trap>);

impl Served {
    fn tree(&self) -> MutexGuard<'_, Tree> {
        // A panic in another request (none is expected) leaves the tree
        // whole: every change is made under the lock in one step.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entry(&self, t: &Tree, ino: u64, reply: ReplyEntry) {
        match t.attr(ino) {
            Some(a) => reply.entry(&TTL, &a, Generation(t.generation)),
            None => reply.error(Errno::ENOENT),
        }
    }
}

impl Filesystem for Served {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut t = self.tree();
        match t.lookup(parent.0, name) {
            Ok(ino) => self.entry(&t, ino, reply),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.tree().attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut t = self.tree();
        if let Some(size) = size
            && let Err(e) = t.truncate(ino.0, size)
        {
            return reply.error(e);
        }
        match t.attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, _mode: u32, _umask: u32, reply: ReplyEntry) {
        let mut t = self.tree();
        let dir = Node::Dir { names: BTreeMap::new(), durable: BTreeMap::new() };
        match t.make(parent.0, name, dir) {
            Ok(ino) => self.entry(&t, ino, reply),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.tree().remove(parent.0, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.tree().remove(parent.0, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        match self.tree().rename(parent.0, name, newparent.0, newname) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut t = self.tree();
        if flags.0 & libc::O_TRUNC != 0
            && let Err(e) = t.truncate(ino.0, 0)
        {
            return reply.error(e);
        }
        match t.nodes.get(&ino.0) {
            Some(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut t = self.tree();
        match t.file(ino.0) {
            Ok(data) => {
                let from = (offset as usize).min(data.len());
                let to = from.saturating_add(size as usize).min(data.len());
                reply.data(&data[from..to]);
            }
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let written = self.tree().write(ino.0, offset, data);
        if written.is_ok() {
            self.1.after_write();
        }
        match written {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.tree().sync_file(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let mut t = self.tree();
        let names: Vec<(OsString, u64)> = match t.names(ino.0) {
            Ok(n) => n.iter().map(|(k, &v)| (k.clone(), v)).collect(),
            Err(e) => return reply.error(e),
        };
        let mut all = vec![(OsString::from("."), ino.0, FileType::Directory)];
        all.push((OsString::from(".."), ino.0, FileType::Directory));
        for (name, child) in names {
            let kind = match t.nodes.get(&child) {
                Some(Node::Dir { .. }) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            all.push((name, child, kind));
        }
        for (i, (name, child, kind)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), (i + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.tree().sync_dir(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let used: u64 = self
            .tree()
            .nodes
            .values()
            .map(|n| match n {
                Node::File { data, .. } => data.len() as u64,
                Node::Dir { .. } => 0,
            })
            .sum();
        let free = SIZE.saturating_sub(used) / 4096;
        reply.statfs(SIZE / 4096, free, free, 1 << 20, 1 << 20, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    // No extended attributes: ENOSYS tells the kernel once (fuser's
    // defaults say so too, with a warning in the harness's log each time).
    fn getxattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, _size: u32, reply: fuser::ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: fuser::ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut t = self.tree();
        let ino = match t.lookup(parent.0, name) {
            Ok(_) if flags & libc::O_EXCL != 0 => return reply.error(Errno::EEXIST),
            Ok(ino) => {
                if flags & libc::O_TRUNC != 0
                    && let Err(e) = t.truncate(ino, 0)
                {
                    return reply.error(e);
                }
                ino
            }
            Err(_) => match t.make(parent.0, name, Node::File { data: Vec::new(), durable: Vec::new() }) {
                Ok(ino) => ino,
                Err(e) => return reply.error(e),
            },
        };
        match t.attr(ino) {
            Some(a) => reply.created(&TTL, &a, Generation(t.generation), FileHandle(0), FopenFlags::empty()),
            None => reply.error(Errno::ENOENT),
        }
    }
}
