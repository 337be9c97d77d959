//! An entry as lookups share it: decoded from its record once per read of
//! the index, then handed to every hit by reference count (`Arc`), not
//! copied (a full entry is a few kilobytes, mostly its struct type, and a
//! batch of lookups answers thousands).
//!
//! A server answering hits derives things from an entry (its wire
//! encoding); [`SharedEntry::derived`] keeps one such value beside the
//! entry. It lives exactly as long as this decoded entry: when a commit
//! changes the record, the lookup cache drops the entry and the next read
//! makes a new one with an empty slot, so a derived value is never older
//! than the entry it was made from.

use std::any::Any;
use std::fmt;
use std::ops::Deref;
use std::sync::OnceLock;

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
    derived: OnceLock<Box<dyn Any + Send + Sync>>,
}

impl SharedEntry {
    /// The entry a record under `key_bytes` describes.
    pub(crate) fn from_record(key_bytes: KeyBytes, record: Record) -> StoreResult<SharedEntry> {
        let device_recorded = record.device.is_some();
        Ok(SharedEntry {
            entry: record.into_entry(EntryKey::from_bytes(&key_bytes)?, None),
            key_bytes,
            device_recorded,
            derived: OnceLock::new(),
        })
    }

    /// The entry, owned (a copy).
    pub fn to_entry(&self) -> Entry {
        self.entry.clone()
    }

    /// The value of type `T` kept beside this entry, made by `make` on
    /// first use. `None` when the slot already holds a value of another
    /// type (one user per store: the server that embeds it).
    pub fn derived<T: Any + Send + Sync>(&self, make: impl FnOnce(&Entry) -> T) -> Option<&T> {
        self.derived
            .get_or_init(|| Box::new(make(&self.entry)))
            .downcast_ref()
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
