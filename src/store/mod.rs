//! The local store of compiled payloads (D7).
//!
//! A cache dir (see `layout.rs`) holds an index (sled, behind the `Index`
//! trait, `index.rs`) of entries keyed by (source digest, device key, physical type
//! key), and immutable payload files named by their blake3. One process
//! owns a cache dir at a time (an flock on `LOCK`); inside it a [`Store`] is
//! shared by any number of threads.
//!
//! Invariants, kept across crashes at any instant:
//! - **Payload files are published (temp, fsync, rename, fsync dir) before
//!   the index commit that references them**, and **deleted only after the
//!   commit that dropped their last reference is flushed**; so every entry
//!   the index recovers points at a complete file. A crash leaves at most
//!   orphan files (no entry) and temp files, both removed (tmp/ at start-up,
//!   orphans by [`Store::reconcile`] and GC).
//! - **A payload file is never modified after publish**; readers map it.
//! - Index commits are atomic across its trees; the index flush policy (see
//!   `sled_index.rs`) bounds what a crash can lose to the last flush window
//!   (default 500 ms) of puts, which then are simply misses.
//! - **Start-up does no walk proportional to the number of entries**: the
//!   index is the truth; only tmp/ leftovers are listed and removed.
//!   `reconcile` (run in the background by the daemon) repairs what
//!   differs between files and index.
//!
//! Lookups read a per-source key list (`sources.rs`) and the records, and
//! keep the decoded entries of recent sources in memory (`cache.rs`,
//! invalidated by every commit that changes them).
//!
//! Integrity (`integrity.rs`, D12): a payload file is hashed when written,
//! when a put would share it and whenever a serve ([`Store::open_payload`])
//! finds it is no longer the file hashed (its inode, size, mtime or ctime
//! differ); copies and streams check each 256 KiB group against the digests
//! that hash left (`chunks.rs`, [`Payload::checked`]). A file that does not
//! hash to its name is quarantined and every entry using it dropped, never
//! served.
//!
//! Locks, always taken in this order: the lease gate (lease creation vs
//! removal), then blob stripes (file operations vs the commits referencing a
//! blob; several only by GC, in stripe order), then the list of pending
//! reference drops (held for a map operation only). Nothing holding a
//! stripe waits on the rayon pool.

mod blobs;
mod cache;
mod entry;
mod error;
mod gc;
mod index;
mod integrity;
mod key;
mod layout;
mod lease;
mod lookup;
mod memo;
mod open;
mod options;
mod payload;
mod put;
mod rebuild;
mod records;
mod removal;
mod shared;
mod sled_index;
mod sources;
mod stats;
mod use_stats;
mod verify;
mod verity;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub use entry::{AccessStats, Entry, NewEntry, PayloadInfo, Producer};
pub use error::StoreError;
pub use gc::{EntryAbout, GcItem, GcPolicy, GcReason, GcReport, GcTarget};
pub use integrity::Rotted;
pub use key::{EntryKey, InvalidKey, KEY_LEN};
pub use layout::LAYOUT_VERSION;
pub use lease::{Lease, LeaseAuthority, LeaseId};
pub use lookup::{Accept, Filter, Hit, HostFilter};
pub use open::{IndexReset, OpenReport};
pub use options::{Clock, StoreOptions, WriteFault};
pub use payload::Payload;
pub use rebuild::RecordSync;
pub use shared::SharedEntry;
pub use stats::{Stats, Usage};
pub use verify::{Damage, ReconcileReport, VerifyProblem, VerifyReport};

// Used only inside this crate: the index trait and its vocabulary (nothing
// outside implements or calls it) and the result alias.
pub(crate) use error::StoreResult;
pub(crate) use index::{Expect, Index, Op, Precondition, Tree};

use entry::Access;
use key::{KeyBytes, SOURCE_PREFIX_LEN};
use layout::Paths;

/// The result of a put.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// The entry as stored (the existing one when the key was already there).
    pub entry: Entry,
    /// False when the key already existed: the first payload stays and the
    /// new one was not read (put is idempotent per key).
    pub created: bool,
}

/// A cache dir, opened. `Send + Sync`: share it (e.g. in an `Arc`).
pub struct Store {
    paths: Paths,
    index: Box<dyn Index>,
    opts: StoreOptions,
    stripes: blobs::Stripes,
    /// The lease gate, holding the in-memory book of live leases.
    gate: Mutex<lease::Book>,
    access: use_stats::AccessLog,
    counters: stats::Counters,
    cache: cache::LookupCache,
    /// Reference drops committed, and how many of them are known durable (a
    /// flush finished after them): a payload file is deleted only when its
    /// last reference drop is durable.
    dropped: AtomicU64,
    durable: AtomicU64,
    /// The blobs whose latest reference drop may not be durable yet, with
    /// the `dropped` count right after it (updated under the blob's stripe,
    /// pruned by each flush); a blob not listed has no pending drop.
    pending_drops: Mutex<HashMap<[u8; 32], u64>>,
    /// Prefix of this instance's temp files; anything else in tmp/ is stale.
    session: String,
    /// fs-verity on published payloads, where the file system has it.
    verity: verity::Verity,
    tmp_seq: AtomicU64,
    opened: OpenReport,
    /// Payload files hashed (by us, or at publish) since the store opened.
    verified: integrity::Verified,
    // Declared last so it is dropped last: the index closes before another
    // process may take the dir.
    _lock: layout::DirLock,
}

