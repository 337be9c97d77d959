//! ctcached, the compiled-tensor cache daemon, as a library: [`run`] serves
//! a [`Config`](config::Config) on listeners the caller binds until a
//! shutdown future resolves. `main.rs` parses flags, starts logging, binds
//! the sockets and calls it; tests call it in-process on temp dirs.
//!
//! Inside: `ops/` holds the use cases (core types in and out, no gRPC),
//! `rpc/` the gRPC edge; the scheduler, watcher, policy and digest memo
//! serve the use cases.

#![deny(missing_docs)]

pub mod config;
pub mod logging;

mod budget;
mod caller;
mod cpu_budget;
mod error;
mod events;
mod fleet;
mod flights;
mod handouts;
mod hash_budget;
mod jobs;
mod locks;
mod memo;
mod metrics;
mod ops;
mod policy;
mod rpc;
mod runtimes;
mod scheduler;
mod shares;
mod state;
mod systemd;
mod use_case_names;
mod view;
mod watcher;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use config::Config;
pub use error::RunError;
use state::Daemon;

/// The sockets the daemon serves on, bound by the caller.
#[derive(Debug)]
pub struct Listeners {
    /// The Unix socket (from systemd or bound at `socket_path`).
    pub unix: std::os::unix::net::UnixListener,
    /// Where the Unix socket lives, for `status`.
    pub socket_path: Option<PathBuf>,
    /// The optional TCP listener.
    pub tcp: Option<std::net::TcpListener>,
    /// The descriptor channel's listening SOCK_SEQPACKET socket.
    pub handouts: Option<std::os::fd::OwnedFd>,
}

/// Raises the soft limit on open files to the hard one (systemd's advice
/// for programs that use no select(2)): besides connections, mapped models
/// and payloads, each user's watched folder is held open, and the usual
/// soft limit of 1024 would be reached at some 60 uids of 16 watches.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: both calls get a valid pointer to an rlimit of this process.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            let was = limit.rlim_cur;
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                tracing::debug!(from = was, to = limit.rlim_max, "open files limit raised");
            }
        }
    }
}

/// Runs the daemon: opens the store, starts the scheduler, the watcher and
/// the optional metrics endpoint, serves on `listeners` until `shutdown`
/// resolves, then drains (queued jobs cancelled, running ones finished
/// within a bound, the index flushed).
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    config.validate()?;
    raise_open_files_limit();
    // tonic's TLS brings rustls with ring and object_store with aws-lc-rs;
    // with two providers compiled in, rustls will not pick one by itself.
    // Another caller in this process may have installed one already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutdown requested");
        let _ = tx.send(true);
    });
    if let Some(addr) = &config.metrics_addr {
        metrics::install(addr)?;
    }
    let fleet = config
        .remote
        .clone()
        .map(|r| fleet::Fleet::start(*r, tokio::runtime::Handle::current()))
        .transpose()?;
    let dir = config.cache_dir.clone();
    let socket = listeners.socket_path.clone();
    let daemon = tokio::task::spawn_blocking(move || -> Result<Arc<Daemon>, RunError> {
        std::fs::create_dir_all(&dir)
            .map_err(|e| RunError::io(format!("creating {}", dir.display()), e))?;
        let store =
            ctcache::store::Store::open(&dir, Default::default()).map_err(|e| RunError::Store {
                dir,
                problem: Box::new(e),
            })?;
        let opened = store.opened();
        if let Some(reset) = &opened.index_reset {
            tracing::warn!(
                moved_to = %reset.moved_to.display(),
                detail = %reset.detail,
                "the cache index could not be opened: set aside and rebuilt from the record files"
            );
        }
        if let Some(r) = &opened.record_sync {
            tracing::info!(
                indexed = r.indexed,
                rewritten = r.rewritten,
                dropped = r.dropped,
                "index and record files brought to agree at open"
            );
        }
        Ok(Arc::new(Daemon::new(
            config,
            Arc::new(store),
            socket,
            fleet,
        )))
    })
    .await
    .map_err(|e| RunError::Serve(format!("start-up failed: {e}")))??;
    ops::scan::start(&daemon).map_err(|e| RunError::Serve(e.message))?;
    daemon.runtimes.identify_in_background();
    if daemon.config.metrics_addr.is_some() {
        metrics::watch_state(&daemon, rx.clone()).await;
    }
    // Repair file/index mismatches in the background; lookups go on meanwhile.
    let d = daemon.clone();
    tokio::task::spawn_blocking(move || {
        match d.store.reconcile() {
            Ok(r) => ops::gc::log_reconcile(&r),
            Err(e) => tracing::warn!(error = %e, "reconcile failed"),
        }
        d.reconciled
            .store(true, std::sync::atomic::Ordering::SeqCst);
    });
    let _watchdog = systemd::spawn_watchdog();
    let where_ = listeners
        .socket_path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let ready = move || {
        tracing::info!(socket = %where_, "ctcached ready");
        systemd::ready(&format!("serving on {where_}"));
    };
    if let Some(channel) = listeners.handouts {
        tokio::spawn(rpc::handout::serve(daemon.clone(), channel, rx.clone()));
    }
    let served = rpc::serve(daemon.clone(), listeners.unix, listeners.tcp, rx, ready).await;
    daemon.watcher.stop();
    release(daemon).await;
    served
}

/// Waits (a bounded time) until nothing else holds the daemon (the watcher's
/// scan thread, pack jobs finishing), then drops it: when `run` returns,
/// the store is closed and the cache dir free for another owner.
async fn release(daemon: Arc<Daemon>) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while Arc::strong_count(&daemon) > 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    if Arc::strong_count(&daemon) > 1 {
        tracing::warn!("work still running after shutdown; the store closes when it ends");
    }
    // Closing the store flushes and syncs: off the async threads.
    let _ = tokio::task::spawn_blocking(move || drop(daemon)).await;
}
