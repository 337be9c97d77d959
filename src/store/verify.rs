//! Repair passes. `verify` rehashes every payload file and lists orphan
//! files (repairing only when asked); `reconcile` (cheap:
//! no hashing, run by the daemon in the background) makes files and index
//! agree: entries without files or with files of the wrong length, files
//! without entries, index records that point nowhere, expired leases and
//! stale temp files. A damaged payload's file goes to quarantine/ and all
//! entries using it are dropped (also leased ones: bad data is never served).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use super::blobs;
use super::entry;
use super::error::StoreResult;
use super::index::{Expect, Op, Precondition, Tree};
use super::key::{EntryKey, KeyBytes, KEY_LEN, SOURCE_PREFIX_LEN};
use super::lease;
use super::sources;
use super::{blob_ref_key, Store};

/// What was wrong with a payload file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Damage {
    /// The payload file does not exist.
    Missing,
    /// The payload file's length differs from the entry's.
    WrongLength {
        /// The length the entries record.
        expected: u64,
        /// The file's length.
        actual: u64,
    },
    /// The payload file's content does not hash to its name.
    WrongHash {
        /// The blake3 of the content found.
        actual: [u8; 32],
    },
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::Missing => f.write_str("payload file missing"),
            Damage::WrongLength { expected, actual } => {
                write!(f, "payload file has {actual} bytes, expected {expected}")
            }
            Damage::WrongHash { actual } => {
                write!(f, "payload file content hashes to {}", hex::encode(actual))
            }
        }
    }
}

/// One damaged payload file found by verify or reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyProblem {
    /// The file's name: the blake3 its content should have.
    pub blob: [u8; 32],
    /// What is wrong with it.
    pub damage: Damage,
    /// The entries using the file (when the problem was found).
    pub entries: Vec<EntryKey>,
    /// The entries dropped (empty when not repairing).
    pub entries_dropped: Vec<EntryKey>,
    /// Where the damaged file went (None when it was missing or not repaired).
    pub quarantined: Option<PathBuf>,
}

/// What [`Store::verify`](super::Store::verify) checked and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Whether problems were repaired (else only reported).
    pub repaired: bool,
    /// Payload files rehashed.
    pub blobs_checked: u64,
    /// Bytes rehashed.
    pub bytes_checked: u64,
    /// Every damaged file found.
    pub problems: Vec<VerifyProblem>,
    /// Payload files no entry references (removed when repairing).
    pub orphan_files: Vec<PathBuf>,
}

/// What [`Store::reconcile`](super::Store::reconcile) checked and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Index entries looked at.
    pub entries_checked: u64,
    /// Entries whose payload file is missing or of the wrong length.
    pub damaged: Vec<VerifyProblem>,
    /// Payload files no entry references, removed.
    pub orphan_files_removed: Vec<PathBuf>,
    /// Files in blobs/ that are not payload files, removed.
    pub stray_files_removed: Vec<PathBuf>,
    /// Temp files of writers that are gone, removed.
    pub temp_files_removed: Vec<PathBuf>,
    /// Missing blob-reference records re-created.
    pub refs_added: u64,
    /// Per-source key lists that missed entries or named absent ones.
    pub source_lists_fixed: u64,
    /// Index records pointing at no entry removed (blob refs, access, leases).
    pub records_removed: u64,
    /// Leases past their end, removed.
    pub expired_leases_removed: u64,
    /// Record files and index brought to agree (D13), before the rest.
    pub records: super::RecordSync,
}

