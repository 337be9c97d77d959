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
//! store then sets the index aside and rebuilds it from the record files
//! (`Store::open`).
//!
//! After a write error (a full disk) sled 0.34 fails every later operation
//! of that `Db`, even once space is back. So a failed I/O marks the index
//! failed; reads go on from the old `Db`, and the next write (at most every
//! [`RETRY_EVERY`], once the file system has room) opens it again from its
//! files; commits the old `Db` had not written are lost, and
//! [`Index::take_reopened`] tells the store to bring index and record
//! files to agree again.
//!
//! A lost wake-up in sled 0.34: when a log write fails (a full disk), one
//! of sled's paths records the error without waking the threads that wait
//! for that write to be stable (`flush`). They sleep until a later log
//! reservation sees the error and wakes them, and meanwhile hold sled's
//! process-wide concurrency lock as readers, so a transaction queued behind
//! them (a writer of that lock) waits forever, and every reader behind it,
//! in every `Db` of the process. Hence [`SledIndex::wait_stable`]: no commit
//! of any index starts while a flush waits, and a waker reserves log space
//! every [`WAKE_EVERY`] until the flush returns.
//!
//! Observed cost (sled 0.34): every transaction or batch rolls sled's log
//! buffer and writes it with `sync_file_range`, a few hundred microseconds
//! to milliseconds on a VM disk. Hence the store commits a whole GC batch,
//! and a whole access-statistics batch, as one transaction. sled range scans
//! clone an index node per scan, hence point reads on the lookup path.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

use super::error::{StoreError, StoreResult};
use super::index::{Expect, Index, Op, Precondition, Tree};
use super::options::{Clock, StoreOptions};

/// How often a failed index is opened again while it keeps failing.
const RETRY_EVERY: Duration = Duration::from_millis(200);
/// Free bytes the file system needs before a failed index is opened again
/// (sled writes as it opens; on a full disk the old `Db` still serves reads).
const REOPEN_NEEDS: u64 = 4 << 20;
/// How often a waiting flush is woken to look for a failed write.
const WAKE_EVERY: Duration = Duration::from_millis(50);
/// The key a waker writes in the default tree (no store data lives there).
const WAKE_KEY: &[u8] = b"ctcache.wake";

/// Commits hold it shared, waits for the log exclusively (one per process,
/// as sled's concurrency lock is).
static WAITS: RwLock<()> = RwLock::new(());

pub(crate) struct SledIndex {
    path: PathBuf,
    config: sled::Config,
    /// `None` between a failed reopen and the next one.
    open: RwLock<Option<Arc<Open>>>,
    /// Set by a failed I/O; what to answer until a reopen succeeds.
    failed: Mutex<Option<Failed>>,
    is_failed: AtomicBool,
    reopened: AtomicBool,
    /// The store's clock: when a reopen was last tried.
    clock: Clock,
    /// Tests: the open `Db` fails every write for space until reopened, as
    /// sled does after a background flush failed on a full disk.
    #[cfg(test)]
    db_failed_for_space: AtomicBool,
}

/// One opened sled `Db` and its trees.
struct Open {
    db: sled::Db,
    trees: [sled::Tree; 7],
}

struct Failed {
    error: StoreError,
    /// The store's clock (unix ms) at the last reopen tried.
    last_try: Option<u64>,
}

/// The same error again (the store's errors are not `Clone`: they may
/// hold an I/O error).
fn again(e: &StoreError) -> StoreError {
    match e {
        StoreError::IndexNoSpace { op } => StoreError::IndexNoSpace { op },
        other => StoreError::Index {
            op: "reopen",
            message: other.to_string(),
        },
    }
}

