//! Unit tests of the store as a whole (integration tests live in
//! tests/store_*.rs).

use std::fs;
use std::io::Read;
use std::time::Duration;

use super::*;
use crate::digest::{Algorithm, SourceDigest};
use crate::pb;
use crate::structs::FORMAT_VERSION_KEY;

fn new_entry(n: u8) -> NewEntry {
    NewEntry {
        source: SourceDigest {
            algorithm: Algorithm::Blake3,
            bytes: [n; 32],
        },
        device: pb::DeviceProto {
            r#type: "cpu".into(),
            architecture: "x86_64-avx2".into(),
            ..Default::default()
        },
        physical_type: pb::StructTypeProto {
            name: "t.fmt".into(),
            metadata_props: vec![pb::StringStringEntryProto {
                key: FORMAT_VERSION_KEY.into(),
                value: "1".into(),
            }],
            ..Default::default()
        },
        dims: vec![],
        source_shape: crate::hit::SourceShape {
            data_type: crate::dtype::DataType::FLOAT,
            dims: vec![],
        },
        producer: Producer::default(),
        source_names: vec![format!("w{n}")],
        model_paths: vec![],
        pack_duration: Duration::from_millis(3),
    }
}

/// A temp dir for a store and options whose clock the test moves by hand
/// (it starts at 1,000,000 ms).
fn hand_clock_store() -> (
    tempfile::TempDir,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
    StoreOptions,
) {
    let now = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1_000_000));
    let opts = StoreOptions {
        clock: Clock::manual(now.clone()),
        ..Default::default()
    };
    (tempfile::tempdir().unwrap(), now, opts)
}

#[test]
fn put_open_remove_round_trip() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let a = s.put(&new_entry(1), &b"hello"[..]).unwrap();
    assert!(a.created);
    let again = s.put(&new_entry(1), &b"other"[..]).unwrap();
    assert!(!again.created);
    assert_eq!(again.entry.payload, a.entry.payload);
    // Same payload under another key shares the file.
    let b = s.put(&new_entry(2), &b"hello"[..]).unwrap();
    assert_eq!(b.entry.payload.blake3, a.entry.payload.blake3);
    let p = s.open_payload(&a.entry.key).unwrap();
    assert_eq!(&p[..], b"hello");
    assert!(s.remove(&a.entry.key).unwrap());
    assert!(s.blob_path(&b.entry.payload.blake3).exists());
    assert!(s.remove(&b.entry.key).unwrap());
    assert!(!s.blob_path(&b.entry.payload.blake3).exists());
    assert!(!s.remove(&b.entry.key).unwrap());
    // The mapping outlives the removal.
    assert_eq!(&p[..], b"hello");
}

#[test]
fn the_store_is_its_owners_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let a = s.put(&new_entry(1), &b"hello"[..]).unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for private in ["index", "records", "tmp", "quarantine"] {
        assert_eq!(mode(&d.path().join(private)), 0o700, "{private}");
    }
    let blob = s.blob_path(&a.entry.payload.blake3);
    assert_eq!(mode(&d.path().join("blobs")), 0o711);
    assert_eq!(mode(blob.parent().unwrap()), 0o711);
    // A store made under a loose umask is tightened when it opens again.
    drop(s);
    std::fs::set_permissions(
        d.path().join("records"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let _s = Store::open(d.path(), StoreOptions::default()).unwrap();
    assert_eq!(mode(&d.path().join("records")), 0o700);
}

#[test]
fn gc_never_counts_bytes_kept_by_hard_links_as_freed() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let linked = s.put(&new_entry(1), &b"linked payload"[..]).unwrap().entry;
    let alone = s.put(&new_entry(2), &b"alone"[..]).unwrap().entry;
    let outside = d.path().join("model.onnx.weights.bin");
    fs::hard_link(s.blob_path(&linked.payload.blake3), &outside).unwrap();
    let r = s
        .gc(&GcPolicy {
            max_bytes: Some(0),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(r.items.len(), 2, "{r:?}");
    assert_eq!(r.bytes_freed, b"alone".len() as u64);
    assert_eq!(r.bytes_still_linked, b"linked payload".len() as u64);
    assert!(s.stat(&linked.key).unwrap().is_none() && s.stat(&alone.key).unwrap().is_none());
    assert!(outside.exists());
}

#[test]
fn empty_payload() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let a = s.put(&new_entry(1), &b""[..]).unwrap();
    assert_eq!(s.open_payload(&a.entry.key).unwrap().len(), 0);
    assert!(s.verify(true).unwrap().problems.is_empty());
}

#[test]
fn seen_lists_merge_on_repeated_put() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    s.put(&new_entry(1), &b"x"[..]).unwrap();
    let mut n = new_entry(1);
    n.source_names = vec!["other".into()];
    n.model_paths = vec!["/m.onnx".into()];
    let e = s.put(&n, &b"x"[..]).unwrap().entry;
    assert_eq!(e.source_names, vec!["w1".to_string(), "other".to_string()]);
    assert_eq!(e.model_paths, vec!["/m.onnx".to_string()]);
}

