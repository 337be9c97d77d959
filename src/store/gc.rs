//! Garbage collection: a size budget (least recently used first), a maximum
//! idle age, orphans (payload files without entries, entries without payload
//! files), stale temp files, and expired lease records.
//!
//! GC first *plans* from one walk of the index (entries and access times,
//! walked in parallel) and one listing of blobs/ and tmp/ (a pure function
//! of what it saw, so a dry run reports exactly what a real run on the same
//! state does), then *executes* the plan in batches of `gc_batch` entries.
//! Each batch takes the lease gate, checks the live leases (an entry leased
//! since the plan is kept), reads each record once (it describes the entry
//! in the report and is what the removal's precondition compares against),
//! commits the removals, flushes the index, and
//! only then unlinks the payload files that lost their last reference: on
//! threads of their own, while the next batch commits (a commit is index
//! work on one core, an unlink mostly waits for the file system). Lookups
//! only ever wait for one index commit, never for a batch. **A leased entry
//! is never removed.**

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use super::blobs;
use super::entry::{self, Access};

use super::error::{StoreError, StoreResult};
use super::index::{Op, Tree};
use super::key::{EntryKey, KeyBytes};
use super::Store;

/// What to collect. The default collects nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcPolicy {
    /// Remove least recently used entries until the payload files of the
    /// remaining ones take at most this many bytes.
    pub max_bytes: Option<u64>,
    /// Remove entries not accessed for this long or longer (zero: every
    /// entry not leased, like a `max_bytes` of zero).
    pub max_age: Option<Duration>,
    /// First of all, remove the least recently used entries packed for an
    /// untrusted uid's requests until each uid's take at most this many
    /// bytes.
    pub max_bytes_per_uid: Option<u64>,
    /// Remove payload files without entries and entries without files.
    pub orphans: bool,
    /// Remove temp files left by writers that are gone.
    pub temp_files: bool,
    /// Report what would go, change nothing.
    pub dry_run: bool,
}

/// Why gc removed (or, in a dry run, would remove) an item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GcReason {
    /// Not accessed for `idle`.
    MaxAge {
        /// Time since the entry's last access.
        idle: Duration,
    },
    /// Least recently used while the store was over `max_bytes`.
    OverBudget,
    /// Least recently used of the entries packed for `uid` while they were
    /// over `max_bytes_per_uid`.
    OverQuota {
        /// The uid whose requests had them packed.
        uid: u32,
    },
    /// The entry's payload file is missing.
    MissingPayload,
    /// A payload file no entry references.
    OrphanPayload,
    /// A file in blobs/ that is not a payload file.
    StrayFile,
    /// A temp file of a writer that is gone.
    StaleTemp,
}

/// What a gc item removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GcTarget {
    /// An index entry (its payload file goes with its last entry).
    Entry(EntryKey),
    /// A file under the cache dir with no entry.
    File(PathBuf),
}

/// One thing gc removed, or would remove in a dry run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcItem {
    /// The entry or file.
    pub target: GcTarget,
    /// Why it goes.
    pub reason: GcReason,
    /// Bytes of files deleted with it (0 when an entry's payload file is
    /// still referenced by other entries).
    pub bytes_freed: u64,
    /// What an entry was packed from, for people reading the report
    /// (`None` for files).
    pub about: Option<EntryAbout>,
}

/// An entry's physical type and the names it was packed under.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryAbout {
    /// The physical type's name.
    pub type_name: String,
    /// Initializer names the entry was packed under.
    pub source_names: Vec<String>,
    /// Model files the entry was packed from.
    pub model_paths: Vec<String>,
}

impl From<entry::Record> for EntryAbout {
    fn from(r: entry::Record) -> EntryAbout {
        EntryAbout {
            type_name: r.type_name,
            source_names: r.source_names,
            model_paths: r.model_paths,
        }
    }
}

/// What a gc run did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// True when nothing was removed, only planned.
    pub dry_run: bool,
    /// In execution order: entries, then files, then temp files.
    pub items: Vec<GcItem>,
    /// Total bytes of the files removed.
    pub bytes_freed: u64,
    /// Bytes of referenced payload files before and after (as planned).
    pub bytes_before: u64,
    /// Bytes of referenced payload files after the run (as planned in a dry run).
    pub bytes_after: u64,
    /// The limits applied (the policy's).
    pub max_bytes: Option<u64>,
    /// The idle-age limit applied, if any.
    pub max_age: Option<Duration>,
    /// Entries a policy selected but a lease kept.
    pub leased_kept: u64,
    /// Expired lease records removed (or, dry, that would be).
    pub expired_leases: u64,
}

