//! Garbage collection: a size budget (least recently used first), a maximum
//! idle age, orphans (payload files without entries, entries without payload
//! files), stale temp files, and expired lease records.
//!
//! GC first *plans* from one walk of the index (entries and access times,
//! walked in parallel) and one listing of blobs/ and tmp/ (`gc/snapshot.rs`;
//! the plan, `gc/plan.rs`, is a pure function of what it saw, so a dry run
//! reports exactly what a real run on the same state does), then *executes*
//! the plan (here) in batches of `gc_batch` entries.
//! Each batch takes the lease gate, checks the live leases (an entry leased
//! since the plan is kept), reads each record once (it describes the entry
//! in the report and is what the removal's precondition compares against),
//! commits the removals, flushes the index, and
//! only then unlinks the payload files that lost their last reference: on
//! threads of their own, while the next batch commits (a commit is index
//! work on one core, an unlink mostly waits for the file system). Lookups
//! only ever wait for one index commit, never for a batch. **A leased entry
//! is never removed.**

mod plan;
mod report;
mod snapshot;

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use super::blobs;
use super::entry;
use super::error::{StoreError, StoreResult};
use super::index::{Op, Tree};
use super::Store;
use plan::plan;
pub use report::{EntryAbout, GcItem, GcPolicy, GcReason, GcReport, GcTarget};

/// Threads unlinking payload files during a GC run. An unlink is mostly a
/// wait for the file system (inode eviction, block freeing, discard), not
/// CPU: on a 2-core VM with ext4 `-o discard`, 10k unlinks take 6 s on one
/// thread, 2.3 s on two and 1.5 s on eight.
const UNLINKERS: usize = 8;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
                    let Some(blob) = name.as_deref().and_then(|n| self.paths.names.parse(n)) else {
                        continue;
                    };
                    let _s = self.stripes.lock(&blob);
                    self.delete_unreferenced(&blob)?
                }
                _ => blobs::delete_path(path)?,
            };
            // Gone already (another collector or a remove got there first).
            let Some(gone) = freed else {
                continue;
            };
            report.items.push(GcItem {
                bytes_freed: gone.freed,
                bytes_still_linked: gone.still_linked,
                ..item
            });
        }
        report.bytes_freed = report.items.iter().map(|i| i.bytes_freed).sum();
        report.bytes_still_linked = report.items.iter().map(|i| i.bytes_still_linked).sum();
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
        let freed: Mutex<HashMap<[u8; 32], blobs::Unlinked>> = Mutex::new(HashMap::new());
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
                        Ok(gone) => {
                            let gone = gone.unwrap_or_default();
                            let mut freed = lock(&freed);
                            let b = freed.entry(blob).or_default();
                            b.freed = b.freed.max(gone.freed);
                            b.still_linked = b.still_linked.max(gone.still_linked);
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
            let gone = match seen.insert(blob) {
                true => freed.get(&blob).copied().unwrap_or_default(),
                false => blobs::Unlinked::default(),
            };
            out.push(GcItem {
                bytes_freed: gone.freed,
                bytes_still_linked: gone.still_linked,
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
}
