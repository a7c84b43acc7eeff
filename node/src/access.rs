//! Who may use the node's local socket, and where it lives.
//!
//! A trainer that reaches the socket gets chunks and can make the node
//! read, convert and plan, so three things guard it:
//! - **the folder**: the socket lives in a folder that only its owner (the
//!   node's user, or root) can write, so no other user can take the path
//!   first or swap it; the default is `/run/granary` for root and
//!   `$XDG_RUNTIME_DIR/granary` otherwise (both created 0750), never the
//!   shared temporary folder;
//! - **the file**: mode 0660, and a leftover file at the path is replaced
//!   only if it is a socket this user owns;
//! - **the peer**: every connection's credentials (`SO_PEERCRED`) are
//!   checked against an allow-list of uids and gids ([`LocalAccess`];
//!   default: the node's own uid and group, but never group 0: in a
//!   container many processes run with group 0, and a node run as root
//!   would admit them all; root itself is always admitted, as it can read
//!   the node's memory anyway). The gid checked is the peer's effective
//!   group, not its supplementary groups: give trainers a group of their
//!   own as their primary group and list it in `allow_gids`.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The users and groups admitted on the local socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalAccess {
    uids: Vec<u32>,
    gids: Vec<u32>,
}

impl LocalAccess {
    /// `uids` and `gids` as configured (`allow_uids`, `allow_gids`), each
    /// defaulting to the node's own, except group 0 (root's group, which
    /// many container processes have): a node run as root admits by
    /// default only root, and groups only as listed.
    pub fn new(uids: Option<Vec<u32>>, gids: Option<Vec<u32>>) -> Self {
        Self::for_node(rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw(), uids, gids)
    }

    /// [`LocalAccess::new`] for a node running as `uid` and `gid`.
    fn for_node(uid: u32, gid: u32, uids: Option<Vec<u32>>, gids: Option<Vec<u32>>) -> Self {
        Self {
            uids: uids.unwrap_or_else(|| vec![uid]),
            gids: gids.unwrap_or_else(|| if gid == 0 { Vec::new() } else { vec![gid] }),
        }
    }

    /// Whether a peer with effective `uid` and `gid` may use the socket.
    pub fn admits(&self, uid: u32, gid: u32) -> bool {
        uid == 0 || self.uids.contains(&uid) || self.gids.contains(&gid)
    }

    /// The refusal a peer that is not admitted gets.
    pub fn refusal(&self, uid: u32, gid: u32) -> String {
        format!(
            "uid {uid} (group {gid}) may not use this node: it admits uids {:?} and groups {:?} \
             (allow_uids, allow_gids in node.toml)",
            self.uids, self.gids
        )
    }
}

/// The socket path for a configuration that sets none: `/run/granary/node.sock`
/// for root, `$XDG_RUNTIME_DIR/granary/node.sock` for another user; an
/// error saying to set `socket` where neither applies.
pub fn default_socket() -> Result<PathBuf, String> {
    default_socket_for(rustix::process::geteuid().is_root(), std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from))
}

fn default_socket_for(root: bool, runtime_dir: Option<PathBuf>) -> Result<PathBuf, String> {
    match (root, runtime_dir) {
        (true, _) => Ok(PathBuf::from("/run/granary/node.sock")),
        (false, Some(d)) if d.is_absolute() => Ok(d.join("granary").join("node.sock")),
        _ => Err("no `socket` in the node's config, and no runtime folder for a non-root user \
                  ($XDG_RUNTIME_DIR unset): set `socket` to a path in a folder only this user can write"
            .to_string()),
    }
}

/// Makes the socket's folder if missing (mode 0750) and checks that no
/// other user can write it: owned by this user or root, and not writable
/// by others (a folder like `/tmp` lets another user take the path first).
pub fn prepare_dir(socket: &Path) -> io::Result<()> {
    let dir = match socket.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::env::current_dir()?,
    };
    if !dir.exists() {
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750))?;
    }
    let meta = std::fs::metadata(&dir)?;
    let me = rustix::process::geteuid().as_raw();
    dir_is_private(meta.uid(), meta.mode(), me).map_err(|why| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("the socket's folder {}: {why}; choose a folder only the node's user can write", dir.display()),
        )
    })
}

