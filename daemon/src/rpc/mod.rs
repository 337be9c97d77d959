//! The gRPC edge, the only place in the daemon that knows tonic and the API
//! messages: the service (decode, call one use case, encode), the status
//! mapping, and serving it with grpc.health.v1 and reflection on the Unix
//! listener (and optionally TCP) until shutdown, then draining.

mod caller;
mod decode;
mod encode;
mod peer;
mod service;
mod status;

use std::sync::Arc;
use std::time::Duration;

use ctcache_api::v1::compiled_tensor_cache_server::CompiledTensorCacheServer;
use tokio::sync::watch;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_stream::StreamExt;
use tonic::transport::Server;

use crate::error::RunError;
use crate::state::Daemon;
use service::Service;

/// How long running pack jobs may take to finish after shutdown.
const DRAIN_BOUND: Duration = Duration::from_secs(20);
/// How long open calls may take to finish after shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Resolves once `rx` turns true (or its sender is gone).
async fn turned_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Serves until `shutdown` turns true, then drains.
pub(crate) async fn serve(
    daemon: Arc<Daemon>,
    unix: std::os::unix::net::UnixListener,
    tcp: Option<std::net::TcpListener>,
    shutdown: watch::Receiver<bool>,
    on_ready: impl FnOnce(),
) -> Result<(), RunError> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<CompiledTensorCacheServer<Service>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ctcache_api::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| RunError::Serve(format!("building the reflection service: {e}")))?;
    let limit = daemon.config.max_message_bytes;
    let svc = CompiledTensorCacheServer::new(Service {
        daemon: daemon.clone(),
        shutdown: shutdown.clone(),
    })
    .max_decoding_message_size(limit)
    .max_encoding_message_size(limit);
    let router = |s: &CompiledTensorCacheServer<Service>| {
        Server::builder()
            .add_service(health.clone())
            .add_service(reflection.clone())
            .add_service(s.clone())
    };
    unix.set_nonblocking(true)
        .map_err(|e| RunError::io("the unix listener", e))?;
    let unix = tokio::net::UnixListener::from_std(unix)
        .map_err(|e| RunError::io("the unix listener", e))?;
    // A connection whose peer cannot be read is dropped, not served.
    let incoming = UnixListenerStream::new(unix).filter_map(|conn| match conn {
        Ok(s) => match peer::PeerStream::new(s) {
            Ok(p) => Some(Ok::<_, std::io::Error>(p)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a connection's peer credentials");
                None
            }
        },
        Err(e) => Some(Err(e)),
    });
    let unix_server =
        router(&svc).serve_with_incoming_shutdown(incoming, turned_true(shutdown.clone()));
    let tcp_server = match tcp {
        Some(l) => {
            l.set_nonblocking(true)
                .map_err(|e| RunError::io("the tcp listener", e))?;
            let l = tokio::net::TcpListener::from_std(l)
                .map_err(|e| RunError::io("the tcp listener", e))?;
            Some(tokio::spawn(router(&svc).serve_with_incoming_shutdown(
                TcpListenerStream::new(l),
                turned_true(shutdown.clone()),
            )))
        }
        None => None,
    };
    on_ready();
    // Graceful shutdown waits for open calls (Events streams end at the
    // signal); after the grace period the daemon drains anyway.
    let grace = {
        let rx = shutdown.clone();
        async move {
            turned_true(rx).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        }
    };
    tokio::select! {
        r = unix_server => r.map_err(|e| RunError::Serve(format!("serving on the Unix socket: {e}")))?,
        _ = grace => tracing::warn!("open calls did not finish within {SHUTDOWN_GRACE:?}; closing them"),
    }
    if let Some(t) = tcp_server {
        t.abort();
    }
    turned_true(shutdown).await;
    drain(&daemon).await;
    Ok(())
}

/// Stops taking work, lets running pack jobs finish within a bound, stops
/// the watcher and flushes the index.
async fn drain(d: &Arc<Daemon>) {
    crate::systemd::stopping();
    d.scheduler.shutdown();
    d.watcher.stop();
    let deadline = tokio::time::Instant::now() + DRAIN_BOUND;
    while d
        .scheduler
        .stats()
        .running
        .load(std::sync::atomic::Ordering::Relaxed)
        > 0
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Err(e) = d.store.flush() {
        tracing::error!(error = %e, "flushing the index failed");
    }
    tracing::info!("drained; exiting");
}
