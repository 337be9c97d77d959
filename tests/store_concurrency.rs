//! Concurrency: 16 threads put, look up, map payloads, lease, remove and
//! collect on one store until they made 50,000 operations and gc ran ten
//! times (a few seconds). No unexpected error, every
//! mapped payload matches its hash, leased entries survive GC, and the
//! store is consistent (and has no orphans) afterwards.

mod store_util;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctcache::store::{Accept, Filter, GcPolicy, HostFilter, Store, StoreError, StoreOptions};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use store_util::*;

const THREADS: usize = 16;
/// The run ends once the threads made this many operations and gc ran this
/// often (about 3 s here), or fails after `DEADLINE`.
const OPS: u64 = 50_000;
const GC_RUNS: u64 = 10;
const DEADLINE: Duration = Duration::from_secs(120);
const SOURCES: u64 = 300;

fn expected<T>(r: Result<T, StoreError>, what: &str) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        // Another thread removed or leased it first: part of the game.
        Err(StoreError::NotFound(_))
        | Err(StoreError::Leased { .. })
        | Err(StoreError::UnknownLease(_)) => None,
        Err(e) => panic!("{what}: {e}"),
    }
}

#[test]
fn sixteen_threads_mixed_load() {
    let d = tempfile::tempdir().unwrap();
    let store = Arc::new(
        Store::open(
            d.path(),
            StoreOptions {
                gc_batch: 8,
                access_batch: 64,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    // Pinned entries: leased for the whole run, must survive every GC.
    let pinned: Vec<_> = (0..5)
        .map(|i| {
            let n = SOURCES + i;
            let e = store
                .put(&entry(n), payload(n, 20_000).as_slice())
                .unwrap()
                .entry;
            store
                .acquire_lease(&e.key, Duration::from_secs(600))
                .unwrap();
            (n, e)
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let gcs = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = store.clone();
            let stop = stop.clone();
            let ops = ops.clone();
            let gcs = gcs.clone();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(t as u64);
                let host = HostFilter::new(vec![cpu("x86_64-avx2", "avx2")], None, Accept::Any);
                while !stop.load(Ordering::Relaxed) {
                    let n = rng.random_range(0..SOURCES);
                    match t % 8 {
                        0..=2 => {
                            // Content repeats across sources: shared files.
                            let c = rng.random_range(0..100u64);
                            let len = rng.random_range(0..32 * 1024);
                            store
                                .put(&entry(n), payload(c, len).as_slice())
                                .expect("put");
                        }
                        3..=4 => {
                            for hit in store.lookup(&digest(n), &host).expect("lookup") {
                                if let Some(p) =
                                    expected(store.open_payload(&hit.entry.key), "open")
                                {
                                    // The mapped bytes are those of the entry
                                    // opened. gc may have dropped the hit's
                                    // entry and a put re-added the key with
                                    // other bytes since the lookup (this test
                                    // puts random payloads under one key).
                                    assert_eq!(*blake3::hash(&p).as_bytes(), p.info.blake3);
                                }
                            }
                        }
                        5 => {
                            let found = store
                                .list(&Filter {
                                    source: Some(digest(n)),
                                    ..Default::default()
                                })
                                .expect("list");
                            if let Some(e) = found.first() {
                                if let Some(id) = expected(
                                    store.acquire_lease(&e.key, Duration::from_secs(5)),
                                    "lease",
                                ) {
                                    // While leased, the entry stays and its
                                    // payload reads back intact (it may have been
                                    // replaced between list and lease).
                                    let now =
                                        store.stat(&e.key).expect("stat").expect("leased entry");
                                    let p = store.open_payload(&e.key).expect("open leased");
                                    assert_eq!(*blake3::hash(&p).as_bytes(), now.payload.blake3);
                                    expected(store.renew(id, Duration::from_secs(5)), "renew");
                                    assert!(store.release(id).expect("release"));
                                }
                            }
                        }
                        6 => {
                            let found = store
                                .list(&Filter {
                                    source: Some(digest(n)),
                                    ..Default::default()
                                })
                                .expect("list");
                            for e in found {
                                expected(store.remove(&e.key), "remove");
                            }
                        }
                        _ => {
                            let r = store
                                .gc(&GcPolicy {
                                    max_bytes: Some(rng.random_range(0..2_000_000)),
                                    max_age: None,
                                    max_bytes_per_uid: None,
                                    orphans: true,
                                    temp_files: true,
                                    dry_run: false,
                                })
                                .expect("gc");
                            // Other writers' temp files are never stale.
                            // (Orphan payloads do occur: another collector's
                            // batch may have dropped an entry and not yet
                            // unlinked its file.)
                            let stale: Vec<_> = r
                                .items
                                .iter()
                                .filter(|i| i.reason == ctcache::store::GcReason::StaleTemp)
                                .collect();
                            assert!(stale.is_empty(), "{stale:?}");
                            gcs.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let enough = || ops.load(Ordering::Relaxed) >= OPS && gcs.load(Ordering::Relaxed) >= GC_RUNS;
    let ran = ctcache_testkit::poll(DEADLINE, Duration::from_millis(10), || {
        enough().then_some(())
    });
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("worker thread panicked");
    }
    eprintln!(
        "{} ops ({} gc runs) in {:.1?}",
        ops.load(Ordering::Relaxed),
        gcs.load(Ordering::Relaxed),
        started.elapsed()
    );
    assert!(
        ran.is_some(),
        "{OPS} operations and {GC_RUNS} gc runs not done within {DEADLINE:?}"
    );
    for (n, e) in &pinned {
        let p = store.open_payload(&e.key).expect("pinned entry survived");
        assert_eq!(&p[..], payload(*n, 20_000).as_slice());
    }
    assert_consistent(&store);
    assert!(store.verify(true).unwrap().problems.is_empty());
    let r = store.reconcile().unwrap();
    assert!(r.damaged.is_empty(), "{r:?}");
    assert!(r.orphan_files_removed.is_empty(), "{r:?}");
    assert_eq!(r.refs_added, 0, "{r:?}");
    assert_eq!(r.source_lists_fixed, 0, "{r:?}");
    assert_eq!(r.records_removed, 0, "{r:?}");
    assert!(tmp_is_empty(d.path()));
}
