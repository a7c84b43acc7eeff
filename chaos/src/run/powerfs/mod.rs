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
//! Mounting needs root and `/dev/fuse`; [`available`] says why not. The
//! tree that loses power is `tree.rs` (pure), its FUSE side `fuse.rs`.

mod fuse;
mod tree;

use anyhow::{Context, Result};
use fuse::{Served, Trap, TrapState};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tree::{Tree, owner};

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
