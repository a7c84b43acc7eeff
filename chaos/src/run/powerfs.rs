//! A filesystem that can lose power: what a process wrote and did not
//! sync is gone after a cut, what it synced stays.
//!
//! A voter's data folder in `granary-chaos run` is a FUSE mount served by
//! this module from the harness's memory. Each file keeps two images: what
//! the process sees, and what a disk would hold after a power cut. The
//! second moves to the first only on a sync:
//!
//! - `fsync`/`fdatasync` of a file makes its bytes and size durable, and
//!   the name it was created under in its folder (as ext4 and xfs do for a
//!   new file: its name reaches the journal with it);
//! - `fsync` of a folder makes its names durable as they are now: a rename
//!   or an unlink survives a cut only after it.
//!
//! [`PowerFs::cut`] is the power cut: the mount goes away (the process
//! using it must be dead: a killed voter), every file and folder goes back
//! to its durable image, what no durable name reaches is gone, and the
//! folder is mounted again. A cut loses exactly what POSIX allows a crash
//! to lose, no more (unsynced pages are lost whole: torn writes are not
//! modelled).
//!
//! Mounting needs root and `/dev/fuse`; [`available`] says why not.

use anyhow::{Context, Result};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// How long the kernel may cache names and attributes (every change comes
/// through this filesystem, so its caches stay true).
const TTL: Duration = Duration::from_secs(1);
/// The filesystem's size as `statfs` reports it.
const SIZE: u64 = 1 << 30;
/// Bytes a file may grow to (a voter's log is a few MiB).
const MAX_FILE: u64 = 256 << 20;

/// One file or folder, with what a power cut leaves of it.
#[derive(Debug, Clone)]
enum Node {
    File { data: Vec<u8>, durable: Vec<u8> },
    Dir { names: BTreeMap<OsString, u64>, durable: BTreeMap<OsString, u64> },
}

/// The whole tree. Inode 1 is the mount's root; it is always durable.
#[derive(Debug)]
struct Tree {
    nodes: BTreeMap<u64, Node>,
    /// Where each inode was last given a name: (folder, name).
    named: BTreeMap<u64, (u64, OsString)>,
    next: u64,
    /// Bumped by each cut, so no kernel cache of an earlier mount can
    /// mistake a new inode for an old one.
    generation: u64,
    /// Syncs seen (file and folder).
    syncs: u64,
    /// Every file's owner: the harness's user and group.
    owner: (u32, u32),
}

