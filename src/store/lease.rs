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
//!
//! A hold is one lease over several entries with no time-to-live: it lasts
//! until it is released (by its holder, or by the daemon when the
//! connection that holds it closes). Holds live in the book only: one
//! counts once against its owner's bound, and none outlives the process,
//! as none outlives the connection it belongs to.

use std::time::Duration;

use prost::Message;

use super::error::{StoreError, StoreResult};
use super::index::{Expect, Op, Precondition, Tree};
use super::key::EntryKey;
use super::Store;

mod book;
pub(super) mod record;

pub(crate) use book::Book;
use book::Hold;
pub(crate) use record::decode;
use record::LeaseRecord;
pub use record::{Lease, LeaseId};

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

fn ttl_ms(ttl: Duration) -> u64 {
    ttl.as_millis().min(u64::MAX as u128) as u64
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

    /// The lease gate, once `owner` has room for one more lease.
    fn gate_with_room(&self, owner: Option<u32>, max_live: Option<usize>) -> StoreResult<Gate<'_>> {
        self.resync_if_reopened()?;
        let gate = self.lease_gate()?;
        gate.room_for(owner, max_live)?;
        Ok(gate)
    }

    fn take_lease(
        &self,
        key: &EntryKey,
        ttl: Duration,
        owner: Option<u32>,
        max_live: Option<usize>,
    ) -> StoreResult<LeaseId> {
        let mut gate = self.gate_with_room(owner, max_live)?;
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

    /// Holds every entry of `keys` for `owner` (see the module doc), who
    /// may hold at most `max_live` live leases (`TooManyLeases` beyond):
    /// one lease, until [`Store::release_as`] ends it. `NotFound` when one
    /// of the entries is not there (none is held then).
    pub fn hold_for(
        &self,
        keys: &[EntryKey],
        owner: Option<u32>,
        max_live: Option<usize>,
    ) -> StoreResult<LeaseId> {
        let mut gate = self.gate_with_room(owner, max_live)?;
        let mut held = Vec::with_capacity(keys.len());
        for key in keys {
            let kb = key.to_bytes();
            // Under the gate: a removal checks the leases under it too.
            if self.index.get(Tree::Entries, &kb)?.is_none() {
                return Err(StoreError::NotFound(*key));
            }
            held.push(kb);
        }
        let id = self.index.next_id()?;
        for kb in &held {
            // Held to be mapped: a use for LRU gc.
            self.note_access(*kb);
        }
        gate.hold(id, Hold { owner, keys: held });
        Ok(LeaseId(id))
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
        if let Some(owner) = gate.hold_owner(id) {
            if !by.covers(owner) {
                return Ok(false);
            }
            gate.let_go(id.0);
            return Ok(true);
        }
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

    /// The live leases (holds aside).
    pub fn leases(&self) -> StoreResult<Vec<Lease>> {
        self.lease_gate()?.leases()
    }

    /// How many leases are live, holds included (no walk).
    pub fn lease_count(&self) -> StoreResult<u64> {
        Ok(self.lease_gate()?.live() as u64)
    }

    /// Whether an entry has a live lease (no walk).
    pub fn is_leased(&self, key: &EntryKey) -> StoreResult<bool> {
        Ok(self.lease_gate()?.is_leased(&key.to_bytes()))
    }
}
