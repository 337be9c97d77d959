//! Opening a cache dir: one owner at a time, layout versions (refuse newer,
//! migrate older), temp cleanup at start-up, plus lookups (D5/D4 and the
//! best-first order), list filters and stats.

mod store_util;

use std::fs;
use std::time::Duration;

use ctcache::device::RuntimeIdentity;
use ctcache::hit::KnownTypes;
use ctcache::pb;
use ctcache::store::{Accept, Filter, HostFilter, Store, StoreError, StoreOptions, LAYOUT_VERSION};
use store_util::*;

#[test]
fn second_opener_is_refused_naming_the_owner() {
    let d = tempfile::tempdir().unwrap();
    let first = Store::open(d.path(), StoreOptions::default()).unwrap();
    let err = Store::open(d.path(), StoreOptions::default())
        .err()
        .expect("refused");
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Locked { pid: Some(p), .. } if p == std::process::id()));
    assert!(
        msg.contains(&format!("pid {}", std::process::id())),
        "{msg}"
    );
    assert!(msg.contains("in use by another process"), "{msg}");
    drop(first);
    Store::open(d.path(), StoreOptions::default()).expect("free again after drop");
}

#[test]
fn second_opener_in_another_process_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let _owner = Store::open(d.path(), StoreOptions::default()).unwrap();
    // flock(1) from util-linux stands in for a second ctcache process.
    let out = std::process::Command::new("flock")
        .args(["--nonblock", "--conflict-exit-code", "42"])
        .arg(d.path().join("LOCK"))
        .arg("true")
        .output();
    if let Ok(out) = out {
        assert_eq!(out.status.code(), Some(42), "LOCK is not held exclusively");
    }
    let pid = fs::read_to_string(d.path().join("LOCK")).unwrap();
    assert_eq!(pid.trim(), std::process::id().to_string());
}

#[test]
fn newer_layout_is_refused_with_a_clear_message() {
    let d = tempfile::tempdir().unwrap();
    drop(Store::open(d.path(), StoreOptions::default()).unwrap());
    fs::write(
        d.path().join("LAYOUT"),
        format!("ctcache-store-layout {}\n", LAYOUT_VERSION + 1),
    )
    .unwrap();
    let err = Store::open(d.path(), StoreOptions::default())
        .err()
        .unwrap();
    assert!(matches!(err, StoreError::NewerLayout { found, .. } if found == LAYOUT_VERSION + 1));
    assert!(
        err.to_string().contains("newer than this build supports"),
        "{err}"
    );
}

#[test]
fn version_0_layout_is_migrated() {
    let d = tempfile::tempdir().unwrap();
    let keys: Vec<_> = {
        let s = Store::open(d.path(), StoreOptions::default()).unwrap();
        (0..5)
            .map(|i| {
                s.put(&entry(i), payload(i, 1000).as_slice())
                    .unwrap()
                    .entry
                    .key
            })
            .collect()
    };
    // Rewrite it as a layout-0 dir: payload files flat in blobs/, named by
    // their digest alone.
    let blobs = d.path().join("blobs");
    for shard in fs::read_dir(&blobs).unwrap() {
        let shard = shard.unwrap().path();
        for f in fs::read_dir(&shard).unwrap() {
            let f = f.unwrap();
            let name = f.file_name().to_string_lossy().into_owned();
            let digest = name.split('.').next().unwrap();
            fs::rename(f.path(), blobs.join(digest)).unwrap();
        }
        fs::remove_dir(shard).unwrap();
    }
    fs::remove_dir(d.path().join("quarantine")).unwrap();
    fs::write(d.path().join("LAYOUT"), "ctcache-store-layout 0\n").unwrap();

    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    assert_eq!(s.opened().layout_found, Some(0));
    assert_eq!(
        fs::read_to_string(d.path().join("LAYOUT")).unwrap().trim(),
        format!("ctcache-store-layout {LAYOUT_VERSION}")
    );
    assert_eq!(assert_consistent(&s).len(), 5);
    for k in keys {
        s.open_payload(&k).unwrap();
    }
    assert!(s.verify(true).unwrap().problems.is_empty());
}

