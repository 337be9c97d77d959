//! What a collection is planned from: one walk of the index (entries and
//! access times, walked in parallel) and one listing of blobs/ and tmp/.

use std::collections::HashSet;
use std::path::PathBuf;

use super::plan::{Cand, Snapshot};
use super::GcPolicy;
use crate::store::blobs;
use crate::store::entry::{self, Access};
use crate::store::error::{StoreError, StoreResult};
use crate::store::index::Tree;
use crate::store::key::{EntryKey, KeyBytes};
use crate::store::Store;

fn file_len(p: &std::path::Path) -> u64 {
    std::fs::symlink_metadata(p).map(|m| m.len()).unwrap_or(0)
}

impl Store {
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
        let rd = std::fs::read_dir(tmp).map_err(|e| StoreError::io("list", tmp, e))?;
        for e in rd {
            let e = e.map_err(|e| StoreError::io("list", tmp, e))?;
            if !e.file_name().to_string_lossy().starts_with(&self.session) {
                out.push((e.path(), file_len(&e.path())));
            }
        }
        out.sort();
        Ok(out)
    }
}
