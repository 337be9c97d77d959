//! Access statistics, batched: `open_payload` adds to an in-memory map (one
//! short mutex hold, no index write); the map is written to the index's
//! `Access` tree in one batch when it grows past `access_batch`, when
//! `access_interval` passed, before GC plans, on `flush` and on drop.
//! Lookups never wait for it. A crash loses at most the unwritten batch,
//! which only makes LRU a little less exact.
//!
//! A lookup hit notes its entry at most once per [`LOOKUP_WINDOW_MS`]: a
//! hot entry looked up a million times a second would otherwise have the
//! index rewrite its record on every batch, which costs far more than the
//! lookup (gc orders by the last use, at a far coarser scale). Leases and
//! resolves note every use.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::entry::Access;
use super::error::StoreResult;
use super::index::{Expect, Index, Op, Precondition, Tree};
use super::key::KeyBytes;

/// How long a lookup hit's use stands for the entry's later lookups.
pub(crate) const LOOKUP_WINDOW_MS: u64 = 60_000;

pub(crate) struct AccessLog {
    pending: Mutex<HashMap<KeyBytes, Access>>,
    /// The current lookup window's start and the entries noted in it.
    looked_up: Mutex<(u64, HashSet<KeyBytes>)>,
    /// Serializes writers so read-add-write of a record never loses counts.
    writer: Mutex<()>,
    last_write_ms: AtomicU64,
}

impl AccessLog {
    pub fn new(now_ms: u64) -> AccessLog {
        AccessLog {
            pending: Mutex::new(HashMap::new()),
            looked_up: Mutex::new((now_ms, HashSet::new())),
            writer: Mutex::new(()),
            last_write_ms: AtomicU64::new(now_ms),
        }
    }

    /// Records one access; returns whether a write is due.
    pub fn record(&self, key: KeyBytes, now_ms: u64, batch: usize, interval_ms: u64) -> bool {
        let n = {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let a = p.entry(key).or_default();
            a.last_ms = a.last_ms.max(now_ms);
            a.count += 1;
            p.len()
        };
        n >= batch
            || now_ms.saturating_sub(self.last_write_ms.load(Ordering::Relaxed)) >= interval_ms
    }

    /// [`AccessLog::record`] for a lookup hit: only the first of `key`'s
    /// hits in the current window is noted (`false` for the others).
    pub fn record_lookup(
        &self,
        key: KeyBytes,
        now_ms: u64,
        batch: usize,
        interval_ms: u64,
    ) -> bool {
        {
            let mut w = self.looked_up.lock().unwrap_or_else(|e| e.into_inner());
            if now_ms.saturating_sub(w.0) >= LOOKUP_WINDOW_MS {
                *w = (now_ms, HashSet::new());
            }
            if !w.1.insert(key) {
                return false;
            }
        }
        self.record(key, now_ms, batch, interval_ms)
    }

    /// Not yet written statistics of one key.
    pub(crate) fn pending(&self, key: &KeyBytes) -> Option<Access> {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied()
    }

    /// Writes pending statistics of entries that still exist.
    pub fn write(&self, index: &dyn Index, now_ms: u64) -> StoreResult<()> {
        let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let batch = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        self.last_write_ms.store(now_ms, Ordering::Relaxed);
        if batch.is_empty() {
            return Ok(());
        }
        // Merge into the stored statistics, in one commit conditioned on every
        // entry still existing (so a removed entry never gets its statistics
        // back); when one went away meanwhile, try again without it.
        let mut items: Vec<(KeyBytes, Access)> = batch.into_iter().collect();
        for _ in 0..3 {
            let mut when = Vec::with_capacity(items.len());
            let mut ops = Vec::with_capacity(items.len());
            let mut live = Vec::with_capacity(items.len());
            for (k, add) in items {
                if index.get(Tree::Entries, &k)?.is_none() {
                    continue;
                }
                let old = index.get(Tree::Access, &k)?;
                let mut a = old.as_deref().map(Access::decode).unwrap_or_default();
                a.last_ms = a.last_ms.max(add.last_ms);
                a.count += add.count;
                when.push(Precondition::new(Tree::Entries, &k, Expect::Present));
                when.push(Precondition::new(
                    Tree::Access,
                    &k,
                    old.map(Expect::Equals).unwrap_or(Expect::Absent),
                ));
                ops.push(Op::Put(Tree::Access, k.to_vec(), a.encode()));
                live.push((k, add));
            }
            if ops.is_empty() || index.commit(&when, &ops)? {
                return Ok(());
            }
            items = live;
        }
        // Statistics only: drop what kept racing with removals.
        Ok(())
    }
}
