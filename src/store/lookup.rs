//! Reads: `lookup` (the entries of one source digest that this host can
//! use, best first), `explain_miss`, `stat` and `list`.
//!
//! A lookup reads the key list of one source digest (usually one to a
//! handful of entries; see `sources.rs`), reads each record (kept decoded in
//! memory by `cache.rs`) and asks the one hit rule, [`hit::judge`], about
//! it: device compatibility (D5), then the physical type key and dims
//! against the layouts this build produces for the recorded source shape
//! (D9). Verdicts on types are cached in [`crate::hit::KnownTypes`].
//!
//! "Best first" means: an exact device match (the entry's descriptor equals
//! the host device's) before a merely compatible one; then the host device
//! listed first (callers list their preferred device first); then the
//! newest entry; then key order, so the order is deterministic.

use std::sync::Arc;

use super::entry::{self, Access};
use super::error::StoreResult;
use super::index::Tree;
use super::key::{source_prefix, EntryKey, KeyBytes, KEY_LEN, SOURCE_PREFIX_LEN};
use super::shared::SharedEntry;
use super::sources;
use super::{Entry, Store};
use crate::digest::SourceDigest;
use crate::hit::{self, EntryFacts, KnownLayout, MissReason, SourceShape};
use crate::pb;
use crate::structs::PhysicalTypeKey;

pub use crate::hit::{Accept, Host as HostFilter};

/// A usable entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    /// The stored entry, shared with the lookup cache (see `shared.rs`).
    pub entry: Arc<SharedEntry>,
    /// Index into the host's devices of the device it runs on.
    pub host_device: usize,
    /// The entry's device descriptor equals that host device's.
    pub exact: bool,
    /// The layout it was recognized as (`None` with `Accept::Any`).
    pub layout: Option<Arc<KnownLayout>>,
}

/// A stored entry, as the judge reads it.
struct StoredFacts<'a>(&'a SharedEntry);

impl<'a> StoredFacts<'a> {
    /// `want`: the source's shape as the caller knows it (it has the
    /// tensor); a record of another shape is refused, not judged.
    fn new(e: &'a SharedEntry, want: Option<&SourceShape>) -> Result<Self, MissReason> {
        if let (Some(w), Some(s)) = (want, &e.source_shape) {
            if w != s {
                return Err(MissReason::Invalid {
                    rule: "store.record",
                    message: format!("the entry records a {s} source, the source is {w}"),
                });
            }
        }
        Ok(StoredFacts(e))
    }

    fn entry(&self) -> &Entry {
        self.0
    }
}

/// The entry's own facts (`impl EntryFacts for Entry`), except that a
/// record that named no device is refused rather than read as the empty
/// device the entry holds for it.
impl EntryFacts for StoredFacts<'_> {
    fn device(&self) -> Result<&pb::DeviceProto, MissReason> {
        if !self.0.device_recorded {
            return Err(MissReason::Invalid {
                rule: "store.record",
                message: "the record names no device".into(),
            });
        }
        EntryFacts::device(self.entry())
    }

    fn type_key(&self) -> Result<PhysicalTypeKey, MissReason> {
        EntryFacts::type_key(self.entry())
    }

    fn physical_type(&self) -> Result<pb::StructTypeProto, MissReason> {
        EntryFacts::physical_type(self.entry())
    }

    fn dims(&self) -> &[u64] {
        EntryFacts::dims(self.entry())
    }

    fn source_shape(&self) -> Option<&SourceShape> {
        EntryFacts::source_shape(self.entry())
    }

    fn client_uid(&self) -> Option<u32> {
        EntryFacts::client_uid(self.entry())
    }
}

/// Filters of `list`; unset fields match everything.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Physical type name.
    pub format: Option<String>,
    /// `DeviceProto.type` (`cpu`, `wgpu`, `cuda`).
    pub device_type: Option<String>,
    /// `DeviceProto.architecture`, e.g. `x86_64`.
    pub architecture: Option<String>,
    /// Only entries of this source digest.
    pub source: Option<SourceDigest>,
    /// At most this many entries.
    pub limit: Option<usize>,
}

impl Store {
    /// A client's lookup: the entries of `source` usable on `host`, best
    /// first (see module docs), counted as a hit or a miss and each hit as
    /// a use (the first in `access::LOOKUP_WINDOW_MS` of each entry's hits:
    /// gc's LRU needs no finer). Unreadable records are skipped (a miss), `verify` reports
    /// them. Hits carry no access statistics (`Entry::access` is `None`).
    pub fn lookup(&self, source: &SourceDigest, host: &HostFilter) -> StoreResult<Vec<Hit>> {
        let hits = self.lookup_uncounted(source, host)?;
        self.count_lookups(u64::from(!hits.is_empty()), u64::from(hits.is_empty()));
        for h in &hits {
            self.note_lookup_hit(h.entry.key_bytes);
        }
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
        self.judged(source, None, host, |_| {})
    }

