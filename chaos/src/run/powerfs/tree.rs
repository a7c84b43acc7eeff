//! The power-losing tree itself, pure (no FUSE, no mount): every file and
//! folder with the image a power cut leaves of it, the syncs that move what
//! the process sees into that image, and the cut. `fuse.rs` serves it to
//! the kernel; its tests here check what a cut keeps.

use fuser::{Errno, FileAttr, FileType, INodeNo};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::time::SystemTime;

/// Bytes a file may grow to (a voter's log is a few MiB).
const MAX_FILE: u64 = 256 << 20;

/// One file or folder, with what a power cut leaves of it.
#[derive(Debug, Clone)]
pub(super) enum Node {
    File { data: Vec<u8>, durable: Vec<u8> },
    Dir { names: BTreeMap<OsString, u64>, durable: BTreeMap<OsString, u64> },
}

/// The whole tree. Inode 1 is the mount's root; it is always durable.
#[derive(Debug)]
pub(super) struct Tree {
    pub(super) nodes: BTreeMap<u64, Node>,
    /// Where each inode was last given a name: (folder, name).
    pub(super) named: BTreeMap<u64, (u64, OsString)>,
    pub(super) next: u64,
    /// Bumped by each cut, so no kernel cache of an earlier mount can
    /// mistake a new inode for an old one.
    pub(super) generation: u64,
    /// Syncs seen (file and folder).
    pub(super) syncs: u64,
    /// Every file's owner: the harness's user and group.
    pub(super) owner: (u32, u32),
}

/// This process's effective user and group.
pub(super) fn owner() -> (u32, u32) {
    // SAFETY: geteuid and getegid take nothing and cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

impl Tree {
    pub(super) fn new() -> Self {
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

    pub(super) fn attr(&self, ino: u64) -> Option<FileAttr> {
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

    pub(super) fn names(&mut self, dir: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        match self.nodes.get_mut(&dir) {
            Some(Node::Dir { names, .. }) => Ok(names),
            Some(Node::File { .. }) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    pub(super) fn lookup(&mut self, dir: u64, name: &OsStr) -> Result<u64, Errno> {
        self.names(dir)?.get(name).copied().ok_or(Errno::ENOENT)
    }

    /// A new inode under `dir`/`name`.
    pub(super) fn make(&mut self, dir: u64, name: &OsStr, node: Node) -> Result<u64, Errno> {
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

    pub(super) fn file(&mut self, ino: u64) -> Result<&mut Vec<u8>, Errno> {
        match self.nodes.get_mut(&ino) {
            Some(Node::File { data, .. }) => Ok(data),
            Some(Node::Dir { .. }) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    pub(super) fn write(&mut self, ino: u64, offset: u64, bytes: &[u8]) -> Result<usize, Errno> {
        let end = offset.checked_add(bytes.len() as u64).filter(|&e| e <= MAX_FILE).ok_or(Errno::EFBIG)?;
        let data = self.file(ino)?;
        if data.len() < end as usize {
            data.resize(end as usize, 0);
        }
        data[offset as usize..end as usize].copy_from_slice(bytes);
        Ok(bytes.len())
    }

    pub(super) fn truncate(&mut self, ino: u64, size: u64) -> Result<(), Errno> {
        if size > MAX_FILE {
            return Err(Errno::EFBIG);
        }
        self.file(ino)?.resize(size as usize, 0);
        Ok(())
    }

    /// Removes `dir`/`name` (a file, or an empty folder when `folder`).
    pub(super) fn remove(&mut self, dir: u64, name: &OsStr, folder: bool) -> Result<(), Errno> {
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

    pub(super) fn rename(&mut self, dir: u64, name: &OsStr, to_dir: u64, to_name: &OsStr) -> Result<(), Errno> {
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
    pub(super) fn sync_file(&mut self, ino: u64) -> Result<(), Errno> {
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
    pub(super) fn sync_dir(&mut self, ino: u64) -> Result<(), Errno> {
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
    pub(super) fn cut(&mut self) {
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
    pub(super) fn unsynced_bytes(&self) -> u64 {
        self.nodes
            .values()
            .map(|n| match n {
                Node::File { data, durable } if data != durable => data.len().max(durable.len()) as u64,
                _ => 0,
            })
            .sum()
    }
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
