//! The [`Index`] on sled 0.34: one sled `Db` under `<cache>/index/`, one sled
//! tree per [`Tree`]. The only module that names sled.
//!
//! Flush policy: sled keeps recent writes in memory and writes its log in
//! the background every `StoreOptions::flush_every` (default 500 ms); the
//! store also flushes explicitly before it deletes any payload file (removal,
//! GC, verify), after each put with `durable_puts`, and on drop. sled
//! recovers a prefix of its log, and every commit is one atomic transaction,
//! so a crash loses at most the commits of the last flush window and never
//! tears one. Because payload files are published before their entry is
//! committed, and deleted only after the removal is flushed, a recovered
//! entry always points at a complete file; the crash window leaves at most
//! orphan files, which reconcile/GC remove. Rarely (seen in the crash-loop
//! test) a kill leaves a log sled reports as corrupt at the next open; the
//! store then sets the index aside and starts empty (`Store::open`).
//!
//! Observed cost (sled 0.34): every transaction or batch rolls sled's log
//! buffer and writes it with `sync_file_range`, a few hundred microseconds
//! to milliseconds on a VM disk. Hence the store commits a whole GC batch,
//! and a whole access-statistics batch, as one transaction. sled range scans
//! clone an index node per scan, hence point reads on the lookup path.

use std::ops::Bound;
use std::path::Path;

use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

use super::error::{StoreError, StoreResult};
use super::index::{Expect, Index, Op, Precondition, Tree};
use super::options::StoreOptions;

pub(crate) struct SledIndex {
    db: sled::Db,
    trees: [sled::Tree; 7],
}

fn err(op: &'static str) -> impl FnOnce(sled::Error) -> StoreError {
    move |e| StoreError::Index {
        op,
        message: e.to_string(),
    }
}

fn slot(t: Tree) -> usize {
    match t {
        Tree::Entries => 0,
        Tree::BlobRefs => 1,
        Tree::Access => 2,
        Tree::Leases => 3,
        Tree::Sources => 4,
        Tree::Memo => 5,
        Tree::Counters => 6,
    }
}

impl SledIndex {
    pub(crate) fn open(path: &Path, opts: &StoreOptions) -> StoreResult<SledIndex> {
        let config = sled::Config::new()
            .path(path)
            .cache_capacity(opts.index_cache_bytes)
            .flush_every_ms(opts.flush_every.map(|d| d.as_millis().max(1) as u64));
        // The caller holds the store's LOCK, so a busy sled lock belongs to
        // a store of this process that was just dropped: sled releases it
        // only when its flusher thread ends, shortly after. Wait for that.
        let started = std::time::Instant::now();
        let db = loop {
            match config.open() {
                // sled 0.34 reports a busy lock only in the message of an
                // `Other` error ("could not acquire lock on ...").
                Err(sled::Error::Io(e))
                    if e.to_string().starts_with("could not acquire lock")
                        && started.elapsed() < std::time::Duration::from_secs(10) =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                Err(e) if is_damage(&e) => {
                    return Err(StoreError::IndexCorrupt {
                        path: path.to_path_buf(),
                        detail: e.to_string(),
                    })
                }
                r => break r.map_err(err("open"))?,
            }
        };
        let open_tree = |t: Tree| {
            db.open_tree(t.name()).map_err(|e| {
                if is_damage(&e) {
                    StoreError::IndexCorrupt {
                        path: path.to_path_buf(),
                        detail: e.to_string(),
                    }
                } else {
                    err("open tree")(e)
                }
            })
        };
        let trees = [
            open_tree(Tree::Entries)?,
            open_tree(Tree::BlobRefs)?,
            open_tree(Tree::Access)?,
            open_tree(Tree::Leases)?,
            open_tree(Tree::Sources)?,
            open_tree(Tree::Memo)?,
            open_tree(Tree::Counters)?,
        ];
        Ok(SledIndex { db, trees })
    }

    /// Whether the index was opened from files (false: created empty).
    pub(crate) fn recovered(&self) -> bool {
        self.db.was_recovered()
    }

    fn tree(&self, t: Tree) -> &sled::Tree {
        &self.trees[slot(t)]
    }
}

/// Whether an open failed on the index's files rather than on the system
/// (permissions, descriptors): damaged files are set aside and rebuilt, a
/// system problem is reported as it is.
fn is_damage(e: &sled::Error) -> bool {
    use std::io::ErrorKind;
    match e {
        sled::Error::Corruption { .. }
        | sled::Error::Unsupported(_)
        | sled::Error::ReportableBug(_)
        | sled::Error::CollectionNotFound(_) => true,
        sled::Error::Io(e) => matches!(
            e.kind(),
            ErrorKind::InvalidData
                | ErrorKind::UnexpectedEof
                | ErrorKind::InvalidInput
                // index/ (or a file sled expects) is something else
                | ErrorKind::NotADirectory
                | ErrorKind::IsADirectory
        ),
    }
}

impl Index for SledIndex {
    fn get(&self, tree: Tree, key: &[u8]) -> StoreResult<Option<Vec<u8>>> {
        Ok(self
            .tree(tree)
            .get(key)
            .map_err(err("get"))?
            .map(|v| v.to_vec()))
    }