#[test]
fn access_statistics_are_batched_and_visible() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let k = s.put(&new_entry(1), &b"x"[..]).unwrap().entry.key;
    for _ in 0..3 {
        s.open_payload(&k).unwrap();
    }
    assert_eq!(s.stat(&k).unwrap().unwrap().access.unwrap().count, 3);
    // Pending (not yet written) statistics show in list too.
    let l = s.list(&Filter::default()).unwrap();
    assert_eq!(l[0].access.unwrap().count, 3);
    s.flush().unwrap();
    let l = s.list(&Filter::default()).unwrap();
    assert_eq!(l[0].access.unwrap().count, 3);
    assert_eq!(s.stat(&k).unwrap().unwrap().access.unwrap().count, 3);
}

#[test]
fn store_is_send_and_sync() {
    fn shared<T: Send + Sync>() {}
    shared::<Store>();
}

#[test]
fn reconcile_repairs_source_lists() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let a = s.put(&new_entry(1), &b"a"[..]).unwrap().entry.key;
    let b = s.put(&new_entry(2), &b"b"[..]).unwrap().entry.key;
    let host = HostFilter::new(vec![new_entry(1).device], None, Accept::Any);
    // Lose a's list, and give b's list a suffix naming no entry.
    let (pa, pb) = (a.to_bytes(), b.to_bytes());
    let mut bogus = sources::suffix(&pb).to_vec();
    bogus[0] ^= 1;
    let list_b = sources::with(sources::suffix(&pb), &bogus);
    s.index
        .commit(
            &[],
            &[
                Op::Delete(Tree::Sources, sources::prefix(&pa).to_vec()),
                Op::Put(Tree::Sources, sources::prefix(&pb).to_vec(), list_b),
            ],
        )
        .unwrap();
    assert!(s.lookup(&a.source, &host).unwrap().is_empty());
    let r = s.reconcile().unwrap();
    assert_eq!(r.source_lists_fixed, 2);
    assert_eq!(s.lookup(&a.source, &host).unwrap()[0].entry.key, a);
    assert_eq!(s.lookup(&b.source, &host).unwrap().len(), 1);
    assert_eq!(s.reconcile().unwrap().source_lists_fixed, 0);
}

