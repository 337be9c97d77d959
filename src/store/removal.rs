//! Removing entries: the commits that drop them, and the deletion of a
//! payload file once the drop of its last reference is durable.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use super::error::{StoreError, StoreResult};
use super::index::{Expect, Op, Precondition, Tree};
use super::key::{EntryKey, KeyBytes};
use super::{blob_ref_key, blobs, entry, rebuild, records, sources, Store};

impl Store {
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
    /// stripe. Returns what the unlink did (`None`: kept, or already gone).
    pub(crate) fn delete_unreferenced(
        &self,
        blob: &[u8; 32],
    ) -> StoreResult<Option<blobs::Unlinked>> {
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
}