fn err(op: &'static str) -> impl FnOnce(sled::Error) -> StoreError {
    move |e| match &e {
        sled::Error::Io(io) if super::error::io_is_no_space(io) => StoreError::IndexNoSpace { op },
        _ => StoreError::Index {
            op,
            message: e.to_string(),
        },
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
        let open = Open::new(path, &config)?;
        Ok(SledIndex {
            path: path.to_path_buf(),
            config,
            open: RwLock::new(Some(Arc::new(open))),
            failed: Mutex::new(None),
            is_failed: AtomicBool::new(false),
            reopened: AtomicBool::new(false),
            clock: opts.clock.clone(),
            #[cfg(test)]
            db_failed_for_space: AtomicBool::new(false),
        })
    }

    /// Whether the index was opened from files (false: created empty).
    pub(crate) fn recovered(&self) -> bool {
        self.current().is_ok_and(|o| o.db.was_recovered())
    }

    /// The open `Db` for reads: a failed one still reads.
    fn current(&self) -> StoreResult<Arc<Open>> {
        if let Some(o) = &*self.open.read().unwrap_or_else(|p| p.into_inner()) {
            return Ok(o.clone());
        }
        self.reopen()?;
        self.current_or_closed()
    }

    /// The open `Db` for writes, opened again first if an I/O failed.
    fn writable(&self) -> StoreResult<Arc<Open>> {
        if self.is_failed.load(Ordering::SeqCst) {
            self.reopen()?;
        }
        self.current_or_closed()
    }

    fn current_or_closed(&self) -> StoreResult<Arc<Open>> {
        let open = self.open.read().unwrap_or_else(|p| p.into_inner());
        open.clone().ok_or_else(|| StoreError::Index {
            op: "reopen",
            message: "the index is not open".into(),
        })
    }

    fn has_room(&self) -> bool {
        rustix::fs::statvfs(&self.path).map_or(true, |s| {
            s.f_bavail.saturating_mul(s.f_frsize) >= REOPEN_NEEDS
        })
    }

    fn reopen(&self) -> StoreResult<()> {
        let mut open = self.open.write().unwrap_or_else(|p| p.into_inner());
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        let Some(f) = failed.as_mut() else {
            return Ok(()); // another thread reopened it
        };
        let room = self.has_room();
        // A disk that was full and has room again is tried at once: the
        // write that finds the space back must not fail for the throttle.
        let space_back = room && matches!(f.error, StoreError::IndexNoSpace { .. });
        let now = self.clock.now_ms();
        let too_soon = f
            .last_try
            .is_some_and(|t| now.saturating_sub(t) < RETRY_EVERY.as_millis() as u64)
            && !space_back;
        if too_soon || (open.is_some() && !room) {
            return Err(again(&f.error));
        }
        f.last_try = Some(now);
        // The old Db's lock is released once every user of it is done.
        *open = None;
        match Open::new(&self.path, &self.config) {
            Ok(o) => {
                #[cfg(test)]
                self.db_failed_for_space.store(false, Ordering::SeqCst);
                *open = Some(Arc::new(o));
                *failed = None;
                self.is_failed.store(false, Ordering::SeqCst);
                self.reopened.store(true, Ordering::SeqCst);
                Ok(())
            }
            Err(e) => {
                let answer = again(&e);
                f.error = e;
                Err(answer)
            }
        }
    }

    /// Flushes `open` and waits until its log is stable, with no commit
    /// started meanwhile and a waker for a lost wake-up (module docs).
    fn wait_stable(open: &Open) -> sled::Result<usize> {
        let _no_commits = WAITS.write().unwrap_or_else(|p| p.into_inner());
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let waker = s.spawn(|| {
                while !done.load(Ordering::SeqCst) {
                    std::thread::park_timeout(WAKE_EVERY);
                    if !done.load(Ordering::SeqCst) {
                        // A reservation that finds the log failed wakes
                        // every waiter; its own result does not matter.
                        let _ = open.db.insert(WAKE_KEY, &[][..]);
                    }
                }
            });
            let flushed = open.db.flush();
            done.store(true, Ordering::SeqCst);
            waker.thread().unpark();
            flushed
        })
    }

    /// Maps a sled error of `op`; an I/O error marks the index failed.
    fn fail(&self, op: &'static str) -> impl FnOnce(sled::Error) -> StoreError + '_ {
        move |e| {
            let io = matches!(e, sled::Error::Io(_));
            let error = err(op)(e);
            if io {
                let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
                if failed.is_none() {
                    *failed = Some(Failed {
                        error: again(&error),
                        last_try: None,
                    });
                }
                self.is_failed.store(true, Ordering::SeqCst);
            }
            error
        }
    }

    /// One try of [`Index::commit`].
    fn commit_once(&self, when: &[Precondition], ops: &[Op]) -> StoreResult<bool> {
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
        let open = self.writable()?;
        let _no_wait = WAITS.read().unwrap_or_else(|p| p.into_inner());
        #[cfg(test)]
        if self.db_failed_for_space.load(Ordering::SeqCst) {
            let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
            return Err(self.fail("commit")(sled::Error::Io(full)));
        }
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
            open.tree(t).apply_batch(b).map_err(self.fail("commit"))?;
            return Ok(true);
        }
        let [a, b, c, d, e, f, g] = &open.trees;
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
            Err(TransactionError::Storage(e)) => Err(self.fail("commit")(e)),
        }
    }
}

