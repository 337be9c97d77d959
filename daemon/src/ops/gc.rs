//! The Gc and Verify use cases: collect entries over the size budget or
//! unused for too long (the request's limits, else the configured ones),
//! and rehash every payload.

use std::time::Duration;

use ctcache::store::{GcPolicy, GcReport, GcTarget, ReconcileReport, VerifyReport};

use super::Result;
use crate::caller::Caller;
use crate::state::Daemon;
use crate::view::View;

/// A Gc request; a limit not given is the configured one.
#[derive(Debug, Clone, Default)]
pub(crate) struct GcRequest {
    pub max_bytes: Option<u64>,
    pub max_age_secs: Option<u64>,
    pub dry_run: bool,
}

/// The budget a Gc that names no limit applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budget {
    pub max_bytes: Option<u64>,
    /// True when `max_bytes` is the default: no `gc_max_bytes` configured.
    pub max_bytes_default: bool,
    pub max_age: Option<Duration>,
}

/// The configured budget: `gc_max_bytes` (else half the cache's file
/// system, so that no peer's packs fill the disk the cache shares) and
/// `gc_max_age_secs` (else none).
pub(crate) fn configured_budget(d: &Daemon) -> Budget {
    let cfg = &d.config;
    let (max_bytes, max_bytes_default) = match cfg.gc_max_bytes {
        0 => (default_max_bytes(&cfg.cache_dir), true),
        n => (Some(n), false),
    };
    Budget {
        max_bytes,
        max_bytes_default,
        max_age: (cfg.gc_max_age_secs > 0).then(|| Duration::from_secs(cfg.gc_max_age_secs)),
    }
}

/// Half the size of the file system `cache_dir` is on (`None` when it
/// cannot be read).
fn default_max_bytes(cache_dir: &std::path::Path) -> Option<u64> {
    match ctcache::fsutil::fs_size(cache_dir) {
        Ok(size) => Some(size / 2),
        Err(e) => {
            tracing::warn!("no default gc size budget: {}: {e}", cache_dir.display());
            None
        }
    }
}

/// The Gc use case (a dry run is open to every caller).
pub(crate) fn gc(d: &Daemon, caller: &Caller, r: &GcRequest) -> Result<GcReport> {
    if !r.dry_run {
        caller.require_trusted("collect garbage")?;
    }
    // Each limit the request leaves out is the configured one: the daily
    // timer's `--max-age 30d` keeps the size budget.
    let budget = configured_budget(d);
    let max_bytes = r.max_bytes.or(budget.max_bytes);
    let max_age = r.max_age_secs.map(Duration::from_secs).or(budget.max_age);
    let policy = GcPolicy {
        max_bytes,
        max_age,
        max_bytes_per_uid: Some(d.config.max_stored_bytes_per_uid),
        orphans: true,
        temp_files: true,
        dry_run: r.dry_run,
    };
    let mut report = d.store.gc(&policy)?;
    metrics::counter!("ctcache_gc_evictions_total").increment(report.items.len() as u64);
    let entries = report
        .items
        .iter()
        .filter(|i| matches!(i.target, GcTarget::Entry(_)))
        .count();
    tracing::info!(
        caller = %caller.describe(),
        "gc{}: {} {entries} entries and {} leftover files, {} bytes freed, store {} -> {} bytes{}{}{}",
        if r.dry_run { " (dry run)" } else { "" },
        if r.dry_run { "would remove" } else { "removed" },
        report.items.len() - entries,
        report.bytes_freed,
        report.bytes_before,
        report.bytes_after,
        match report.bytes_still_linked {
            0 => String::new(),
            n => format!(", {n} bytes still on disk through hard links outside the store"),
        },
        match report.leased_kept {
            0 => String::new(),
            n => format!(", {n} leased entries kept"),
        },
        if max_bytes.is_none() && max_age.is_none() {
            "; no size or age limit given or configured"
        } else {
            ""
        },
    );
    // A dry run shows a peer only the entries it may see (totals stay whole).
    let view = View::of(caller);
    if !view.sees_all() {
        report.items.retain(|i| match (&i.target, &i.about) {
            (GcTarget::Entry(_), Some(about)) => view.sees_entry_of(&about.model_paths, None),
            (GcTarget::Entry(_), None) => false,
            (GcTarget::File(_), _) => true,
        });
    }
    Ok(report)
}

/// The Verify use case: rehash every payload and list orphan files; with
/// `repair`, damaged payloads are quarantined (their entries dropped),
/// orphans removed and files and index reconciled. Without, nothing
/// changes (a damaged payload is refused when served all the same).
pub(crate) fn verify(
    d: &Daemon,
    caller: &Caller,
    repair: bool,
) -> Result<(VerifyReport, Option<ReconcileReport>)> {
    caller.require_trusted("verify the store")?;
    let report = d.store.verify(repair)?;
    let damaged = report.problems.len();
    tracing::info!(
        caller = %caller.describe(),
        "verify: {} payload files ({} bytes) rehashed, {}",
        report.blobs_checked,
        report.bytes_checked,
        if damaged == 0 {
            "all intact".to_string()
        } else {
            format!(
                "{damaged} damaged ({})",
                if repair {
                    "quarantined, their entries dropped"
                } else {
                    "reported only"
                }
            )
        }
    );
    let repaired = if repair {
        let r = d.store.reconcile()?;
        log_reconcile(&r);
        Some(r)
    } else {
        None
    };
    Ok((report, repaired))
}

/// One line for what a reconcile found and fixed.
pub(crate) fn log_reconcile(r: &ReconcileReport) {
    tracing::info!(
        "reconcile: {} entries checked, {} damaged, {} orphan and {} stray files and {} temp files removed, {} index records fixed; record files: {} indexed again, {} written again, {} dropped",
        r.entries_checked,
        r.damaged.len(),
        r.orphan_files_removed.len(),
        r.stray_files_removed.len(),
        r.temp_files_removed.len(),
        r.refs_added + r.source_lists_fixed + r.records_removed + r.expired_leases_removed,
        r.records.indexed,
        r.records.rewritten,
        r.records.dropped + r.records.stray_removed,
    );
}
