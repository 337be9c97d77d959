//! The Lookup use case: the stored entries of one source digest that the
//! caller's devices, runtime and types can use, best first; or why none can.

use std::sync::Arc;

use ctcache::device::RuntimeIdentity;
use ctcache::digest::{Algorithm, SourceDigest};
use ctcache::hit::MissReason;
use ctcache::pb;
use ctcache::store::{HostFilter, SharedEntry};

use super::{Error, Miss, Result};
use crate::state::Daemon;

/// Most lookups in one batch.
pub(crate) const MAX_BATCH: usize = 100_000;

/// A physical type the caller accepts: a name and format versions (empty:
/// any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AcceptedType {
    pub name: String,
    pub versions: Vec<u32>,
}

/// What the caller can use; empty fields mean the daemon's own host.
#[derive(Debug, Clone, Default)]
pub(crate) struct Target {
    pub devices: Vec<pb::DeviceProto>,
    pub runtime: Option<RuntimeIdentity>,
    pub accepted: Vec<AcceptedType>,
}

/// One lookup.
#[derive(Debug, Clone, Default)]
pub(crate) struct LookupRequest {
    pub source_digest: Vec<u8>,
    /// Empty: blake3.
    pub digest_algorithm: String,
    pub target: Target,
    /// Only entries the daemon packed itself (not put by clients).
    pub daemon_produced_only: bool,
}

/// Hits best first, or the miss.
#[derive(Debug, Clone)]
pub(crate) enum LookupOutcome {
    /// Shared with the store's lookup cache (see [`SharedEntry`]).
    Hits(Vec<Arc<SharedEntry>>),
    Miss(Miss),
}

impl Target {
    /// The lookup filter for this target: its devices and runtime, the
    /// layouts this build produces, narrowed to the names it accepts; only
    /// daemon-packed entries when the daemon is configured so.
    pub fn filter(&self, d: &Daemon) -> HostFilter {
        let devices = if self.devices.is_empty() {
            d.host.devices().to_vec()
        } else {
            self.devices.clone()
        };
        let host = HostFilter::new(devices, self.runtime.clone(), d.host.accept().clone())
            .daemon_produced_only(d.config.daemon_produced_only);
        if self.accepted.is_empty() {
            host
        } else {
            host.accepting_names(
                self.accepted
                    .iter()
                    .map(|a| (a.name.clone(), a.versions.clone())),
            )
        }
    }

    fn is_host(&self) -> bool {
        self.devices.is_empty() && self.runtime.is_none() && self.accepted.is_empty()
    }
}

/// The Lookup use case.
pub(crate) fn lookup(d: &Daemon, r: &LookupRequest) -> Result<LookupOutcome> {
    let algorithm = if r.digest_algorithm.is_empty() {
        "blake3"
    } else {
        &r.digest_algorithm
    };
    let algorithm: Algorithm = match algorithm.parse() {
        Ok(a) => a,
        Err(_) => {
            return Ok(LookupOutcome::Miss(
                MissReason::UnknownDigestAlgorithm(algorithm.to_string()).into(),
            ))
        }
    };
    let bytes: [u8; 32] = r.source_digest.as_slice().try_into().map_err(|_| {
        Error::invalid(format!(
            "source_digest has {} bytes, expected 32",
            r.source_digest.len()
        ))
    })?;
    let source = SourceDigest { algorithm, bytes };
    // The common case (the daemon's own host) reuses the prepared filter
    // instead of re-deriving device keys and accepted types per lookup.
    let custom;
    let filter = if r.target.is_host() && !r.daemon_produced_only {
        &d.host_filter
    } else {
        custom = r
            .target
            .filter(d)
            .daemon_produced_only(r.daemon_produced_only || d.config.daemon_produced_only);
        &custom
    };
    let hits: Vec<Arc<SharedEntry>> = d
        .store
        .lookup(&source, filter)?
        .into_iter()
        .map(|h| h.entry)
        .collect();
    if !hits.is_empty() {
        metrics::counter!("ctcache_lookup_hits_total").increment(1);
        return Ok(LookupOutcome::Hits(hits));
    }
    let miss = explain_miss(d, &source, filter)?;
    metrics::counter!("ctcache_lookup_misses_total", "reason" => miss.code()).increment(1);
    Ok(LookupOutcome::Miss(miss))
}

/// Lookups in one call, answered in order.
pub(crate) fn batch(d: &Daemon, requests: &[LookupRequest]) -> Result<Vec<LookupOutcome>> {
    if requests.len() > MAX_BATCH {
        return Err(Error::invalid(format!(
            "at most {MAX_BATCH} lookups per batch"
        )));
    }
    requests.iter().map(|r| lookup(d, r)).collect()
}

/// Why no entry of `source` fits: the core's judgement of the entry that
/// got furthest.
fn explain_miss(d: &Daemon, source: &SourceDigest, filter: &HostFilter) -> Result<Miss> {
    let reason = match d.store.lookup_explained(source, None, filter)? {
        Ok(_) => MissReason::NoEntry,
        Err(m) => m,
    };
    Ok(reason.into())
}