    fn scan(
        &self,
        tree: Tree,
        prefix: &[u8],
        after: Option<&[u8]>,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> StoreResult<()> {
        let t = self.tree(tree);
        let iter = match after {
            Some(a) if a >= prefix => t.range::<&[u8], _>((Bound::Excluded(a), Bound::Unbounded)),
            _ => t.scan_prefix(prefix),
        };
        for kv in iter {
            let (k, v) = kv.map_err(err("scan"))?;
            if !k.starts_with(prefix) || !visit(&k, &v) {
                break;
            }
        }
        Ok(())
    }

    fn commit(&self, when: &[Precondition], ops: &[Op]) -> StoreResult<bool> {
        let single_tree = match ops.first() {
            Some(Op::Put(t, ..)) | Some(Op::Delete(t, _)) => Some(*t),
            None => return Ok(when.is_empty()),
        };
        let single_tree = single_tree.filter(|t| {
            when.is_empty()
                && ops.iter().all(|o| match o {
                    Op::Put(u, ..) | Op::Delete(u, _) => u == t,
                })
        });
        if let Some(t) = single_tree {
            // Unconditional writes to one tree: a batch is atomic and cheaper
            // than a transaction.
            let mut b = sled::Batch::default();
            for o in ops {
                match o {
                    Op::Put(_, k, v) => b.insert(k.as_slice(), v.as_slice()),
                    Op::Delete(_, k) => b.remove(k.as_slice()),
                }
            }
            self.tree(t).apply_batch(b).map_err(err("commit"))?;
            return Ok(true);
        }
        let [a, b, c, d, e, f, g] = &self.trees;
        let result = (a, b, c, d, e, f, g).transaction(|(a, b, c, d, e, f, g)| {
            let txs = [a, b, c, d, e, f, g];
            for p in when {
                let cur = txs[slot(p.tree)].get(&p.key)?;
                let ok = match (&p.expect, &cur) {
                    (Expect::Absent, None) | (Expect::Present, Some(_)) => true,
                    (Expect::Equals(want), Some(v)) => v.as_ref() == want.as_slice(),
                    _ => false,
                };
                if !ok {
                    return Err(ConflictableTransactionError::Abort(()));
                }
            }
            for o in ops {
                match o {
                    Op::Put(t, k, v) => {
                        txs[slot(*t)].insert(k.as_slice(), v.as_slice())?;
                    }
                    Op::Delete(t, k) => {
                        txs[slot(*t)].remove(k.as_slice())?;
                    }
                }
            }
            Ok(())
        });
        match result {
            Ok(()) => Ok(true),
            Err(TransactionError::Abort(())) => Ok(false),
            Err(TransactionError::Storage(e)) => Err(err("commit")(e)),
        }
    }

    fn next_id(&self) -> StoreResult<u64> {
        self.db.generate_id().map_err(err("generate id"))
    }

    fn flush(&self) -> StoreResult<()> {
        self.db.flush().map_err(err("flush"))?;
        Ok(())
    }

    fn disk_bytes(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> (tempfile::TempDir, SledIndex) {
        let d = tempfile::tempdir().unwrap();
        let i = SledIndex::open(&d.path().join("index"), &StoreOptions::default()).unwrap();
        (d, i)
    }

    #[test]
    fn conditional_commit_and_scan() {
        let (_d, i) = open();
        let put = |k: &[u8]| Op::Put(Tree::Entries, k.to_vec(), b"v".to_vec());
        let absent = |k: &[u8]| Precondition::new(Tree::Entries, k, Expect::Absent);
        assert!(i.commit(&[absent(b"a1")], &[put(b"a1")]).unwrap());
        assert!(!i.commit(&[absent(b"a1")], &[put(b"a1")]).unwrap());
        assert!(i.commit(&[], &[put(b"a2"), put(b"b1")]).unwrap());
        let eq = Precondition::new(Tree::Entries, b"a2", Expect::Equals(b"v".to_vec()));
        assert!(i
            .commit(
                &[eq],
                &[
                    Op::Delete(Tree::Entries, b"a2".to_vec()),
                    Op::Put(Tree::Access, b"a2".to_vec(), b"x".to_vec())
                ]
            )
            .unwrap());
        let mut seen = Vec::new();
        i.scan(Tree::Entries, b"a", None, &mut |k, _| {
            seen.push(k.to_vec());
            true
        })
        .unwrap();
        assert_eq!(seen, vec![b"a1".to_vec()]);
        seen.clear();
        i.scan(Tree::Entries, b"", Some(b"a1"), &mut |k, _| {
            seen.push(k.to_vec());
            true
        })
        .unwrap();
        assert_eq!(seen, vec![b"b1".to_vec()]);
        assert_eq!(i.get(Tree::Access, b"a2").unwrap(), Some(b"x".to_vec()));
        assert!(i.next_id().unwrap() < i.next_id().unwrap());
        i.flush().unwrap();
    }

    #[test]
    fn open_waits_for_a_lock_released_shortly_after() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("index");
        // Another handle of this process holds sled's lock for a while, as
        // a just-dropped store's flusher thread does.
        let held = sled::open(&path).unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(held);
        });
        let i = SledIndex::open(&path, &StoreOptions::default()).expect("waited for the lock");
        assert!(i.next_id().is_ok());
        release.join().unwrap();
    }
}
