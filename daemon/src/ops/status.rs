//! Read-only views of the daemon: its status, store statistics and the list
//! of stored entries.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ctcache::digest::{Algorithm, SourceDigest};
use ctcache::store::{Entry, Stats};

use super::{Error, Result};
use crate::caller::Caller;
use crate::state::Daemon;
use crate::view::View;

/// What `ctcachectl status` shows.
#[derive(Debug)]
pub(crate) struct StatusReport {
    pub uptime: Duration,
    pub stats: Stats,
    pub jobs_running: u32,
    pub jobs_queued: u32,
    pub watches: Vec<PathBuf>,
    pub cache_dir: PathBuf,
    pub socket: Option<PathBuf>,
    /// The configured gc budget (what a Gc without limits applies).
    pub gc_budget: super::gc::Budget,
    pub remote: Option<crate::fleet::Report>,
    /// The start-up reconcile of the store still runs.
    pub reconciling: bool,
    /// The configured runtimes.
    pub runtimes: Vec<crate::runtimes::Report>,
}

/// The Status use case: the watched folders are those `caller` may see
/// (as ListWatches shows them).
pub(crate) fn status(d: &Daemon, caller: &Caller) -> Result<StatusReport> {
    let sched = d.scheduler.stats();
    Ok(StatusReport {
        uptime: d.started.elapsed(),
        stats: d.store.stats()?,
        jobs_running: sched.running.load(Ordering::Relaxed) as u32,
        jobs_queued: d.scheduler.queued() as u32,
        watches: super::watch::visible(d, caller)?,
        cache_dir: d.config.cache_dir.clone(),
        socket: d.socket.clone(),
        gc_budget: super::gc::configured_budget(d),
        remote: d.fleet.as_ref().map(|f| f.report(false)),
        reconciling: !d.reconciled.load(Ordering::SeqCst),
        runtimes: d.runtimes.reports(),
    })
}

/// The RemoteStatus use case: the fleet tier's report, the remote probed
/// (`None`: no remote configured).
pub(crate) fn remote_status(d: &Daemon) -> Result<Option<crate::fleet::Report>> {
    Ok(d.fleet.as_ref().map(|f| f.report(true)))
}

/// Store statistics and the number of active leases.
pub(crate) fn stats(d: &Daemon) -> Result<(Stats, u64)> {
    let stats = d.store.stats()?;
    let leases = d.store.lease_count()?;
    Ok((stats, leases))
}

/// Filters of the List use case; empty fields match everything.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListRequest {
    /// Struct type name prefix.
    pub format: String,
    /// Substring of the device description.
    pub device: String,
    pub source_digest: Vec<u8>,
    pub model_path: String,
    /// 0: no limit.
    pub limit: u32,
}

/// A listed entry and whether a lease holds it.
pub(crate) struct Listed {
    pub entry: Entry,
    pub leased: bool,
}

/// The List use case: the entries `caller` may see (`view.rs`).
pub(crate) fn list(d: &Daemon, caller: &Caller, r: &ListRequest) -> Result<Vec<Listed>> {
    let view = View::of(caller);
    let source = if r.source_digest.is_empty() {
        None
    } else {
        let bytes: [u8; 32] = r
            .source_digest
            .as_slice()
            .try_into()
            .map_err(|_| Error::invalid("source_digest must be 32 bytes"))?;
        Some(SourceDigest {
            algorithm: Algorithm::Blake3,
            bytes,
        })
    };
    let filter = ctcache::store::Filter {
        source,
        ..Default::default()
    };
    let entries = d.store.list(&filter)?;
    let limit = if r.limit == 0 {
        usize::MAX
    } else {
        r.limit as usize
    };
    entries
        .into_iter()
        .filter(|e| r.format.is_empty() || e.type_name.starts_with(&r.format))
        .filter(|e| r.device.is_empty() || ctcache::device::describe(&e.device).contains(&r.device))
        .filter_map(|e| view.entry(e))
        .filter(|e| r.model_path.is_empty() || e.model_paths.iter().any(|p| p == &r.model_path))
        .take(limit)
        .map(|e| {
            Ok(Listed {
                leased: d.store.is_leased(&e.key)?,
                entry: e,
            })
        })
        .collect()
}
