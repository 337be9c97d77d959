//! The Lookup use case: the stored entries of one source digest that the
//! caller's devices, runtime and types can use, best first; or why none can.

use ctcache::device::RuntimeIdentity;
use ctcache::digest::{Algorithm, SourceDigest};
use ctcache::pb;
use ctcache::resolve::Recognized;
use ctcache::store::{Accept, Entry, HostFilter};

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
    Hits(Vec<Entry>),
    Miss(Miss),
}

impl Target {
    /// The lookup filter for this target.
    pub fn filter(&self, d: &Daemon) -> HostFilter {
        let devices = if self.devices.is_empty() {
            d.host.devices.clone()
        } else {
            self.devices.clone()
        };
        let accept = if self.accepted.is_empty() {
            Accept::Types(d.host.recognized.clone())
        } else {
            let mut r = Recognized::default();
            for a in &self.accepted {
                let versions: Vec<u32> = if a.versions.is_empty() {
                    (1..=64).collect()
                } else {
                    a.versions.clone()
                };
                for v in versions {
                    r.insert(a.name.clone(), v);
                }
            }
            Accept::Types(r)
        };
        HostFilter::new(devices, self.runtime.clone(), accept)
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
            return Ok(LookupOutcome::Miss(Miss::new(
                "unknown_digest_algorithm",
                format!("{algorithm:?} is not blake3 or sha256"),
            )))
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
    let filter = if r.target.is_host() {
        &d.host_filter
    } else {
        custom = r.target.filter(d);
        &custom
    };
    let only_daemon = r.daemon_produced_only || d.config.daemon_produced_only;
    let hits: Vec<Entry> = d
        .store
        .lookup(&source, filter)?
        .into_iter()
        .filter(|h| !only_daemon || h.entry.producer.client_uid.is_none())
        .map(|h| h.entry)
        .collect();
    if !hits.is_empty() {
        metrics::counter!("ctcache_lookup_hits_total").increment(1);
        return Ok(LookupOutcome::Hits(hits));
    }
    let miss = explain_miss(d, &source, filter)?;
    metrics::counter!("ctcache_lookup_misses_total", "reason" => miss.reason).increment(1);
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

/// Why no entry of `source` fits: the closest entry's first differing part.
fn explain_miss(d: &Daemon, source: &SourceDigest, filter: &HostFilter) -> Result<Miss> {
    let all = d.store.list(&ctcache::store::Filter {
        source: Some(*source),
        limit: Some(64),
        ..Default::default()
    })?;
    let Some(first) = all.first() else {
        return Ok(Miss::new(
            "no_entry",
            "nothing is stored for this source digest",
        ));
    };
    for e in &all {
        if let Err(m) = ctcache::device::find_compatible(&e.device, filter.devices(), None) {
            if all.len() == 1 {
                return Ok(Miss::new("incompatible_device", m.to_string()));
            }
        } else {
            let known = d.host.recognized.versions(&e.type_name);
            return Ok(match known {
                None => Miss::new(
                    "unknown_physical_type",
                    format!("{:?} is not recognized", e.type_name),
                ),
                Some(v) if !v.contains(&e.format_version) => Miss::new(
                    "unsupported_format_version",
                    format!("{:?} version {}", e.type_name, e.format_version),
                ),
                Some(_) => Miss::new(
                    "incompatible_device",
                    "the runtime or required metadata differ",
                ),
            });
        }
    }
    let m = ctcache::device::find_compatible(&first.device, filter.devices(), None).err();
    Ok(Miss::new(
        "incompatible_device",
        m.map(|m| m.to_string())
            .unwrap_or_else(|| "no entry fits these devices".into()),
    ))
}
