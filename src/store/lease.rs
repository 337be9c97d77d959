//! Leases: a holder (a client mapping a payload, a model being loaded)
//! pins an entry for a time-to-live; GC and `remove` leave leased entries
//! alone. Leases live in the index so they survive a daemon restart, and
//! they expire by time, so the leases of a holder that crashed stop counting
//! once their TTL passes (GC then deletes their records).
//!
//! A lease records its owner (a uid, or none for the store's own users);
//! renewing or releasing it takes the owner's or any ([`LeaseAuthority`])
//! authority, and an owner may hold a bounded number of live leases.
//!
//! The live leases are mirrored in memory ([`Book`], loaded from the index
//! the first time the lease gate is taken): per-owner counts, per-entry
//! counts and the expiry order make acquire, "is this entry leased", stats
//! and GC independent of how many leases exist. Every lease change happens
//! under the gate, which holds the book, so index and book agree.
//!
//! The gate also orders lease creation against removal: a lease is created
//! only while its entry exists, and a removal checks the leases under the
//! same gate, so no lease ever outlives the check that protects its entry.

use std::collections::{BTreeSet, HashMap};
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
    /// The lease's id, for renew and release.
    pub id: LeaseId,
    /// The entry it keeps from gc.
    pub key: EntryKey,
    /// When it ends unless renewed, unix ms.
    pub expires_ms: u64,
    /// The uid that took it (`None`: the store's own user, or no uid).
    pub owner: Option<u32>,
    /// When it was taken, unix ms (0: a lease recorded before this was
    /// kept); renewals never carry it past a lifetime cap.
    pub acquired_ms: u64,
}

/// Whose leases a renew or release may touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseAuthority {
    /// Any lease (the store's own user, a trusted caller).
    Any,
    /// Only leases this owner took.
    Owner(Option<u32>),
}

impl LeaseAuthority {
    fn covers(self, owner: Option<u32>) -> bool {
        match self {
            LeaseAuthority::Any => true,
            LeaseAuthority::Owner(o) => o == owner,
        }
    }
}

#[derive(Clone, PartialEq, prost::Message)]
struct LeaseRecord {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(uint64, tag = "2")]
    expires_ms: u64,
    #[prost(uint32, optional, tag = "3")]
    owner: Option<u32>,
    #[prost(uint64, tag = "4")]
    acquired_ms: u64,
}

impl LeaseRecord {
    fn of(lease: &Lease) -> LeaseRecord {
        LeaseRecord {
            key: lease.key.to_bytes().to_vec(),
            expires_ms: lease.expires_ms,
            owner: lease.owner,
            acquired_ms: lease.acquired_ms,
        }
    }
}

pub(crate) fn decode(id: &[u8], v: &[u8]) -> Option<Lease> {
    let r = LeaseRecord::decode(v).ok()?;
    Some(Lease {
        id: LeaseId(u64::from_be_bytes(id.try_into().ok()?)),
        key: EntryKey::from_bytes(&r.key).ok()?,
        expires_ms: r.expires_ms,
        owner: r.owner,
        acquired_ms: r.acquired_ms,
    })
}

fn ttl_ms(ttl: Duration) -> u64 {
    ttl.as_millis().min(u64::MAX as u128) as u64
}

/// A live lease as the book keeps it.
struct Held {
    key: KeyBytes,
    owner: Option<u32>,
    expires_ms: u64,
    acquired_ms: u64,
}

/// The live leases in memory (see the module doc); only touched under the
/// lease gate.
#[derive(Default)]
pub(crate) struct Book {
    loaded: bool,
    by_id: HashMap<u64, Held>,
    /// (expiry, id) of every lease in `by_id`: expired ones leave from the
    /// front.
    by_expiry: BTreeSet<(u64, u64)>,
    per_owner: HashMap<Option<u32>, usize>,
    per_key: HashMap<KeyBytes, usize>,
    /// Index records of leases that expired (or cannot be read), for GC to
    /// delete.
    dead: Vec<Vec<u8>>,
}

fn bump<K: std::hash::Hash + Eq>(m: &mut HashMap<K, usize>, k: K, up: bool) {
    if up {
        *m.entry(k).or_default() += 1;
    } else if let Some(n) = m.get_mut(&k) {
        *n -= 1;
        if *n == 0 {
            m.remove(&k);
        }
    }
}

impl Book {
    /// Reads every lease record once (the first time the gate is taken).
    fn load(&mut self, index: &dyn Index, now_ms: u64) -> StoreResult<()> {
        if self.loaded {
            return Ok(());
        }
        let mut live = Vec::new();
        let mut dead = Vec::new();
        index.scan(Tree::Leases, &[], None, &mut |k, v| {
            match decode(k, v) {
                Some(l) if l.expires_ms > now_ms => live.push(l),
                _ => dead.push(k.to_vec()),
            }
            true
        })?;
        self.dead = dead;
        for l in &live {
            self.insert(l);
        }
        self.loaded = true;
        Ok(())
    }

