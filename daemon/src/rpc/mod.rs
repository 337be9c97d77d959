//! The gRPC edge, the only place in the daemon that knows tonic and the API
//! messages: the service (decode, call one use case, encode), the status
//! mapping, the transport rule applied to every request (`guard.rs`), and
//! serving it with grpc.health.v1 and reflection on the Unix listener (and
//! optionally TCP, with TLS when configured) within the configured
//! connection, stream and request bounds until shutdown, then draining.

mod accept;
mod caller;
mod decode;
mod encode;
mod error_codes;
mod guard;
pub(crate) mod handout;
mod handout_asks;
mod peer;
mod service;
mod wire_cache;

use std::sync::Arc;
use std::time::Duration;

use ctcache_api::served::compiled_tensor_cache_server::CompiledTensorCacheServer;
use tokio::sync::watch;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::config::Config;
use crate::error::RunError;
use crate::state::Daemon;
use guard::GuardLayer;
use service::Service;

/// Pings that find dead peers, so their connections do not stay open.
const KEEPALIVE: Duration = Duration::from_secs(60);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

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
        wire: Default::default(),
    })
    .max_decoding_message_size(limit)
    .max_encoding_message_size(limit);
    let cfg = &daemon.config;
    let guard = GuardLayer {
        trusted_uids: cfg.trusted_uids.clone().into(),
        deadline: Duration::from_secs(cfg.request_timeout_secs),
        cpu: daemon.cpu_budget.clone(),
    };
    let server = |tls: Option<ServerTlsConfig>| -> Result<_, RunError> {
        let mut b = Server::builder();
        if let Some(tls) = tls {
            b = b
                .tls_config(tls)
                .map_err(|e| RunError::Serve(format!("TLS for listen_tcp: {e}")))?;
        }
        let routes = b
            .concurrency_limit_per_connection(cfg.max_requests_per_connection)
            .max_concurrent_streams(cfg.max_streams_per_connection)
            .http2_keepalive_interval(Some(KEEPALIVE))
            .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
            .layer(guard.clone())
            .add_service(health.clone())
            .add_service(reflection.clone())
            .add_service(svc.clone());
        Ok(routes)
    };
    let unix_incoming = accept::unix(unix, cfg)?;
    let unix_server =
        server(None)?.serve_with_incoming_shutdown(unix_incoming, turned_true(shutdown.clone()));
    let tcp_server = match tcp {
        Some(l) => {
            let incoming = accept::tcp(l, cfg)?;
            Some(tokio::spawn(
                server(tls(cfg)?)?
                    .serve_with_incoming_shutdown(incoming, turned_true(shutdown.clone())),
            ))
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

/// The TLS settings of the TCP listener, from the configured PEM files.
fn tls(cfg: &Config) -> Result<Option<ServerTlsConfig>, RunError> {
    let (Some(cert), Some(key)) = (&cfg.tls_cert, &cfg.tls_key) else {
        return Ok(None);
    };
    let read = |key: &str, p: &std::path::Path| {
        std::fs::read(p).map_err(|e| RunError::io(format!("reading {key} {}", p.display()), e))
    };
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(
        read("tls_cert", cert)?,
        read("tls_key", key)?,
    ));
    if let Some(ca) = &cfg.tls_client_ca {
        tls = tls
            .client_ca_root(Certificate::from_pem(read("tls_client_ca", ca)?))
            .client_auth_optional(false);
    }
    Ok(Some(tls))
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
