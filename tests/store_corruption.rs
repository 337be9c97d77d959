//! Corruption: a flipped byte or a truncated payload file is found by
//! `verify` (and a wrong length or a missing file by `reconcile`), the file
//! goes to quarantine/, its entries are dropped and lookups stop returning
//! them; intact entries are untouched.

mod store_util;

use std::fs::{self, OpenOptions, Permissions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use ctcache::store::{Accept, Damage, HostFilter, Store, StoreError, StoreOptions};
use store_util::*;

fn host() -> HostFilter {
    HostFilter::new(vec![cpu("x86_64-avx2", "")], None, Accept::Any)
}

/// Payload files are read-only; damage them the way a disk or a stray
/// process would.
fn writable(p: &Path) {
    fs::set_permissions(p, Permissions::from_mode(0o644)).unwrap();
}

fn flip_byte(p: &Path, at: u64) {
    writable(p);
    let mut f = OpenOptions::new().read(true).write(true).open(p).unwrap();
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(at)).unwrap();
    std::io::Read::read_exact(&mut f, &mut b).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&[b[0] ^ 0x40]).unwrap();
}

#[test]
fn flipped_byte_is_quarantined_and_no_longer_served() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let bad = s.put(&entry(1), payload(1, 5000).as_slice()).unwrap().entry;
    let good = s.put(&entry(2), payload(2, 5000).as_slice()).unwrap().entry;
    let path = s.blob_path(&bad.payload.blake3);
    flip_byte(&path, 1234);

    let r = s.verify(true).unwrap();
    assert_eq!(r.blobs_checked, 2);
    assert_eq!(r.problems.len(), 1);
    let p = &r.problems[0];
    assert_eq!(p.blob, bad.payload.blake3);
    assert!(matches!(p.damage, Damage::WrongHash { .. }));
    assert_eq!(p.entries_dropped, vec![bad.key]);
    let q = p.quarantined.as_ref().expect("quarantined");
    assert!(q.starts_with(d.path().join("quarantine")) && q.exists());
    assert!(!path.exists());

    assert!(s.lookup(&digest(1), &host()).unwrap().is_empty());
    assert!(matches!(
        s.open_payload(&bad.key),
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(
        s.lookup(&digest(2), &host()).unwrap()[0].entry.key,
        good.key
    );
    assert!(s.verify(true).unwrap().problems.is_empty());
    assert_eq!(assert_consistent(&s).len(), 1);
    // The key can be stored again.
    assert!(
        s.put(&entry(1), payload(1, 5000).as_slice())
            .unwrap()
            .created
    );
}

#[test]
fn truncated_shared_payload_drops_every_entry_using_it() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let data = payload(9, 4096);
    let a = s.put(&entry(1), data.as_slice()).unwrap().entry;
    let b = s.put(&entry(2), data.as_slice()).unwrap().entry;
    assert_eq!(a.payload.blake3, b.payload.blake3);
    let path = s.blob_path(&a.payload.blake3);
    writable(&path);
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(100)
        .unwrap();

    // Reading it is refused before mapping (no SIGBUS on a short file).
    assert!(matches!(
        s.open_payload(&a.key),
        Err(StoreError::PayloadDamaged { .. })
    ));
    let r = s.verify(true).unwrap();
    assert_eq!(r.problems.len(), 1);
    assert_eq!(
        r.problems[0].damage,
        Damage::WrongLength {
            expected: 4096,
            actual: 100
        }
    );
    let mut dropped = r.problems[0].entries_dropped.clone();
    dropped.sort();
    let mut want = vec![a.key, b.key];
    want.sort();
    assert_eq!(dropped, want);
    assert!(s.lookup(&digest(1), &host()).unwrap().is_empty());
    assert!(s.lookup(&digest(2), &host()).unwrap().is_empty());
}

#[test]
fn reconcile_finds_wrong_lengths_missing_files_and_orphans() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let short = s.put(&entry(1), payload(1, 3000).as_slice()).unwrap().entry;
    let gone = s.put(&entry(2), payload(2, 3000).as_slice()).unwrap().entry;
    let kept = s.put(&entry(3), payload(3, 3000).as_slice()).unwrap().entry;
    let p = s.blob_path(&short.payload.blake3);
    writable(&p);
    OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(10)
        .unwrap();
    fs::remove_file(s.blob_path(&gone.payload.blake3)).unwrap();
    let orphan = s.blob_path(blake3::hash(b"nobody").as_bytes());
    fs::write(&orphan, b"nobody").unwrap();

    let r = s.reconcile().unwrap();
    assert_eq!(r.entries_checked, 3);
    let mut damage: Vec<_> = r
        .damaged
        .iter()
        .map(|p| (p.entries_dropped.clone(), p.damage.clone()))
        .collect();
    damage.sort_by_key(|(k, _)| k[0]);
    let mut want = vec![
        (
            vec![short.key],
            Damage::WrongLength {
                expected: 3000,
                actual: 10,
            },
        ),
        (vec![gone.key], Damage::Missing),
    ];
    want.sort_by_key(|(k, _)| k[0]);
    assert_eq!(damage, want);
    assert_eq!(r.orphan_files_removed, vec![orphan.clone()]);
    assert!(!orphan.exists());
    assert_eq!(assert_consistent(&s).len(), 1);
    assert_eq!(
        s.lookup(&digest(3), &host()).unwrap()[0].entry.key,
        kept.key
    );
    // A second pass finds nothing.
    let again = s.reconcile().unwrap();
    assert!(again.damaged.is_empty() && again.orphan_files_removed.is_empty());
}