    fn insert(&mut self, l: &Lease) {
        let key = l.key.to_bytes();
        bump(&mut self.per_owner, l.owner, true);
        bump(&mut self.per_key, key, true);
        self.by_expiry.insert((l.expires_ms, l.id.0));
        self.by_id.insert(
            l.id.0,
            Held {
                key,
                owner: l.owner,
                expires_ms: l.expires_ms,
                acquired_ms: l.acquired_ms,
            },
        );
    }

    fn remove(&mut self, id: u64) -> Option<Held> {
        let h = self.by_id.remove(&id)?;
        self.by_expiry.remove(&(h.expires_ms, id));
        bump(&mut self.per_owner, h.owner, false);
        bump(&mut self.per_key, h.key, false);
        Some(h)
    }

    /// Drops the leases expired at `now_ms` (their records become dead).
    fn prune(&mut self, now_ms: u64) {
        while let Some(&(expires, id)) = self.by_expiry.first() {
            if expires > now_ms {
                break;
            }
            self.remove(id);
            self.dead.push(id.to_be_bytes().to_vec());
        }
    }

    fn owned_by(&self, owner: Option<u32>) -> usize {
        self.per_owner.get(&owner).copied().unwrap_or(0)
    }

    /// Whether an entry has a live lease.
    pub(crate) fn is_leased(&self, key: &KeyBytes) -> bool {
        self.per_key.contains_key(key)
    }

    /// The entries with a live lease.
    pub(crate) fn leased_keys(&self) -> impl Iterator<Item = &KeyBytes> {
        self.per_key.keys()
    }

    /// How many entries have a live lease.
    pub(crate) fn leased_entries(&self) -> usize {
        self.per_key.len()
    }

    /// The latest expiry of an entry's live leases.
    pub(crate) fn leased_until(&self, key: &KeyBytes) -> Option<u64> {
        if !self.is_leased(key) {
            return None;
        }
        self.by_id
            .values()
            .filter(|h| &h.key == key)
            .map(|h| h.expires_ms)
            .max()
    }

    /// The dead records GC deletes.
    pub(crate) fn dead(&self) -> &[Vec<u8>] {
        &self.dead
    }

    /// Takes the dead records to delete them.
    pub(crate) fn take_dead(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.dead)
    }

    /// Gives back dead records that could not be deleted.
    pub(crate) fn restore_dead(&mut self, dead: Vec<Vec<u8>>) {
        self.dead.extend(dead);
    }

    /// Forgets a lease whose record was deleted (by verify).
    pub(crate) fn forget(&mut self, id: &[u8]) {
        if let Ok(b) = <[u8; 8]>::try_from(id) {
            self.remove(u64::from_be_bytes(b));
        }
    }
}

/// The lease gate with the book loaded and pruned to now.
pub(crate) struct Gate<'a> {
    guard: std::sync::MutexGuard<'a, Book>,
}

impl std::ops::Deref for Gate<'_> {
    type Target = Book;
    fn deref(&self) -> &Book {
        &self.guard
    }
}

impl std::ops::DerefMut for Gate<'_> {
    fn deref_mut(&mut self) -> &mut Book {
        &mut self.guard
    }
}

