//! Leases: a holder (a client mapping a payload, a model being loaded)
//! pins an entry for a time-to-live; GC and `remove` leave leased entries
//! alone. Leases live in the index so they survive a daemon restart, and
//! they expire by time, so the leases of a holder that crashed stop counting
//! once their TTL passes (GC then deletes their records).
//!
//! `lease_gate` orders lease creation against removal: a lease is created
//! only while its entry exists, and a removal re-reads the leases under the
//! same gate, so no lease ever outlives the check that protects its entry.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use prost::Message;

use super::error::{StoreError, StoreResult};
use super::index::{Expect, Index, Op, Precondition, Tree};
use super::key::{EntryKey, KeyBytes};
use super::Store;

/// Identifies a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub u64);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lease-{}", self.0)
    }
}

/// An active lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub id: LeaseId,
    pub key: EntryKey,
    pub expires_ms: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LeaseRecord {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(uint64, tag = "2")]
    expires_ms: u64,
}

pub(crate) fn decode(id: &[u8], v: &[u8]) -> Option<Lease> {
    let r = LeaseRecord::decode(v).ok()?;
    Some(Lease {
        id: LeaseId(u64::from_be_bytes(id.try_into().ok()?)),
        key: EntryKey::from_bytes(&r.key).ok()?,
        expires_ms: r.expires_ms,
    })
}

fn ttl_ms(ttl: Duration) -> u64 {
    ttl.as_millis().min(u64::MAX as u128) as u64
}

/// Entry key -> latest expiry (unix ms) of its live leases.
pub(crate) type LiveLeases = HashMap<KeyBytes, u64>;

/// All lease records: (live leases by entry key with their latest expiry,
/// ids of expired or unreadable records).
pub(crate) fn scan(index: &dyn Index, now_ms: u64) -> StoreResult<(LiveLeases, Vec<Vec<u8>>)> {
    let mut live: HashMap<KeyBytes, u64> = HashMap::new();
    let mut dead = Vec::new();
    index.scan(Tree::Leases, &[], None, &mut |k, v| {
        match decode(k, v) {
            Some(l) if l.expires_ms > now_ms => {
                let e = live.entry(l.key.to_bytes()).or_default();
                *e = (*e).max(l.expires_ms);
            }
            _ => dead.push(k.to_vec()),
        }
        true
    })?;
    Ok((live, dead))
}

impl Store {
    /// Pins `key` for `ttl`; fails with `NotFound` when there is no such entry.
    pub fn acquire_lease(&self, key: &EntryKey, ttl: Duration) -> StoreResult<LeaseId> {
        let _g = self.lease_gate();
        let id = self.index.next_id()?;
        let kb = key.to_bytes();
        let rec = LeaseRecord {
            key: kb.to_vec(),
            expires_ms: self.now().saturating_add(ttl_ms(ttl)),
        };
        let ok = self.index.commit(
            &[Precondition::new(Tree::Entries, &kb, Expect::Present)],
            &[Op::Put(
                Tree::Leases,
                id.to_be_bytes().to_vec(),
                rec.encode_to_vec(),
            )],
        )?;
        if !ok {
            return Err(StoreError::NotFound(*key));
        }
        // A lease is taken to map the payload: that is a use for LRU gc.
        self.note_access(kb);
        Ok(LeaseId(id))
    }

    /// Extends a live lease to `ttl` from now. An expired lease cannot be
    /// renewed: its entry may already be gone.
    pub fn renew(&self, id: LeaseId, ttl: Duration) -> StoreResult<Lease> {
        let _g = self.lease_gate();
        let idb = id.0.to_be_bytes();
        let now = self.now();
        let old = self
            .index
            .get(Tree::Leases, &idb)?
            .ok_or(StoreError::UnknownLease(id))?;
        let lease = decode(&idb, &old)
            .filter(|l| l.expires_ms > now)
            .ok_or(StoreError::UnknownLease(id))?;
        let lease = Lease {
            expires_ms: now.saturating_add(ttl_ms(ttl)),
            ..lease
        };
        let rec = LeaseRecord {
            key: lease.key.to_bytes().to_vec(),
            expires_ms: lease.expires_ms,
        };
        let ok = self.index.commit(
            &[Precondition::new(Tree::Leases, &idb, Expect::Equals(old))],
            &[Op::Put(Tree::Leases, idb.to_vec(), rec.encode_to_vec())],
        )?;
        if !ok {
            return Err(StoreError::UnknownLease(id));
        }
        Ok(lease)
    }

    /// Ends a lease; returns whether it existed.
    pub fn release(&self, id: LeaseId) -> StoreResult<bool> {
        let idb = id.0.to_be_bytes();
        self.index.commit(
            &[Precondition::new(Tree::Leases, &idb, Expect::Present)],
            &[Op::Delete(Tree::Leases, idb.to_vec())],
        )
    }

    /// The live leases.
    pub fn leases(&self) -> StoreResult<Vec<Lease>> {
        let now = self.now();
        let mut out = Vec::new();
        self.index.scan(Tree::Leases, &[], None, &mut |k, v| {
            if let Some(l) = decode(k, v).filter(|l| l.expires_ms > now) {
                out.push(l);
            }
            true
        })?;
        Ok(out)
    }
}
