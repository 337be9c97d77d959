//! Listening sockets: the Unix socket at the configured path (parent 0750,
//! socket 0660, optional group), a stale socket replaced, a live daemon
//! detected; systemd socket activation (LISTEN_FDS / LISTEN_PID); the
//! descriptor channel's SOCK_SEQPACKET socket beside it (systemd's second
//! socket, or `<socket>.fds`); optional TCP.

use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::io::FromRawFd;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// First file descriptor passed by systemd.
const SD_LISTEN_FDS_START: i32 = 3;

/// A Unix listener and where it came from.
pub(crate) struct UnixListenerSpec {
    pub listener: std::os::unix::net::UnixListener,
    pub files: SocketFiles,
    /// The descriptor channel's socket systemd passed (its second).
    pub channel: Option<OwnedFd>,
}

/// Where a Unix socket lives, and what of it this process made.
pub(crate) struct SocketFiles {
    pub path: Option<PathBuf>,
    pub activated: bool,
    /// Folders made for the socket, deepest first: removed again (when
    /// empty) when the daemon could not start, so a failed start leaves
    /// none. A daemon that ran keeps them (an admin may have set their
    /// modes for the socket's users).
    pub made: Vec<PathBuf>,
}

impl SocketFiles {
    /// Removes the socket this process bound and, when the daemon `failed`
    /// to start, the folders it made for it (a socket systemd passed is
    /// systemd's).
    pub fn remove(&self, failed: bool) {
        if self.activated {
            return;
        }
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
        for dir in self.made.iter().filter(|_| failed) {
            if std::fs::remove_dir(dir).is_err() {
                break;
            }
        }
    }
}

/// Takes the socket systemd passed, when LISTEN_PID names this process.
pub(crate) fn from_systemd(
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<UnixListenerSpec>> {
    let pid_ok = env("LISTEN_PID").and_then(|p| p.parse::<u32>().ok()) == Some(std::process::id());
    let fds: i32 = env("LISTEN_FDS").and_then(|n| n.parse().ok()).unwrap_or(0);
    if !pid_ok || fds < 1 {
        return Ok(None);
    }
    // The fd is ours to own from here on; mark it close-on-exec.
    let fd = SD_LISTEN_FDS_START;
    // SAFETY: fcntl on a descriptor systemd passed to this very process.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags < 0 {
            bail!("LISTEN_FDS=1 but fd 3 is not open");
        }
        libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
    }
    // SAFETY: fd 3 is a listening socket passed by the service manager and
    // owned by no other object in this process.
    let listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
    listener
        .set_nonblocking(true)
        .context("socket-activated fd")?;
    let path = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(Path::to_path_buf));
    let channel = (fds >= 2).then(|| {
        // SAFETY: with LISTEN_FDS >= 2, fd 4 is the second listening socket
        // the service manager passed, owned by nothing else here.
        let fd = unsafe { OwnedFd::from_raw_fd(SD_LISTEN_FDS_START + 1) };
        let _ = rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC);
        let _ = rustix::io::ioctl_fionbio(&fd, true);
        fd
    });
    Ok(Some(UnixListenerSpec {
        channel,
        listener,
        files: SocketFiles {
            path,
            activated: true,
            made: Vec::new(),
        },
    }))
}

/// Binds the Unix socket at `path`, replacing a stale one and refusing when a
/// live daemon answers on it.
pub(crate) fn bind_unix(path: &Path, group: Option<u32>) -> Result<UnixListenerSpec> {
    let made: Vec<PathBuf> = path
        .ancestors()
        .skip(1)
        .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
        .map(Path::to_path_buf)
        .collect();
    if let Some(parent) = path.parent() {
        if !parent.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(parent)
                .with_context(|| format!("creating socket folder {}", parent.display()))?;
        }
    }
    // The folders made here are the socket group's to search (whatever
    // the umask): its members must reach the socket through them.
    for dir in &made {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750))
            .with_context(|| format!("chmod 0750 {}", dir.display()))?;
        if let Some(gid) = group {
            std::os::unix::fs::chown(dir, None, Some(gid))
                .with_context(|| format!("chgrp {} to gid {gid}", dir.display()))?;
        }
    }
    if path.exists() {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => bail!(
                "another ctcached is already listening on {} (stop it first, or pass --socket)",
                path.display()
            ),
            Err(_) => {
                std::fs::remove_file(path)
                    .with_context(|| format!("removing stale socket {}", path.display()))?;
            }
        }
    }
    let listener = std::os::unix::net::UnixListener::bind(path)
        .with_context(|| format!("binding {}", path.display()))?;
    for_the_group(path, group)?;
    listener.set_nonblocking(true)?;
    Ok(UnixListenerSpec {
        channel: None,
        listener,
        files: SocketFiles {
            path: Some(path.to_path_buf()),
            activated: false,
            made,
        },
    })
}

/// Binds the descriptor channel's socket at `path` (0660, `group`'s),
/// replacing a stale one: the gRPC socket beside it was bound first, so no
/// live daemon holds it.
pub(crate) fn bind_channel(path: &Path, group: Option<u32>) -> Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    if path.exists() {
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    let flags = SocketFlags::CLOEXEC | SocketFlags::NONBLOCK;
    let fd = rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, flags, None)?;
    let addr = SocketAddrUnix::new(path)?;
    rustix::net::bind(&fd, &addr).with_context(|| format!("binding {}", path.display()))?;
    rustix::net::listen(&fd, 128)?;
    for_the_group(path, group)?;
    Ok(fd)
}

/// A bound socket's mode: the socket group's to connect to (0660).
fn for_the_group(path: &Path, group: Option<u32>) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid))
            .with_context(|| format!("chgrp {} to gid {gid}", path.display()))?;
    }
    Ok(())
}

/// Resolves a group name or number to a gid.
pub(crate) fn resolve_group(group: &str) -> Result<Option<u32>> {
    if group.is_empty() {
        return Ok(None);
    }
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(Some(gid));
    }
    let text = std::fs::read_to_string("/etc/group").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let gid = f.nth(1)?.parse::<u32>().ok()?;
            (name == group).then_some(gid)
        })
        .next()
        .map(Some)
        .with_context(|| format!("socket_group {group:?} does not exist"))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn folders_made_for_the_socket_belong_to_its_group() {
        let t = tempfile::tempdir().unwrap();
        let root = nix_is_root();
        // Root can give them any group; anyone else, their own.
        let gid = if root {
            65534
        } else {
            t.path().metadata().unwrap().gid()
        };
        let path = t.path().join("run/ctcache/s.sock");
        let spec = bind_unix(&path, Some(gid)).unwrap();
        for dir in [
            t.path().join("run"),
            t.path().join("run/ctcache"),
            path.clone(),
        ] {
            let m = dir.metadata().unwrap();
            assert_eq!(m.gid(), gid, "{}", dir.display());
        }
        let m = t.path().join("run/ctcache").metadata().unwrap();
        assert_eq!(m.mode() & 0o777, 0o750);
        drop(spec);
    }

    fn nix_is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }
}
