//! The book: the live leases and holds in memory, per owner, per entry
//! and by expiry (see the module doc of `lease`); only touched under the
//! lease gate.

use std::collections::{BTreeSet, HashMap};

use super::record::{decode, Lease, LeaseId};
use crate::store::error::StoreResult;
use crate::store::index::{Index, Tree};
use crate::store::key::{EntryKey, KeyBytes};

/// A live lease as the book keeps it.
pub(super) struct Held {
    key: KeyBytes,
    owner: Option<u32>,
    expires_ms: u64,
    acquired_ms: u64,
}

/// A hold as the book keeps it.
pub(super) struct Hold {
    pub owner: Option<u32>,
    pub keys: Vec<KeyBytes>,
}

/// The live leases in memory (see the module doc); only touched under the
/// lease gate.
#[derive(Default)]
pub(crate) struct Book {
    loaded: bool,
    by_id: HashMap<u64, Held>,
    holds: HashMap<u64, Hold>,
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
    pub(super) fn load(&mut self, index: &dyn Index, now_ms: u64) -> StoreResult<()> {
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

    pub(super) fn insert(&mut self, l: &Lease) {
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

    pub(super) fn remove(&mut self, id: u64) -> Option<Held> {
        let h = self.by_id.remove(&id)?;
        self.by_expiry.remove(&(h.expires_ms, id));
        bump(&mut self.per_owner, h.owner, false);
        bump(&mut self.per_key, h.key, false);
        Some(h)
    }

    pub(super) fn hold(&mut self, id: u64, hold: Hold) {
        bump(&mut self.per_owner, hold.owner, true);
        for k in &hold.keys {
            bump(&mut self.per_key, *k, true);
        }
        self.holds.insert(id, hold);
    }

    pub(super) fn let_go(&mut self, id: u64) -> Option<Hold> {
        let hold = self.holds.remove(&id)?;
        bump(&mut self.per_owner, hold.owner, false);
        for k in &hold.keys {
            bump(&mut self.per_key, *k, false);
        }
        Some(hold)
    }

    /// Drops the leases expired at `now_ms` (their records become dead).
    pub(super) fn prune(&mut self, now_ms: u64) {
        while let Some(&(expires, id)) = self.by_expiry.first() {
            if expires > now_ms {
                break;
            }
            self.remove(id);
            self.dead.push(id.to_be_bytes().to_vec());
        }
    }

    pub(super) fn owned_by(&self, owner: Option<u32>) -> usize {
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

    /// The latest expiry of an entry's live leases (`u64::MAX` while a
    /// hold covers it).
    pub(crate) fn leased_until(&self, key: &KeyBytes) -> Option<u64> {
        if !self.is_leased(key) {
            return None;
        }
        if self.holds.values().any(|h| h.keys.contains(key)) {
            return Some(u64::MAX);
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

impl Book {
    /// Fails with `TooManyLeases` when `owner` holds `max_live` leases
    /// (holds included) already.
    pub(super) fn room_for(&self, owner: Option<u32>, max_live: Option<usize>) -> StoreResult<()> {
        match max_live {
            Some(max) if self.owned_by(owner) >= max => {
                Err(crate::store::error::StoreError::TooManyLeases { owner, max })
            }
            _ => Ok(()),
        }
    }

    /// The owner of the hold `id`, when `id` is one.
    pub(super) fn hold_owner(&self, id: LeaseId) -> Option<Option<u32>> {
        self.holds.get(&id.0).map(|h| h.owner)
    }

    /// How many leases and holds are live.
    pub(super) fn live(&self) -> usize {
        self.by_id.len() + self.holds.len()
    }

    /// The live leases (holds aside).
    pub(super) fn leases(&self) -> StoreResult<Vec<Lease>> {
        let mut out = Vec::with_capacity(self.by_id.len());
        for (&id, h) in &self.by_id {
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
}
