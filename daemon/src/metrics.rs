//! The optional Prometheus endpoint (off by default). Counters and
//! histograms are recorded with the `metrics` macros where things happen.

use crate::error::RunError;

/// Starts the endpoint at `addr` (host:port) and describes the metrics.
pub(crate) fn install(addr: &str) -> Result<(), RunError> {
    let addr: std::net::SocketAddr = addr
        .parse()
        .map_err(|_| RunError::Metrics(format!("metrics_addr {addr:?} is not host:port")))?;
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
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
    Ok(())
}
