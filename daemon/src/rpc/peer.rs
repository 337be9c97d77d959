//! Unix-socket connections that carry their peer's credentials and
//! supplementary groups, read once when the connection is accepted
//! (SO_PEERCRED, SO_PEERGROUPS): the identity a caller's file access is
//! judged for.

use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use ctcache::access::Identity;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tonic::transport::server::Connected;

/// Groups read at most (the kernel's NGROUPS_MAX is 65536).
const MAX_GROUPS: usize = 65536;

/// Who is at the other end of a Unix-socket connection.
#[derive(Debug, Clone)]
pub(crate) struct PeerInfo {
    pub identity: Identity,
    pub pid: Option<i32>,
}

/// An accepted connection and its peer.
pub(crate) struct PeerStream {
    inner: UnixStream,
    info: PeerInfo,
    _share: Option<super::accept::Share>,
}

impl PeerStream {
    /// Reads the peer of an accepted connection.
    pub fn new(inner: UnixStream) -> io::Result<PeerStream> {
        let cred = inner.peer_cred()?;
        let groups = peer_groups(&inner)?;
        Ok(PeerStream {
            info: PeerInfo {
                identity: Identity {
                    uid: cred.uid(),
                    gid: cred.gid(),
                    groups,
                },
                pid: cred.pid(),
            },
            inner,
            _share: None,
        })
    }

    /// The peer's uid.
    pub fn uid(&self) -> u32 {
        self.info.identity.uid
    }

    /// The connection, counted in its uid's share until it closes.
    pub fn holding(mut self, share: Option<super::accept::Share>) -> PeerStream {
        self._share = share;
        self
    }
}

/// The peer's supplementary groups (SO_PEERGROUPS, Linux 4.13+).
fn peer_groups(s: &UnixStream) -> io::Result<Vec<u32>> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `groups`, a live
        // buffer of exactly that size, and sets `len` to what it wrote (or,
        // with ERANGE, to what it needs).
        let r = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
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

impl Connected for PeerStream {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for PeerStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for PeerStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
