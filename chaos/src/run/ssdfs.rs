//! The SSD faults that need more than a signal: a filesystem of the tier's
//! own size that can be filled (a tmpfs per node), and a kill at a chosen
//! write into the tier's files (strace's syscall fault injection).
//!
//! Both need root (mounting; tracing a process) and one a tool (strace).
//! Where they cannot be had, a seed still runs its schedule: the fault
//! falls back to a plain kill and restart, and the seed's report says so
//! ([`super::SeedReport::not_injected`]).

use anyhow::{Context, Result, bail};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Room on a node's filesystem beyond its SSD tier: foyer's and the
/// node's small files, and what the fill fault takes.
const MARGIN: u64 = 8 << 20;

/// One node's SSD filesystem: a tmpfs mounted at `node-ID/ssdfs`, the
/// tier in its `tier` folder, `node-ID/ssd` a link to that folder (where
/// the cluster's node config puts the tier).
#[derive(Debug)]
pub struct SsdFs {
    mount: PathBuf,
}

impl SsdFs {
    /// Where the filesystem is mounted.
    pub fn mount_point(&self) -> &Path {
        &self.mount
    }

    /// Fills what is free on the filesystem with a file of its own, until a
    /// write fails for want of space. Returns the bytes it took.
    pub fn fill(&self) -> Result<u64> {
        use std::io::Write;
        let path = self.mount.join("filler");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let chunk = vec![0xa5u8; 1 << 20];
        let mut taken = 0u64;
        let mut size = chunk.len();
        loop {
            match f.write(&chunk[..size]) {
                Ok(0) => break,
                Ok(n) => taken += n as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                    if size == 1 {
                        break;
                    }
                    size = (size / 2).max(1);
                }
                Err(e) => return Err(e).with_context(|| format!("filling {}", path.display())),
            }
        }
        Ok(taken)
    }
}

/// Every node's [`SsdFs`] of a seed; unmounted (detached) on drop.
#[derive(Debug, Default)]
pub struct SsdMounts {
    by_node: Vec<(u64, SsdFs)>,
}

impl SsdMounts {
    /// Mounts a tmpfs of `tier_bytes` and a margin for each of `nodes` under
    /// `dir` (the cluster's folder), before the nodes start.
    pub fn mount(dir: &Path, nodes: &[u64], tier_bytes: u64) -> Result<Self> {
        let mut out = SsdMounts::default();
        for &id in nodes {
            let node_dir = dir.join(format!("node-{id}"));
            let mount = node_dir.join("ssdfs");
            std::fs::create_dir_all(&mount).with_context(|| format!("creating {}", mount.display()))?;
            mount_tmpfs(&mount, tier_bytes + MARGIN)?;
            out.by_node.push((id, SsdFs { mount: mount.clone() }));
            std::fs::create_dir_all(mount.join("tier"))?;
            let link = node_dir.join("ssd");
            std::os::unix::fs::symlink("ssdfs/tier", &link).with_context(|| format!("linking {}", link.display()))?;
        }
        Ok(out)
    }

    /// Node `id`'s filesystem.
    pub fn node(&self, id: u64) -> Option<&SsdFs> {
        self.by_node.iter().find(|(n, _)| *n == id).map(|(_, f)| f)
    }
}

