//! The calling process's identity (from the Unix socket's credentials) and
//! the file-access checks done on its behalf.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use tonic::transport::server::UdsConnectInfo;

/// Who is calling. TCP callers have no credentials: every check refuses them
/// unless the path is under a watched folder.
#[derive(Debug, Clone, Copy, Default)]
pub struct Peer {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub pid: Option<i32>,
}

impl Peer {
    pub fn of<T>(req: &tonic::Request<T>) -> Peer {
        match req
            .extensions()
            .get::<UdsConnectInfo>()
            .and_then(|i| i.peer_cred)
        {
            Some(c) => Peer {
                uid: Some(c.uid()),
                gid: Some(c.gid()),
                pid: c.pid(),
            },
            None => Peer::default(),
        }
    }

    /// True for root and for the daemon's own user.
    pub fn is_self_or_root(&self) -> bool {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        matches!(self.uid, Some(0)) || self.uid == Some(me)
    }

    /// Whether the permission bits let this peer do `want` (4 read, 2 write)
    /// on `path` (its primary group only; supplementary groups are unknown).
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

    /// The peer may read the file and search every folder above it.
    pub fn may_read(&self, path: &Path) -> bool {
        self.allowed(path, 4)
            && path
                .ancestors()
                .skip(1)
                .all(|d| d.as_os_str().is_empty() || self.allowed(d, 1))
    }

    /// The peer may create files in `dir`.
    pub fn may_write_dir(&self, dir: &Path) -> bool {
        self.allowed(dir, 2 | 1)
    }

    pub fn describe(&self) -> String {
        match (self.uid, self.pid) {
            (Some(u), Some(p)) => format!("uid {u} (pid {p})"),
            (Some(u), None) => format!("uid {u}"),
            _ => "a TCP peer".into(),
        }
    }
}
