//! Reads: `lookup` (the entries of one source digest that this host can
//! use, best first), `stat` and `list`.
//!
//! A lookup reads the key list of one source digest (usually one to a
//! handful of entries; see `sources.rs`), filters on the type key in each
//! key before reading anything else, then reads each record and applies D5
//! (device compatibility, in its order) and D4 (type recognized) to it.
//!
//! "Best first" means: an exact device match (the entry's descriptor equals
//! the host device's) before a merely compatible one; then the host device
//! listed first (callers list their preferred device first); then the
//! newest entry; then key order, so the order is deterministic.

use std::collections::HashSet;

use super::entry::{self, Access};
use super::error::StoreResult;
use super::index::Tree;
use super::key::{source_prefix, EntryKey, KeyBytes, KEY_LEN, SOURCE_PREFIX_LEN};
use super::sources;
use super::{Entry, Store};
use crate::device::{self, RuntimeIdentity};
use crate::digest::SourceDigest;
use crate::pb;
use crate::resolve::{Host, Recognized};
use crate::structs::PhysicalTypeKey;

/// Which physical types the consumer accepts (D4).
#[derive(Debug, Clone, Default)]
pub enum Accept {
    /// Any type (tools that list what is there).
    #[default]
    Any,
    /// Exactly these type keys.
    Keys(HashSet<PhysicalTypeKey>),
    /// These type names at these format versions.
    Types(Recognized),
}

impl Accept {
    fn key_ok(&self, type_key: &[u8]) -> bool {
        match self {
            Accept::Keys(keys) => type_key
                .try_into()
                .map(|k| keys.contains(&PhysicalTypeKey(k)))
                .unwrap_or(false),
            _ => true,
        }
    }

    fn type_ok(&self, name: &str, version: u32) -> bool {
        match self {
            Accept::Types(r) => r.versions(name).is_some_and(|v| v.contains(&version)),
            _ => true,
        }
    }
}

/// The host side of a lookup, prepared once and reused (device keys are
/// computed here, not per lookup).
#[derive(Debug, Clone)]
pub struct HostFilter {
    devices: Vec<pb::DeviceProto>,
    keys: Vec<[u8; 32]>,
    runtime: Option<RuntimeIdentity>,
    accept: Accept,
}

impl HostFilter {
    /// `devices` in order of preference; `runtime: None` skips the runtime
    /// checks (D5).
    pub fn new(
        devices: Vec<pb::DeviceProto>,
        runtime: Option<RuntimeIdentity>,
        accept: Accept,
    ) -> HostFilter {
        HostFilter {
            keys: devices.iter().map(device::device_key).collect(),
            devices,
            runtime,
            accept,
        }
    }

    /// The filter of a loading-rules host: its devices, runtime and
    /// recognized types.
    pub fn from_host(host: &Host) -> HostFilter {
        HostFilter::new(
            host.devices.clone(),
            host.runtime.clone(),
            Accept::Types(host.recognized.clone()),
        )
    }

    pub fn devices(&self) -> &[pb::DeviceProto] {
        &self.devices
    }
}

/// A usable entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    pub entry: Entry,
    /// Index into the host's devices of the device it runs on.
    pub host_device: usize,
    /// The entry's device descriptor equals that host device's.
    pub exact: bool,
}

/// Filters of `list`; unset fields match everything.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Physical type name.
    pub format: Option<String>,
    /// `DeviceProto.type` (`cpu`, `wgpu`, `cuda`).
    pub device_type: Option<String>,
    pub architecture: Option<String>,
    pub source: Option<SourceDigest>,
    pub limit: Option<usize>,
}

impl Store {
    /// The entries of `source` usable on `host`, best first (see module docs).
    /// Unreadable records are skipped (a miss), `verify` reports them. Hits
    /// carry no access statistics (`Entry::access` is `None`).
    pub fn lookup(&self, source: &SourceDigest, host: &HostFilter) -> StoreResult<Vec<Hit>> {
        let hits = self.lookup_uncounted(source, host)?;
        self.count_lookups(u64::from(!hits.is_empty()), u64::from(hits.is_empty()));
        Ok(hits)
    }

    /// Adds to the hit / miss counters of `stats` (for callers that judge
    /// hits themselves, such as a resolve that only counts wanted tensors).
    pub fn count_lookups(&self, hits: u64, misses: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.counters.hits.fetch_add(hits, Relaxed);
        self.counters.misses.fetch_add(misses, Relaxed);
        self.save_counters_if_due();
    }