impl Store {
    /// Takes the lease gate (see the module doc of `store`); the book is
    /// loaded and holds the leases live now.
    pub(crate) fn lease_gate(&self) -> StoreResult<Gate<'_>> {
        let mut guard = self.gate.lock().unwrap_or_else(|p| p.into_inner());
        let now = self.now();
        guard.load(&*self.index, now)?;
        guard.prune(now);
        Ok(Gate { guard })
    }

    /// Pins `key` for `ttl` for the store's own user (no owner, no bound);
    /// fails with `NotFound` when there is no such entry.
    pub fn acquire_lease(&self, key: &EntryKey, ttl: Duration) -> StoreResult<LeaseId> {
        self.take_lease(key, ttl, None, None)
    }

    /// Pins `key` for `ttl` for `owner`, who may hold at most `max_live`
    /// live leases (`TooManyLeases` beyond); `NotFound` when there is no
    /// such entry.
    pub fn acquire_lease_for(
        &self,
        key: &EntryKey,
        ttl: Duration,
        owner: Option<u32>,
        max_live: usize,
    ) -> StoreResult<LeaseId> {
        self.take_lease(key, ttl, owner, Some(max_live))
    }

    fn take_lease(
        &self,
        key: &EntryKey,
        ttl: Duration,
        owner: Option<u32>,
        max_live: Option<usize>,
    ) -> StoreResult<LeaseId> {
        self.resync_if_reopened()?;
        let mut gate = self.lease_gate()?;
        if let Some(max) = max_live {
            if gate.owned_by(owner) >= max {
                return Err(StoreError::TooManyLeases { owner, max });
            }
        }
        let id = self.index.next_id()?;
        let kb = key.to_bytes();
        let now = self.now();
        let lease = Lease {
            id: LeaseId(id),
            key: *key,
            expires_ms: now.saturating_add(ttl_ms(ttl)),
            owner,
            acquired_ms: now,
        };
        let ok = self.commit(
            &[Precondition::new(Tree::Entries, &kb, Expect::Present)],
            &[Op::Put(
                Tree::Leases,
                id.to_be_bytes().to_vec(),
                LeaseRecord::of(&lease).encode_to_vec(),
            )],
        )?;
        if !ok {
            return Err(StoreError::NotFound(*key));
        }
        gate.insert(&lease);
        // A lease is taken to map the payload: that is a use for LRU gc.
        self.note_access(kb);
        Ok(lease.id)
    }

    /// The live lease `id` as its record says, if `by` may touch it;
    /// another holder's is unknown to `by`.
    fn owned_lease(&self, id: LeaseId, by: LeaseAuthority) -> StoreResult<(Lease, Vec<u8>)> {
        let idb = id.0.to_be_bytes();
        let old = self
            .index
            .get(Tree::Leases, &idb)?
            .ok_or(StoreError::UnknownLease(id))?;
        let lease = decode(&idb, &old).ok_or(StoreError::UnknownLease(id))?;
        if !by.covers(lease.owner) {
            return Err(StoreError::UnknownLease(id));
        }
        Ok((lease, old))
    }

    /// Extends a live lease to `ttl` from now (any lease). An expired lease
    /// cannot be renewed: its entry may already be gone.
    pub fn renew(&self, id: LeaseId, ttl: Duration) -> StoreResult<Lease> {
        self.renew_as(id, ttl, LeaseAuthority::Any)
    }

    /// Extends a live lease `by` may touch (`UnknownLease` otherwise).
    pub(crate) fn renew_as(
        &self,
        id: LeaseId,
        ttl: Duration,
        by: LeaseAuthority,
    ) -> StoreResult<Lease> {
        self.renew_within(id, ttl, by, None)
    }

    /// [`Store::renew_as`], never past `lifetime` after the lease was
    /// taken: a renewal is cut to that end, and one at or past it fails
    /// with `LeaseLifetimeOver` (so a holder that renews forever cannot
    /// keep an entry from gc forever).
    pub fn renew_within(
        &self,
        id: LeaseId,
        ttl: Duration,
        by: LeaseAuthority,
        lifetime: Option<Duration>,
    ) -> StoreResult<Lease> {
        let mut gate = self.lease_gate()?;
        let now = self.now();
        let (lease, old) = self.owned_lease(id, by)?;
        if lease.expires_ms <= now {
            return Err(StoreError::UnknownLease(id));
        }
        let mut expires_ms = now.saturating_add(ttl_ms(ttl));
        if let (Some(max), true) = (lifetime, lease.acquired_ms > 0) {
            let end = lease.acquired_ms.saturating_add(ttl_ms(max));
            if end <= now {
                return Err(StoreError::LeaseLifetimeOver { id, max });
            }
            expires_ms = expires_ms.min(end);
        }
        let renewed = Lease {
            expires_ms,
            ..lease
        };
        let idb = id.0.to_be_bytes();
        let ok = self.index.commit(
            &[Precondition::new(Tree::Leases, &idb, Expect::Equals(old))],
            &[Op::Put(
                Tree::Leases,
                idb.to_vec(),
                LeaseRecord::of(&renewed).encode_to_vec(),
            )],
        )?;
        if !ok {
            return Err(StoreError::UnknownLease(id));
        }
        gate.remove(id.0);
        gate.insert(&renewed);
        Ok(renewed)
    }

    /// Ends a lease (any lease); returns whether it existed.
    pub fn release(&self, id: LeaseId) -> StoreResult<bool> {
        self.release_as(id, LeaseAuthority::Any)
    }

    /// Ends a lease `by` may touch; returns whether it existed (another
    /// holder's is not touched and answers like a missing one).
    pub fn release_as(&self, id: LeaseId, by: LeaseAuthority) -> StoreResult<bool> {
        let mut gate = self.lease_gate()?;
        let (_, old) = match self.owned_lease(id, by) {
            Err(StoreError::UnknownLease(_)) => return Ok(false),
            other => other?,
        };
        let idb = id.0.to_be_bytes();
        let done = self.index.commit(
            &[Precondition::new(Tree::Leases, &idb, Expect::Equals(old))],
            &[Op::Delete(Tree::Leases, idb.to_vec())],
        )?;
        gate.remove(id.0);
        Ok(done)
    }

    /// The live leases.
    pub fn leases(&self) -> StoreResult<Vec<Lease>> {
        let gate = self.lease_gate()?;
        let mut out = Vec::with_capacity(gate.by_id.len());
        for (&id, h) in &gate.by_id {
            out.push(Lease {
                id: LeaseId(id),
                key: EntryKey::from_bytes(&h.key)?,
                expires_ms: h.expires_ms,
                owner: h.owner,
                acquired_ms: h.acquired_ms,
            });
        }
        out.sort_by_key(|l| l.id);
        Ok(out)
    }

    /// How many leases are live (no walk).
    pub fn lease_count(&self) -> StoreResult<u64> {
        Ok(self.lease_gate()?.by_id.len() as u64)
    }

    /// Whether an entry has a live lease (no walk).
    pub fn is_leased(&self, key: &EntryKey) -> StoreResult<bool> {
        Ok(self.lease_gate()?.is_leased(&key.to_bytes()))
    }
}
