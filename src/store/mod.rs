//! The local store of compiled payloads (D7).
//!
//! A cache dir (see `layout.rs`) holds an index (sled, behind the [`Index`]
//! trait) of entries keyed by (source digest, device key, physical type
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

mod access;
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
mod options;
mod rebuild;
mod records;
mod shared;
mod sled_index;
mod sources;
mod stats;
mod verify;
mod verity;

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{ErrorKind, Read};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use memmap2::Mmap;
use prost::Message;

pub use entry::{AccessStats, Entry, NewEntry, PayloadInfo, Producer};
pub use error::{StoreError, StoreResult};
pub use gc::{EntryAbout, GcItem, GcPolicy, GcReason, GcReport, GcTarget};
pub use index::{Expect, Index, Op, Precondition, Tree};
pub use integrity::Rotted;
pub use key::{source_prefix, EntryKey, KEY_LEN, SOURCE_PREFIX_LEN};
pub use layout::LAYOUT_VERSION;
pub use lease::{Lease, LeaseAuthority, LeaseId};
pub use lookup::{Accept, Filter, Hit, HostFilter};
pub use options::{Clock, StoreOptions, WriteFault};
pub use rebuild::RecordSync;
pub use shared::SharedEntry;
pub use stats::{Stats, Usage};
pub use verify::{Damage, ReconcileReport, VerifyProblem, VerifyReport};

use entry::Access;
use key::KeyBytes;
use layout::Paths;

/// What `open` found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenReport {
    /// The layout version found (`None`: a new cache dir).
    pub layout_found: Option<u32>,
    /// Leftovers of interrupted writes removed from tmp/.
    pub temp_removed: usize,
    /// The index could not be opened: it was set aside and rebuilt from
    /// the record files.
    pub index_reset: Option<IndexReset>,
    /// What the record sync at open did: it runs when the last owner did
    /// not close the dir cleanly (a crash), when the index was rebuilt or
    /// found empty, and after a layout upgrade; `None` otherwise.
    pub record_sync: Option<RecordSync>,
}

/// A damaged index set aside at open and rebuilt from the record files
/// (D13): every entry whose record and payload file are intact is back;
/// leases, access times (reset to the rebuild's time), the hit/miss
/// counters and the digest memo start anew. Nothing wrong is ever served
/// from the old one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexReset {
    /// Where the corrupt index now lies, for a bug report.
    pub moved_to: PathBuf,
    /// What the index library reported.
    pub detail: String,
}

/// The result of a put.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// The entry as stored (the existing one when the key was already there).
    pub entry: Entry,
    /// False when the key already existed: the first payload stays and the
    /// new one was not read (put is idempotent per key).
    pub created: bool,
}

/// A payload mapped read-only. The mapping stays valid after the entry is
/// removed (the file is unlinked, never truncated or rewritten).
pub struct Payload {
    map: Option<Mmap>,
    /// The payload file.
    pub path: PathBuf,
    /// Its hash and length, as the entry records them.
    pub info: PayloadInfo,
    /// The file as it was when its bytes were hashed.
    stamp: Option<integrity::Stamp>,
    /// The group digests copies check as they send (see [`Payload::checked`]).
    chunks: Option<std::sync::Arc<crate::chunks::ChunkDigests>>,
}

impl Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Payload")
            .field("path", &self.path)
            .field("len", &self.info.len)
            .finish()
    }
}

/// A cache dir, opened. `Send + Sync`: share it (e.g. in an `Arc`).
pub struct Store {
    paths: Paths,
    index: Box<dyn Index>,
    opts: StoreOptions,
    stripes: blobs::Stripes,
    /// The lease gate, holding the in-memory book of live leases.
    gate: Mutex<lease::Book>,
    access: access::AccessLog,
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

/// Opens the index; a damaged one (a crash can tear sled 0.34's log even
/// with fsync, and files can rot) is moved to `quarantine/index-<unix ms>`
/// and replaced by an empty index, which the caller fills from the record
/// files. sled panics on some damage: that is damage too.
fn open_index(
    paths: &Paths,
    opts: &StoreOptions,
) -> StoreResult<(sled_index::SledIndex, Option<IndexReset>)> {
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        sled_index::SledIndex::open(&paths.index, opts)
    }));
    let detail = match opened {
        Ok(Err(StoreError::IndexCorrupt { detail, .. })) => detail,
        Ok(r) => return r.map(|i| (i, None)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no message");
            format!("the index library panicked: {what}")
        }
    };
    let moved_to = paths
        .quarantine
        .join(format!("index-{}", opts.clock.now_ms()));
    fs::create_dir_all(&paths.quarantine)
        .map_err(|e| StoreError::io("create", &paths.quarantine, e))?;
    fs::rename(&paths.index, &moved_to)
        .map_err(|e| StoreError::io("set aside", &paths.index, e))?;
    let index = sled_index::SledIndex::open(&paths.index, opts)?;
    Ok((index, Some(IndexReset { moved_to, detail })))
}