/// One entry as GC sees it.
#[derive(Debug, Clone)]
pub(crate) struct Cand {
    pub kb: KeyBytes,
    pub blob: [u8; 32],
    pub len: u64,
    pub last_ms: u64,
    pub created_ms: u64,
    /// The uid a per-uid quota charges it to.
    pub requested_by: Option<u32>,
}

/// Everything a plan is computed from.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// In key order.
    pub cands: Vec<Cand>,
    pub leased: HashSet<KeyBytes>,
    /// Payload files present (None when orphans are not collected).
    pub files: Option<HashSet<[u8; 32]>>,
    /// Unreferenced payload files and their sizes.
    pub orphan_files: Vec<(PathBuf, u64)>,
    pub stray_files: Vec<(PathBuf, u64)>,
    pub temps: Vec<(PathBuf, u64)>,
}

/// The plan: items (with bytes freed as planned) and the byte totals.
pub(crate) fn plan(s: &Snapshot, p: &GcPolicy, now_ms: u64) -> (Vec<GcItem>, u64, u64, u64) {
    let mut refs: HashMap<[u8; 32], (u32, u64)> = HashMap::new();
    let mut items = Vec::new();
    let mut gone: HashSet<KeyBytes> = HashSet::new();
    let mut leased_kept = 0u64;
    for c in &s.cands {
        let missing = s.files.as_ref().is_some_and(|f| !f.contains(&c.blob));
        if missing {
            if s.leased.contains(&c.kb) {
                leased_kept += 1;
            } else {
                items.push(entry_item(c, GcReason::MissingPayload, 0));
                gone.insert(c.kb);
            }
            continue;
        }
        let r = refs.entry(c.blob).or_insert((0, c.len));
        r.0 += 1;
    }
    // Lengths come from records: a corrupt one must not wrap the totals.
    let before = refs.values().fold(0u64, |sum, r| sum.saturating_add(r.1));
    let mut total = before;
    let pinned: HashSet<[u8; 32]> = s
        .cands
        .iter()
        .filter(|c| s.leased.contains(&c.kb))
        .map(|c| c.blob)
        .collect();
    if let Some(max_age) = p.max_age {
        let max_ms = max_age.as_millis() as u64;
        for c in &s.cands {
            let idle = now_ms.saturating_sub(c.last_ms);
            if gone.contains(&c.kb) || idle < max_ms {
                continue;
            }
            if s.leased.contains(&c.kb) {
                leased_kept += 1;
                continue;
            }
            let freed = release(&mut refs, &mut total, &c.blob);
            items.push(entry_item(
                c,
                GcReason::MaxAge {
                    idle: Duration::from_millis(idle),
                },
                freed,
            ));
            gone.insert(c.kb);
        }
    }
    let mut removal = Removal {
        s,
        refs: &mut refs,
        total: &mut total,
        items: &mut items,
        gone: &mut gone,
        leased_kept: &mut leased_kept,
        pinned: &pinned,
    };
    if let Some(quota) = p.max_bytes_per_uid {
        // Over a uid's quota before over the store's budget: that uid's
        // least recently used go first.
        let mut held: BTreeMap<u32, u64> = BTreeMap::new();
        for c in s.cands.iter().filter(|c| !removal.gone.contains(&c.kb)) {
            if let Some(uid) = c.requested_by {
                let h = held.entry(uid).or_default();
                *h = h.saturating_add(c.len);
            }
        }
        for (uid, bytes) in held.into_iter().filter(|(_, b)| *b > quota) {
            let lru = removal.lru(|c| c.requested_by == Some(uid));
            removal.evict(lru, &GcReason::OverQuota { uid }, Some(bytes), quota);
        }
    }
    if let Some(max) = p.max_bytes {
        let lru = removal.lru(|_| true);
        removal.evict(lru, &GcReason::OverBudget, None, max);
    }
    if p.orphans {
        for (path, len) in &s.orphan_files {
            items.push(GcItem {
                target: GcTarget::File(path.clone()),
                reason: GcReason::OrphanPayload,
                bytes_freed: *len,
                about: None,
            });
        }
        for (path, len) in &s.stray_files {
            items.push(GcItem {
                target: GcTarget::File(path.clone()),
                reason: GcReason::StrayFile,
                bytes_freed: *len,
                about: None,
            });
        }
    }
    if p.temp_files {
        for (path, len) in &s.temps {
            items.push(GcItem {
                target: GcTarget::File(path.clone()),
                reason: GcReason::StaleTemp,
                bytes_freed: *len,
                about: None,
            });
        }
    }
    (items, before, total, leased_kept)
}

