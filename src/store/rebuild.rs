//! Keeping the index a view of the record files (D13): after a crash, after
//! a damaged index was set aside, and in every reconcile, records the index
//! lacks are indexed again and index entries without a record get theirs
//! written again (see `records.rs` for why that direction is the safe one).

use std::collections::{BTreeMap, HashSet};

use super::entry::{self, Access};
use super::error::StoreResult;
use super::index::{Expect, Op, Precondition, Tree};
use super::key::KeyBytes;
use super::records::{self, Found};
use super::{blob_ref_key, blobs, sources, Store};

/// Records indexed per commit when many are (a rebuild).
const ADOPT_BATCH: usize = 512;

/// What a record sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordSync {
    /// Records the index lacked, indexed again (their entries are back).
    pub indexed: u64,
    /// Index entries whose record file was missing or damaged, written again.
    pub rewritten: u64,
    /// Records dropped: their payload file is gone or of the wrong length,
    /// or the file is not a whole record.
    pub dropped: u64,
    /// Files in records/ that are not record files, removed.
    pub stray_removed: u64,
}

/// A per-source key list as read (for the commit's precondition) and as
/// it will be written.
type ListEdit = (Option<Vec<u8>>, Vec<u8>);

/// How soon a record write must be durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durable {
    /// Before the call returns (a put, before its index commit).
    Now,
    /// At the end of a pass that writes many (one file system sync).
    Later,
}

impl Store {
    /// Writes the record of `kb`.
    pub(crate) fn write_record(&self, kb: &KeyBytes, record: &[u8], d: Durable) -> StoreResult<()> {
        let tmp = self.temp_path("rec");
        let fsync = self.opts.fsync && d == Durable::Now;
        records::write(&self.paths, &tmp, kb, record, fsync)
    }

    /// Makes the record file of `kb` match the index (caller holds no
    /// stripe): written from the index's record when the entry exists,
    /// removed when it does not.
    pub(crate) fn restore_record(&self, kb: &KeyBytes) -> StoreResult<()> {
        for _ in 0..4 {
            let Some(v) = self.index.get(Tree::Entries, kb)? else {
                return records::remove(&self.paths, kb);
            };
            let blob = entry::decode_brief(kb, &v)?.blob();
            let _stripe = self.stripes.lock(&blob);
            if self.index.get(Tree::Entries, kb)?.as_deref() == Some(v.as_slice()) {
                return self.write_record(kb, &v, Durable::Now);
            }
        }
        // The entry keeps changing: the next reconcile looks again.
        Ok(())
    }