impl Store {
    /// Opens (creating if needed) the store in `dir`; fails with
    /// [`StoreError::Locked`] when another process owns it.
    pub fn open(dir: impl AsRef<Path>, opts: StoreOptions) -> StoreResult<Store> {
        let root = dir.as_ref();
        fs::create_dir_all(root).map_err(|e| StoreError::io("create", root, e))?;
        let lock = layout::lock(root)?;
        let paths = Paths::new(root);
        let layout_found = layout::prepare(&paths)?;
        let temp_removed = layout::clean_tmp(&paths)?;
        let clean = layout::take_clean_mark(&paths)?;
        let (index, index_reset) = open_index(&paths, &opts)?;
        let must_sync = !clean || index_reset.is_some() || !index.recovered();
        let now = opts.clock.now_ms();
        let counters = stats::Counters::load(&index, now)?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let mut store = Store {
            session: format!("{:x}-{:x}{:08x}", std::process::id(), now, nanos),
            paths,
            index: Box::new(index),
            stripes: blobs::Stripes::new(),
            gate: Mutex::new(lease::Book::default()),
            access: access::AccessLog::new(now),
            counters,
            cache: cache::LookupCache::new(opts.lookup_cache_sources),
            dropped: AtomicU64::new(0),
            durable: AtomicU64::new(0),
            pending_drops: Mutex::new(HashMap::new()),
            tmp_seq: AtomicU64::new(0),
            opened: OpenReport {
                layout_found,
                temp_removed,
                index_reset,
                record_sync: None,
            },
            verified: integrity::Verified::default(),
            verity: verity::Verity::default(),
            opts,
            _lock: lock,
        };
        if must_sync {
            store.opened.record_sync = Some(store.sync_records()?);
        }
        Ok(store)
    }

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

    pub(crate) fn now(&self) -> u64 {
        self.opts.clock.now_ms()
    }

    /// Stores a payload streamed from `payload` under the key `new` derives.
    ///
    /// The payload is hashed while written to tmp/, fsynced, renamed into
    /// blobs/ (or dropped when a referenced file of that blake3 is already
    /// there and its bytes hash to its name: equal payloads under different
    /// keys share one file; a file that does not is replaced by the new
    /// one), then the entry is committed. An existing key is not
    /// overwritten and its payload not read.
    pub fn put(&self, new: &NewEntry, mut payload: impl Read) -> StoreResult<Stored> {
        self.resync_if_reopened()?;
        let now = self.now();
        let prep = entry::prepare(new, now, self.opts.max_seen)?;
        let kb = prep.key.to_bytes();
        if let Some(e) = self.existing(&kb, new)? {
            return Ok(Stored {
                entry: e,
                created: false,
            });
        }
        let tmp = self.temp_path("part");
        let w = blobs::write_temp(
            &self.paths,
            tmp,
            &mut payload,
            self.opts.fsync,
            self.opts.write_fault.as_ref(),
        )?;
        let blob = w.blake3;
        let mut record = prep.record;
        record.payload_blake3 = blob.to_vec();
        record.payload_len = w.len;
        let value = record.encode_to_vec();
        let access = Access {
            last_ms: now,
            count: 0,
        };
        if let Some(e) = self.commit_put(&kb, new, w, &value, &access)? {
            // Another put of this key won, and our record file may have
            // replaced its record: write the winner's again.
            self.restore_record(&kb)?;
            return Ok(Stored {
                entry: e,
                created: false,
            });
        }
        if self.opts.durable_puts {
            self.index.flush()?;
        }
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        self.save_counters_if_due();
        Ok(Stored {
            entry: record.into_entry(prep.key, Some(access)),
            created: true,
        })
    }