/// The plan's item removing candidate `c`.
fn entry_item(c: &Cand, reason: GcReason, bytes_freed: u64) -> GcItem {
    GcItem {
        target: GcTarget::Entry(EntryKey::from_bytes(&c.kb).expect("own key")),
        reason,
        bytes_freed,
        about: None,
    }
}

/// The removals of a plan in progress.
struct Removal<'p> {
    s: &'p Snapshot,
    refs: &'p mut HashMap<[u8; 32], (u32, u64)>,
    total: &'p mut u64,
    items: &'p mut Vec<GcItem>,
    gone: &'p mut HashSet<KeyBytes>,
    leased_kept: &'p mut u64,
    /// Payload files a leased entry references.
    pinned: &'p HashSet<[u8; 32]>,
}

impl<'p> Removal<'p> {
    /// The candidates `keep` selects not removed yet, least recently used
    /// first.
    fn lru(&self, keep: impl Fn(&Cand) -> bool) -> Vec<&'p Cand> {
        let s: &'p Snapshot = self.s;
        let mut lru: Vec<&'p Cand> = s
            .cands
            .iter()
            .filter(|c| !self.gone.contains(&c.kb) && keep(c))
            .collect();
        lru.sort_by_key(|c| (c.last_ms, c.created_ms, c.kb));
        lru
    }

    /// Removes from `lru` in order while the bytes held exceed `limit`:
    /// `held` counted down by each entry's length, or (`None`) the store's
    /// total of payload files. A leased entry stays, and so does one whose
    /// file a leased entry shares (removing it would free nothing).
    fn evict(&mut self, lru: Vec<&Cand>, reason: &GcReason, mut held: Option<u64>, limit: u64) {
        for c in lru {
            if held.unwrap_or(*self.total) <= limit {
                break;
            }
            if self.s.leased.contains(&c.kb) {
                *self.leased_kept += 1;
                continue;
            }
            if self.pinned.contains(&c.blob) {
                continue;
            }
            let freed = release(self.refs, self.total, &c.blob);
            if let Some(h) = held.as_mut() {
                *h = h.saturating_sub(c.len);
            }
            self.items.push(entry_item(c, reason.clone(), freed));
            self.gone.insert(c.kb);
        }
    }
}

/// Drops one reference to `blob`; returns the bytes freed when it was the last.
fn release(refs: &mut HashMap<[u8; 32], (u32, u64)>, total: &mut u64, blob: &[u8; 32]) -> u64 {
    let r = refs.get_mut(blob).expect("counted");
    r.0 -= 1;
    if r.0 == 0 {
        *total = total.saturating_sub(r.1);
        r.1
    } else {
        0
    }
}

/// Threads unlinking payload files during a GC run. An unlink is mostly a
/// wait for the file system (inode eviction, block freeing, discard), not
/// CPU: on a 2-core VM with ext4 `-o discard`, 10k unlinks take 6 s on one
/// thread, 2.3 s on two and 1.5 s on eight.
const UNLINKERS: usize = 8;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn file_len(p: &std::path::Path) -> u64 {
    std::fs::symlink_metadata(p).map(|m| m.len()).unwrap_or(0)
}

