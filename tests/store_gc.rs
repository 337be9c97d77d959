//! GC policies: least recently used first under a byte budget, maximum idle
//! age, orphans both ways, stale temp files, expired leases; a dry run
//! reports exactly what the real run then does; leased entries survive.

mod store_util;

use std::fs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ctcache::store::{
    Clock, EntryKey, GcPolicy, GcReason, GcTarget, Store, StoreError, StoreOptions,
};
use store_util::*;

struct Fixture {
    _dir: tempfile::TempDir,
    now: Arc<AtomicU64>,
    store: Store,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let now = Arc::new(AtomicU64::new(1_000));
        let store = Store::open(
            dir.path(),
            StoreOptions {
                clock: Clock::manual(now.clone()),
                gc_batch: 2,
                ..Default::default()
            },
        )
        .unwrap();
        Fixture {
            _dir: dir,
            now,
            store,
        }
    }

    fn at(&self, ms: u64) {
        self.now.store(ms, Ordering::SeqCst);
    }

    /// Entries 1..=5 of 1000 bytes, created at 1000..5000 ms.
    fn five(&self) -> Vec<EntryKey> {
        (1..=5)
            .map(|i| {
                self.at(i * 1000);
                self.store
                    .put(&entry(i), payload(i, 1000).as_slice())
                    .unwrap()
                    .entry
                    .key
            })
            .collect()
    }

    fn dry_then_real(&self, p: &GcPolicy) -> ctcache::store::GcReport {
        let dry = self.store.gc(&GcPolicy {
            dry_run: true,
            ..p.clone()
        });
        let dry = dry.unwrap();
        let real = self.store.gc(p).unwrap();
        assert_eq!(dry.items, real.items, "dry run differs from the real run");
        assert_eq!(dry.bytes_freed, real.bytes_freed);
        real
    }

    fn remaining(&self) -> Vec<EntryKey> {
        assert_consistent(&self.store)
            .into_iter()
            .map(|e| e.key)
            .collect()
    }
}

fn entries(r: &ctcache::store::GcReport) -> Vec<EntryKey> {
    r.items
        .iter()
        .filter_map(|i| match i.target {
            GcTarget::Entry(k) => Some(k),
            GcTarget::File(_) => None,
        })
        .collect()
}

#[test]
fn budget_removes_least_recently_used_first() {
    let f = Fixture::new();
    let k = f.five();
    // Touch 3 then 1: LRU order is now 2, 4, 5, 3, 1.
    f.at(6_000);
    f.store.open_payload(&k[2]).unwrap();
    f.at(7_000);
    f.store.open_payload(&k[0]).unwrap();
    let r = f.dry_then_real(&GcPolicy {
        max_bytes: Some(3_000),
        ..Default::default()
    });
    assert_eq!(entries(&r), vec![k[1], k[3]]);
    assert!(r.items.iter().all(|i| i.reason == GcReason::OverBudget));
    assert_eq!(
        (r.bytes_freed, r.bytes_before, r.bytes_after),
        (2_000, 5_000, 3_000)
    );
    let mut left = vec![k[0], k[2], k[4]];
    left.sort();
    assert_eq!(f.remaining(), left);
    // Under budget now: nothing more goes.
    assert!(f
        .store
        .gc(&GcPolicy {
            max_bytes: Some(3_000),
            ..Default::default()
        })
        .unwrap()
        .items
        .is_empty());
}

#[test]
fn max_age_removes_idle_entries() {
    let f = Fixture::new();
    let k = f.five();
    f.at(8_000);
    f.store.open_payload(&k[0]).unwrap();
    f.at(10_000);
    let r = f.dry_then_real(&GcPolicy {
        max_age: Some(Duration::from_millis(6_500)),
        ..Default::default()
    });
    // Idle: e1 2 s (touched), e2 8 s, e3 7 s, e4 6 s, e5 5 s.
    assert_eq!(entries(&r), vec![k[1], k[2]]);
    assert_eq!(
        r.items[0].reason,
        GcReason::MaxAge {
            idle: Duration::from_millis(8_000)
        }
    );
    // The report says what each entry was packed from, and the limits.
    let about = r.items[0].about.as_ref().expect("an entry is described");
    assert_eq!(
        (&about.source_names[..], &about.model_paths[..]),
        (&["w".to_string()][..], &["/models/m.onnx".to_string()][..])
    );
    assert!(!about.type_name.is_empty());
    assert_eq!(
        (r.max_age, r.max_bytes),
        (Some(Duration::from_millis(6_500)), None)
    );
    assert_eq!(f.remaining().len(), 3);
}

