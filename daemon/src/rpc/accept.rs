//! Accepting the listeners' connections within a pool: a connection holds
//! a permit until it closes, and no new one is accepted while none is free
//! (the kernel's backlog holds the rest). The Unix socket's connections
//! carry their peer's credentials. The Unix socket's pool is `max_connections`,
//! and each uid also has a share (`max_connections_per_uid`), so no one
//! caller can hold them all and starve the others; TCP has a pool of its
//! own (a quarter of that), so TCP peers cannot starve the socket.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::peer::{self, PeerInfo};
use crate::config::Config;
use crate::error::RunError;
use crate::shares::{Share, Shares};

/// The connections a listener yields, as the server takes them.
pub(crate) type Incoming<IO, Info> = ReceiverStream<io::Result<Accepted<IO, Info>>>;

/// An accepted connection: what the server knows of its peer (the
/// request's connect info), and what it holds until it closes (its place
/// among the open ones, its uid's share).
pub(crate) struct Accepted<IO, Info> {
    io: IO,
    info: Info,
    _share: Option<Share>,
    _permit: OwnedSemaphorePermit,
}

impl<IO, Info: Clone + Send + Sync + 'static> Connected for Accepted<IO, Info> {
    type ConnectInfo = Info;

    fn connect_info(&self) -> Info {
        self.info.clone()
    }
}

impl<IO: AsyncRead + Unpin, Info: Unpin> AsyncRead for Accepted<IO, Info> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin, Info: Unpin> AsyncWrite for Accepted<IO, Info> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The connections `accept` yields (each with its peer's info and, where
/// counted, its uid's share), each once a permit of `open` is free; ends
/// when the server drops the stream.
fn incoming<IO, Info, F, Fut>(mut accept: F, open: Arc<Semaphore>) -> Incoming<IO, Info>
where
    IO: Send + 'static,
    Info: Send + 'static,
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = io::Result<(IO, Info, Option<Share>)>> + Send,
{
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        loop {
            let permit = tokio::select! {
                p = open.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
                _ = tx.closed() => return,
            };
            let accepted = tokio::select! {
                r = accept() => r,
                _ = tx.closed() => return,
            };
            let failed = accepted.is_err();
            let item = accepted.map(|(io, info, share)| Accepted {
                io,
                info,
                _share: share,
                _permit: permit,
            });
            if tx.send(item).await.is_err() {
                return;
            }
            if failed {
                // Out of descriptors, say: do not spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// The Unix socket's connections, within `max_connections`: each with its
/// peer's credentials and its uid's share. A connection whose peer cannot
/// be read is dropped, not served; so is one over its uid's share (closed
/// at once, so the hog sees it).
pub(crate) fn unix(
    listener: std::os::unix::net::UnixListener,
    cfg: &Config,
) -> Result<Incoming<UnixStream, PeerInfo>, RunError> {
    let shares = Shares::new(cfg.max_connections_per_uid);
    let trusted_uids = cfg.trusted_uids.clone();
    let listener = on_tokio("the unix listener", || {
        listener.set_nonblocking(true)?;
        tokio::net::UnixListener::from_std(listener)
    })?;
    let accept = move || {
        let (l, shares, trusted_uids) = (listener.clone(), shares.clone(), trusted_uids.clone());
        async move {
            loop {
                let (s, _) = l.accept().await?;
                let peer = peer::peer_of(&s).inspect_err(|e| {
                    tracing::warn!(error = %e, "cannot read a connection's peer credentials");
                })?;
                let uid = peer.identity.uid;
                match shares.take(crate::caller::bounded_uid(uid, &trusted_uids)) {
                    Some(share) => return Ok((s, peer, share)),
                    None => {
                        metrics::counter!("ctcache_connections_refused_total").increment(1);
                        tracing::debug!(uid, "connection over the uid's share closed");
                    }
                }
            }
        }
    };
    Ok(incoming(
        accept,
        Arc::new(Semaphore::new(cfg.max_connections)),
    ))
}

/// The TCP listener's connections. TCP peers have no uid to share by:
/// their own pool, a quarter of the socket's ([`tcp_connections`]), so
/// that TCP can never take the socket's places.
pub(crate) fn tcp(
    listener: std::net::TcpListener,
    cfg: &Config,
) -> Result<Incoming<TcpStream, TcpConnectInfo>, RunError> {
    let listener = on_tokio("the tcp listener", || {
        listener.set_nonblocking(true)?;
        tokio::net::TcpListener::from_std(listener)
    })?;
    let accept = move || {
        let l = listener.clone();
        async move {
            let (s, _) = l.accept().await?;
            let info = s.connect_info();
            Ok((s, info, None))
        }
    };
    let open = Semaphore::new(tcp_connections(cfg.max_connections));
    Ok(incoming(accept, Arc::new(open)))
}

/// A std listener handed to tokio's reactor by `take` (non-blocking
/// first); `what` names it in errors.
fn on_tokio<T>(what: &str, take: impl FnOnce() -> io::Result<T>) -> Result<Arc<T>, RunError> {
    take().map(Arc::new).map_err(|e| RunError::io(what, e))
}

/// Open TCP connections allowed beside `max_connections` on the socket.
pub(crate) fn tcp_connections(max_connections: usize) -> usize {
    (max_connections / 4).max(1)
}