#[test]
fn temp_leftovers_are_removed_at_start_up() {
    let d = tempfile::tempdir().unwrap();
    drop(Store::open(d.path(), StoreOptions::default()).unwrap());
    fs::write(d.path().join("tmp/123-0.part"), b"half a payload").unwrap();
    fs::create_dir(d.path().join("tmp/odd")).unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    assert_eq!(s.opened().temp_removed, 2);
    assert!(tmp_is_empty(d.path()));
}

/// A first start killed between writing LAYOUT's temp file and renaming it
/// left a new dir holding only that temp; the next start must not read it
/// as a folder in use (it refused, and the cache dir could never open).
#[test]
fn an_interrupted_first_start_is_finished_by_the_next() {
    let d = tempfile::tempdir().unwrap();
    let temp = d.path().join(".LAYOUT.tmp-0123456789abcdef");
    fs::write(&temp, b"ctcache-store-layout 1\n").unwrap();
    fs::write(d.path().join("LOCK"), b"").unwrap();
    drop(Store::open(d.path(), StoreOptions::default()).expect("opens"));
    assert!(!temp.exists());
    // Another hidden file is still somebody else's.
    let e = tempfile::tempdir().unwrap();
    fs::write(e.path().join(".LAYOUT.tmp-notours"), b"").unwrap();
    assert!(Store::open(e.path(), StoreOptions::default()).is_err());
}

#[test]
fn a_folder_in_use_is_not_taken_over() {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("thesis.tex"), b"...").unwrap();
    let err = Store::open(d.path(), StoreOptions::default())
        .err()
        .unwrap();
    assert!(matches!(err, StoreError::BadLayout { .. }), "{err}");
}

#[test]
fn a_new_cache_dir_may_hold_the_daemons_socket() {
    // The default socket lives in the cache dir (D8) and is bound first.
    let d = tempfile::tempdir().unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(d.path().join("ctcached.sock")).unwrap();
    Store::open(d.path(), StoreOptions::default()).expect("a socket is no data to protect");
}

