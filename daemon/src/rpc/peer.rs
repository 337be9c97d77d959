//! The peer of a Unix-socket connection: its credentials and supplementary
//! groups, read once when the connection is accepted (SO_PEERCRED,
//! SO_PEERGROUPS) and carried as the connection's info: the identity a
//! caller's file access is judged for.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use ctcache::access::Identity;

/// Groups read at most (the kernel's NGROUPS_MAX is 65536).
const MAX_GROUPS: usize = 65536;

/// Who is at the other end of a Unix-socket connection.
#[derive(Debug, Clone)]
pub(crate) struct PeerInfo {
    pub identity: Identity,
    pub pid: Option<i32>,
}

/// Reads the peer of an accepted connection (a gRPC or a descriptor
/// channel one).
pub(crate) fn peer_of(s: &impl AsFd) -> io::Result<PeerInfo> {
    let cred = rustix::net::sockopt::socket_peercred(s)?;
    Ok(PeerInfo {
        identity: Identity {
            uid: cred.uid.as_raw(),
            gid: cred.gid.as_raw(),
            groups: peer_groups(s)?,
        },
        pid: Some(cred.pid.as_raw_nonzero().get()),
    })
}

/// The peer's supplementary groups (SO_PEERGROUPS, Linux 4.13+).
fn peer_groups(s: &impl AsFd) -> io::Result<Vec<u32>> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `groups`, a live
        // buffer of exactly that size, and sets `len` to what it wrote (or,
        // with ERANGE, to what it needs).
        let r = unsafe {
            libc::getsockopt(
                s.as_fd().as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let need = len as usize / std::mem::size_of::<libc::gid_t>();
        if r == 0 {
            groups.truncate(need);
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) || need <= groups.len() || need > MAX_GROUPS {
            return Err(e);
        }
        groups.resize(need, 0);
    }
}