/// This process's effective user and group.
fn owner() -> (u32, u32) {
    // SAFETY: geteuid and getegid take nothing and cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

impl Tree {
    fn new() -> Self {
        let root = Node::Dir { names: BTreeMap::new(), durable: BTreeMap::new() };
        Tree {
            nodes: BTreeMap::from([(1, root)]),
            named: BTreeMap::new(),
            next: 2,
            generation: 0,
            syncs: 0,
            owner: owner(),
        }
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let node = self.nodes.get(&ino)?;
        let (kind, size, perm, nlink) = match node {
            Node::File { data, .. } => (FileType::RegularFile, data.len() as u64, 0o644, 1),
            Node::Dir { .. } => (FileType::Directory, 0, 0o755, 2),
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: SystemTime::UNIX_EPOCH,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            crtime: SystemTime::UNIX_EPOCH,
            kind,
            perm,
            nlink,
            uid: self.owner.0,
            gid: self.owner.1,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        })
    }

    fn names(&mut self, dir: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        match self.nodes.get_mut(&dir) {
            Some(Node::Dir { names, .. }) => Ok(names),
            Some(Node::File { .. }) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn lookup(&mut self, dir: u64, name: &OsStr) -> Result<u64, Errno> {
        self.names(dir)?.get(name).copied().ok_or(Errno::ENOENT)
    }

    /// A new inode under `dir`/`name`.
    fn make(&mut self, dir: u64, name: &OsStr, node: Node) -> Result<u64, Errno> {
        let ino = self.next;
        let names = self.names(dir)?;
        if names.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        names.insert(name.to_owned(), ino);
        self.next += 1;
        self.nodes.insert(ino, node);
        self.named.insert(ino, (dir, name.to_owned()));
        Ok(ino)
    }

    fn file(&mut self, ino: u64) -> Result<&mut Vec<u8>, Errno> {
        match self.nodes.get_mut(&ino) {
            Some(Node::File { data, .. }) => Ok(data),
            Some(Node::Dir { .. }) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn write(&mut self, ino: u64, offset: u64, bytes: &[u8]) -> Result<usize, Errno> {
        let end = offset.checked_add(bytes.len() as u64).filter(|&e| e <= MAX_FILE).ok_or(Errno::EFBIG)?;
        let data = self.file(ino)?;
        if data.len() < end as usize {
            data.resize(end as usize, 0);
        }
        data[offset as usize..end as usize].copy_from_slice(bytes);
        Ok(bytes.len())
    }

    fn truncate(&mut self, ino: u64, size: u64) -> Result<(), Errno> {
        if size > MAX_FILE {
            return Err(Errno::EFBIG);
        }
        self.file(ino)?.resize(size as usize, 0);
        Ok(())
    }

    /// Removes `dir`/`name` (a file, or an empty folder when `folder`).
    fn remove(&mut self, dir: u64, name: &OsStr, folder: bool) -> Result<(), Errno> {
        let ino = self.lookup(dir, name)?;
        match (self.nodes.get(&ino), folder) {
            (Some(Node::Dir { names, .. }), true) if !names.is_empty() => return Err(Errno::ENOTEMPTY),
            (Some(Node::Dir { .. }), false) => return Err(Errno::EISDIR),
            (Some(Node::File { .. }), true) => return Err(Errno::ENOTDIR),
            _ => {}
        }
        self.names(dir)?.remove(name);
        // The inode lives on while a durable name reaches it (a cut brings
        // it back) or an open handle uses it; `reachable` sweeps it later.
        Ok(())
    }

    fn rename(&mut self, dir: u64, name: &OsStr, to_dir: u64, to_name: &OsStr) -> Result<(), Errno> {
        let ino = self.lookup(dir, name)?;
        if let Ok(old) = self.lookup(to_dir, to_name) {
            if old == ino {
                return Ok(());
            }
            if let Some(Node::Dir { names, .. }) = self.nodes.get(&old)
                && !names.is_empty()
            {
                return Err(Errno::ENOTEMPTY);
            }
        }
        self.names(to_dir)?; // the target folder exists
        self.names(dir)?.remove(name);
        self.names(to_dir)?.insert(to_name.to_owned(), ino);
        self.named.insert(ino, (to_dir, to_name.to_owned()));
        Ok(())
    }

    /// `fsync` of a file: its bytes, and the name it has, are durable.
    fn sync_file(&mut self, ino: u64) -> Result<(), Errno> {
        self.syncs += 1;
        match self.nodes.get_mut(&ino) {
            Some(Node::File { data, durable }) => durable.clone_from(data),
            Some(Node::Dir { .. }) => return self.sync_dir(ino),
            None => return Err(Errno::ENOENT),
        }
        if let Some((dir, name)) = self.named.get(&ino).cloned()
            && let Some(Node::Dir { names, durable }) = self.nodes.get_mut(&dir)
            && names.get(&name) == Some(&ino)
        {
            durable.insert(name, ino);
        }
        Ok(())
    }

    /// `fsync` of a folder: its names, as they are now, are durable.
    fn sync_dir(&mut self, ino: u64) -> Result<(), Errno> {
        self.syncs += 1;
        match self.nodes.get_mut(&ino) {
            Some(Node::Dir { names, durable }) => {
                durable.clone_from(names);
                Ok(())
            }
            Some(Node::File { .. }) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    /// The power cut: every node back to its durable image, and what no
    /// durable name reaches from the root dropped.
    fn cut(&mut self) {
        self.generation += 1;
        for node in self.nodes.values_mut() {
            match node {
                Node::File { data, durable } => data.clone_from(durable),
                Node::Dir { names, durable } => names.clone_from(durable),
            }
        }
        let mut keep = BTreeSet::from([1u64]);
        let mut named = BTreeMap::new();
        let mut stack = vec![1u64];
        while let Some(dir) = stack.pop() {
            if let Some(Node::Dir { names, .. }) = self.nodes.get(&dir) {
                for (name, &ino) in names {
                    if keep.insert(ino) {
                        named.insert(ino, (dir, name.clone()));
                        stack.push(ino);
                    }
                }
            }
        }
        self.nodes.retain(|ino, _| keep.contains(ino));
        self.named = named;
    }

    /// Bytes held that a cut would lose (files' bytes that differ from
    /// their durable image, counted by size), for the report.
    fn unsynced_bytes(&self) -> u64 {
        self.nodes
            .values()
            .map(|n| match n {
                Node::File { data, durable } if data != durable => data.len().max(durable.len()) as u64,
                _ => 0,
            })
            .sum()
    }
}

/// A trap for the next write: once armed, the write that follows is made
/// (to what the process sees, not synced) and its answer held back, so
/// the process is caught between a write and the sync that would follow
/// it, the moment a power cut costs most.
#[derive(Debug, Default)]
struct Trap {
    state: Mutex<TrapState>,
    changed: std::sync::Condvar,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum TrapState {
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

    fn set(&self, to: TrapState) {
        *self.lock() = to;
        self.changed.notify_all();
    }

    /// Waits up to `within` for a write to be caught.
    fn caught(&self, within: Duration) -> bool {
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
struct Served(Arc<Mutex<Tree>>, Arc<Trap>);

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

/// A folder that loses what was not synced when [`PowerFs::cut`] is
/// called. Unmounted on drop.
pub struct PowerFs {
    mount: PathBuf,
    tree: Arc<Mutex<Tree>>,
    trap: Arc<Trap>,
    session: Option<fuser::BackgroundSession>,
}

impl std::fmt::Debug for PowerFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerFs").field("mount", &self.mount).finish_non_exhaustive()
    }
}

/// What a cut took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CutReport {
    /// Bytes of files that held writes not synced, now back to their
    /// synced image.
    pub unsynced_bytes: u64,
    /// Syncs the filesystem had seen before the cut.
    pub syncs: u64,
}

impl PowerFs {
    /// Mounts an empty filesystem at `mount` (created if missing).
    pub fn mount(mount: &Path) -> Result<Self> {
        std::fs::create_dir_all(mount).with_context(|| format!("creating {}", mount.display()))?;
        let mut fs = PowerFs {
            mount: mount.to_path_buf(),
            tree: Arc::new(Mutex::new(Tree::new())),
            trap: Arc::new(Trap::default()),
            session: None,
        };
        fs.attach()?;
        Ok(fs)
    }

    fn attach(&mut self) -> Result<()> {
        let mut cfg = fuser::Config::default();
        cfg.mount_options =
            vec![fuser::MountOption::FSName("granary-powerfs".into()), fuser::MountOption::DefaultPermissions];
        let session = fuser::spawn_mount(Served(self.tree.clone(), self.trap.clone()), &self.mount, &cfg)
            .with_context(|| format!("mounting a FUSE filesystem at {}", self.mount.display()))?;
        self.session = Some(session);
        Ok(())
    }

    fn detach(&mut self) {
        // A held write is answered first: the session cannot end while
        // its one thread waits.
        self.trap.set(TrapState::Off);
        if let Some(s) = self.session.take() {
            // A lazy unmount: a process still holding a file (none should:
            // the voter was killed) cannot hold the cut up.
            let _ = s.umount_and_join();
            let _ = lazy_umount(&self.mount);
        }
    }

    /// Where the filesystem is mounted.
    pub fn mount_point(&self) -> &Path {
        &self.mount
    }

    /// Catches the next write into the folder (made, not synced, its
    /// answer held back) within `within`: `true` if one was caught. The
    /// writer then waits until [`Self::cut`] (kill it first), or
    /// [`Self::let_go`].
    pub fn catch_write(&self, within: Duration) -> bool {
        self.trap.set(TrapState::Armed);
        let caught = self.trap.caught(within);
        if !caught {
            self.trap.set(TrapState::Off);
        }
        caught
    }

    /// Disarms the trap, and answers a held write.
    pub fn let_go(&self) {
        self.trap.set(TrapState::Off);
    }

    /// The power cut. Call it once the processes using the folder are
    /// dead: the folder is unmounted, every file and folder goes back to
    /// what was synced, and it is mounted again.
    pub fn cut(&mut self) -> Result<CutReport> {
        self.detach();
        let report = {
            let mut t = self.tree.lock().unwrap_or_else(|e| e.into_inner());
            let report = CutReport { unsynced_bytes: t.unsynced_bytes(), syncs: t.syncs };
            t.cut();
            report
        };
        self.attach()?;
        Ok(report)
    }
}

impl Drop for PowerFs {
    fn drop(&mut self) {
        self.detach();
    }
}

/// The voters' data folders of one seed, as power-cut filesystems when
/// its schedule cuts a voter's power (plain folders otherwise).
#[derive(Debug)]
pub struct VoterDisks {
    by_voter: BTreeMap<u64, PowerFs>,
    /// What the report says the folders were: `fuse` (power-cut
    /// filesystems), or why not.
    pub fs: String,
    /// Power cuts made.
    pub cuts: u64,
    /// Bytes of files holding writes not synced when their power was cut.
    pub unsynced_bytes: u64,
    /// Cuts that came between a write and its sync (the write caught).
    pub mid_write: u64,
    /// Syncs (of files and folders) the cut voters' folders had seen: what
    /// a cut kept.
    pub syncs: u64,
}

impl VoterDisks {
    /// Mounts a [`PowerFs`] at `dir/voter-ID` for each of `voters` when
    /// `wanted` (before the voters start); else, or where it cannot be
    /// mounted, the folders stay plain and `fs` says why.
    pub fn mount(dir: &Path, voters: &[u64], wanted: bool) -> Self {
        if !wanted {
            return Self::plain("plain folders (no power cut drawn)".into());
        }
        if let Err(why) = available(dir) {
            return Self::plain(format!("plain folders (no FUSE: {why})"));
        }
        let mut out = Self::plain("fuse".into());
        for &v in voters {
            match PowerFs::mount(&dir.join(format!("voter-{v}"))) {
                Ok(fs) => {
                    out.by_voter.insert(v, fs);
                }
                Err(e) => {
                    out.by_voter.clear();
                    out.fs = format!("plain folders (mounting voter {v}'s: {e:#})");
                    break;
                }
            }
        }
        out
    }

    fn plain(fs: String) -> Self {
        VoterDisks { by_voter: BTreeMap::new(), fs, cuts: 0, unsynced_bytes: 0, mid_write: 0, syncs: 0 }
    }

    /// Catches voter `v`'s next write into its folder within `within`
    /// (see [`PowerFs::catch_write`]): `true` if caught; then send the
    /// voter SIGKILL, [`Self::let_go`], and wait for it to die.
    pub fn catch_write(&self, v: u64, within: Duration) -> bool {
        self.by_voter.get(&v).is_some_and(|fs| fs.catch_write(within))
    }

    /// Answers voter `v`'s held write (after the voter was sent SIGKILL).
    pub fn let_go(&self, v: u64) {
        if let Some(fs) = self.by_voter.get(&v) {
            fs.let_go();
        }
    }

    /// Cuts voter `v`'s power; the voter must be dead already. `Err` says
    /// why its folder could not lose anything (a plain kill, then).
    pub fn cut(&mut self, v: u64) -> Result<CutReport, String> {
        let fs = self.by_voter.get_mut(&v).ok_or_else(|| format!("voter {v}'s folder is {}", self.fs))?;
        let r = fs.cut().map_err(|e| format!("{e:#}"))?;
        self.cuts += 1;
        self.unsynced_bytes += r.unsynced_bytes;
        self.syncs += r.syncs;
        Ok(r)
    }
}

impl Drop for VoterDisks {
    /// Copies what each folder holds to `voter-ID.kept` beside it before it
    /// goes (the voters have stopped by then): the folders live in memory,
    /// and a failing seed's logs and snapshots are what shows why.
    fn drop(&mut self) {
        for fs in self.by_voter.values() {
            let kept = fs.mount.with_extension("kept");
            if let Err(e) = copy_folder(&fs.mount, &kept) {
                tracing::warn!("keeping {}: {e:#}", fs.mount.display());
            }
        }
    }
}

/// Copies the files of `from` (and its folders) to `to`.
fn copy_folder(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_folder(&e.path(), &target)?;
        } else {
            std::fs::copy(e.path(), target)?;
        }
    }
    Ok(())
}

/// `umount -l`, ignoring a folder that is not mounted.
fn lazy_umount(path: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: a NUL-terminated path that outlives the call; MNT_DETACH
    // only.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether a [`PowerFs`] can be mounted here: `Err` says why not.
pub fn available(probe_dir: &Path) -> Result<(), String> {
    if owner().0 != 0 {
        return Err("not root (mounting FUSE filesystems needs root here)".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("no /dev/fuse".into());
    }
    let probe = probe_dir.join(".powerfs-probe");
    let result = PowerFs::mount(&probe).map(drop).map_err(|e| format!("{e:#}"));
    let _ = std::fs::remove_dir(&probe);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(t: &mut Tree, name: &str, bytes: &[u8]) -> u64 {
        let ino = t.make(1, OsStr::new(name), Node::File { data: Vec::new(), durable: Vec::new() }).expect("make");
        t.write(ino, 0, bytes).expect("write");
        ino
    }

    fn read(t: &mut Tree, name: &str) -> Option<Vec<u8>> {
        let ino = t.lookup(1, OsStr::new(name)).ok()?;
        t.file(ino).ok().cloned()
    }

    #[test]
    fn a_cut_keeps_what_was_synced_and_loses_the_rest() {
        let mut t = Tree::new();
        let a = file(&mut t, "a", b"synced");
        t.sync_file(a).expect("sync");
        t.write(a, 0, b"SYNCED and more").expect("write");
        file(&mut t, "b", b"never synced");
        t.cut();
        assert_eq!(read(&mut t, "a").as_deref(), Some(&b"synced"[..]), "a's synced bytes and size");
        assert_eq!(read(&mut t, "b"), None, "a file never synced has no name after a cut");
    }

    #[test]
    fn a_rename_survives_a_cut_only_after_its_folder_is_synced() {
        let mut t = Tree::new();
        let old = file(&mut t, "snapshot.json", b"old");
        t.sync_file(old).expect("sync");
        let new = file(&mut t, "snapshot.tmp", b"new");
        t.sync_file(new).expect("sync");
        t.rename(1, OsStr::new("snapshot.tmp"), 1, OsStr::new("snapshot.json")).expect("rename");
        assert_eq!(read(&mut t, "snapshot.json").as_deref(), Some(&b"new"[..]));
        // Cut before the folder's sync: the old snapshot, and the temp file.
        let mut before = Tree { nodes: t.nodes.clone(), named: t.named.clone(), ..Tree::new() };
        before.cut();
        assert_eq!(read(&mut before, "snapshot.json").as_deref(), Some(&b"old"[..]));
        assert_eq!(read(&mut before, "snapshot.tmp").as_deref(), Some(&b"new"[..]));
        // After it: the new one alone.
        t.sync_dir(1).expect("sync dir");
        t.cut();
        assert_eq!(read(&mut t, "snapshot.json").as_deref(), Some(&b"new"[..]));
        assert_eq!(read(&mut t, "snapshot.tmp"), None);
        assert!(!t.nodes.contains_key(&old), "the replaced file is swept");
    }

    #[test]
    fn an_unlink_is_undone_by_a_cut_before_the_folder_sync() {
        let mut t = Tree::new();
        let a = file(&mut t, "a", b"kept");
        t.sync_file(a).expect("sync");
        t.remove(1, OsStr::new("a"), false).expect("unlink");
        assert_eq!(read(&mut t, "a"), None);
        t.cut();
        assert_eq!(read(&mut t, "a").as_deref(), Some(&b"kept"[..]));
        t.remove(1, OsStr::new("a"), false).expect("unlink");
        t.sync_dir(1).expect("sync dir");
        t.cut();
        assert_eq!(read(&mut t, "a"), None);
    }

    #[test]
    fn a_folder_not_synced_into_its_parent_is_lost_with_its_files() {
        let mut t = Tree::new();
        let d =
            t.make(1, OsStr::new("d"), Node::Dir { names: BTreeMap::new(), durable: BTreeMap::new() }).expect("mkdir");
        let f = t.make(d, OsStr::new("f"), Node::File { data: Vec::new(), durable: Vec::new() }).expect("create");
        t.write(f, 0, b"x").expect("write");
        t.sync_file(f).expect("sync");
        t.cut();
        assert!(t.lookup(1, OsStr::new("d")).is_err());
        assert!(!t.nodes.contains_key(&f));
    }

    #[test]
    fn writes_past_the_end_fill_with_zeros_and_sizes_are_bounded() {
        let mut t = Tree::new();
        let a = file(&mut t, "a", b"");
        t.write(a, 4, b"x").expect("write");
        assert_eq!(read(&mut t, "a").as_deref(), Some(&b"\0\0\0\0x"[..]));
        assert_eq!(t.write(a, MAX_FILE, b"x"), Err(Errno::EFBIG));
        assert_eq!(t.truncate(a, MAX_FILE + 1), Err(Errno::EFBIG));
    }
}
