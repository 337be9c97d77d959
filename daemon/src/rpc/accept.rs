//! Accepting connections within a pool: a connection holds a permit until
//! it closes, and no new one is accepted while none is free (the kernel's
//! backlog holds the rest). The Unix socket's pool is `max_connections`,
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
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

use crate::shares::Share;

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
pub(crate) fn incoming<IO, Info, F, Fut>(
    mut accept: F,
    open: Arc<Semaphore>,
) -> ReceiverStream<io::Result<Accepted<IO, Info>>>
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
