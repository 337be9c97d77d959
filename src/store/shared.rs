//! An entry as lookups share it: decoded from its record once per read of
//! the index, then handed to every hit by reference count (`Arc`), not
//! copied (a full entry is a few kilobytes, mostly its struct type, and a
//! batch of lookups answers thousands).
//!
//! A decoded entry lives as long as its record is unchanged: when a commit
//! changes the record, the lookup cache drops the entry and the next read
//! makes a new one. A server may key what it derives from an entry by the
//! entry's allocation (`Arc::as_ptr`, held with a `Weak`), as ctcached's
//! encoded answers are.

use std::fmt;
use std::ops::Deref;

use super::entry::{Entry, Record};
use super::error::StoreResult;
use super::key::{EntryKey, KeyBytes};

/// A stored entry, shared among lookups (derefs to [`Entry`]).
pub struct SharedEntry {
    entry: Entry,
    /// The key's index bytes (what lookups sort and compare by).
    pub(crate) key_bytes: KeyBytes,
    /// The record named a device (an entry without one is never a hit).
    pub(crate) device_recorded: bool,
}

impl SharedEntry {
    /// The entry a record under `key_bytes` describes.
    pub(crate) fn from_record(key_bytes: KeyBytes, record: Record) -> StoreResult<SharedEntry> {
        let device_recorded = record.device.is_some();
        Ok(SharedEntry {
            entry: record.into_entry(EntryKey::from_bytes(&key_bytes)?, None),
            key_bytes,
            device_recorded,
        })
    }

    /// The entry, owned (a copy).
    pub fn to_entry(&self) -> Entry {
        self.entry.clone()
    }
}

impl Deref for SharedEntry {
    type Target = Entry;

    fn deref(&self) -> &Entry {
        &self.entry
    }
}

impl fmt::Debug for SharedEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.entry.fmt(f)
    }
}

impl PartialEq for SharedEntry {
    fn eq(&self, other: &SharedEntry) -> bool {
        self.entry == other.entry
    }
}