impl Store {
    /// Makes every source's key list name exactly its existing entries.
    /// Each list is rewritten only if unchanged since read (a concurrent put
    /// or removal wins; the next pass looks again).
    fn reconcile_sources(&self, entries: &HashMap<KeyBytes, [u8; 32]>) -> StoreResult<u64> {
        let mut want: BTreeMap<Vec<u8>, BTreeSet<Vec<u8>>> = BTreeMap::new();
        for kb in entries.keys() {
            want.entry(sources::prefix(kb).to_vec())
                .or_default()
                .insert(sources::suffix(kb).to_vec());
        }
        self.index.scan(Tree::Sources, &[], None, &mut |k, _| {
            want.entry(k.to_vec()).or_default();
            true
        })?;
        let mut fixed = 0;
        for (prefix, expected) in want {
            let list = self.index.get(Tree::Sources, &prefix)?;
            let mut kb = [0u8; KEY_LEN];
            kb[..prefix.len().min(SOURCE_PREFIX_LEN)]
                .copy_from_slice(&prefix[..prefix.len().min(SOURCE_PREFIX_LEN)]);
            let mut keep = Vec::new();
            let candidates: BTreeSet<Vec<u8>> = sources::suffixes(list.as_deref().unwrap_or(&[]))
                .map(<[u8]>::to_vec)
                .chain(expected)
                .collect();
            for suffix in candidates {
                kb[SOURCE_PREFIX_LEN..].copy_from_slice(&suffix);
                if prefix.len() == SOURCE_PREFIX_LEN
                    && self.index.get(Tree::Entries, &kb)?.is_some()
                {
                    keep.push(suffix);
                }
            }
            let new = keep.concat();
            if list.as_deref().unwrap_or(&[]) != new.as_slice()
                && self.commit(
                    &[sources::unchanged(&prefix, &list)],
                    &[sources::store(&prefix, new)],
                )?
            {
                fixed += 1;
            }
        }
        Ok(fixed)
    }
}

fn entry_keys(kbs: &[KeyBytes]) -> StoreResult<Vec<EntryKey>> {
    kbs.iter().map(|kb| Ok(EntryKey::from_bytes(kb)?)).collect()
}

/// Referenced payloads: blob -> (length, entries using it).
type Referenced = BTreeMap<[u8; 32], (u64, Vec<KeyBytes>)>;