impl Open {
    fn new(path: &Path, config: &sled::Config) -> StoreResult<Open> {
        // The caller holds the store's LOCK, so a busy sled lock belongs to
        // a Db of this process that was just dropped: sled releases it only
        // when its flusher thread ends, shortly after. Wait for that.
        let started = Instant::now();
        let db = loop {
            match config.open() {
                // sled 0.34 reports a busy lock only in the message of an
                // `Other` error ("could not acquire lock on ...").
                Err(sled::Error::Io(e))
                    if e.to_string().starts_with("could not acquire lock")
                        && started.elapsed() < Duration::from_secs(10) =>
                {
                    std::thread::sleep(Duration::from_millis(10))
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
        Ok(Open { db, trees })
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
            .current()?
            .tree(tree)
            .get(key)
            .map_err(self.fail("get"))?
            .map(|v| v.to_vec()))
    }

    fn scan(
        &self,
        tree: Tree,
        prefix: &[u8],
        after: Option<&[u8]>,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> StoreResult<()> {
        let open = self.current()?;
        let t = open.tree(tree);
        let iter = match after {
            Some(a) if a >= prefix => t.range::<&[u8], _>((Bound::Excluded(a), Bound::Unbounded)),
            _ => t.scan_prefix(prefix),
        };
        for kv in iter {
            let (k, v) = kv.map_err(self.fail("scan"))?;
            if !k.starts_with(prefix) || !visit(&k, &v) {
                break;
            }
        }
        Ok(())
    }

    fn commit(&self, when: &[Precondition], ops: &[Op]) -> StoreResult<bool> {
        match self.commit_once(when, ops) {
            // Once a write failed, also one of sled's own in the background
            // while the disk was full, sled fails every later one: a commit
            // refused for space on a disk with room again reopens the index
            // and tries once more (the refused one was not made).
            Err(StoreError::IndexNoSpace { .. }) if self.has_room() => {
                self.reopen()?;
                self.commit_once(when, ops)
            }
            other => other,
        }
    }

    fn next_id(&self) -> StoreResult<u64> {
        self.writable()?
            .db
            .generate_id()
            .map_err(self.fail("generate id"))
    }

    fn flush(&self) -> StoreResult<()> {
        let open = self.writable()?;
        Self::wait_stable(&open).map_err(self.fail("flush"))?;
        Ok(())
    }

    fn take_reopened(&self) -> bool {
        // A load first: the lookup path asks on every call.
        self.reopened.load(Ordering::Acquire) && self.reopened.swap(false, Ordering::AcqRel)
    }

    fn still_reopened(&self) {
        self.reopened.store(true, Ordering::SeqCst);
    }

    fn reopen_if_due(&self) {
        if self.is_failed.load(Ordering::Acquire) {
            // Still failing: the next write says why.
            let _ = self.reopen();
        }
    }

    fn disk_bytes(&self) -> u64 {
        self.current()
            .ok()
            .and_then(|o| o.db.size_on_disk().ok())
            .unwrap_or(0)
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

    /// A full disk freed: the next write reopens the index at once, even
    /// right after a failed attempt (the throttle is for a disk still full
    /// or a broken index).
    #[test]
    fn a_write_right_after_space_came_back_reopens_at_once() {
        let (_d, i) = open();
        *i.failed.lock().unwrap() = Some(Failed {
            error: StoreError::IndexNoSpace { op: "commit" },
            last_try: Some(i.clock.now_ms()),
        });
        i.is_failed.store(true, Ordering::SeqCst);
        let put = Op::Put(Tree::Entries, b"k".to_vec(), b"v".to_vec());
        assert!(i.commit(&[], &[put]).unwrap());
        assert!(!i.is_failed.load(Ordering::SeqCst));
    }

    /// sled failed in the background while the disk was full (no commit
    /// of ours saw it): the first commit once there is room again succeeds.
    #[test]
    fn a_commit_refused_by_a_db_failed_in_the_background_is_made_after_a_reopen() {
        let (_d, i) = open();
        i.db_failed_for_space.store(true, Ordering::SeqCst);
        let put = Op::Put(Tree::Entries, b"k".to_vec(), b"v".to_vec());
        assert!(i.commit(&[], &[put]).unwrap());
        assert_eq!(
            i.get(Tree::Entries, b"k").unwrap().as_deref(),
            Some(&b"v"[..])
        );
        assert!(i.take_reopened(), "the store is told to reconcile");
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
