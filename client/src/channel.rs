//! The HTTP/2 channel to the daemon's Unix socket that every call rides
//! on, for [`Client`](crate::Client) and for generated gRPC clients of
//! one's own.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::chain;
use crate::error::{Error, Result};

/// An HTTP/2 channel to the daemon's socket at `path`, for a generated
/// gRPC client of one's own (tonic's health client, say);
/// [`Client`](crate::Client) is built on it. Unlike
/// [`Client::connect_to`](crate::Client::connect_to) it does not first
/// probe the socket to name why it cannot be reached.
pub async fn channel_to(path: impl AsRef<Path>) -> Result<Channel> {
    let socket = path.as_ref().to_path_buf();
    endpoint()
        .connect_with_connector(socket_connector(socket.clone()))
        .await
        .map_err(|e| Error::Connect {
            detail: chain(&e),
            socket,
        })
}

/// Like [`channel_to`], but connects at the first call rather than now
/// (a call fails if the socket cannot be reached then).
pub fn lazy_channel_to(path: impl AsRef<Path>) -> Channel {
    endpoint().connect_with_connector_lazy(socket_connector(path.as_ref().to_path_buf()))
}

/// The URI is a placeholder: every connection goes to the socket.
fn endpoint() -> Endpoint {
    Endpoint::from_static("http://[::]:50051")
}

/// A connection to the daemon's socket, as tonic's channel drives it.
type SocketIo = TokioIo<tokio::net::UnixStream>;

/// Opens each of a channel's connections to the socket at `socket`.
fn socket_connector(
    socket: PathBuf,
) -> impl tower::Service<
    Uri,
    Response = SocketIo,
    Error = std::io::Error,
    Future = impl std::future::Future<Output = std::io::Result<SocketIo>> + Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |_: Uri| {
        let socket = socket.clone();
        async move { Ok(TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
    })
}
