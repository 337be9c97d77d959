//! An in-memory cache of the decoded entries of recently looked-up sources,
//! in front of the index: a sled point read costs a few microseconds, and a
//! lookup needs the key list plus each record, which would keep a core
//! below the lookup rate the daemon needs. The index stays the truth.
//!
//! Every commit that changes an entry or a source list invalidates that
//! source. A reader that missed takes the shard's generation before reading
//! the index and inserts what it read only if no invalidation happened in
//! the meantime, so a stale read is never cached. Misses (no entries) are
//! cached too. A full shard drops an arbitrary source to make room.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::key::SOURCE_PREFIX_LEN;
use super::shared::SharedEntry;

const SHARDS: usize = 64;

pub(crate) type Prefix = [u8; SOURCE_PREFIX_LEN];

/// The entries of one source, decoded.
pub(crate) type Cached = Arc<Vec<Arc<SharedEntry>>>;

#[derive(Default)]
struct Shard {
    generation: u64,
    map: HashMap<Prefix, Cached>,
}

pub(crate) struct LookupCache {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
}

impl LookupCache {
    /// A cache of up to `sources` sources (0 disables it).
    pub fn new(sources: usize) -> LookupCache {
        LookupCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: sources.div_ceil(SHARDS),
        }
    }

    fn shard(&self, p: &[u8]) -> MutexGuard<'_, Shard> {
        // Byte 1 is the first digest byte: uniformly distributed.
        let i = p.get(1).copied().unwrap_or(0) as usize % SHARDS;
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached entries, or the generation to hand back to `insert`.
    pub fn get(&self, p: &Prefix) -> Result<Cached, u64> {
        let s = self.shard(p);
        s.map.get(p).cloned().ok_or(s.generation)
    }

    pub fn insert(&self, p: Prefix, generation: u64, v: Cached) {
        if self.per_shard == 0 {
            return;
        }
        let mut s = self.shard(&p);
        if s.generation != generation {
            return;
        }
        if s.map.len() >= self.per_shard && !s.map.contains_key(&p) {
            if let Some(k) = s.map.keys().next().copied() {
                s.map.remove(&k);
            }
        }
        s.map.insert(p, v);
    }

    /// Forgets a source after a commit changed it.
    pub(crate) fn invalidate(&self, p: &[u8]) {
        let mut s = self.shard(p);
        s.generation += 1;
        if let Ok(k) = Prefix::try_from(p) {
            s.map.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_reads_are_not_cached() {
        let c = LookupCache::new(1000);
        let p = [1u8; SOURCE_PREFIX_LEN];
        let g = c.get(&p).unwrap_err();
        c.invalidate(&p); // a commit lands between the read and the insert
        c.insert(p, g, Arc::new(Vec::new()));
        let g = c.get(&p).unwrap_err();
        c.insert(p, g, Arc::new(Vec::new()));
        assert!(c.get(&p).is_ok());
        c.invalidate(&p);
        assert!(c.get(&p).is_err());
    }

    #[test]
    fn bounded() {
        let c = LookupCache::new(SHARDS); // one per shard
        let mut p = [0u8; SOURCE_PREFIX_LEN];
        for i in 0..3u8 {
            p[2] = i;
            let g = c.get(&p).unwrap_err();
            c.insert(p, g, Arc::new(Vec::new()));
        }
        let n: usize = c.shards.iter().map(|s| s.lock().unwrap().map.len()).sum();
        assert_eq!(n, 1);
    }
}
