//! Opening a file with another user's rights, enforced by the kernel: for
//! the one open, the calling thread's filesystem uid and gid and its
//! supplementary groups become the identity's, then are set back. Linux
//! keeps these per thread, and only the raw system calls change just the
//! calling thread (glibc's `setgroups` changes every thread of the
//! process). A filesystem uid other than 0 also drops the capabilities that
//! bypass file modes, so the kernel judges every folder on the way, every
//! link followed and the file itself exactly as for that user.

use std::io;
use std::sync::OnceLock;

use super::Identity;

/// Most supplementary groups one identity may carry (the kernel's
/// NGROUPS_MAX).
const MAX_GROUPS: usize = 65536;

/// Whether this process may take on other users' filesystem rights (it
/// runs as root): then every open for an identity is the kernel's check.
pub fn can_switch() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    // SAFETY: geteuid has no preconditions.
    *ROOT.get_or_init(|| unsafe { libc::geteuid() } == 0)
}

/// Runs `f` on this thread with `who`'s filesystem rights. `f` must not
/// hand the thread back to a scheduler (no `.await`) before it returns.
pub(crate) fn with_rights_of<T>(
    who: &Identity,
    f: impl FnOnce() -> io::Result<T>,
) -> io::Result<T> {
    if who.is_root() {
        return f();
    }
    if who.groups.len() > MAX_GROUPS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "more supplementary groups than the kernel allows",
        ));
    }
    let _restore = Switched::to(who)?;
    f()
}

/// This thread's own rights, put back when dropped.
struct Switched {
    fsgid: u32,
    groups: Vec<libc::gid_t>,
}

impl Switched {
    fn to(who: &Identity) -> io::Result<Switched> {
        // A failure part way puts the thread back (drop) before returning.
        let back = Switched {
            // SAFETY: getegid has no preconditions.
            fsgid: unsafe { libc::getegid() },
            groups: own_groups()?,
        };
        set_groups(&who.groups)?;
        set_fsgid(who.gid)?;
        set_fsuid(who.uid)?;
        Ok(back)
    }
}

impl Drop for Switched {
    fn drop(&mut self) {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let back = set_fsuid(euid)
            .and_then(|()| set_fsgid(self.fsgid))
            .and_then(|()| set_groups(&self.groups));
        if back.is_err() {
            // A thread left with a peer's rights (or root's groups on a
            // peer's uid) would act wrongly for whatever it runs next.
            std::process::abort();
        }
    }
}

/// The calling thread's supplementary groups.
fn own_groups() -> io::Result<Vec<libc::gid_t>> {
    // SAFETY: a count of 0 only asks for the number of groups.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    let mut groups = vec![0; n];
    // SAFETY: `groups` has room for `n` ids.
    let got = unsafe { libc::getgroups(n as libc::c_int, groups.as_mut_ptr()) };
    let got = usize::try_from(got).map_err(|_| io::Error::last_os_error())?;
    groups.truncate(got);
    Ok(groups)
}

fn set_groups(groups: &[u32]) -> io::Result<()> {
    // SAFETY: the raw call reads `groups.len()` ids from the slice; unlike
    // glibc's wrapper it changes only the calling thread.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// setfsuid and setfsgid answer the previous id and never an error: asking
/// with an id that is never valid (-1) reads the current one back.
fn set_fs_id(call: libc::c_long, id: u32) -> io::Result<()> {
    // SAFETY: both calls take one id and change only this thread's creds.
    unsafe { libc::syscall(call, id) };
    // SAFETY: as above; -1 changes nothing.
    let now = unsafe { libc::syscall(call, u32::MAX) } as u32;
    if now == id {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("could not take on filesystem id {id}"),
        ))
    }
}

fn set_fsuid(uid: u32) -> io::Result<()> {
    set_fs_id(libc::SYS_setfsuid, uid)
}

fn set_fsgid(gid: u32) -> io::Result<()> {
    set_fs_id(libc::SYS_setfsgid, gid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_kernel_refuses_what_the_identity_may_not_read_and_rights_come_back() {
        if !can_switch() {
            eprintln!("skipped: needs root to take on another user's rights");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"s").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let nobody = Identity {
            uid: 65534,
            gid: 65534,
            groups: vec![],
        };
        let e = with_rights_of(&nobody, || std::fs::File::open(&secret)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        // The group it is given counts, and only on this thread.
        std::os::unix::fs::chown(&secret, None, Some(4242)).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o640)).unwrap();
        let member = Identity {
            groups: vec![4242],
            ..nobody.clone()
        };
        assert!(with_rights_of(&member, || std::fs::File::open(&secret)).is_ok());
        // Root's rights are back once the call returns.
        let before = own_groups().unwrap();
        assert!(std::fs::File::open(&secret).is_ok());
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
        assert!(
            std::fs::File::open(&secret).is_ok(),
            "root's override is back"
        );
        assert_eq!(own_groups().unwrap(), before);
    }
}
