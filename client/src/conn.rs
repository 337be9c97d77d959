//! The channel to the daemon and the one place calls go through: a call
//! that finds the connection lost gets a new channel for the next one, and
//! calls that are safe to repeat are repeated for a bounded time, so a
//! daemon restarted by systemd is invisible to the caller.

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use ctcache_api::v1::compiled_tensor_cache_client::CompiledTensorCacheClient;
use tonic::transport::Channel;

use crate::error::{connection_lost, Error, Result};

/// Largest message accepted from the daemon (a List of many entries).
const MAX_MESSAGE: usize = 256 << 20;
/// The first pause before a retry; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// The generated client over one channel.
pub(crate) type Grpc = CompiledTensorCacheClient<Channel>;

/// Whether a call may be sent again when the connection was lost before its
/// answer (the daemon may or may not have acted on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Repeat {
    /// Sending it twice does what sending it once does.
    Safe,
    /// A second send could act twice (a lease taken twice, an output
    /// written over): the caller decides.
    Never,
}

/// The current channel and a generation number, so that many calls failing
/// at once replace it once.
pub(crate) struct Conn {
    socket: Arc<PathBuf>,
    current: RwLock<(u64, Grpc)>,
}

fn grpc(channel: Channel) -> Grpc {
    CompiledTensorCacheClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE)
}

impl Conn {
    pub(crate) fn new(socket: Arc<PathBuf>, channel: Channel) -> Conn {
        Conn {
            socket,
            current: RwLock::new((0, grpc(channel))),
        }
    }

    fn get(&self) -> (u64, Grpc) {
        let g = self.current.read().unwrap_or_else(|p| p.into_inner());
        (g.0, g.1.clone())
    }

    /// Replaces the channel of generation `seen` by a new one that connects
    /// at its first call (a later generation is already new).
    fn renew(&self, seen: u64) {
        let mut g = self.current.write().unwrap_or_else(|p| p.into_inner());
        if g.0 == seen {
            *g = (seen + 1, grpc(crate::lazy_channel_to(self.socket.as_ref())));
        }
    }

    /// Sends `req` through `send`; see the module comment. `retry_for`
    /// bounds the time spent waiting for the daemon to come back.
    pub(crate) async fn call<Req, Resp, F, Fut>(
        &self,
        rpc: &'static str,
        repeat: Repeat,
        retry_for: Duration,
        req: Req,
        send: F,
    ) -> Result<Resp>
    where
        Req: Clone,
        F: Fn(Grpc, Req) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let started = tokio::time::Instant::now();
        let mut pause = FIRST_PAUSE;
        loop {
            let (generation, grpc) = self.get();
            let status = match send(grpc, req.clone()).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) => s,
            };
            if !connection_lost(&status) {
                return Err(Error::from_status(&self.socket, rpc, status));
            }
            self.renew(generation);
            if repeat == Repeat::Never || started.elapsed() + pause > retry_for {
                return Err(Error::from_status(&self.socket, rpc, status));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }
}