impl Store {
    /// Runs (or, with `dry_run`, plans) a collection.
    pub fn gc(&self, policy: &GcPolicy) -> StoreResult<GcReport> {
        self.resync_if_reopened()?;
        let now = self.now();
        // Exact LRU needs the pending access statistics in the index.
        self.access.write(&*self.index, now)?;
        let (snap, expired) = self.snapshot(policy)?;
        let (mut items, before, after, leased_kept) = plan(&snap, policy, now);
        let mut report = GcReport {
            dry_run: policy.dry_run,
            bytes_before: before,
            bytes_after: after,
            max_bytes: policy.max_bytes,
            max_age: policy.max_age,
            leased_kept,
            expired_leases: expired.len() as u64,
            ..Default::default()
        };
        if policy.dry_run {
            // A real run describes each entry from the record it removes.
            self.describe(&mut items)?;
            report.bytes_freed = items.iter().map(|i| i.bytes_freed).sum();
            report.items = items;
            return Ok(report);
        }
        drop(expired);
        report.expired_leases = self.delete_dead_leases()?;
        let (entries, files): (Vec<GcItem>, Vec<GcItem>) = items
            .into_iter()
            .partition(|i| matches!(i.target, GcTarget::Entry(_)));
        report.items = self.remove_entries(&entries, &mut report.leased_kept)?;
        for item in files {
            let GcTarget::File(path) = &item.target else {
                continue;
            };
            let freed = match item.reason {
                GcReason::OrphanPayload => {
                    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
                    let Some(blob) = name.as_deref().and_then(super::layout::parse_blob_name)
                    else {
                        continue;
                    };
                    let _s = self.stripes.lock(&blob);
                    self.delete_unreferenced(&blob)?
                }
                _ => blobs::delete_path(path)?,
            };
            // Gone already (another collector or a remove got there first).
            let Some(freed) = freed else {
                continue;
            };
            report.items.push(GcItem {
                bytes_freed: freed,
                ..item
            });
        }
        report.bytes_freed = report.items.iter().map(|i| i.bytes_freed).sum();
        Ok(report)
    }

    /// Deletes the records of expired leases; returns how many.
    fn delete_dead_leases(&self) -> StoreResult<u64> {
        let mut gate = self.lease_gate()?;
        let dead = gate.take_dead();
        let ops: Vec<Op> = dead
            .iter()
            .map(|k| Op::Delete(Tree::Leases, k.clone()))
            .collect();
        if let Err(e) = self.commit(&[], &ops) {
            gate.restore_dead(dead);
            return Err(e);
        }
        Ok(ops.len() as u64)
    }

    /// Fills in what each planned entry was packed from (one record read
    /// per entry; an entry gone meanwhile stays undescribed).
    fn describe(&self, items: &mut [GcItem]) -> StoreResult<()> {
        for item in items {
            let GcTarget::Entry(key) = &item.target else {
                continue;
            };
            let kb = key.to_bytes();
            if let Some(v) = self.index.get(Tree::Entries, &kb)? {
                item.about = Some(entry::decode_record(&kb, &v)?.into());
            }
        }
        Ok(())
    }

    /// Removes the planned entries batch by batch; each batch's payload
    /// files are unlinked by [`UNLINKERS`] threads while the next batch
    /// commits. Returns the entries removed, in plan order, with the bytes
    /// their removal freed.
    fn remove_entries(
        &self,
        entries: &[GcItem],
        leased_kept: &mut u64,
    ) -> StoreResult<Vec<GcItem>> {
        let mut removed: Vec<(GcItem, [u8; 32])> = Vec::with_capacity(entries.len());
        let freed: Mutex<HashMap<[u8; 32], u64>> = Mutex::new(HashMap::new());
        let failed: Mutex<Option<StoreError>> = Mutex::new(None);
        let (send, recv) = std::sync::mpsc::channel::<[u8; 32]>();
        let recv = Mutex::new(recv);
        std::thread::scope(|scope| -> StoreResult<()> {
            for _ in 0..UNLINKERS {
                scope.spawn(|| loop {
                    // The lock is held for the receive only, not the unlink.
                    let Ok(blob) = lock(&recv).recv() else {
                        return;
                    };
                    let _s = self.stripes.lock(&blob);
                    match self.delete_unreferenced(&blob) {
                        // Another batch may have this blob too: the one that
                        // deleted the file counts its bytes.
                        Ok(bytes) => {
                            let mut freed = lock(&freed);
                            let b = freed.entry(blob).or_insert(0);
                            *b = (*b).max(bytes.unwrap_or(0));
                        }
                        Err(e) => {
                            lock(&failed).get_or_insert(e);
                        }
                    }
                });
            }
            // Dropping the sender (also on an error) ends the unlinkers.
            let send = send;
            for batch in entries.chunks(self.opts.gc_batch.max(1)) {
                let done = self.commit_batch(batch, leased_kept)?;
                if done.is_empty() {
                    continue;
                }
                // The removals are durable before any of their files goes.
                self.make_durable()?;
                let mut blobs: Vec<[u8; 32]> = done.iter().map(|d| d.1).collect();
                blobs.sort_unstable();
                blobs.dedup();
                removed.extend(done);
                for blob in blobs {
                    // The receivers live until this scope ends.
                    let _ = send.send(blob);
                }
            }
            Ok(())
        })?;
        if let Some(e) = lock(&failed).take() {
            return Err(e);
        }
        let freed = freed.into_inner().unwrap_or_else(|p| p.into_inner());
        // As in the plan, the bytes of a shared file go to the last of its
        // entries removed.
        let mut out = Vec::with_capacity(removed.len());
        let mut seen = HashSet::new();
        for (item, blob) in removed.into_iter().rev() {
            let bytes_freed = match seen.insert(blob) {
                true => freed.get(&blob).copied().unwrap_or(0),
                false => 0,
            };
            out.push(GcItem {
                bytes_freed,
                ..item
            });
        }
        out.reverse();
        Ok(out)
    }

