//! Store statistics: entries and bytes, by format and by device, and the
//! lookup hit/miss and put counters of this process (reset at open). Walks
//! the index (cheap head decodes); it is a report, not something start-up
//! or lookups do.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

use super::entry;
use super::error::StoreResult;
use super::index::Tree;
use super::Store;
use crate::device;

/// Entries and the bytes of their payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub entries: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stats {
    pub entries: u64,
    /// Sum of the payload lengths of all entries.
    pub entry_bytes: u64,
    /// Distinct payload files and their bytes (shared payloads count once).
    pub blobs: u64,
    pub stored_bytes: u64,
    /// By physical type name.
    pub by_format: BTreeMap<String, Usage>,
    /// By device, in `device::describe` form.
    pub by_device: BTreeMap<String, Usage>,
    pub hits: u64,
    pub misses: u64,
    pub puts: u64,
    /// Entries with at least one live lease.
    pub leased_entries: u64,
    pub index_bytes: u64,
}

impl Store {
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