/// Why a folder with owner `owner` and `mode` is not private to user `me`.
fn dir_is_private(owner: u32, mode: u32, me: u32) -> Result<(), String> {
    if owner != me && owner != 0 {
        return Err(format!("owned by uid {owner}, not this user ({me}) or root"));
    }
    if mode & 0o002 != 0 {
        return Err(format!("writable by every user (mode {:o})", mode & 0o7777));
    }
    Ok(())
}

/// Removes a leftover socket at `path` before binding, if it is a socket
/// this user owns and nothing answers on it; anything else there is an
/// error naming it.
pub fn clear_stale(path: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    use std::os::unix::fs::FileTypeExt;
    let me = rustix::process::geteuid().as_raw();
    if !meta.file_type().is_socket() || meta.uid() != me {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket this user (uid {me}) owns; remove it or choose another path",
                path.display()
            ),
        ));
    }
    // A socket nobody answers on is left over from a dead node.
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("{} is served by a running node", path.display()),
        ));
    }
    std::fs::remove_file(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allow_list_admits_its_uids_its_groups_and_root_only() {
        let a = LocalAccess::new(Some(vec![1000]), Some(vec![50]));
        assert!(a.admits(1000, 7));
        assert!(a.admits(1001, 50));
        assert!(a.admits(0, 0));
        assert!(!a.admits(1001, 51));
        assert!(a.refusal(1001, 51).contains("uid 1001 (group 51) may not use this node"));
    }

    /// Issue 29: a node run as root does not admit every process of group
    /// 0 by default (many container processes have it); one run as a user
    /// of its own admits its group. Group 0 is admitted when listed.
    #[test]
    fn root_s_group_is_never_admitted_by_default() {
        let as_root = LocalAccess::for_node(0, 0, None, None);
        assert!(!as_root.admits(1234, 0), "a gid-0 process outside the list");
        assert!(as_root.admits(0, 0), "root");
        let as_user = LocalAccess::for_node(10001, 1000, None, None);
        assert!(as_user.admits(1000, 1000), "the node's group");
        assert!(!as_user.admits(1234, 0));
        assert!(LocalAccess::for_node(0, 0, None, Some(vec![0])).admits(1234, 0), "listed");
    }

    #[test]
    fn the_default_socket_is_never_in_the_shared_temporary_folder() {
        assert_eq!(default_socket_for(true, None).unwrap(), PathBuf::from("/run/granary/node.sock"));
        let user = default_socket_for(false, Some("/run/user/1000".into())).unwrap();
        assert_eq!(user, PathBuf::from("/run/user/1000/granary/node.sock"));
        let e = default_socket_for(false, None).unwrap_err();
        assert!(e.contains("set `socket`"), "{e}");
        assert!(default_socket_for(false, Some("relative".into())).is_err());
    }

    #[test]
    fn a_folder_others_can_write_or_another_user_owns_is_refused() {
        assert!(dir_is_private(1000, 0o40750, 1000).is_ok());
        assert!(dir_is_private(0, 0o40755, 1000).is_ok());
        assert!(dir_is_private(0, 0o41777, 1000).unwrap_err().contains("writable by every user (mode 1777)"));
        assert!(dir_is_private(1001, 0o40700, 1000).unwrap_err().contains("owned by uid 1001"));
    }

    #[test]
    fn a_leftover_file_that_is_not_this_users_socket_is_not_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.sock");
        std::fs::write(&path, b"not a socket").unwrap();
        let e = clear_stale(&path).unwrap_err();
        assert!(e.to_string().contains("is not a socket this user"), "{e}");
        assert!(path.exists(), "left in place");
        // A dead node's socket is removed.
        std::fs::remove_file(&path).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        clear_stale(&path).unwrap();
        assert!(!path.exists());
    }
}