    /// [`Store::lookup_uncounted`] for a caller that knows the source's
    /// shape (it has the tensor): an entry recorded with another shape is
    /// never a hit.
    pub fn lookup_shaped(
        &self,
        source: &SourceDigest,
        shape: &SourceShape,
        host: &HostFilter,
    ) -> StoreResult<Vec<Hit>> {
        self.judged(source, Some(shape), host, |_| {})
    }

    /// The usable entries of `source` on `host` (uncounted), or, when there
    /// is none, why: `no_entry`, or the reason of the entry that got
    /// furthest through the checks (a type or trust miss says more than a
    /// device miss). `shape` as in [`Store::lookup_shaped`].
    pub fn lookup_explained(
        &self,
        source: &SourceDigest,
        shape: Option<&SourceShape>,
        host: &HostFilter,
    ) -> StoreResult<Result<Vec<Hit>, MissReason>> {
        let mut best: Option<MissReason> = None;
        let rank = |r: &MissReason| match r {
            MissReason::IncompatibleDevice(_) => 0,
            MissReason::Invalid { .. } => 1,
            _ => 2,
        };
        let hits = self.judged(source, shape, host, |m| {
            if best.as_ref().is_none_or(|b| rank(m) > rank(b)) {
                best = Some(m.clone());
            }
        })?;
        Ok(if hits.is_empty() {
            Err(best.unwrap_or(MissReason::NoEntry))
        } else {
            Ok(hits)
        })
    }

    /// Judges every entry of `source`; misses go to `missed`.
    fn judged(
        &self,
        source: &SourceDigest,
        shape: Option<&SourceShape>,
        host: &HostFilter,
        mut missed: impl FnMut(&MissReason),
    ) -> StoreResult<Vec<Hit>> {
        self.resync_if_reopened()?;
        let prefix = source_prefix(source);
        let entries = match self.cache.get(&prefix) {
            Ok(cached) => cached,
            Err(generation) => {
                let read = Arc::new(self.read_source(&prefix)?);
                self.cache.insert(prefix, generation, read.clone());
                read
            }
        };
        let mut found: Vec<(&Arc<SharedEntry>, hit::Usable, bool)> = Vec::new();
        for e in entries.iter() {
            match StoredFacts::new(e, shape).and_then(|f| hit::judge(&f, host)) {
                Ok(u) => {
                    let exact = host
                        .device_keys()
                        .get(u.host_device)
                        .is_some_and(|k| k[..] == e.key_bytes[33..65]);
                    found.push((e, u, exact));
                }
                Err(m) => missed(&m),
            }
        }
        found.sort_by_key(|&(e, ref u, exact)| {
            (
                !exact,
                u.host_device,
                std::cmp::Reverse(e.created_ms),
                &e.key_bytes,
            )
        });
        Ok(found
            .into_iter()
            .map(|(e, u, exact)| Hit {
                entry: e.clone(),
                host_device: u.host_device,
                exact,
                layout: u.layout,
            })
            .collect())
    }

    /// The decoded entries of one source, read from the index: its key list,
    /// then each record (unreadable ones are left out).
    fn read_source(&self, prefix: &[u8; SOURCE_PREFIX_LEN]) -> StoreResult<Vec<Arc<SharedEntry>>> {
        let list = self.index.get(Tree::Sources, prefix)?.unwrap_or_default();
        let mut out = Vec::with_capacity(list.len() / sources::SUFFIX_LEN);
        let mut kb = [0u8; KEY_LEN];
        kb[..SOURCE_PREFIX_LEN].copy_from_slice(prefix);
        for suffix in sources::suffixes(&list) {
            kb[SOURCE_PREFIX_LEN..].copy_from_slice(suffix);
            if let Some(v) = self.index.get(Tree::Entries, &kb)? {
                let shared =
                    entry::decode_record(&kb, &v).and_then(|rec| SharedEntry::from_record(kb, rec));
                if let Ok(e) = shared {
                    out.push(Arc::new(e));
                }
            }
        }
        Ok(out)
    }

    /// One entry, with its access statistics up to date.
    pub fn stat(&self, key: &EntryKey) -> StoreResult<Option<Entry>> {
        self.resync_if_reopened()?;
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
        self.resync_if_reopened()?;
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