#[test]
fn lookup_applies_d5_and_d4_best_first() {
    let d = tempfile::tempdir().unwrap();
    let now = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1_000));
    let s = Store::open(
        d.path(),
        StoreOptions {
            clock: ctcache::store::Clock::manual(now.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let src = digest(7);
    let host_cpu = cpu("x86_64-avx2", "avx,avx2,fma");
    let put = |dev: pb::DeviceProto, t: pb::StructTypeProto, at: u64| {
        now.store(at, std::sync::atomic::Ordering::SeqCst);
        s.put(&entry_for(src, dev, t), &b"p"[..]).unwrap().entry.key
    };
    let exact = put(host_cpu.clone(), ty("a.fmt", 1), 1_000);
    let subset_old = put(cpu("x86_64-avx2", "avx2"), ty("a.fmt", 1), 2_000);
    let subset_new = put(cpu("x86_64-avx2", "fma"), ty("a.fmt", 1), 3_000);
    let _needs_more = put(cpu("x86_64-avx512", "avx512f"), ty("a.fmt", 1), 4_000);
    let _arm = put(cpu("aarch64-neon", ""), ty("a.fmt", 1), 5_000);
    let mut rt_dev = host_cpu.clone();
    rt_dev.runtime = "ort".into();
    rt_dev.runtime_version = "1.2.0".into();
    let with_rt = put(rt_dev, ty("a.fmt", 1), 6_000);
    let v2 = put(cpu("x86_64-avx2", ""), ty("a.fmt", 2), 7_000);
    let other = put(cpu("x86_64-avx2", ""), ty("b.fmt", 1), 8_000);
    let _other_source = s
        .put(
            &entry_for(digest(8), host_cpu.clone(), ty("a.fmt", 1)),
            &b"q"[..],
        )
        .unwrap();

    let keys = |h: &HostFilter| -> Vec<_> {
        s.lookup(&src, h)
            .unwrap()
            .into_iter()
            .map(|h| h.entry.key)
            .collect()
    };
    // No runtime named: runtime checks skipped. Exact device first, then newest.
    let any = HostFilter::new(vec![host_cpu.clone()], None, Accept::Any);
    assert_eq!(
        keys(&any),
        vec![exact, other, v2, with_rt, subset_new, subset_old]
    );
    let hits = s.lookup(&src, &any).unwrap();
    assert!(hits[0].exact && !hits[1].exact);

    let recognized = Accept::Known(std::sync::Arc::new(KnownTypes::new(NamedTypes(vec![(
        "a.fmt", 1,
    )]))));
    let ort13 = RuntimeIdentity {
        name: "ort".into(),
        version: "1.3.0".into(),
    };
    let h = HostFilter::new(vec![host_cpu.clone()], Some(ort13), recognized.clone());
    assert_eq!(keys(&h), vec![exact, with_rt, subset_new, subset_old]);
    let ort2 = RuntimeIdentity {
        name: "ort".into(),
        version: "2.0.0".into(),
    };
    let h = HostFilter::new(vec![host_cpu.clone()], Some(ort2), recognized);
    assert_eq!(keys(&h), vec![exact, subset_new, subset_old]);

    let h = HostFilter::new(
        vec![host_cpu.clone()],
        None,
        Accept::exact([layout("a.fmt", 2)]),
    );
    assert_eq!(keys(&h), vec![v2]);
    assert_eq!(v2.physical_type, layout("a.fmt", 2).key);

    // A second host device: entries fitting the first listed device come first.
    let gpu = pb::DeviceProto {
        r#type: "wgpu".into(),
        architecture: "10de-2330".into(),
        ..Default::default()
    };
    let g = put(gpu.clone(), ty("a.fmt", 1), 9_000);
    let h = HostFilter::new(vec![gpu, host_cpu.clone()], None, Accept::Any);
    let hits = s.lookup(&src, &h).unwrap();
    assert_eq!(hits[0].entry.key, g);
    assert_eq!((hits[0].host_device, hits[1].host_device), (0, 1));

    // A miss counts as one.
    assert!(s.lookup(&digest(99), &any).unwrap().is_empty());
    let st = s.stats().unwrap();
    assert_eq!(st.misses, 1);
    assert_eq!(st.entries, 10);
}

#[test]
fn list_filters_and_stats() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    for i in 0..4 {
        s.put(&entry(i), payload(i, 100).as_slice()).unwrap();
    }
    let gpu = pb::DeviceProto {
        r#type: "wgpu".into(),
        architecture: "10de-2330".into(),
        ..Default::default()
    };
    s.put(
        &entry_for(digest(0), gpu, ty("g.fmt", 3)),
        payload(0, 100).as_slice(),
    )
    .unwrap();
    let n = |f: Filter| s.list(&f).unwrap().len();
    assert_eq!(n(Filter::default()), 5);
    assert_eq!(
        n(Filter {
            format: Some("g.fmt".into()),
            ..Default::default()
        }),
        1
    );
    assert_eq!(
        n(Filter {
            device_type: Some("cpu".into()),
            ..Default::default()
        }),
        4
    );
    assert_eq!(
        n(Filter {
            source: Some(digest(0)),
            ..Default::default()
        }),
        2
    );
    assert_eq!(
        n(Filter {
            limit: Some(2),
            ..Default::default()
        }),
        2
    );
    let st = s.stats().unwrap();
    assert_eq!((st.entries, st.entry_bytes), (5, 500));
    // entry(0) and the GPU entry share one payload file.
    assert_eq!((st.blobs, st.stored_bytes), (4, 400));
    assert_eq!(st.by_format["test.fmt"].entries, 4);
    assert_eq!(st.by_format["g.fmt"].bytes, 100);
    assert_eq!(st.by_device["wgpu 10de-2330"].entries, 1);
    assert_eq!(st.puts, 5);
    let e = s
        .stat(&s.list(&Filter::default()).unwrap()[0].key)
        .unwrap()
        .unwrap();
    assert_eq!(e.dims, vec![16, 16]);
    assert_eq!(e.producer.packer_id, "test");
    assert_eq!(e.pack_duration, Duration::from_millis(1));
    assert_eq!(e.physical_type().unwrap().name, e.type_name);
}

#[test]
fn lookups_explain_their_misses_and_check_a_known_shape() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let avx2 = cpu("x86_64-avx2", "");
    let known = Accept::Known(std::sync::Arc::new(KnownTypes::new(NamedTypes(vec![(
        "a.fmt", 1,
    )]))));
    let host = HostFilter::new(vec![avx2.clone()], None, known.clone());
    let code = |source: u64, shape: Option<&ctcache::hit::SourceShape>, h: &HostFilter| match s
        .lookup_explained(&digest(source), shape, h)
        .unwrap()
    {
        Ok(hits) => format!("{} hit(s)", hits.len()),
        Err(m) => m.code().to_string(),
    };
    assert_eq!(code(1, None, &host), "no_entry");
    s.put(
        &entry_for(digest(1), avx2.clone(), ty("a.fmt", 1)),
        &b"x"[..],
    )
    .unwrap();
    assert_eq!(code(1, None, &host), "1 hit(s)");
    assert_eq!(code(1, Some(&shape()), &host), "1 hit(s)");
    let other = ctcache::hit::SourceShape {
        data_type: ctcache::dtype::DataType::FLOAT,
        dims: vec![8, 32],
    };
    assert_eq!(code(1, Some(&other), &host), "invalid");
    assert!(s
        .lookup_shaped(&digest(1), &other, &host)
        .unwrap()
        .is_empty());
    let arm = HostFilter::new(vec![cpu("aarch64-neon", "")], None, known);
    assert_eq!(code(1, None, &arm), "incompatible_device");
    s.put(
        &entry_for(digest(2), avx2.clone(), ty("a.fmt", 2)),
        &b"y"[..],
    )
    .unwrap();
    assert_eq!(code(2, None, &host), "unsupported_format_version");
    // A type miss says more than a device miss of another entry.
    s.put(
        &entry_for(digest(2), cpu("aarch64-neon", ""), ty("a.fmt", 1)),
        &b"z"[..],
    )
    .unwrap();
    assert_eq!(code(2, None, &host), "unsupported_format_version");
    let mut client = entry_for(digest(3), avx2, ty("a.fmt", 1));
    client.producer.client_uid = Some(4242);
    s.put(&client, &b"w"[..]).unwrap();
    assert_eq!(code(3, None, &host), "1 hit(s)");
    let trusted = host.clone().daemon_produced_only(true);
    assert_eq!(code(3, None, &trusted), "not_daemon_produced");
}