#[test]
fn orphans_strays_and_stale_temps() {
    let f = Fixture::new();
    let k = f.five();
    let dir = f.store.dir().to_path_buf();
    // A payload file without an entry, an entry without its file, a stray
    // file in a shard, and a temp file of a writer that is gone.
    let orphan = f.store.blob_path(blake3::hash(b"orphan").as_bytes());
    fs::write(&orphan, b"orphan").unwrap();
    let e2 = f.store.stat(&k[1]).unwrap().unwrap();
    fs::remove_file(f.store.blob_path(&e2.payload.blake3)).unwrap();
    let stray = dir.join("blobs/00/notes.txt");
    fs::write(&stray, b"x").unwrap();
    let temp = dir.join("tmp/4242-1.part");
    fs::write(&temp, b"half").unwrap();

    let r = f.dry_then_real(&GcPolicy {
        orphans: true,
        temp_files: true,
        ..Default::default()
    });
    let got: Vec<(GcTarget, GcReason, u64)> = r
        .items
        .iter()
        .map(|i| (i.target.clone(), i.reason.clone(), i.bytes_freed))
        .collect();
    assert_eq!(
        got,
        vec![
            (GcTarget::Entry(k[1]), GcReason::MissingPayload, 0),
            (GcTarget::File(orphan.clone()), GcReason::OrphanPayload, 6),
            (GcTarget::File(stray.clone()), GcReason::StrayFile, 1),
            (GcTarget::File(temp.clone()), GcReason::StaleTemp, 4),
        ]
    );
    assert!(!orphan.exists() && !stray.exists() && !temp.exists());
    assert_eq!(f.remaining().len(), 4);
}

#[test]
fn leased_entries_survive_and_expired_leases_stop_counting() {
    let f = Fixture::new();
    let k = f.five();
    f.at(10_000);
    let long = f
        .store
        .acquire_lease(&k[0], Duration::from_secs(60))
        .unwrap();
    let short = f
        .store
        .acquire_lease(&k[1], Duration::from_millis(500))
        .unwrap();
    assert!(matches!(
        f.store.remove(&k[0]),
        Err(StoreError::Leased {
            until_ms: 70_000,
            ..
        })
    ));
    let all = GcPolicy {
        max_bytes: Some(0),
        max_age: Some(Duration::ZERO),
        ..Default::default()
    };
    let r = f.dry_then_real(&all);
    assert_eq!(entries(&r), vec![k[2], k[3], k[4]]);
    assert!(r.leased_kept >= 2);
    let mut left = vec![k[0], k[1]];
    left.sort();
    assert_eq!(f.remaining(), left);

    // The short lease's holder "crashed": once the TTL passed, it stops
    // protecting the entry, cannot be renewed, and its record is removed.
    f.at(11_000);
    assert!(matches!(
        f.store.renew(short, Duration::from_secs(1)),
        Err(StoreError::UnknownLease(_))
    ));
    let r = f.dry_then_real(&all);
    assert_eq!(entries(&r), vec![k[1]]);
    assert_eq!(r.expired_leases, 1);
    assert_eq!(f.store.leases().unwrap().len(), 1);

    // Renewed leases keep protecting; released ones do not.
    f.at(65_000);
    let l = f.store.renew(long, Duration::from_secs(10)).unwrap();
    assert_eq!(l.expires_ms, 75_000);
    f.at(72_000);
    assert!(f.store.gc(&all).unwrap().items.is_empty());
    assert!(f.store.release(long).unwrap());
    assert!(!f.store.release(long).unwrap());
    assert_eq!(entries(&f.store.gc(&all).unwrap()), vec![k[0]]);
    assert!(f.remaining().is_empty());
    assert!(matches!(
        f.store.acquire_lease(&k[0], Duration::from_secs(1)),
        Err(StoreError::NotFound(_))
    ));
}

#[test]
fn shared_payload_file_goes_with_its_last_entry() {
    let f = Fixture::new();
    let data = payload(7, 2000);
    f.at(1_000);
    let a = f.store.put(&entry(1), data.as_slice()).unwrap().entry;
    f.at(2_000);
    let b = f.store.put(&entry(2), data.as_slice()).unwrap().entry;
    let path = f.store.blob_path(&a.payload.blake3);
    let r = f.dry_then_real(&GcPolicy {
        max_bytes: Some(0),
        ..Default::default()
    });
    assert_eq!(entries(&r), vec![a.key, b.key]);
    assert_eq!(
        r.items.iter().map(|i| i.bytes_freed).collect::<Vec<_>>(),
        vec![0, 2000]
    );
    assert!(!path.exists());
}
