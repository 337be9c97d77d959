//! Store statistics: entries and bytes, by format and by device, and the
//! lookup hit/miss and put counters. Walks the index (cheap head decodes);
//! it is a report, not something start-up or lookups do.
//!
//! The counters are kept in the index (`Tree::Counters`), so that they
//! survive restarts as `ccache -s` counts do: loaded at open, written at
//! most once per `access_interval` while lookups count, and on flush. A
//! crash loses at most the counts since the last write.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::entry;
use super::error::StoreResult;
use super::index::{Index, Op, Tree};
use super::Store;
use crate::device;

/// The lookup and put counters, and when they were last written.
pub(crate) struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub puts: AtomicU64,
    saved_ms: AtomicU64,
    /// Serializes writes, so an older total never overwrites a newer one.
    saving: Mutex<()>,
}

const HITS: &[u8] = b"hits";
const MISSES: &[u8] = b"misses";
const PUTS: &[u8] = b"puts";

impl Counters {
    /// The totals the index holds (a missing or malformed value counts 0:
    /// statistics never keep a store from opening).
    pub fn load(index: &dyn Index, now_ms: u64) -> StoreResult<Counters> {
        let read = |k: &[u8]| -> StoreResult<u64> {
            Ok(index
                .get(Tree::Counters, k)?
                .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
                .map_or(0, u64::from_be_bytes))
        };
        Ok(Counters {
            hits: AtomicU64::new(read(HITS)?),
            misses: AtomicU64::new(read(MISSES)?),
            puts: AtomicU64::new(read(PUTS)?),
            saved_ms: AtomicU64::new(now_ms),
            saving: Mutex::new(()),
        })
    }

    /// Writes the totals (durable at the next index flush).
    pub fn save(&self, index: &dyn Index) -> StoreResult<()> {
        let _w = self.saving.lock().unwrap_or_else(|e| e.into_inner());
        let put = |k: &[u8], v: &AtomicU64| {
            Op::Put(
                Tree::Counters,
                k.to_vec(),
                v.load(Ordering::Relaxed).to_be_bytes().to_vec(),
            )
        };
        let ops = [
            put(HITS, &self.hits),
            put(MISSES, &self.misses),
            put(PUTS, &self.puts),
        ];
        index.commit(&[], &ops).map(|_| ())
    }

    /// Writes the totals when `interval_ms` passed since the last write (one
    /// caller does; a failed write is retried at the next one).
    pub(crate) fn save_if_due(&self, index: &dyn Index, now_ms: u64, interval_ms: u64) {
        let last = self.saved_ms.load(Ordering::Relaxed);
        if now_ms.saturating_sub(last) < interval_ms
            || self
                .saved_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        // Statistics only: a failed write must not fail a lookup.
        let _ = self.save(index);
    }
}

/// Entries and the bytes of their payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Number of entries.
    pub entries: u64,
    /// Sum of their payload lengths.
    pub bytes: u64,
}

/// A store's size, usage counters and index size, for `ctcachectl stats`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stats {
    /// Number of entries.
    pub entries: u64,
    /// Sum of the payload lengths of all entries.
    pub entry_bytes: u64,
    /// Distinct payload files and their bytes (shared payloads count once).
    pub blobs: u64,
    /// Bytes of those payload files.
    pub stored_bytes: u64,
    /// By physical type name.
    pub by_format: BTreeMap<String, Usage>,
    /// By device, in `device::describe` form.
    pub by_device: BTreeMap<String, Usage>,
    /// Lookups that found a usable entry, since the store was created.
    pub hits: u64,
    /// Lookups that found none, since the store was created.
    pub misses: u64,
    /// Entries stored, since the store was created.
    pub puts: u64,
    /// Entries with at least one live lease.
    pub leased_entries: u64,
    /// Bytes the index takes on disk.
    pub index_bytes: u64,
}

impl Store {
    /// Counts entries, payload files and usage by format and device (a full index scan).
    pub fn stats(&self) -> StoreResult<Stats> {
        let mut s = Stats::default();
        let mut blobs: HashMap<[u8; 32], u64> = HashMap::new();
        let mut err = None;
        self.index.scan(Tree::Entries, &[], None, &mut |k, v| {
            let h = match entry::decode_head(k, v) {
                Ok(h) => h,
                Err(e) => {
                    err = Some(e);
                    return false;
                }
            };
            s.entries += 1;
            s.entry_bytes += h.payload_len;
            blobs.insert(h.blob(), h.payload_len);
            let add = |u: &mut Usage| {
                u.entries += 1;
                u.bytes += h.payload_len;
            };
            add(s.by_format.entry(h.type_name.clone()).or_default());
            let dev = h.device.as_ref().map(device::describe).unwrap_or_default();
            add(s.by_device.entry(dev).or_default());
            true
        })?;
        if let Some(e) = err {
            return Err(e);
        }
        s.blobs = blobs.len() as u64;
        s.stored_bytes = blobs.values().sum();
        s.hits = self.counters.hits.load(Ordering::Relaxed);
        s.misses = self.counters.misses.load(Ordering::Relaxed);
        s.puts = self.counters.puts.load(Ordering::Relaxed);
        s.leased_entries = self.lease_gate()?.leased_entries() as u64;
        s.index_bytes = self.index.disk_bytes();
        Ok(s)
    }
}