impl Store {
    /// Referenced payloads: blob -> (length, entries), in blob order.
    fn referenced(&self) -> StoreResult<Referenced> {
        let mut out = Referenced::new();
        let mut err = None;
        self.index.scan(Tree::Entries, &[], None, &mut |k, v| {
            match (entry::decode_brief(k, v), KeyBytes::try_from(k)) {
                (Ok(b), Ok(kb)) => out
                    .entry(b.blob())
                    .or_insert((b.payload_len, vec![]))
                    .1
                    .push(kb),
                (Err(e), _) => {
                    err = Some(e);
                    return false;
                }
                _ => {}
            }
            true
        })?;
        match err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// What is wrong with a payload file, if anything; `locked` says the
    /// caller holds the blob's stripe (then hashing stays off the pool).
    fn check_file(
        &self,
        blob: &[u8; 32],
        len: u64,
        rehash: bool,
        locked: bool,
    ) -> StoreResult<Option<Damage>> {
        let path = self.paths.blob(blob);
        let actual = match std::fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Some(Damage::Missing)),
            Err(e) => return Err(super::StoreError::io("stat", &path, e)),
        };
        if actual != len {
            return Ok(Some(Damage::WrongLength {
                expected: len,
                actual,
            }));
        }
        if !rehash {
            return Ok(None);
        }
        let (_, h) = blobs::hash_file(&path, !locked)
            .map_err(|e| super::StoreError::io("read", &path, e))?;
        Ok((h != *blob).then_some(Damage::WrongHash { actual: h }))
    }

    /// Drops every entry using `blob` and quarantines its file, after
    /// checking again under the blob's stripe that it is still damaged.
    pub(crate) fn condemn(
        &self,
        blob: &[u8; 32],
        len: u64,
        rehash: bool,
    ) -> StoreResult<Option<VerifyProblem>> {
        let _s = self.stripes.lock(blob);
        let Some(damage) = self.check_file(blob, len, rehash, true)? else {
            return Ok(None);
        };
        self.verified.remove(blob);
        let users = self.blob_users(blob)?;
        let mut dropped = Vec::new();
        for kb in &users {
            if let Some(old) = self.index.get(Tree::Entries, kb)? {
                if self.drop_entry(kb, blob, old)? {
                    dropped.push(EntryKey::from_bytes(kb)?);
                }
            }
        }
        self.make_durable()?;
        let quarantined = blobs::quarantine(&self.paths, blob, self.now())?;
        Ok(Some(VerifyProblem {
            blob: *blob,
            damage,
            entries: entry_keys(&users)?,
            entries_dropped: dropped,
            quarantined,
        }))
    }

    /// Rehashes every referenced payload file and lists the payload files
    /// no entry references. With `repair`, damaged files are quarantined
    /// and their entries dropped, and orphan files removed; without, the
    /// store is not changed.
    pub fn verify(&self, repair: bool) -> StoreResult<VerifyReport> {
        let mut r = VerifyReport {
            repaired: repair,
            ..Default::default()
        };
        let referenced = self.referenced()?;
        for (blob, (len, users)) in &referenced {
            r.blobs_checked += 1;
            match self.check_file(blob, *len, true, false)? {
                None => r.bytes_checked += len,
                Some(_) if repair => match self.condemn(blob, *len, true)? {
                    Some(p) => r.problems.push(p),
                    None => r.bytes_checked += len,
                },
                Some(damage) => r.problems.push(VerifyProblem {
                    blob: *blob,
                    damage,
                    entries: entry_keys(users)?,
                    entries_dropped: Vec::new(),
                    quarantined: None,
                }),
            }
        }
        let (files, _) = blobs::list(&self.paths)?;
        for (blob, path) in files {
            if referenced.contains_key(&blob) {
                continue;
            }
            if repair {
                // Under the stripe: a put publishing this blob right now
                // commits its entry before we could look.
                let _s = self.stripes.lock(&blob);
                if self.delete_unreferenced(&blob)?.is_some() {
                    r.orphan_files.push(path);
                }
            } else if !self.blob_referenced(&blob)? {
                r.orphan_files.push(path);
            }
        }
        Ok(r)
    }

    /// Makes files and index agree (see module docs). Safe to run while the
    /// store is in use; every repair re-checks under the right lock.
    pub fn reconcile(&self) -> StoreResult<ReconcileReport> {
        // Records first: a payload file whose entry lives only in its
        // record is indexed again here, not removed below as an orphan.
        let mut r = ReconcileReport {
            records: self.sync_records()?,
            ..Default::default()
        };
        let referenced = self.referenced()?;
        let mut entries: HashMap<KeyBytes, [u8; 32]> = HashMap::new();
        for (blob, (_, users)) in &referenced {
            for kb in users {
                entries.insert(*kb, *blob);
            }
        }
        r.entries_checked = entries.len() as u64;

        // Index consistency: every entry has its blob ref, no record points nowhere.
        r.refs_added = self.add_missing_refs(&entries)?;
        r.records_removed = self.remove_stale_refs(&entries)?;
        r.source_lists_fixed = self.reconcile_sources(&entries)?;
        r.records_removed += self.remove_stale_access(&entries)?;
        self.remove_dead_leases(&entries, &mut r)?;

        // Files against entries.
        self.reconcile_files(&referenced, &mut r)?;
        Ok(r)
    }

    /// Re-creates the blob reference of every entry that lacks one;
    /// returns how many.
    fn add_missing_refs(&self, entries: &HashMap<KeyBytes, [u8; 32]>) -> StoreResult<u64> {
        let mut added = 0;
        for (kb, blob) in entries {
            let rk = blob_ref_key(blob, kb);
            if self.index.get(Tree::BlobRefs, &rk)?.is_none() {
                let Some(v) = self.index.get(Tree::Entries, kb)? else {
                    continue;
                };
                if entry::decode_brief(kb, &v)?.blob() == *blob
                    && self.commit(
                        &[Precondition::new(Tree::Entries, kb, Expect::Equals(v))],
                        &[Op::Put(Tree::BlobRefs, rk, Vec::new())],
                    )?
                {
                    added += 1;
                }
            }
        }
        Ok(added)
    }

    /// Removes the blob references naming no entry, or another payload
    /// than the entry's; returns how many.
    fn remove_stale_refs(&self, entries: &HashMap<KeyBytes, [u8; 32]>) -> StoreResult<u64> {
        let mut stale_refs = Vec::new();
        self.index.scan(Tree::BlobRefs, &[], None, &mut |k, _| {
            let ok = k.len() == 32 + KEY_LEN
                && KeyBytes::try_from(&k[32..])
                    .ok()
                    .and_then(|kb| entries.get(&kb))
                    .is_some_and(|b| b[..] == k[..32]);
            if !ok {
                stale_refs.push(k.to_vec());
            }
            true
        })?;
        let mut removed = 0;
        for rk in stale_refs {
            // Re-read: the entry may have been put since the walk.
            let kb = rk.get(32..).unwrap_or(&[]);
            let live = match self.index.get(Tree::Entries, kb)? {
                Some(v) => entry::decode_brief(kb, &v)
                    .map(|b| b.blob()[..] == rk[..32])
                    .unwrap_or(false),
                None => false,
            };
            let when = match self.index.get(Tree::Entries, kb)? {
                Some(v) if !live => vec![Precondition::new(Tree::Entries, kb, Expect::Equals(v))],
                None => vec![Precondition::new(Tree::Entries, kb, Expect::Absent)],
                Some(_) => continue,
            };
            if self
                .index
                .commit(&when, &[Op::Delete(Tree::BlobRefs, rk)])?
            {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes the access records of entries that do not exist; returns
    /// how many.
    fn remove_stale_access(&self, entries: &HashMap<KeyBytes, [u8; 32]>) -> StoreResult<u64> {
        let mut stale_access = Vec::new();
        self.index.scan(Tree::Access, &[], None, &mut |k, _| {
            if KeyBytes::try_from(k)
                .map(|kb| !entries.contains_key(&kb))
                .unwrap_or(true)
            {
                stale_access.push(k.to_vec());
            }
            true
        })?;
        let mut removed = 0;
        for k in stale_access {
            if self.commit(
                &[Precondition::new(Tree::Entries, &k, Expect::Absent)],
                &[Op::Delete(Tree::Access, k.clone())],
            )? {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes, under the lease gate, the lease records past their end and
    /// those of entries that do not exist, and forgets them in the book.
    fn remove_dead_leases(
        &self,
        entries: &HashMap<KeyBytes, [u8; 32]>,
        r: &mut ReconcileReport,
    ) -> StoreResult<()> {
        let mut gate = self.lease_gate()?;
        let now = self.now();
        let mut ops = Vec::new();
        self.index.scan(Tree::Leases, &[], None, &mut |k, v| {
            match lease::decode(k, v) {
                Some(l) if l.expires_ms > now => {
                    if !entries.contains_key(&l.key.to_bytes()) {
                        r.records_removed += 1;
                        ops.push(Op::Delete(Tree::Leases, k.to_vec()));
                    }
                }
                _ => {
                    r.expired_leases_removed += 1;
                    ops.push(Op::Delete(Tree::Leases, k.to_vec()));
                }
            }
            true
        })?;
        self.commit(&[], &ops)?;
        // Every record the book knows as dead was expired by `now`.
        gate.take_dead();
        for op in &ops {
            if let Op::Delete(_, id) = op {
                gate.forget(id);
            }
        }
        Ok(())
    }

    /// Condemns the payload files missing or of the wrong length, and
    /// removes orphan and stray files in blobs/ and stale temp files.
    fn reconcile_files(&self, referenced: &Referenced, r: &mut ReconcileReport) -> StoreResult<()> {
        for (blob, (len, _)) in referenced {
            if self.check_file(blob, *len, false, false)?.is_some() {
                if let Some(p) = self.condemn(blob, *len, false)? {
                    r.damaged.push(p);
                }
            }
        }
        let (good, stray) = blobs::list(&self.paths)?;
        for (blob, path) in good {
            if referenced.contains_key(&blob) {
                continue;
            }
            let _s = self.stripes.lock(&blob);
            if self.delete_unreferenced(&blob)?.is_some() {
                r.orphan_files_removed.push(path);
            }
        }
        for path in stray {
            if let Ok(Some(_)) = blobs::delete_path(&path) {
                r.stray_files_removed.push(path);
            }
        }
        for (path, _) in self.stale_temps()? {
            if let Ok(Some(_)) = blobs::delete_path(&path) {
                r.temp_files_removed.push(path);
            }
        }
        Ok(())
    }
}