/// `BlobRefs` key of an entry.
fn blob_ref_key(blob: &[u8; 32], key: &KeyBytes) -> Vec<u8> {
    let mut k = Vec::with_capacity(32 + key.len());
    k.extend_from_slice(blob);
    k.extend_from_slice(key);
    k
}

impl Store {
    /// A fresh path in tmp/ for a file this instance writes.
    pub(crate) fn temp_path(&self, ext: &str) -> PathBuf {
        self.paths.tmp.join(format!(
            "{}-{}.{ext}",
            self.session,
            self.tmp_seq.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// The cache dir this store owns.
    pub fn dir(&self) -> &Path {
        &self.paths.root
    }

    /// What `open` found and repaired.
    pub fn opened(&self) -> &OpenReport {
        &self.opened
    }

    /// Where the payload file of `blake3` lives.
    pub fn blob_path(&self, blake3: &[u8; 32]) -> PathBuf {
        self.paths.blob(blake3)
    }

    /// The folder of the payload files.
    pub fn payload_folder(&self) -> &Path {
        &self.paths.blobs
    }

    /// Where the payload file of `blake3` lies in [`Store::payload_folder`].
    pub fn blob_in_folder(&self, blake3: &[u8; 32]) -> PathBuf {
        let path = self.paths.blob(blake3);
        let rel = path.strip_prefix(&self.paths.blobs).unwrap_or(&path);
        rel.to_path_buf()
    }

    pub(crate) fn now(&self) -> u64 {
        self.opts.clock.now_ms()
    }

    /// source whose entries or key list the commit changed.
    pub(crate) fn commit(&self, when: &[Precondition], ops: &[Op]) -> StoreResult<bool> {
        let mut applied = self.index.commit(when, ops)?;
        // Opened again by this very commit: the preconditions were judged
        // on an index that may lack acknowledged entries. Agree, then retry.
        if !applied && !when.is_empty() && self.index.take_reopened() {
            self.sync_records()?;
            applied = self.index.commit(when, ops)?;
        }
        if applied {
            for op in ops {
                match op {
                    Op::Put(Tree::Entries, k, _) | Op::Delete(Tree::Entries, k) => {
                        self.cache.invalidate(&k[..k.len().min(SOURCE_PREFIX_LEN)])
                    }
                    Op::Put(Tree::Sources, k, _) | Op::Delete(Tree::Sources, k) => {
                        self.cache.invalidate(k)
                    }
                    _ => {}
                }
            }
        }
        Ok(applied)
    }

    /// Whether any entry references `blob`.
    pub(crate) fn blob_referenced(&self, blob: &[u8; 32]) -> StoreResult<bool> {
        let mut any = false;
        self.index.scan(Tree::BlobRefs, blob, None, &mut |_, _| {
            any = true;
            false
        })?;
        Ok(any)
    }

    /// The entries referencing `blob`.
    pub(crate) fn blob_users(&self, blob: &[u8; 32]) -> StoreResult<Vec<KeyBytes>> {
        let mut out = Vec::new();
        self.index.scan(Tree::BlobRefs, blob, None, &mut |k, _| {
            if let Ok(kb) = k[32..].try_into() {
                out.push(kb);
            }
            true
        })?;
        Ok(out)
    }

    pub(crate) fn access_of(&self, kb: &KeyBytes) -> StoreResult<Access> {
        Ok(self
            .index
            .get(Tree::Access, kb)?
            .map(|v| Access::decode(&v))
            .unwrap_or_default())
    }

    /// use for LRU and age gc.
    pub fn note_use(&self, key: &EntryKey) {
        self.note_access(key.to_bytes());
    }

    fn note_access(&self, kb: KeyBytes) {
        self.note(kb, use_stats::AccessLog::record);
    }

    /// Notes a lookup hit's use (at most once per entry and window).
    pub(crate) fn note_lookup_hit(&self, kb: KeyBytes) {
        self.note(kb, use_stats::AccessLog::record_lookup);
    }

    /// Notes a use with `record`, writing the batch when one is due.
    fn note(
        &self,
        kb: KeyBytes,
        record: fn(&use_stats::AccessLog, KeyBytes, u64, usize, u64) -> bool,
    ) {
        let now = self.now();
        let interval = self.opts.access_interval.as_millis() as u64;
        if record(&self.access, kb, now, self.opts.access_batch, interval) {
            // Statistics only: a failed write must not fail the read.
            let _ = self.access.write(&*self.index, now);
        }
    }

    /// Writes the counters when a write is due (see `stats.rs`).
    pub(crate) fn save_counters_if_due(&self) {
        let interval = self.opts.access_interval.as_millis() as u64;
        self.counters
            .save_if_due(&*self.index, self.now(), interval);
    }

    /// Writes pending access statistics and the counters, and makes every
    /// commit durable.
    pub fn flush(&self) -> StoreResult<()> {
        self.access.write(&*self.index, self.now())?;
        self.counters.save(&*self.index)?;
        self.make_durable()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if self.flush().is_ok() {
            layout::set_clean_mark(&self.paths);
        }
    }
}

#[cfg(test)]
mod tests;
