//! The optional Prometheus endpoint (off by default). Counters and
//! histograms are recorded with the `metrics` macros where things happen;
//! the gauges of the daemon's state (build, store, leases, watches) are set
//! before the first request and refreshed every few seconds, so a scrape
//! always finds them.

use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::Matcher;

use crate::error::RunError;
use crate::state::Daemon;

/// Upper bounds of the pack-time histogram, in seconds: a small tensor on a
/// fast core to a multi-GiB one on a slow GPU driver.
const PACK_SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// How often the state gauges are refreshed.
const STATE_PERIOD: Duration = Duration::from_secs(5);

/// Starts the endpoint at `addr` (host:port) and describes the metrics.
pub(crate) fn install(addr: &str) -> Result<(), RunError> {
    let addr: std::net::SocketAddr = addr
        .parse()
        .map_err(|_| RunError::Metrics(format!("metrics_addr {addr:?} is not host:port")))?;
    let pack_seconds = Matcher::Full("ctcache_pack_seconds".into());
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        // A histogram, not the exporter's default summary, whose quantiles
        // cover a sliding minute and read 0 after one without packs.
        .set_buckets_for_metric(pack_seconds, PACK_SECONDS_BUCKETS)
        .map_err(|e| RunError::Metrics(format!("pack-time buckets: {e}")))?
        .install()
        .map_err(|e| RunError::Metrics(format!("starting the Prometheus endpoint: {e}")))?;
    metrics::describe_counter!(
        "ctcache_lookup_hits_total",
        "lookups that found a usable entry"
    );
    metrics::describe_counter!(
        "ctcache_lookup_misses_total",
        "lookups without a usable entry, by reason"
    );
    metrics::describe_counter!(
        "ctcache_pack_jobs_total",
        "pack jobs run, by format and backend"
    );
    metrics::describe_histogram!(
        "ctcache_pack_seconds",
        "pack duration, by format and backend"
    );
    metrics::describe_counter!(
        "ctcache_gc_evictions_total",
        "entries and files removed by gc"
    );
    metrics::describe_counter!(
        "ctcache_watcher_events_total",
        "file system events seen by the watcher"
    );
    metrics::describe_gauge!(
        "ctcache_build_info",
        "1, with the daemon's version as a label"
    );
    metrics::describe_gauge!("ctcache_store_bytes", "bytes of the store's payload files");
    metrics::describe_gauge!("ctcache_store_entries", "entries in the store");
    metrics::describe_gauge!("ctcache_leases", "live leases");
    metrics::describe_gauge!("ctcache_watches", "watched folders");
    Ok(())
}

/// Sets the state gauges now, then every [`STATE_PERIOD`] until `stop`.
pub(crate) async fn watch_state(d: &Arc<Daemon>, mut stop: tokio::sync::watch::Receiver<bool>) {
    metrics::gauge!("ctcache_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    let first = d.clone();
    let _ = tokio::task::spawn_blocking(move || set_state(&first)).await;
    let d = d.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(STATE_PERIOD) => {}
                _ = stop.changed() => break,
            }
            let now = d.clone();
            let _ = tokio::task::spawn_blocking(move || set_state(&now)).await;
        }
    });
}

fn set_state(d: &Daemon) {
    match crate::ops::status::stats(d) {
        Ok((stats, leases)) => {
            metrics::gauge!("ctcache_store_bytes").set(stats.stored_bytes as f64);
            metrics::gauge!("ctcache_store_entries").set(stats.entries as f64);
            metrics::gauge!("ctcache_leases").set(leases as f64);
        }
        Err(e) => tracing::warn!(error = %e.message, "store statistics for /metrics"),
    }
    metrics::gauge!("ctcache_watches").set(d.watcher.dirs_with_uids().len() as f64);
}