#[test]
fn a_lease_lifetime_cap_lets_gc_collect_a_lease_renewed_for_ever() {
    let (d, now, opts) = hand_clock_store();
    let s = Store::open(d.path(), opts).unwrap();
    let k = s.put(&new_entry(1), &b"x"[..]).unwrap().entry.key;
    let ttl = Duration::from_secs(60);
    let life = Some(Duration::from_secs(100));
    let by = LeaseAuthority::Owner(Some(1000));
    let id = s.acquire_lease_for(&k, ttl, Some(1000), 8).unwrap();
    let tick = |ms: u64| now.fetch_add(ms, std::sync::atomic::Ordering::SeqCst);
    // Renewed every 50 s: cut to the cap at 100 s after it was taken.
    tick(50_000);
    let l = s.renew_within(id, ttl, by, life).unwrap();
    assert_eq!(l.expires_ms, 1_000_000 + 100_000, "{l:?}");
    tick(49_000);
    assert!(s.is_leased(&k).unwrap());
    tick(1_000);
    assert!(matches!(
        s.renew_within(id, ttl, by, life),
        Err(StoreError::UnknownLease(_) | StoreError::LeaseLifetimeOver { .. })
    ));
    // Then gc may take the entry.
    assert!(!s.is_leased(&k).unwrap());
    let r = s
        .gc(&GcPolicy {
            max_bytes: Some(0),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(r.items.len(), 1, "{r:?}");
    // Without a cap (trusted holders) renewals go on.
    let k = s.put(&new_entry(2), &b"y"[..]).unwrap().entry.key;
    let id = s.acquire_lease_for(&k, ttl, None, 8).unwrap();
    for _ in 0..5 {
        tick(50_000);
        s.renew_within(id, ttl, LeaseAuthority::Any, None).unwrap();
    }
    // A lease taken for longer than the cap (the cap is the daemon's
    // renewal rule) is refused by name when renewed past it.
    let id = s.acquire_lease_for(&k, ttl, Some(1000), 8).unwrap();
    let cap = Some(Duration::from_secs(30));
    tick(20_000);
    let l = s.renew_within(id, ttl, by, cap).unwrap();
    assert_eq!(l.expires_ms, l.acquired_ms + 30_000);
    tick(5_000);
    s.renew_within(id, Duration::from_secs(1), by, cap).unwrap();
    let id = s.acquire_lease_for(&k, ttl, Some(1000), 8).unwrap();
    tick(40_000);
    assert!(matches!(
        s.renew_within(id, ttl, by, cap),
        Err(StoreError::LeaseLifetimeOver { .. })
    ));
}

#[test]
fn leases_are_owned_and_bounded_per_owner() {
    let (d, now, opts) = hand_clock_store();
    let s = Store::open(d.path(), opts.clone()).unwrap();
    let k = s.put(&new_entry(1), &b"x"[..]).unwrap().entry.key;
    let ttl = Duration::from_secs(10);
    let a = s.acquire_lease_for(&k, ttl, Some(1000), 2).unwrap();
    s.acquire_lease_for(&k, ttl, Some(1000), 2).unwrap();
    assert!(matches!(
        s.acquire_lease_for(&k, ttl, Some(1000), 2),
        Err(StoreError::TooManyLeases {
            owner: Some(1000),
            max: 2
        })
    ));
    // Another owner has its own count; the store's own leases have none.
    s.acquire_lease_for(&k, ttl, Some(1001), 2).unwrap();
    s.acquire_lease(&k, ttl).unwrap();
    assert_eq!(s.lease_count().unwrap(), 4);

    // Only the owner (or any-authority) may renew or release; to anyone
    // else the lease is unknown, as one never issued is.
    let other = LeaseAuthority::Owner(Some(1001));
    assert!(matches!(
        s.renew_as(a, ttl, other),
        Err(StoreError::UnknownLease(_))
    ));
    assert!(!s.release_as(a, other).unwrap(), "not released");
    assert!(s.is_leased(&k).unwrap());
    assert!(matches!(s.remove(&k), Err(StoreError::Leased { .. })));
    let owner = LeaseAuthority::Owner(Some(1000));
    assert_eq!(s.renew_as(a, ttl, owner).unwrap().owner, Some(1000));
    assert!(s.release_as(a, owner).unwrap());
    assert!(!s.release_as(a, owner).unwrap(), "released once");
    s.acquire_lease_for(&k, ttl, Some(1000), 2)
        .expect("a release frees a place");

    // Expired leases stop counting without any release.
    now.fetch_add(11_000, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(s.lease_count().unwrap(), 0);
    s.acquire_lease_for(&k, ttl, Some(1000), 2).unwrap();
    s.acquire_lease_for(&k, ttl, Some(1000), 2).unwrap();

    // The owner and the counts survive a reopen (the book is reloaded).
    drop(s);
    let s = Store::open(d.path(), opts).unwrap();
    assert!(matches!(
        s.acquire_lease_for(&k, ttl, Some(1000), 2),
        Err(StoreError::TooManyLeases { .. })
    ));
    assert!(s.leases().unwrap().iter().all(|l| l.owner == Some(1000)));
    assert!(s.is_leased(&k).unwrap());
    // GC deletes the expired records and keeps the leased entry.
    let r = s
        .gc(&GcPolicy {
            max_bytes: Some(0),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(r.expired_leases, 4);
    assert_eq!(r.leased_kept, 1);
    assert!(s.stat(&k).unwrap().is_some());
}

/// A hold is one lease over several entries: it counts once against its
/// owner's bound, keeps every one of them from removal and gc, has no
/// expiry, and ends when its owner (or any authority) releases it.
#[test]
fn a_hold_is_one_lease_over_several_entries_until_it_is_released() {
    let (d, now, opts) = hand_clock_store();
    let s = Store::open(d.path(), opts).unwrap();
    let a = s.put(&new_entry(1), &b"a"[..]).unwrap().entry.key;
    let b = s.put(&new_entry(2), &b"b"[..]).unwrap().entry.key;
    let hold = s.hold_for(&[a, b], Some(1000), Some(2)).unwrap();
    assert_eq!(s.lease_count().unwrap(), 1);
    s.acquire_lease_for(&a, Duration::from_secs(1), Some(1000), 2)
        .expect("the hold took one place of two");
    assert!(matches!(
        s.hold_for(&[a], Some(1000), Some(2)),
        Err(StoreError::TooManyLeases { .. })
    ));
    // No expiry: an hour later both entries are still kept.
    now.fetch_add(3_600_000, std::sync::atomic::Ordering::SeqCst);
    for k in [&a, &b] {
        assert!(s.is_leased(k).unwrap());
        assert!(matches!(s.remove(k), Err(StoreError::Leased { .. })));
    }
    let r = s
        .gc(&GcPolicy {
            max_bytes: Some(0),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(r.leased_kept, 2);
    assert!(s.stat(&a).unwrap().is_some() && s.stat(&b).unwrap().is_some());
    // Another owner cannot end it; its owner can, once.
    assert!(!s
        .release_as(hold, LeaseAuthority::Owner(Some(1001)))
        .unwrap());
    assert!(s
        .release_as(hold, LeaseAuthority::Owner(Some(1000)))
        .unwrap());
    assert!(!s.release(hold).unwrap(), "released once");
    assert_eq!(s.lease_count().unwrap(), 0);
    assert!(s.remove(&a).unwrap());
    // A hold of an entry that is not there takes nothing.
    assert!(matches!(
        s.hold_for(&[b, a], Some(1000), Some(2)),
        Err(StoreError::NotFound(_))
    ));
    assert!(!s.is_leased(&b).unwrap());
}

#[test]
fn lookup_and_put_counters_survive_reopening() {
    let d = tempfile::tempdir().unwrap();
    let host = HostFilter::new(vec![new_entry(1).device], None, Accept::Any);
    let counts = |s: &Store| {
        let st = s.stats().unwrap();
        (st.hits, st.misses, st.puts)
    };
    {
        let s = Store::open(d.path(), StoreOptions::default()).unwrap();
        let k = s.put(&new_entry(1), &b"a"[..]).unwrap().entry.key;
        assert_eq!(s.lookup(&k.source, &host).unwrap().len(), 1);
        assert!(s.lookup(&new_entry(9).source, &host).unwrap().is_empty());
        assert!(s.lookup(&new_entry(8).source, &host).unwrap().is_empty());
        assert_eq!(counts(&s), (1, 2, 1));
    }
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    assert_eq!(counts(&s), (1, 2, 1), "counted before the restart");
    s.count_lookups(2, 0);
    drop(s);
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    assert_eq!(counts(&s), (3, 2, 1));
    // A malformed stored value counts as 0 instead of failing the open.
    s.index
        .commit(&[], &[Op::Put(Tree::Counters, b"hits".to_vec(), vec![1])])
        .unwrap();
    let loaded = stats::Counters::load(&*s.index, 0).unwrap();
    let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        (get(&loaded.hits), get(&loaded.misses), get(&loaded.puts)),
        (0, 2, 1)
    );
}

/// Hits share the cached entry, and a commit that changes the record hands
/// later lookups a new one.
#[test]
fn hits_share_one_decoded_entry_until_the_record_changes() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let host = HostFilter::new(vec![new_entry(1).device], None, Accept::Any);
    let source = s.put(&new_entry(1), &b"a"[..]).unwrap().entry.key.source;
    let first = s.lookup(&source, &host).unwrap().remove(0).entry;
    let again = s.lookup(&source, &host).unwrap().remove(0).entry;
    assert!(std::sync::Arc::ptr_eq(&first, &again), "one decoded entry");

    let mut renamed = new_entry(1);
    renamed.source_names = vec!["w2".into()];
    s.put(&renamed, &b"a"[..]).unwrap();
    let changed = s.lookup(&source, &host).unwrap().remove(0).entry;
    assert!(!std::sync::Arc::ptr_eq(&first, &changed));
    assert_eq!(changed.source_names, ["w1", "w2"]);
}

/// A record that names no device is never a hit, and the miss says why
/// (the shared entry holds an empty device for it, which must not be read
/// as a device).
#[test]
fn a_record_without_a_device_is_an_invalid_miss() {
    use prost::Message;
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let key = s.put(&new_entry(1), &b"a"[..]).unwrap().entry.key;
    let kb = key.to_bytes();
    let mut rec =
        entry::decode_record(&kb, &s.index.get(Tree::Entries, &kb).unwrap().unwrap()).unwrap();
    rec.device = None;
    assert!(s
        .commit(
            &[],
            &[Op::Put(Tree::Entries, kb.to_vec(), rec.encode_to_vec())]
        )
        .unwrap());
    let host = HostFilter::new(vec![new_entry(1).device], None, Accept::Any);
    match s.lookup_explained(&key.source, None, &host).unwrap() {
        Err(crate::hit::MissReason::Invalid { rule, message }) => {
            assert_eq!(rule, "store.record");
            assert!(message.contains("names no device"), "{message}");
        }
        other => panic!("a hit or another miss: {other:?}"),
    }
}

/// An entry record under a key this build cannot read (an algorithm code
/// from a newer build, after a downgrade): gc plans around it instead of
/// panicking, and removes the entries it can name.
#[test]
fn gc_passes_over_keys_it_cannot_read() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let key = s.put(&new_entry(1), &b"a"[..]).unwrap().entry.key;
    s.put(&new_entry(2), &b"bb"[..]).unwrap();
    let kb = key.to_bytes();
    let record = s.index.get(Tree::Entries, &kb).unwrap().unwrap();
    let mut future = kb.to_vec();
    future[0] = 0xee;
    assert!(EntryKey::from_bytes(&future).is_err());
    assert!(s
        .commit(
            &[],
            &[Op::Put(Tree::Entries, future.clone(), record.to_vec())]
        )
        .unwrap());
    let r = s
        .gc(&GcPolicy {
            max_bytes: Some(0),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(r.items.len(), 2, "{r:?}");
    assert!(s.index.get(Tree::Entries, &future).unwrap().is_some());
}

/// Overwrites one byte of a payload file in place (as disk rot or a stray
/// writer would), keeping its length.
fn flip_byte(path: &Path, at: u64) {
    use std::io::{Seek, SeekFrom, Write};
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644)).unwrap();
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut b).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&[b[0] ^ 0x5a]).unwrap();
}

#[test]
fn every_serve_is_checked_not_only_the_first() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let payload: Vec<u8> = (0..(3 * crate::chunks::GROUP + 100))
        .map(|i| (i % 253) as u8)
        .collect();
    let a = s.put(&new_entry(7), &payload[..]).unwrap().entry;
    let path = s.blob_path(&a.payload.blake3);

    // Served, then damaged on disk: the next open sees another file.
    let held = s.open_payload(&a.key).unwrap();
    assert_eq!(held.checked_all().unwrap(), &payload[..]);
    flip_byte(&path, 2 * crate::chunks::GROUP as u64 + 5);
    match s.open_payload(&a.key) {
        Err(StoreError::PayloadCorrupt { dropped, .. }) => assert_eq!(dropped, [a.key]),
        other => panic!("a damaged payload was served: {other:?}"),
    }
    assert!(s.stat(&a.key).unwrap().is_none(), "its entry is dropped");

    // A payload opened before its bytes changed (the mapping shows the
    // change; the identity check at open could not): a copy checks each
    // group and stops at the damaged one.
    let b = s.put(&new_entry(8), &payload[..]).unwrap().entry;
    let held = s.open_payload(&b.key).unwrap();
    flip_byte(
        &s.blob_path(&b.payload.blake3),
        crate::chunks::GROUP as u64 + 1,
    );
    assert_eq!(
        held.checked(0..crate::chunks::GROUP).unwrap(),
        &payload[..crate::chunks::GROUP]
    );
    let rot = held.checked(10..crate::chunks::GROUP + 10).unwrap_err();
    assert_eq!(rot.offset, crate::chunks::GROUP as u64);
    assert!(held.checked_all().is_err());
    match s.payload_rotted(&b.key, &held, rot) {
        StoreError::PayloadCorrupt {
            dropped,
            quarantined,
            ..
        } => {
            assert_eq!(dropped, [b.key]);
            assert!(quarantined.is_some());
        }
        other => panic!("{other:?}"),
    }
    assert!(s.stat(&b.key).unwrap().is_none());
    assert!(s.verify(false).unwrap().problems.is_empty());
}

#[cfg(target_os = "linux")]
#[test]
fn copying_a_payload_and_hashing_it_on_first_serve_leave_none_of_it_resident() {
    use crate::materialize::{place, LinkMode};
    use ctcache_testkit::resident;
    let d = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = (0..24u32 << 20).map(|i| (i % 251) as u8).collect();
    let key = {
        let s = Store::open(d.path(), StoreOptions::default()).unwrap();
        s.put(&new_entry(1), &bytes[..]).unwrap().entry.key
    };
    // Reopened: the first serve hashes the file (D12).
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let p = s.open_payload(&key).unwrap();
    let page = 4 * 4096;
    assert!(
        resident(&p) <= page,
        "{} bytes stay resident after the hash",
        resident(&p)
    );
    let out = tempfile::tempdir().unwrap();
    let dir = crate::outdir::OutDir::open(out.path()).unwrap();
    place(&p.path, Some(&p), &dir, "copy".as_ref(), LinkMode::Copy).unwrap();
    assert!(
        resident(&p) <= page,
        "{} bytes stay resident after a copy",
        resident(&p)
    );
    assert_eq!(fs::read(out.path().join("copy")).unwrap(), bytes);
    assert_eq!(&p[..], &bytes[..], "released pages read the same");
}

/// A lookup hit notes its entry once per window; a lease notes every use.
#[test]
fn lookup_hits_note_an_entry_once_per_window() {
    let (d, now, opts) = hand_clock_store();
    let s = Store::open(d.path(), opts).unwrap();
    let k = s.put(&new_entry(1), &b"x"[..]).unwrap().entry.key;
    let host = HostFilter::new(vec![new_entry(1).device], None, Accept::Any);
    let uses = || {
        s.flush().unwrap();
        let a = s.access_of(&k.to_bytes()).unwrap();
        (a.count, a.last_ms)
    };
    for _ in 0..3 {
        assert_eq!(s.lookup(&k.source, &host).unwrap().len(), 1);
    }
    assert_eq!(uses(), (1, 1_000_000));
    now.fetch_add(
        super::use_stats::LOOKUP_WINDOW_MS,
        std::sync::atomic::Ordering::SeqCst,
    );
    s.lookup(&k.source, &host).unwrap();
    assert_eq!(uses(), (2, 1_000_000 + super::use_stats::LOOKUP_WINDOW_MS));
    s.note_use(&k);
    s.note_use(&k);
    assert_eq!(uses().0, 4);
}