    /// [`Store::lookup`] without counting a hit or a miss.
    pub fn lookup_uncounted(
        &self,
        source: &SourceDigest,
        host: &HostFilter,
    ) -> StoreResult<Vec<Hit>> {
        let prefix = source_prefix(source);
        let entries = match self.cache.get(&prefix) {
            Ok(cached) => cached,
            Err(generation) => {
                let read = std::sync::Arc::new(self.read_source(&prefix)?);
                self.cache.insert(prefix, generation, read.clone());
                read
            }
        };
        let mut found: Vec<(&KeyBytes, &entry::Record, usize, bool)> = Vec::new();
        for (kb, rec) in entries.iter() {
            if !host.accept.key_ok(&kb[65..]) {
                continue;
            }
            let Some(dev) = rec.device.as_ref() else {
                continue;
            };
            let Ok((i, _)) = device::find_compatible(dev, &host.devices, host.runtime.as_ref())
            else {
                continue;
            };
            if !host.accept.type_ok(&rec.type_name, rec.format_version) {
                continue;
            }
            found.push((kb, rec, i, host.keys[i] == kb[33..65]));
        }
        found.sort_by(|a, b| {
            (!a.3, a.2, std::cmp::Reverse(a.1.created_ms), a.0).cmp(&(
                !b.3,
                b.2,
                std::cmp::Reverse(b.1.created_ms),
                b.0,
            ))
        });
        found
            .into_iter()
            .map(|(kb, rec, host_device, exact)| {
                Ok(Hit {
                    entry: rec.clone().into_entry(EntryKey::from_bytes(kb)?, None),
                    host_device,
                    exact,
                })
            })
            .collect()
    }

    /// The decoded entries of one source, read from the index: its key list,
    /// then each record (unreadable ones are left out).
    fn read_source(
        &self,
        prefix: &[u8; SOURCE_PREFIX_LEN],
    ) -> StoreResult<Vec<(KeyBytes, entry::Record)>> {
        let list = self.index.get(Tree::Sources, prefix)?.unwrap_or_default();
        let mut out = Vec::with_capacity(list.len() / sources::SUFFIX_LEN);
        let mut kb = [0u8; KEY_LEN];
        kb[..SOURCE_PREFIX_LEN].copy_from_slice(prefix);
        for suffix in sources::suffixes(&list) {
            kb[SOURCE_PREFIX_LEN..].copy_from_slice(suffix);
            if let Some(v) = self.index.get(Tree::Entries, &kb)? {
                if let Ok(rec) = entry::decode_record(&kb, &v) {
                    out.push((kb, rec));
                }
            }
        }
        Ok(out)
    }

    /// One entry, with its access statistics up to date.
    pub fn stat(&self, key: &EntryKey) -> StoreResult<Option<Entry>> {
        let kb = key.to_bytes();
        let Some(v) = self.index.get(Tree::Entries, &kb)? else {
            return Ok(None);
        };
        let rec = entry::decode_record(&kb, &v)?;
        Ok(Some(rec.into_entry(*key, Some(self.current_access(&kb)?))))
    }

    /// The entries matching `filter`, in key order. With a source digest
    /// this reads one index prefix; otherwise it walks the index.
    pub fn list(&self, filter: &Filter) -> StoreResult<Vec<Entry>> {
        let prefix: Vec<u8> = filter
            .source
            .map(|s| source_prefix(&s).to_vec())
            .unwrap_or_default();
        let limit = filter.limit.unwrap_or(usize::MAX);
        let mut matched = Vec::new();
        let mut err = None;
        self.index.scan(Tree::Entries, &prefix, None, &mut |k, v| {
            let rec = match entry::decode_record(k, v) {
                Ok(r) => r,
                Err(e) => {
                    err = Some(e);
                    return false;
                }
            };
            let dev = rec.device.clone().unwrap_or_default();
            let ok = filter.format.as_ref().is_none_or(|f| *f == rec.type_name)
                && filter.device_type.as_ref().is_none_or(|t| *t == dev.r#type)
                && filter
                    .architecture
                    .as_ref()
                    .is_none_or(|a| *a == dev.architecture);
            if ok {
                if let Ok(kb) = KeyBytes::try_from(k) {
                    matched.push((kb, rec));
                }
            }
            matched.len() < limit
        })?;
        if let Some(e) = err {
            return Err(e);
        }
        let mut out = Vec::with_capacity(matched.len());
        for (kb, rec) in matched {
            let access = self.current_access(&kb)?;
            out.push(rec.into_entry(EntryKey::from_bytes(&kb)?, Some(access)));
        }
        Ok(out)
    }

    /// Access statistics as written in the index plus those still pending
    /// in the batch (written within about a second).
    fn current_access(&self, kb: &KeyBytes) -> StoreResult<Access> {
        let access = self.access_of(kb)?;
        Ok(match self.access.pending(kb) {
            Some(p) => Access {
                last_ms: access.last_ms.max(p.last_ms),
                count: access.count + p.count,
            },
            None => access,
        })
    }
}
