//! A full disk: a put that hits ENOSPC fails with a clear error and leaves
//! the store as it was (no entry, no file, no temp file). Injected through
//! the write-fault hook always; on a real 4 MiB tmpfs too when the test runs
//! as root and may mount.

mod store_util;

use std::path::Path;
use std::sync::Arc;

use ctcache::store::{Store, StoreError, StoreOptions, WriteFault};
use ctcache_testkit::{fill, Tmpfs};
use store_util::*;

fn assert_full_and_intact(s: &Store, dir: &Path, before_entries: usize, err: StoreError) {
    let msg = err.to_string();
    assert!(matches!(err, StoreError::NoSpace { .. }), "{err:?}");
    assert!(msg.contains("no space left on device"), "{msg}");
    assert!(msg.contains("store is unchanged"), "{msg}");
    assert!(tmp_is_empty(dir), "temp file left behind");
    assert_eq!(assert_consistent(s).len(), before_entries);
    assert_eq!(blob_files(dir), before_entries);
    assert!(s.verify(true).unwrap().problems.is_empty());
}

#[test]
fn injected_enospc_fails_cleanly() {
    let d = tempfile::tempdir().unwrap();
    let fault: WriteFault = Arc::new(|written| {
        if written >= 1 << 20 {
            Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
        } else {
            Ok(())
        }
    });
    let s = Store::open(
        d.path(),
        StoreOptions {
            write_fault: Some(fault),
            ..Default::default()
        },
    )
    .unwrap();
    s.put(&entry(1), payload(1, 1000).as_slice()).unwrap();
    let err = s
        .put(&entry(2), payload(2, 3 << 20).as_slice())
        .err()
        .unwrap();
    assert!(matches!(err, StoreError::NoSpace { written, .. } if written >= 1 << 20));
    assert_full_and_intact(&s, d.path(), 1, err);
    let first = s.list(&Default::default()).unwrap()[0].key;
    assert_eq!(
        &s.open_payload(&first).unwrap()[..],
        payload(1, 1000).as_slice()
    );
    // Small puts still work.
    s.put(&entry(3), payload(3, 1000).as_slice()).unwrap();
}

#[test]
fn real_enospc_on_a_small_tmpfs() {
    let Some(fs) = Tmpfs::mount("4m") else {
        return;
    };
    let dir = fs.path().join("cache");
    let s = Store::open(
        &dir,
        StoreOptions {
            index_cache_bytes: 1 << 20,
            ..Default::default()
        },
    )
    .unwrap();
    s.put(&entry(1), payload(1, 1000).as_slice()).unwrap();
    s.flush().unwrap();
    let err = s
        .put(&entry(2), payload(2, 8 << 20).as_slice())
        .err()
        .unwrap();
    assert_full_and_intact(&s, &dir, 1, err);
    s.put(&entry(3), payload(3, 1000).as_slice()).unwrap();
    drop(s);
    let s = Store::open(&dir, StoreOptions::default()).unwrap();
    assert_eq!(assert_consistent(&s).len(), 2);
}

#[test]
fn the_index_works_again_once_space_is_back() {
    let Some(fs) = Tmpfs::mount("16m") else {
        return;
    };
    let dir = fs.path().join("cache");
    let s = Store::open(&dir, StoreOptions::default()).unwrap();
    let e = s.put(&entry(1), payload(1, 1000).as_slice()).unwrap().entry;
    s.flush().unwrap();
    let ballast = fs.fill();
    // Index writes on a full file system: a no-space error, never another.
    let mut full = None;
    for _ in 0..200 {
        let r = s
            .acquire_lease(&e.key, std::time::Duration::from_secs(30))
            .and_then(|l| s.release(l))
            .and_then(|_| s.flush());
        if let Err(err) = r {
            full = Some(err);
            break;
        }
    }
    if let Some(err) = &full {
        assert!(err.is_no_space(), "{err:?}");
    }
    let put = s.put(&entry(2), payload(2, 1000).as_slice());
    assert!(put.as_ref().is_err_and(StoreError::is_no_space), "{put:?}");
    // Reads go on meanwhile.
    assert_eq!(assert_consistent(&s).len(), 1);
    std::fs::remove_file(ballast).unwrap();
    // Space is back: the same store writes again at once (a failed index
    // whose disk has room again is reopened by the next write).
    s.put(&entry(3), payload(3, 1000).as_slice()).unwrap();
    let l = s
        .acquire_lease(&e.key, std::time::Duration::from_secs(30))
        .unwrap();
    s.release(l).unwrap();
    s.flush().unwrap();
    drop(s);
    let s = Store::open(&dir, StoreOptions::default()).unwrap();
    assert_eq!(assert_consistent(&s).len(), 2);
}

/// sled's lost wake-up (see `sled_index.rs`): a flush whose log write fails
/// must return, while other threads commit. Each round fills the disk under
/// a store that flushes and commits from two threads.
#[test]
fn flushes_on_a_full_disk_return_while_others_commit() {
    let Some(fs) = Tmpfs::mount("16m") else {
        return;
    };
    let root = fs.path().to_path_buf();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for round in 0..10 {
            let dir = root.join(format!("cache{round}"));
            let s = Store::open(&dir, StoreOptions::default()).unwrap();
            let e = s.put(&entry(1), payload(1, 1000).as_slice()).unwrap().entry;
            s.flush().unwrap();
            let ballast = fill(&root);
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    for _ in 0..100 {
                        let _ = s
                            .acquire_lease(&e.key, std::time::Duration::from_secs(30))
                            .and_then(|l| s.release(l));
                    }
                });
                for _ in 0..100 {
                    let _ = s.flush();
                }
            });
            std::fs::remove_file(ballast).unwrap();
            drop(s);
            std::fs::remove_dir_all(&dir).unwrap();
        }
        done.send(()).unwrap();
    });
    finished
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("a flush on a full disk never returned");
}