    /// Publishes a written payload, its record and the index entry, under
    /// the payload's stripe. Returns the existing entry when another put of
    /// the key committed first (our file is dropped again then).
    fn commit_put(
        &self,
        kb: &KeyBytes,
        new: &NewEntry,
        w: blobs::Written,
        value: &[u8],
        access: &Access,
    ) -> StoreResult<Option<Entry>> {
        let blob = w.blake3;
        let _stripe = self.stripes.lock(&blob);
        let mut pending = Some(w);
        let mut recorded = false;
        loop {
            if let Some(e) = self.existing(kb, new)? {
                // Our file, if we published it and nothing else uses it,
                // goes again.
                match pending.take() {
                    Some(w) => w.discard(),
                    None => {
                        self.delete_unreferenced(&blob)?;
                    }
                }
                return Ok(Some(e));
            }
            if let Some(w) = pending.take() {
                if self.blob_referenced(&blob)? && self.blob_intact(&blob, w.len)? {
                    w.discard();
                } else {
                    let chunks = blobs::publish(&self.paths, w, self.opts.fsync, &self.verity)?;
                    self.published(&blob, chunks);
                }
            }
            if !recorded {
                // Durable before the index knows the entry (D13): the put
                // survives a crash that loses the index's last commits.
                self.write_record(kb, value, rebuild::Durable::Now)?;
                recorded = true;
            }
            let (prefix, suffix) = (sources::prefix(kb), sources::suffix(kb));
            let list = self.index.get(Tree::Sources, prefix)?;
            let applied = self.commit(
                &[
                    Precondition::new(Tree::Entries, kb, Expect::Absent),
                    sources::unchanged(prefix, &list),
                ],
                &[
                    Op::Put(Tree::Entries, kb.to_vec(), value.to_vec()),
                    Op::Put(Tree::BlobRefs, blob_ref_key(&blob, kb), Vec::new()),
                    Op::Put(Tree::Access, kb.to_vec(), access.encode()),
                    sources::store(
                        prefix,
                        sources::with(list.as_deref().unwrap_or(&[]), suffix),
                    ),
                ],
            )?;
            if applied {
                return Ok(None);
            }
            // A concurrent put of the key (with another payload, so under
            // another stripe) committed first, or one of another key of the
            // same source changed its list: loop to return the entry, or to
            // try again.
        }
    }

    /// The entry under `kb`, after remembering the new entry's source names
    /// and model paths (a bounded, best-effort list) and, for a record
    /// stored without it, the source shape (`Record::merge_put`).
    fn existing(&self, kb: &KeyBytes, new: &NewEntry) -> StoreResult<Option<Entry>> {
        for _ in 0..4 {
            let Some(old) = self.index.get(Tree::Entries, kb)? else {
                return Ok(None);
            };
            let mut rec = entry::decode_record(kb, &old)?;
            let changed = rec.merge_put(new, self.opts.max_seen);
            let done = !changed
                || self.commit(
                    &[Precondition::new(Tree::Entries, kb, Expect::Equals(old))],
                    &[Op::Put(Tree::Entries, kb.to_vec(), rec.encode_to_vec())],
                )?;
            if done {
                let key = EntryKey::from_bytes(kb)?;
                return Ok(Some(rec.into_entry(key, Some(self.access_of(kb)?))));
            }
        }
        // Lost four races to concurrent updates: the names are informational
        // (a missing shape is completed by a later put).
        self.stat(&EntryKey::from_bytes(kb)?)
    }

    /// Removes an entry (its payload file goes with its last reference);
    /// refuses a leased entry. Returns whether it existed.
    pub fn remove(&self, key: &EntryKey) -> StoreResult<bool> {
        let kb = key.to_bytes();
        let gate = self.lease_gate()?;
        if let Some(until_ms) = gate.leased_until(&kb) {
            return Err(StoreError::Leased {
                key: *key,
                until_ms,
            });
        }
        loop {
            let Some(old) = self.index.get(Tree::Entries, &kb)? else {
                return Ok(false);
            };
            let blob = entry::decode_brief(&kb, &old)?.blob();
            let _stripe = self.stripes.lock(&blob);
            if self.drop_entry(&kb, &blob, old)? {
                drop(gate);
                self.delete_unreferenced(&blob)?;
                return Ok(true);
            }
            // The record changed under us (a put merged its source names):
            // read it again.
        }
    }