    /// Commits the removal of one batch under the lease gate and the stripes
    /// of its blobs: the entries not leased meanwhile and still there.
    /// Returns them, described from the records removed, with their blobs.
    fn commit_batch(
        &self,
        batch: &[GcItem],
        leased_kept: &mut u64,
    ) -> StoreResult<Vec<(GcItem, [u8; 32])>> {
        let mut removed: Vec<(GcItem, [u8; 32])> = Vec::with_capacity(batch.len());
        {
            let gate = self.lease_gate()?;
            let mut todo = Vec::with_capacity(batch.len());
            for item in batch {
                let GcTarget::Entry(key) = &item.target else {
                    continue;
                };
                let kb = key.to_bytes();
                if gate.is_leased(&kb) {
                    *leased_kept += 1;
                    continue;
                }
                let Some(old) = self.index.get(Tree::Entries, &kb)? else {
                    continue;
                };
                let r = entry::decode_record(&kb, &old)?;
                let (blob, len) = (r.blob(), r.payload_len);
                let item = GcItem {
                    about: Some(r.into()),
                    ..item.clone()
                };
                todo.push((item, kb, blob, old, len));
            }
            let blobs: Vec<[u8; 32]> = todo.iter().map(|t| t.2).collect();
            // One commit for the whole batch, under the stripes of all its
            // blobs (see `Store::delete_unreferenced`).
            let _stripes = self.stripes.lock_many(&blobs);
            // A missing payload may have been restored by a put since.
            todo.retain(|t| {
                t.0.reason != GcReason::MissingPayload || !blobs::present(&self.paths, &t.2, t.4)
            });
            let drops: Vec<_> = todo.iter().map(|t| (t.1, t.2, t.3.clone())).collect();
            let done = self.drop_entries(&drops)?;
            for (t, ok) in todo.into_iter().zip(done) {
                if ok {
                    removed.push((t.0, t.2));
                }
            }
        }
        Ok(removed)
    }

    /// Reads what a plan needs: entries with access times, leases, and
    /// (when the policy asks) the files. Returns the expired lease ids too.
    pub(crate) fn snapshot(&self, p: &GcPolicy) -> StoreResult<(Snapshot, Vec<Vec<u8>>)> {
        // The file listings (one folder read per shard, in parallel) run
        // beside the index walk.
        let (index_part, files_part) = rayon::join(
            || self.snapshot_index(),
            || -> StoreResult<_> {
                let listing = if p.orphans {
                    Some(blobs::list(&self.paths)?)
                } else {
                    None
                };
                let temps = if p.temp_files {
                    self.stale_temps()?
                } else {
                    Vec::new()
                };
                Ok((listing, temps))
            },
        );
        let (mut s, expired) = index_part?;
        let (listing, temps) = files_part?;
        if let Some((good, stray)) = listing {
            let referenced: HashSet<[u8; 32]> = s.cands.iter().map(|c| c.blob).collect();
            let mut files = HashSet::with_capacity(good.len());
            for (blob, path) in good {
                if !referenced.contains(&blob) {
                    s.orphan_files.push((path.clone(), file_len(&path)));
                }
                files.insert(blob);
            }
            s.files = Some(files);
            s.orphan_files.sort();
            s.stray_files = stray
                .into_iter()
                .map(|p| (p.clone(), file_len(&p)))
                .collect();
            s.stray_files.sort();
        }
        s.temps = temps;
        Ok((s, expired))
    }

