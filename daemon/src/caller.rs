//! Who is asking: the identity the transport vouches for (the Unix socket's
//! peer credentials), whether the daemon trusts it with admin and mutating
//! use cases, and the file-access checks done on its behalf.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// How the caller reached the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// The Unix socket: credentials from SO_PEERCRED.
    Unix,
    /// TCP: no credentials.
    Tcp,
}

/// The identity a use case acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub pid: Option<i32>,
    pub transport: Transport,
    /// Root, the daemon's own user or a `trusted_uids` member: may run the
    /// admin and mutating use cases.
    pub trusted: bool,
}

/// The daemon's effective uid.
pub(crate) fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

impl Caller {
    /// A caller with these credentials; trusted when root, the daemon's user
    /// or one of `trusted_uids`.
    pub fn new(
        uid: Option<u32>,
        gid: Option<u32>,
        pid: Option<i32>,
        transport: Transport,
        trusted_uids: &[u32],
    ) -> Caller {
        let trusted = uid.is_some_and(|u| u == 0 || u == own_uid() || trusted_uids.contains(&u));
        Caller {
            uid,
            gid,
            pid,
            transport,
            trusted,
        }
    }

    /// Root or the daemon's own user: access checks would change nothing.
    pub fn is_self_or_root(&self) -> bool {
        matches!(self.uid, Some(0)) || self.uid == Some(own_uid())
    }

    /// Fails unless the caller is trusted with `what` (logged either way).
    pub fn require_trusted(&self, what: &str) -> crate::error::Result<()> {
        tracing::info!(caller = %self.describe(), trusted = self.trusted, "{what}");
        if self.trusted {
            Ok(())
        } else {
            Err(crate::error::Error::denied(format!(
                "{} may not {what}: only the daemon's user, root and trusted_uids may",
                self.describe()
            )))
        }
    }

    /// Whether the permission bits let this caller do `want` (4 read, 2
    /// write) on `path` (its primary group only; supplementary groups are
    /// unknown).
    fn allowed(&self, path: &Path, want: u32) -> bool {
        let (Some(uid), Some(gid)) = (self.uid, self.gid) else {
            return false;
        };
        if uid == 0 {
            return true;
        }
        let Ok(m) = std::fs::metadata(path) else {
            return false;
        };
        let mode = m.mode();
        let bits = if m.uid() == uid {
            mode >> 6
        } else if m.gid() == gid {
            mode >> 3
        } else {
            mode
        };
        bits & want == want
    }

    /// The caller may read the file and search every folder above it.
    pub fn may_read(&self, path: &Path) -> bool {
        self.is_self_or_root()
            || self.allowed(path, 4)
                && path
                    .ancestors()
                    .skip(1)
                    .all(|d| d.as_os_str().is_empty() || self.allowed(d, 1))
    }

    /// The caller may create files in `dir`.
    pub fn may_write_dir(&self, dir: &Path) -> bool {
        self.is_self_or_root() || self.allowed(dir, 2 | 1)
    }

    /// "uid 1000 (pid 42)", for logs and messages.
    pub fn describe(&self) -> String {
        match (self.uid, self.pid) {
            (Some(u), Some(p)) => format!("uid {u} (pid {p})"),
            (Some(u), None) => format!("uid {u}"),
            _ => "a TCP peer".into(),
        }
    }
}
