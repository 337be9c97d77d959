//! The optional Prometheus endpoint (off by default). Counters and
//! histograms are recorded with the `metrics` macros where things happen.

use anyhow::{Context, Result};

pub fn install(addr: &str) -> Result<()> {
    let addr: std::net::SocketAddr = addr
        .parse()
        .with_context(|| format!("metrics_addr {addr:?}"))?;
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .context("starting the Prometheus endpoint")?;
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