    /// The index part of a snapshot: entries with access times, leases.
    /// Entries and access times are walked in parallel, both in key order,
    /// and merged.
    fn snapshot_index(&self) -> StoreResult<(Snapshot, Vec<Vec<u8>>)> {
        let mut s = Snapshot::default();
        let expired = {
            let gate = self.lease_gate()?;
            s.leased = gate.leased_keys().copied().collect();
            gate.dead().to_vec()
        };
        let (cands, access) = rayon::join(|| self.entry_cands(), || self.access_times());
        s.cands = cands?;
        let mut access = access?.into_iter().peekable();
        for c in &mut s.cands {
            while access.next_if(|(kb, _)| *kb < c.kb).is_some() {}
            if let Some((_, last_ms)) = access.next_if(|(kb, _)| *kb == c.kb) {
                c.last_ms = c.last_ms.max(last_ms);
            }
        }
        Ok((s, expired))
    }

    /// Every access record's last access time, in key order.
    fn access_times(&self) -> StoreResult<Vec<(KeyBytes, u64)>> {
        let mut out = Vec::new();
        self.index.scan(Tree::Access, &[], None, &mut |k, v| {
            if let Ok(kb) = KeyBytes::try_from(k) {
                out.push((kb, Access::decode(v).last_ms));
            }
            true
        })?;
        Ok(out)
    }

    /// Every entry as GC sees it, in key order, last used when created.
    fn entry_cands(&self) -> StoreResult<Vec<Cand>> {
        let mut cands = Vec::new();
        let mut err = None;
        self.index.scan(Tree::Entries, &[], None, &mut |k, v| {
            let b = match entry::decode_brief(k, v) {
                Ok(b) => b,
                Err(e) => {
                    err = Some(e);
                    return false;
                }
            };
            // A key this build cannot read (lookups ignore it too) is not
            // planned for: plans name entries by their EntryKey.
            let Some(kb) = KeyBytes::try_from(k)
                .ok()
                .filter(|kb| EntryKey::from_bytes(kb).is_ok())
            else {
                return true;
            };
            cands.push(Cand {
                kb,
                blob: b.blob(),
                len: b.payload_len,
                last_ms: b.created_ms,
                created_ms: b.created_ms,
                requested_by: b.requested_by,
            });
            true
        })?;
        match err {
            Some(e) => Err(e),
            None => Ok(cands),
        }
    }