#[test]
fn a_rotten_payload_is_never_served_and_a_later_put_replaces_it() {
    let d = tempfile::tempdir().unwrap();
    let data = payload(4, 6000);
    let (a, b, path) = {
        let s = Store::open(d.path(), StoreOptions::default()).unwrap();
        let a = s.put(&entry(1), data.as_slice()).unwrap().entry;
        // Another key sharing the payload file.
        let b = s.put(&entry(2), data.as_slice()).unwrap().entry;
        let path = s.blob_path(&a.payload.blake3);
        (a, b, path)
    };
    // Same length, one byte changed: only a hash notices.
    flip_byte(&path, 4321);

    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    match s.open_payload(&a.key) {
        Err(StoreError::PayloadCorrupt {
            dropped,
            quarantined,
            ..
        }) => {
            let mut dropped = dropped;
            dropped.sort();
            let mut want = vec![a.key, b.key];
            want.sort();
            assert_eq!(dropped, want, "every entry using the file is dropped");
            assert!(quarantined
                .unwrap()
                .starts_with(d.path().join("quarantine")));
        }
        other => panic!("served a rotten payload: {other:?}"),
    }
    assert!(!path.exists());
    assert!(s.lookup(&digest(1), &host()).unwrap().is_empty());
    assert!(s.lookup(&digest(2), &host()).unwrap().is_empty());
    // Packing the same source again stores the good bytes.
    assert!(s.put(&entry(1), data.as_slice()).unwrap().created);
    assert_eq!(&s.open_payload(&a.key).unwrap()[..], &data[..]);
    let v = s.verify(false).unwrap();
    assert!(v.problems.is_empty() && v.orphan_files.is_empty(), "{v:?}");
}

#[test]
fn a_put_does_not_trust_a_shared_file_it_did_not_hash() {
    let d = tempfile::tempdir().unwrap();
    let data = payload(5, 9000);
    let a = {
        let s = Store::open(d.path(), StoreOptions::default()).unwrap();
        s.put(&entry(1), data.as_slice()).unwrap().entry
    };
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let path = s.blob_path(&a.payload.blake3);
    flip_byte(&path, 10);
    // Same bytes under another key: the existing file of that blake3 does
    // not hash to its name, so it is replaced (atomically) by the new bytes.
    let b = s.put(&entry(2), data.as_slice()).unwrap().entry;
    assert_eq!(b.payload, a.payload);
    assert_eq!(fs::read(&path).unwrap(), data);
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o444
    );
    assert_eq!(&s.open_payload(&a.key).unwrap()[..], &data[..]);
    assert!(s.verify(false).unwrap().problems.is_empty());
    assert_eq!(assert_consistent(&s).len(), 2);
}

#[test]
fn verify_without_repair_only_reports() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let bad = s.put(&entry(1), payload(1, 5000).as_slice()).unwrap().entry;
    let path = s.blob_path(&bad.payload.blake3);
    flip_byte(&path, 7);
    let orphan = s.blob_path(blake3::hash(b"nobody").as_bytes());
    fs::write(&orphan, b"nobody").unwrap();

    let r = s.verify(false).unwrap();
    assert!(!r.repaired);
    assert_eq!(r.problems.len(), 1);
    assert_eq!(r.problems[0].entries, vec![bad.key]);
    assert!(r.problems[0].entries_dropped.is_empty());
    assert_eq!(r.problems[0].quarantined, None);
    assert_eq!(r.orphan_files, vec![orphan.clone()]);
    assert!(
        path.exists() && orphan.exists(),
        "report-only changes nothing"
    );
    assert_eq!(s.list(&Default::default()).unwrap().len(), 1);

    let r = s.verify(true).unwrap();
    assert!(r.repaired);
    assert_eq!(r.problems[0].entries_dropped, vec![bad.key]);
    assert_eq!(r.orphan_files, vec![orphan.clone()]);
    assert!(!path.exists() && !orphan.exists());
    let clean = s.verify(false).unwrap();
    assert!(clean.problems.is_empty() && clean.orphan_files.is_empty());
}
