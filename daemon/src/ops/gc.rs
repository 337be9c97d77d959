//! The Gc and Verify use cases: collect entries over the size budget or
//! unused for too long (the request's limits, else the configured budget),
//! and rehash every payload.

use std::time::Duration;

use ctcache::store::{GcPolicy, GcReport, ReconcileReport, VerifyReport};

use super::Result;
use crate::caller::Caller;
use crate::state::Daemon;

/// A Gc request; no limit given means the configured budget.
#[derive(Debug, Clone, Default)]
pub(crate) struct GcRequest {
    pub max_bytes: Option<u64>,
    pub max_age_secs: Option<u64>,
    pub dry_run: bool,
}

/// The Gc use case (a dry run is open to every caller).
pub(crate) fn gc(d: &Daemon, caller: &Caller, r: &GcRequest) -> Result<GcReport> {
    if !r.dry_run {
        caller.require_trusted("collect garbage")?;
    }
    let cfg = &d.config;
    let (max_bytes, max_age_secs) = if r.max_bytes.is_some() || r.max_age_secs.is_some() {
        (r.max_bytes, r.max_age_secs)
    } else {
        (
            (cfg.gc_max_bytes > 0).then_some(cfg.gc_max_bytes),
            (cfg.gc_max_age_secs > 0).then_some(cfg.gc_max_age_secs),
        )
    };
    let policy = GcPolicy {
        max_bytes,
        max_age: max_age_secs.map(Duration::from_secs),
        orphans: true,
        temp_files: true,
        dry_run: r.dry_run,
    };
    let report = d.store.gc(&policy)?;
    metrics::counter!("ctcache_gc_evictions_total").increment(report.items.len() as u64);
    Ok(report)
}

/// The Verify use case: rehash every payload (damaged ones are quarantined
/// and their entries dropped); with `repair`, also reconcile files and
/// index (orphan files removed, records pointing nowhere fixed).
pub(crate) fn verify(
    d: &Daemon,
    caller: &Caller,
    repair: bool,
) -> Result<(VerifyReport, Option<ReconcileReport>)> {
    caller.require_trusted("verify the store")?;
    let report = d.store.verify()?;
    let repaired = if repair {
        Some(d.store.reconcile()?)
    } else {
        None
    };
    Ok((report, repaired))
}