impl Drop for SsdMounts {
    fn drop(&mut self) {
        for (_, fs) in &self.by_node {
            if let Ok(c) = CString::new(fs.mount.as_os_str().as_bytes()) {
                // SAFETY: a NUL-terminated path; a detached unmount of a
                // tmpfs this run mounted.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

fn mount_tmpfs(at: &Path, bytes: u64) -> Result<()> {
    let target = CString::new(at.as_os_str().as_bytes())?;
    let source = CString::new("granary-chaos")?;
    let fstype = CString::new("tmpfs")?;
    let data = CString::new(format!("size={bytes},mode=0700"))?;
    // SAFETY: NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(source.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, data.as_ptr().cast::<libc::c_void>())
    };
    if rc != 0 {
        bail!("mounting a tmpfs at {}: {}", at.display(), std::io::Error::last_os_error());
    }
    Ok(())
}

/// Detaches the filesystems a run stopped by a signal left mounted under
/// a seed's folder `dir`: `node-*/ssdfs` and the voters' `voter-*`.
pub fn detach_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // A node's SSD tmpfs, or a voter's power-cut folder (a FUSE mount
        // whose server died with the harness).
        let mount = if name.starts_with("node-") {
            e.path().join("ssdfs")
        } else if name.starts_with("voter-") && !name.ends_with(".log") && !name.ends_with(".kept") {
            e.path()
        } else {
            continue;
        };
        if let Ok(c) = CString::new(mount.as_os_str().as_bytes()) {
            // SAFETY: a NUL-terminated path; failing (nothing mounted
            // there) is fine.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Whether this process can mount a tmpfs (root, or what stops it).
pub fn tmpfs_available(scratch: &Path) -> Result<(), String> {
    let probe = scratch.join(".tmpfs-probe");
    std::fs::create_dir_all(&probe).map_err(|e| format!("creating {}: {e}", probe.display()))?;
    let r = mount_tmpfs(&probe, 1 << 20).map_err(|e| format!("{e:#} (mounting needs root)"));
    if r.is_ok()
        && let Ok(c) = CString::new(probe.as_os_str().as_bytes())
    {
        // SAFETY: as in `SsdMounts::drop`.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    let _ = std::fs::remove_dir(&probe);
    r
}

/// A node armed to die at its `nth` write into its SSD tier's files.
#[derive(Debug)]
pub struct ArmedKill {
    /// The node.
    pub node: u64,
    /// Its process.
    pub pid: u32,
    strace: Child,
    since: Instant,
}

/// How an [`ArmedKill`] stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Armed {
    /// The node has not written yet.
    Waiting,
    /// The node died at the chosen write.
    Killed,
    /// No such write came within the wait, or strace gave up: the caller
    /// kills the node plainly; the reason says why.
    Missed(String),
}

impl ArmedKill {
    /// Attaches strace to `pid` (every thread) so that its `nth` pwrite into
    /// one of the tier's block files in `tier` gets SIGKILL on entry.
    pub fn arm(node: u64, pid: u32, tier: &Path, nth: u32) -> Result<Self, String> {
        let files: Vec<PathBuf> = std::fs::read_dir(tier)
            .map_err(|e| format!("listing {}: {e}", tier.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("foyer-storage")))
            .collect();
        if files.is_empty() {
            return Err(format!("no block files in {} yet", tier.display()));
        }
        let calls = "pwrite64,pwritev,pwritev2";
        let mut cmd = Command::new("strace");
        cmd.args(["-qq", "-f", "-o", "/dev/null", "-p", &pid.to_string()])
            .args(["-e", &format!("trace={calls}")])
            .args(["-e", &format!("inject={calls}:signal=KILL:when={nth}")]);
        for f in &files {
            cmd.arg("-P").arg(f);
        }
        let strace = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting strace: {e} (install strace)"))?;
        Ok(Self { node, pid, strace, since: Instant::now() })
    }

    /// Where it stands; `wait` bounds how long the node may go without
    /// the write.
    pub fn poll(&mut self, wait: Duration) -> Armed {
        if process_dead(self.pid) {
            return Armed::Killed;
        }
        if let Ok(Some(status)) = self.strace.try_wait() {
            // strace exits when its tracee dies; the tracee's death may not
            // show in /proc for an instant.
            std::thread::sleep(Duration::from_millis(20));
            if process_dead(self.pid) {
                return Armed::Killed;
            }
            return Armed::Missed(format!("strace ended ({status}) without the kill"));
        }
        if self.since.elapsed() >= wait {
            return Armed::Missed(format!("no write into the SSD tier within {wait:?}"));
        }
        Armed::Waiting
    }
}

impl Drop for ArmedKill {
    fn drop(&mut self) {
        let _ = self.strace.kill();
        let _ = self.strace.wait();
    }
}

/// Whether `pid` is gone or a zombie.
fn process_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).is_some_and(|st| st == "Z"),
    }
}