/// The record file of `e` in the cache dir `dir` (records/<xx>/<key hex>).
fn record_path(dir: &std::path::Path, e: &ctcache::store::Entry) -> std::path::PathBuf {
    let name = hex::encode(e.key.to_bytes());
    dir.join("records").join(&name[..2]).join(name)
}

/// Puts `n` entries (small payloads of different lengths) and returns
/// them as listed.
fn fill(s: &Store, n: u64) -> Vec<ctcache::store::Entry> {
    for i in 0..n {
        s.put(&entry(i), payload(i, 64 + i as usize).as_slice())
            .unwrap();
    }
    let mut all = s.list(&Filter::default()).unwrap();
    all.sort_by_key(|e| e.key.to_string());
    all
}

/// Ways an index can be found damaged after a crash or a bad disk.
fn damage_index(dir: &std::path::Path, how: &str) {
    let index = dir.join("index");
    let edit = |name: &str, f: &dyn Fn(&mut Vec<u8>)| {
        let p = index.join(name);
        let mut b = fs::read(&p).unwrap();
        f(&mut b);
        fs::write(&p, b).unwrap();
    };
    match how {
        // sled's checksummed config: one flipped bit.
        "conf bit" => edit("conf", &|b| b[0] ^= 0x20),
        "conf cut" => edit("conf", &|b| b.truncate(b.len() / 2)),
        "db garbage" => edit("db", &|b| b.iter_mut().step_by(7).for_each(|x| *x ^= 0xa5)),
        "db empty" => edit("db", &|b| b.clear()),
        "gone" => fs::remove_dir_all(&index).unwrap(),
        "a file" => {
            fs::remove_dir_all(&index).unwrap();
            fs::write(&index, b"not an index").unwrap();
        }
        other => panic!("unknown damage {other}"),
    }
}