    /// Files in tmp/ not written by this store instance.
    pub(crate) fn stale_temps(&self) -> StoreResult<Vec<(PathBuf, u64)>> {
        let tmp = &self.paths.tmp;
        let mut out = Vec::new();
        let rd = std::fs::read_dir(tmp).map_err(|e| super::StoreError::io("list", tmp, e))?;
        for e in rd {
            let e = e.map_err(|e| super::StoreError::io("list", tmp, e))?;
            if !e.file_name().to_string_lossy().starts_with(&self.session) {
                out.push((e.path(), file_len(&e.path())));
            }
        }
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(n: u8, blob: u8, len: u64, last: u64) -> Cand {
        let mut kb = [0u8; super::super::KEY_LEN];
        kb[0] = 1;
        kb[1] = n;
        Cand {
            kb,
            blob: [blob; 32],
            len,
            last_ms: last,
            created_ms: 0,
            requested_by: None,
        }
    }

    fn keys(items: &[GcItem]) -> Vec<u8> {
        items
            .iter()
            .map(|i| match &i.target {
                GcTarget::Entry(k) => k.source.bytes[0],
                GcTarget::File(_) => 0,
            })
            .collect()
    }

    #[test]
    fn budget_removes_least_recently_used_and_skips_leased() {
        let mut s = Snapshot {
            cands: vec![
                cand(1, 1, 100, 50),
                cand(2, 2, 100, 10),
                cand(3, 3, 100, 30),
                cand(4, 4, 100, 20),
            ],
            ..Default::default()
        };
        s.leased.insert(s.cands[1].kb);
        let p = GcPolicy {
            max_bytes: Some(200),
            ..Default::default()
        };
        let (items, before, after, kept) = plan(&s, &p, 100);
        assert_eq!(keys(&items), vec![4, 3]);
        assert_eq!((before, after, kept), (400, 200, 1));
        assert!(items.iter().all(|i| i.bytes_freed == 100));
    }

    #[test]
    fn a_uid_over_its_quota_loses_its_least_recently_used_first() {
        let of = |uid, c: Cand| Cand {
            requested_by: Some(uid),
            ..c
        };
        // Entry 1 (nobody's) is the oldest, yet uid 7's go first: 7 holds
        // 400 with a quota of 150, so its three least recently used not
        // leased go (5 is leased and stays); uid 8 is under its quota.
        let mut s = Snapshot {
            cands: vec![
                cand(1, 1, 100, 1),
                of(7, cand(2, 2, 100, 50)),
                of(7, cand(3, 3, 100, 20)),
                of(7, cand(4, 4, 100, 30)),
                of(7, cand(5, 5, 100, 10)),
                of(8, cand(6, 6, 100, 5)),
            ],
            ..Default::default()
        };
        s.leased.insert(s.cands[4].kb);
        let p = GcPolicy {
            max_bytes_per_uid: Some(150),
            ..Default::default()
        };
        let (items, before, after, kept) = plan(&s, &p, 100);
        assert_eq!(keys(&items), vec![3, 4, 2]);
        assert!(items
            .iter()
            .all(|i| i.reason == GcReason::OverQuota { uid: 7 }));
        assert_eq!((before, after, kept), (600, 300, 1));

        // With a size budget too, the budget takes the rest by age.
        let p = GcPolicy {
            max_bytes: Some(200),
            ..p
        };
        let (items, _, after, _) = plan(&s, &p, 100);
        assert_eq!(keys(&items), vec![3, 4, 2, 1]);
        assert_eq!(items[3].reason, GcReason::OverBudget);
        assert_eq!(after, 200);
    }

    #[test]
    fn shared_payload_frees_bytes_with_its_last_entry() {
        let s = Snapshot {
            cands: vec![cand(1, 9, 100, 1), cand(2, 9, 100, 2), cand(3, 3, 100, 3)],
            ..Default::default()
        };
        let p = GcPolicy {
            max_bytes: Some(100),
            ..Default::default()
        };
        let (items, before, after, _) = plan(&s, &p, 10);
        assert_eq!(keys(&items), vec![1, 2]);
        assert_eq!(
            items.iter().map(|i| i.bytes_freed).collect::<Vec<_>>(),
            vec![0, 100]
        );
        assert_eq!((before, after), (200, 100));
    }

    #[test]
    fn a_zero_age_takes_every_entry_like_a_zero_budget() {
        let s = Snapshot {
            cands: vec![cand(1, 1, 10, 100), cand(2, 2, 10, 40)],
            ..Default::default()
        };
        let age = GcPolicy {
            max_age: Some(Duration::ZERO),
            ..Default::default()
        };
        let size = GcPolicy {
            max_bytes: Some(0),
            ..Default::default()
        };
        // Entry 1 was used at this very millisecond: still idle "0 or longer".
        let (by_age, ..) = plan(&s, &age, 100);
        let (by_size, ..) = plan(&s, &size, 100);
        let mut a = keys(&by_age);
        let mut b = keys(&by_size);
        a.sort();
        b.sort();
        assert_eq!((a, b), (vec![1, 2], vec![1, 2]));
    }

    #[test]
    fn age_and_missing_payloads() {
        let mut s = Snapshot {
            cands: vec![cand(1, 1, 10, 0), cand(2, 2, 10, 95), cand(3, 3, 10, 0)],
            ..Default::default()
        };
        s.files = Some([[1u8; 32], [2u8; 32]].into_iter().collect());
        let p = GcPolicy {
            max_age: Some(Duration::from_millis(50)),
            ..Default::default()
        };
        let (items, ..) = plan(&s, &p, 100);
        assert_eq!(keys(&items), vec![3, 1]);
        assert_eq!(items[0].reason, GcReason::MissingPayload);
        assert_eq!(
            items[1].reason,
            GcReason::MaxAge {
                idle: Duration::from_millis(100)
            }
        );
    }
}