    /// Deletes `blob`'s file if no entry references it, after making sure
    /// the commit that dropped its last reference is durable, so that no
    /// crash can bring back an entry whose file is gone. Caller holds the
    /// stripe. Returns the bytes freed (`None`: kept, or already gone).
    pub(crate) fn delete_unreferenced(&self, blob: &[u8; 32]) -> StoreResult<Option<u64>> {
        if self.blob_referenced(blob)? {
            return Ok(None);
        }
        // Every reference drop of this blob happened under its stripe, which
        // we hold, and recorded itself in `pending_drops` before releasing
        // it; a drop of another blob committed since needs no flush here.
        let pending = self.pending_drops().get(blob).copied();
        if pending.is_some_and(|after| self.durable.load(Ordering::SeqCst) < after) {
            self.make_durable()?;
        }
        blobs::delete_path(&self.paths.blob(blob))
    }

    fn pending_drops(&self) -> MutexGuard<'_, HashMap<[u8; 32], u64>> {
        self.pending_drops.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts `n` committed reference drops of `blobs` (caller holds their
    /// stripes and committed the drops).
    fn dropped_refs(&self, n: u64, blobs: impl IntoIterator<Item = [u8; 32]>) {
        let after = self.dropped.fetch_add(n, Ordering::SeqCst) + n;
        let mut pending = self.pending_drops();
        for blob in blobs {
            pending.insert(blob, after);
        }
    }

    /// Flushes the index and records that every reference drop counted
    /// before the flush started is durable.
    pub(crate) fn make_durable(&self) -> StoreResult<()> {
        let target = self.dropped.load(Ordering::SeqCst);
        self.index.flush()?;
        self.durable.fetch_max(target, Ordering::SeqCst);
        self.pending_drops().retain(|_, after| *after > target);
        Ok(())
    }

    /// Commits the removal of one entry if its record is still `old`
    /// (caller holds the blob's stripe). The file is the caller's business.
    pub(crate) fn drop_entry(
        &self,
        kb: &KeyBytes,
        blob: &[u8; 32],
        old: Vec<u8>,
    ) -> StoreResult<bool> {
        let (prefix, suffix) = (sources::prefix(kb), sources::suffix(kb));
        // The record goes first (D13): a crash before the commit leaves an
        // entry without a record, which the next sync keeps.
        records::remove(&self.paths, kb)?;
        loop {
            let list = self.index.get(Tree::Sources, prefix)?;
            let done = self.commit(
                &[
                    Precondition::new(Tree::Entries, kb, Expect::Equals(old.clone())),
                    sources::unchanged(prefix, &list),
                ],
                &[
                    Op::Delete(Tree::Entries, kb.to_vec()),
                    Op::Delete(Tree::BlobRefs, blob_ref_key(blob, kb)),
                    Op::Delete(Tree::Access, kb.to_vec()),
                    sources::store(
                        prefix,
                        sources::without(list.as_deref().unwrap_or(&[]), suffix),
                    ),
                ],
            )?;
            if done {
                self.dropped_refs(1, [*blob]);
                return Ok(true);
            }
            // Either the entry changed (give up) or only the source list did
            // (another entry of this source came or went: try again).
            match self.index.get(Tree::Entries, kb)? {
                Some(v) if v == old => {}
                // Names merged into the record: the entry stays, and so
                // must its record. (Another payload's entry wrote its own
                // record, after ours was gone.)
                Some(v) if entry::decode_brief(kb, &v).is_ok_and(|b| b.blob() == *blob) => {
                    self.write_record(kb, &v, rebuild::Durable::Now)?;
                    return Ok(false);
                }
                _ => return Ok(false),
            }
        }
    }

    /// Drops many entries in one commit (caller holds the stripes of all
    /// their blobs); falls back to one commit each when something changed
    /// under us. Returns, per entry, whether it was dropped.
    pub(crate) fn drop_entries(
        &self,
        items: &[(KeyBytes, [u8; 32], Vec<u8>)],
    ) -> StoreResult<Vec<bool>> {
        let mut lists: std::collections::BTreeMap<&[u8], Option<Vec<u8>>> = Default::default();
        for (kb, ..) in items {
            let p = sources::prefix(kb);
            if !lists.contains_key(p) {
                lists.insert(p, self.index.get(Tree::Sources, p)?);
            }
        }
        let mut when = Vec::with_capacity(items.len() + lists.len());
        let mut ops = Vec::with_capacity(items.len() * 3 + lists.len());
        let mut new_lists: std::collections::BTreeMap<&[u8], Vec<u8>> = lists
            .iter()
            .map(|(p, l)| (*p, l.clone().unwrap_or_default()))
            .collect();
        // Before the commit (see records.rs).
        let keys: Vec<KeyBytes> = items.iter().map(|i| i.0).collect();
        records::remove_many(&self.paths, &keys)?;
        for (kb, blob, old) in items {
            when.push(Precondition::new(
                Tree::Entries,
                kb,
                Expect::Equals(old.clone()),
            ));
            ops.push(Op::Delete(Tree::Entries, kb.to_vec()));
            ops.push(Op::Delete(Tree::BlobRefs, blob_ref_key(blob, kb)));
            ops.push(Op::Delete(Tree::Access, kb.to_vec()));
            let l = new_lists.get_mut(sources::prefix(kb)).expect("read above");
            *l = sources::without(l, sources::suffix(kb));
        }
        for (p, old) in &lists {
            when.push(sources::unchanged(p, old));
        }
        for (p, new) in new_lists {
            ops.push(sources::store(p, new));
        }
        if self.commit(&when, &ops)? {
            self.dropped_refs(items.len() as u64, items.iter().map(|i| i.1));
            return Ok(vec![true; items.len()]);
        }
        items
            .iter()
            .map(|(kb, blob, old)| self.drop_entry(kb, blob, old.clone()))
            .collect()
    }

    /// Commits through the index and invalidates the lookup cache of every
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

    /// Maps an entry's payload read-only for a client and records the use
    /// (its last use for LRU and age gc). The first time a payload file is
    /// served after the store was opened its bytes are hashed: a file that
    /// does not hash to its name is quarantined, every entry using it is
    /// dropped, and the answer is [`StoreError::PayloadCorrupt`] naming
    /// them, never the bytes.
    pub fn open_payload(&self, key: &EntryKey) -> StoreResult<Payload> {
        let payload = self.check_payload(key)?;
        self.note_access(key.to_bytes());
        Ok(payload)
    }

    /// [`Store::open_payload`] for the store's owner's own checks (is a
    /// stored payload still sound before a pack reuses it, an upload): the
    /// same checks, and no use recorded.
    pub fn check_payload(&self, key: &EntryKey) -> StoreResult<Payload> {
        self.resync_if_reopened()?;
        let kb = key.to_bytes();
        let v = self
            .index
            .get(Tree::Entries, &kb)?
            .ok_or(StoreError::NotFound(*key))?;
        let b = entry::decode_brief(&kb, &v)?;
        let info = PayloadInfo {
            blake3: b.blob(),
            len: b.payload_len,
        };
        let path = self.paths.blob(&info.blake3);
        let damaged = |detail: String| StoreError::PayloadDamaged {
            key: Box::new(*key),
            path: path.clone(),
            detail,
        };
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                // Collected since the record was read: files go only after
                // their last entry is gone (and that is durable).
                if self.index.get(Tree::Entries, &kb)?.is_none() {
                    return Err(StoreError::NotFound(*key));
                }
                return Err(damaged("the payload file is missing".into()));
            }
            Err(e) => return Err(StoreError::io("open", &path, e)),
        };
        let meta = file
            .metadata()
            .map_err(|e| StoreError::io("stat", &path, e))?;
        let len = meta.len();
        if len != info.len {
            return Err(damaged(format!(
                "the file has {len} bytes, the entry {}",
                info.len
            )));
        }
        let map = if len == 0 {
            None
        } else {
            // SAFETY: payload files are immutable once published (mode 0444,
            // replaced only by rename, removed only by unlink), so the mapped
            // bytes cannot change under the mapping.
            Some(unsafe { Mmap::map(&file) }.map_err(|e| StoreError::io("map", &path, e))?)
        };
        let mut payload = Payload {
            map,
            path,
            info,
            stamp: None,
            chunks: None,
        };
        self.verify_served(key, &mut payload, &meta)?;
        Ok(payload)
    }

    /// Records a client's use of `key` (a lookup that returned it): its last
    /// use for LRU and age gc.
    pub fn note_use(&self, key: &EntryKey) {
        self.note_access(key.to_bytes());
    }

    fn note_access(&self, kb: KeyBytes) {
        let now = self.now();
        let interval = self.opts.access_interval.as_millis() as u64;
        if self
            .access
            .record(kb, now, self.opts.access_batch, interval)
        {
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