#[test]
fn a_damaged_index_is_rebuilt_from_the_record_files() {
    for how in [
        "conf bit",
        "conf cut",
        "db garbage",
        "db empty",
        "gone",
        "a file",
    ] {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path(), StoreOptions::default()).unwrap();
        let before = fill(&s, 300);
        drop(s);
        damage_index(d.path(), how);

        let s = Store::open(d.path(), StoreOptions::default())
            .unwrap_or_else(|e| panic!("{how}: the store must open: {e}"));
        let opened = s.opened();
        if let Some(reset) = &opened.index_reset {
            assert!(
                reset.moved_to.starts_with(d.path().join("quarantine")),
                "{how}: {reset:?}"
            );
            assert!(!reset.detail.is_empty(), "{how}");
        }
        let sync = opened.record_sync.clone().expect("records synced");
        assert_eq!(sync.indexed, 300, "{how}: {sync:?}");
        // Every entry is back: same key, same payload, lookups find it,
        // and the bytes read are the ones hashed.
        let mut after = assert_consistent(&s);
        after.sort_by_key(|e| e.key.to_string());
        assert_eq!(after.len(), before.len(), "{how}");
        for (a, b) in after.iter().zip(&before) {
            assert_eq!((&a.key, &a.payload), (&b.key, &b.payload), "{how}");
            let p = s.open_payload(&a.key).unwrap();
            assert_eq!(*blake3::hash(&p).as_bytes(), b.payload.blake3, "{how}");
        }
        // Nothing is left for reconcile to remove.
        let r = s.reconcile().unwrap();
        assert!(r.orphan_files_removed.is_empty(), "{how}: {r:?}");
        assert_eq!(r.records, Default::default(), "{how}");
        drop(s);
        let s = Store::open(d.path(), StoreOptions::default()).unwrap();
        assert_eq!(s.opened().index_reset, None, "{how}: the new index opens");
        assert_eq!(s.opened().record_sync, None, "{how}: closed cleanly");
        assert_eq!(s.list(&Filter::default()).unwrap().len(), 300, "{how}");
    }
}

#[test]
fn a_damaged_record_or_a_missing_payload_is_not_indexed() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let all = fill(&s, 4);
    let gone = s.blob_path(&all[1].payload.blake3);
    drop(s);
    let rec = |e: &ctcache::store::Entry| record_path(d.path(), e);
    // One record with a flipped byte, one payload file gone, one record
    // copied under another entry's name; a stray file beside them.
    let mut b = fs::read(rec(&all[0])).unwrap();
    b[12] ^= 1;
    fs::write(rec(&all[0]), b).unwrap();
    fs::remove_file(gone).unwrap();
    fs::copy(rec(&all[3]), rec(&all[2])).unwrap();
    fs::write(d.path().join("records/notes.txt"), b"x").unwrap();
    fs::remove_dir_all(d.path().join("index")).unwrap();

    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let sync = s.opened().record_sync.clone().unwrap();
    assert_eq!(
        (sync.indexed, sync.dropped, sync.stray_removed),
        (1, 3, 1),
        "{sync:?}"
    );
    let left = assert_consistent(&s);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].key, all[3].key);
    let names: usize = fs::read_dir(d.path().join("records"))
        .unwrap()
        .map(|shard| fs::read_dir(shard.unwrap().path()).unwrap().count())
        .sum();
    assert_eq!(names, 1, "dropped records are removed");
}

#[test]
fn index_entries_without_a_record_get_one() {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    let all = fill(&s, 5);
    for e in &all[..2] {
        fs::remove_file(record_path(d.path(), e)).unwrap();
    }
    let r = s.reconcile().unwrap();
    assert_eq!(r.records.rewritten, 2, "{r:?}");
    drop(s);
    // ... so the index can be lost and they come back.
    fs::remove_dir_all(d.path().join("index")).unwrap();
    let s = Store::open(d.path(), StoreOptions::default()).unwrap();
    assert_eq!(assert_consistent(&s).len(), 5);
}
