//! Serving: the gRPC service plus grpc.health.v1 and server reflection, on
//! the Unix listener (and optionally TCP), until the shutdown signal; then
//! drain: stop accepting, cancel queued jobs, let running ones finish within
//! a bound, flush the index.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use ctcache_api::v1::compiled_tensor_cache_server::CompiledTensorCacheServer;
use tokio::sync::watch;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::Server;

use crate::daemon::Daemon;
use crate::service::Service;

/// How long running pack jobs may take to finish after SIGTERM.
const DRAIN_BOUND: Duration = Duration::from_secs(20);
/// How long open calls may take to finish after SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// Serves until `shutdown` turns true, then drains.
pub async fn serve(
    daemon: Arc<Daemon>,
    unix: std::os::unix::net::UnixListener,
    tcp: Option<std::net::TcpListener>,
    mut shutdown: watch::Receiver<bool>,
    on_ready: impl FnOnce(),
) -> Result<()> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<CompiledTensorCacheServer<Service>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ctcache_api::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the reflection service")?;
    let limit = daemon.config.max_message_bytes;
    let svc = CompiledTensorCacheServer::new(Service {
        daemon: daemon.clone(),
        shutdown: shutdown.clone(),
    })
    .max_decoding_message_size(limit)
    .max_encoding_message_size(limit);

    let signal = |mut rx: watch::Receiver<bool>| async move {
        while !*rx.borrow() {
            if rx.changed().await.is_err() {
                break;
            }
        }
    };
    let router = Server::builder()
        .add_service(health.clone())
        .add_service(reflection.clone())
        .add_service(svc.clone());
    let unix = tokio::net::UnixListener::from_std(unix).context("unix listener")?;
    let unix_server = router
        .serve_with_incoming_shutdown(UnixListenerStream::new(unix), signal(shutdown.clone()));
    let tcp_server = match tcp {
        Some(l) => {
            l.set_nonblocking(true)?;
            let l = tokio::net::TcpListener::from_std(l).context("tcp listener")?;
            let router = Server::builder()
                .add_service(health)
                .add_service(reflection)
                .add_service(svc);
            Some(tokio::spawn(router.serve_with_incoming_shutdown(
                TcpListenerStream::new(l),
                signal(shutdown.clone()),
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
            signal(rx).await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        }
    };
    tokio::select! {
        r = unix_server => r.context("serving on the Unix socket")?,
        _ = grace => tracing::warn!("open calls did not finish within {SHUTDOWN_GRACE:?}; closing them"),
    }
    if let Some(t) = tcp_server {
        t.abort();
    }
    signal(shutdown.clone()).await;
    let _ = shutdown.borrow_and_update();
    drain(&daemon).await;
    Ok(())
}

async fn drain(d: &Arc<Daemon>) {
    crate::systemd::stopping();
    d.scheduler.shutdown();
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