    /// After the index was opened again following a failed write (a full
    /// disk), its unwritten commits lost: brings it and the record files to
    /// agree before the next change or read (so an acknowledged entry is
    /// never reported missing).
    pub(crate) fn resync_if_reopened(&self) -> StoreResult<()> {
        self.index.reopen_if_due();
        if self.index.take_reopened() {
            if let Err(e) = self.sync_records() {
                self.index.still_reopened();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Makes index and record files agree (see the module comment).
    /// Concurrent puts and removals are safe: each record is judged under
    /// its payload's stripe, which they hold from record to commit.
    pub(crate) fn sync_records(&self) -> StoreResult<RecordSync> {
        let mut r = RecordSync::default();
        let (keys, stray) = records::list(&self.paths)?;
        for p in stray {
            if blobs::delete_path(&p)?.is_some() {
                r.stray_removed += 1;
            }
        }
        let mut batch = Vec::new();
        for kb in &keys {
            if self.index.get(Tree::Entries, kb)?.is_some() {
                continue;
            }
            match records::read(&self.paths, kb)? {
                Found::Record(rec) => match entry::decode_brief(kb, &rec) {
                    Ok(b) if blobs::present(&self.paths, &b.blob(), b.payload_len) => {
                        batch.push((*kb, b.blob(), rec));
                        if batch.len() >= ADOPT_BATCH {
                            r.indexed += self.adopt(std::mem::take(&mut batch))?;
                        }
                    }
                    _ => r.dropped += self.drop_orphan_record(kb)?,
                },
                Found::Damaged => r.dropped += self.drop_orphan_record(kb)?,
                Found::Missing => {}
            }
        }
        r.indexed += self.adopt(batch)?;
        r.rewritten = self.rewrite_missing_records(&keys.into_iter().collect())?;
        if r.rewritten > 0 && self.opts.fsync {
            records::sync_all(&self.paths)?;
        }
        Ok(r)
    }

    /// Removes a record that cannot be indexed, unless its entry appeared
    /// meanwhile. Returns 1 when removed.
    fn drop_orphan_record(&self, kb: &KeyBytes) -> StoreResult<u64> {
        if self.index.get(Tree::Entries, kb)?.is_some() {
            return Ok(0);
        }
        records::remove(&self.paths, kb)?;
        // A put of this key may have written its record since we looked:
        // then the entry is there now and keeps a record.
        if self.index.get(Tree::Entries, kb)?.is_some() {
            self.restore_record(kb)?;
            return Ok(0);
        }
        Ok(1)
    }

    /// Writes the records of index entries that have none (or a damaged
    /// one); `on_disk` holds the keys listed in records/.
    fn rewrite_missing_records(&self, on_disk: &HashSet<KeyBytes>) -> StoreResult<u64> {
        let mut missing = Vec::new();
        self.index.scan(Tree::Entries, &[], None, &mut |k, _| {
            if let Ok(kb) = KeyBytes::try_from(k) {
                if !on_disk.contains(&kb) {
                    missing.push(kb);
                }
            }
            true
        })?;
        let mut n = 0;
        for kb in missing {
            let Some(v) = self.index.get(Tree::Entries, &kb)? else {
                continue;
            };
            let Ok(blob) = entry::decode_brief(&kb, &v).map(|b| b.blob()) else {
                continue;
            };
            let _stripe = self.stripes.lock(&blob);
            let still = self.index.get(Tree::Entries, &kb)?.as_deref() == Some(v.as_slice());
            // A removal in flight unlinked the record under this stripe;
            // it commits before releasing it, so `still` is false then.
            if still && matches!(records::read(&self.paths, &kb)?, Found::Missing) {
                self.write_record(&kb, &v, Durable::Later)?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Indexes records whose payload files are present: entry, blob
    /// reference, access (now: a rebuilt entry counts as just used) and
    /// the source lists, under the payloads' stripes. Returns how many
    /// were indexed.
    fn adopt(&self, batch: Vec<(KeyBytes, [u8; 32], Vec<u8>)>) -> StoreResult<u64> {
        if batch.is_empty() {
            return Ok(0);
        }
        let blobs: Vec<[u8; 32]> = batch.iter().map(|b| b.1).collect();
        let _stripes = self.stripes.lock_many(&blobs);
        let access = Access {
            last_ms: self.now(),
            count: 0,
        }
        .encode();
        let mut when = Vec::new();
        let mut ops = Vec::new();
        let mut lists: BTreeMap<Vec<u8>, ListEdit> = BTreeMap::new();
        let mut n = 0;
        for (kb, blob, rec) in &batch {
            // Judged again under the stripe: a removal in flight has
            // unlinked the record by now, a put has committed.
            if self.index.get(Tree::Entries, kb)?.is_some()
                || !records::path(&self.paths, kb).exists()
            {
                continue;
            }
            when.push(Precondition::new(Tree::Entries, kb, Expect::Absent));
            ops.push(Op::Put(Tree::Entries, kb.to_vec(), rec.clone()));
            ops.push(Op::Put(Tree::BlobRefs, blob_ref_key(blob, kb), Vec::new()));
            ops.push(Op::Put(Tree::Access, kb.to_vec(), access.clone()));
            let prefix = sources::prefix(kb).to_vec();
            if !lists.contains_key(&prefix) {
                let old = self.index.get(Tree::Sources, &prefix)?;
                let cur = old.clone().unwrap_or_default();
                lists.insert(prefix.clone(), (old, cur));
            }
            let (_, cur) = lists.get_mut(&prefix).expect("inserted above");
            *cur = sources::with(cur, sources::suffix(kb));
            n += 1;
        }
        for (prefix, (old, new)) in lists {
            when.push(sources::unchanged(&prefix, &old));
            ops.push(sources::store(&prefix, new));
        }
        if n == 0 {
            return Ok(0);
        }
        if self.commit(&when, &ops)? {
            return Ok(n);
        }
        // Something changed under us (only concurrent work outside the
        // stripes can: another source of the same list): one at a time.
        drop(_stripes);
        if batch.len() == 1 {
            return Ok(0);
        }
        let mut n = 0;
        for item in batch {
            n += self.adopt(vec![item])?;
        }
        Ok(n)
    }
}
