//! What ctcached reads and writes for a socket peer (issue 13, part B),
//! tested as the attacks the rules stop: uid 65534 plants symbolic links in
//! its own folders and asks the root daemon to write through them, or to
//! read another user's private model through them. The attacker half runs
//! by re-executing this test binary under `setpriv`.

mod support;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ctcache_api::v1 as api;
use support::*;
use tonic::Code;

/// A folder of uid 65534's own (0755) in a folder anyone may search.
fn nobodys_folder() -> (tempfile::TempDir, PathBuf) {
    let top = tempfile::tempdir().unwrap();
    open_to_all(top.path());
    let mine = top.path().join("nobody");
    std::fs::create_dir(&mine).unwrap();
    std::os::unix::fs::chown(&mine, Some(NOBODY), Some(NOBODY)).unwrap();
    (top, mine)
}

/// Every file under `dir` with its content, owner and mode.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, u32, u32)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file() {
                out.insert(p.clone(), (std::fs::read(&p).unwrap(), m.uid(), m.mode()));
            }
        }
    }
    out
}

fn env_path(key: &str) -> Option<PathBuf> {
    std::env::var_os(key).map(PathBuf::from)
}

async fn client_at(socket: &Path) -> Conn {
    Conn::at(socket).await
}

/// The attacker half of `writes_for_a_peer_never_follow_its_links`.
#[tokio::test]
async fn link_planting_helper() {
    let (Some(socket), Some(dir)) = (env_path("CT_TEST_SOCKET"), env_path("CT_TEST_DIR")) else {
        return;
    };
    let c = client_at(&socket).await;
    let s = |p: PathBuf| p.display().to_string();
    let model = s(dir.join("m.onnx"));
    let req = api::MaterializeRequest {
        model_path: model.clone(),
        ..Default::default()
    };
    let copy = ctcache::materialize::LinkMode::Copy;
    // `out.onnx.weights` links into the cache: refused, nothing written.
    let err = materialize_file(&socket, req.clone(), &dir.join("out.onnx"), copy)
        .await
        .expect_err("a linked weights folder is refused");
    assert!(err.to_string().contains("not a folder"), "{err:?}");
    // `out2.onnx` links to root's file: the link is replaced by a file of
    // the caller's; root's file is untouched.
    let r = materialize_file(&socket, req.clone(), &dir.join("out2.onnx"), copy)
        .await
        .expect("materialize beside a planted link");
    assert!(r.nodes_rewritten > 0, "{r:?}");
    let r = c
        .library()
        .await
        .embed(api::EmbedRequest {
            model_path: model.clone(),
            output_path: s(dir.join("out3.onnx")),
            ..Default::default()
        })
        .await
        .expect("embed beside a planted link");
    assert!(r.entries > 0, "{r:?}");
    // A root-owned file in a shared sticky folder is not the caller's to
    // replace: the caller's own write is refused by the kernel.
    let sticky = dir.parent().unwrap().join("sticky/root.onnx");
    let err = materialize_file(&socket, req, &sticky, copy)
        .await
        .expect_err("root's file in a sticky folder is refused");
    assert!(
        err.to_string().contains("another user") || err.to_string().contains("ermission denied"),
        "{err:?}"
    );
    println!("LINKS-REFUSED-OK");
}

#[test]
fn writes_for_a_peer_never_follow_its_links() {
    if !uid_switch_or_skip() {
        return;
    }
    let mut d = daemon_for_nobody("");
    let (top, dir) = nobodys_folder();
    let model = dir.join("m.onnx");
    write_model(&model, &matmul_model(512, 256, 3));
    std::os::unix::fs::chown(&model, Some(NOBODY), Some(NOBODY)).unwrap();
    // Something in the cache for the planted link to point at.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async { prepack_all(&mut client_at(&d.socket).await, &model).await });
    let blobs = d.cache.join("blobs");
    let cache_before = snapshot(&blobs);
    let shard = cache_before
        .keys()
        .next()
        .and_then(|p| p.parent())
        .expect("a payload file in the cache")
        .to_path_buf();
    let private = top.path().join("root-owned");
    std::fs::write(&private, b"root's bytes").unwrap();
    std::os::unix::fs::symlink(&shard, dir.join("out.onnx.weights")).unwrap();
    std::os::unix::fs::symlink(&private, dir.join("out2.onnx")).unwrap();
    std::os::unix::fs::symlink(&private, dir.join("out3.onnx")).unwrap();
    let sticky = top.path().join("sticky");
    std::fs::create_dir(&sticky).unwrap();
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::write(sticky.join("root.onnx"), b"root's model").unwrap();

    run_as_nobody(
        &d,
        "link_planting_helper",
        &[("CT_TEST_SOCKET", &d.socket), ("CT_TEST_DIR", &dir)],
        "LINKS-REFUSED-OK",
    );

    // The cache and root's files are as they were: content, owner, mode.
    let cache_after = snapshot(&blobs);
    for (p, before) in &cache_before {
        assert_eq!(cache_after.get(p), Some(before), "{}", p.display());
    }
    let m = std::fs::metadata(&private).unwrap();
    assert_eq!(std::fs::read(&private).unwrap(), b"root's bytes");
    assert_eq!(m.uid(), 0);
    assert_eq!(
        std::fs::read(sticky.join("root.onnx")).unwrap(),
        b"root's model"
    );
    // The links were replaced by the caller's own files.
    for out in ["out2.onnx", "out3.onnx"] {
        let m = std::fs::symlink_metadata(dir.join(out)).unwrap();
        assert!(m.is_file(), "{out}");
        assert_eq!(m.uid(), NOBODY, "{out}");
    }
    let weights = std::fs::symlink_metadata(dir.join("out2.onnx.weights")).unwrap();
    assert!(weights.is_dir() && weights.uid() == NOBODY);
    assert!(std::fs::symlink_metadata(dir.join("out.onnx.weights"))
        .unwrap()
        .is_symlink());
    assert!(!dir.join("out.onnx").exists());
    assert_eq!(d.stop(), Some(0));
}

/// The peer half of `a_peer_never_reads_a_private_model_through_its_links`.
#[tokio::test]
async fn private_model_helper() {
    let (Some(socket), Some(dir)) = (env_path("CT_TEST_SOCKET"), env_path("CT_TEST_WATCHED"))
    else {
        return;
    };
    let mut c = client_at(&socket).await;
    // The peer's own open is refused: it has nothing to hand over.
    let link = dir.join("private.onnx");
    let err = c
        .try_hand(&link)
        .await
        .map(drop)
        .expect_err("handing over another user's private model");
    assert!(
        matches!(&err, ctcache_client::Error::Io { source, .. }
            if source.kind() == std::io::ErrorKind::PermissionDenied),
        "{err:?}"
    );
    // And the daemon opens no path for it.
    for by_path in [
        c.resolve_model(api::ResolveModelRequest {
            model_path: link.display().to_string(),
            ..Default::default()
        })
        .await
        .map(drop),
        c.prepack(api::PrepackRequest {
            model_path: link.display().to_string(),
            ..Default::default()
        })
        .await
        .map(drop),
    ] {
        let err = by_path.expect_err("another user's private model by path");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    }
    c.add_watch(api::WatchRequest {
        dir: dir.display().to_string(),
    })
    .await
    .expect("watching a folder of one's own");
    println!("PRIVATE-REFUSED-OK");
}

#[test]
fn a_peer_never_reads_a_private_model_through_its_links() {
    if !uid_switch_or_skip() {
        return;
    }
    let mut d = daemon_for_nobody("");
    let (top, watched) = nobodys_folder();
    let private = top.path().join("private.onnx");
    write_model(&private, &matmul_model(512, 256, 5));
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&private, watched.join("private.onnx")).unwrap();
    // A folder in the watched tree the peer may not list, with a model: the
    // watcher walks it with the daemon's rights, and must neither read it
    // nor name it in an event (events go to every subscriber).
    let closed = watched.join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    write_model(&closed.join("hidden.onnx"), &matmul_model(512, 256, 7));
    // A subfolder of its own with a model it may read: a user's watch covers
    // its folder alone (each folder of a user's tree would cost the daemon's
    // user an inotify watch), so this one is not packed either.
    let sub = watched.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let deep = sub.join("deep.onnx");
    write_model(&deep, &matmul_model(512, 256, 8));
    for p in [&sub, &deep] {
        std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    // A model of the peer's own beside it shows when the watch was scanned.
    let own = watched.join("own.onnx");
    write_model(&own, &matmul_model(512, 256, 6));
    std::os::unix::fs::chown(&own, Some(NOBODY), Some(NOBODY)).unwrap();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut events = rt.block_on(async {
        let mut c = client_at(&d.socket).await;
        c.events(api::EventsRequest {}).await.unwrap().into_inner()
    });
    run_as_nobody(
        &d,
        "private_model_helper",
        &[("CT_TEST_SOCKET", &d.socket), ("CT_TEST_WATCHED", &watched)],
        "PRIVATE-REFUSED-OK",
    );
    rt.block_on(async {
        let mut c = client_at(&d.socket).await;
        let own_digest = digest_of(&own, "W");
        let scanned = eventually(Duration::from_secs(60), || {
            let (mut c, digest) = (c.clone(), own_digest.clone());
            async move { (!entries_for(&mut c, &digest).await.is_empty()).then_some(()) }
        })
        .await;
        assert!(scanned.is_some(), "the watch was never scanned");
        // The watcher's turn at the private model ends in its skip event;
        // then nothing of it may be left.
        let link = watched.join("private.onnx").display().to_string();
        let mut seen = Vec::new();
        while !seen
            .iter()
            .any(|e: &api::Event| e.model_path == link && e.detail.starts_with("skipped:"))
        {
            let e = next_event(&mut events, 60, "the private model's skip event").await;
            seen.push(no_hidden_names(e));
        }
        let left = entries_for(&mut c, &digest_of(&private, "W")).await;
        assert!(left.is_empty(), "the private model was packed");
        let hidden = entries_for(&mut c, &digest_of(&closed.join("hidden.onnx"), "W")).await;
        assert!(
            hidden.is_empty(),
            "the model in the closed folder was packed"
        );
        let deep_entries = entries_for(&mut c, &digest_of(&deep, "W")).await;
        assert!(
            deep_entries.is_empty(),
            "a user's watch reached into a subfolder"
        );
        while let Ok(Ok(Some(e))) =
            tokio::time::timeout(Duration::from_millis(200), events.message()).await
        {
            no_hidden_names(e);
        }
    });
    assert_eq!(d.stop(), Some(0));
}

/// `e`, after checking it names nothing the peer may not list, and names
/// a watched folder by its path (it is read through its handle).
fn no_hidden_names(e: api::Event) -> api::Event {
    assert!(
        !e.model_path.contains("hidden") && !e.detail.contains("hidden"),
        "an event names what the peer may not list: {e:?}"
    );
    assert!(
        !e.model_path.contains("/proc/self/fd") && !e.detail.contains("/proc/self/fd"),
        "an event names the handle, not the path: {e:?}"
    );
    e
}

/// Folders uid 65534 races over in `watch_swap_helper`.
const SWAPPED: usize = 48;

/// Swaps `a` and `b` (a folder and a link) in one step.
fn exchange(a: &Path, b: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let (a, b) = (c(a), c(b));
    // SAFETY: two valid NUL-terminated paths; renameat2 reads them only.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(r, 0, "renameat2: {}", std::io::Error::last_os_error());
}

/// The attacker half of `a_watch_lands_on_the_folder_that_was_checked`.
#[tokio::test]
async fn watch_swap_helper() {
    let (Some(socket), Some(mine), Some(secret), Some(hidden)) = (
        env_path("CT_TEST_SOCKET"),
        env_path("CT_TEST_MINE"),
        env_path("CT_TEST_SECRET_DIR"),
        env_path("CT_TEST_HIDDEN_WATCH"),
    ) else {
        return;
    };
    // Each `open{i}` is a folder of its own and `flip{i}` a link to the
    // folder it may not read; a thread swaps the two names as fast as it
    // can while the daemon is asked to watch `open{i}`: the check may see
    // the folder and a later lookup of the same path the link.
    let pairs: Vec<(PathBuf, PathBuf)> = (0..SWAPPED)
        .map(|i| {
            let (open, flip) = (mine.join(format!("open{i}")), mine.join(format!("flip{i}")));
            std::fs::create_dir(&open).unwrap();
            std::os::unix::fs::symlink(&secret, &flip).unwrap();
            (open, flip)
        })
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let (stop, pairs) = (stop.clone(), pairs.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (open, flip) in &pairs {
                    exchange(open, flip);
                }
            }
            // Leave every folder under its `open{i}` name.
            for (open, flip) in &pairs {
                if std::fs::symlink_metadata(open).unwrap().is_symlink() {
                    exchange(open, flip);
                }
            }
        })
    };
    let mut c = client_at(&socket).await;
    let (mut added, mut refused) = (0, 0);
    for _ in 0..8 {
        for (open, _) in &pairs {
            let asked = c
                .add_watch(api::WatchRequest {
                    dir: open.display().to_string(),
                })
                .await;
            match asked {
                Ok(_) => added += 1,
                Err(e) => {
                    assert!(
                        matches!(e.code(), Code::PermissionDenied | Code::ResourceExhausted),
                        "{e:?}"
                    );
                    refused += 1;
                }
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flipper.join().unwrap();
    assert!(added > 0 && refused > 0, "added {added}, refused {refused}");
    // Its list names its own folders, not one of root's it cannot list.
    let listed = c
        .list_watches(api::ListWatchesRequest {})
        .await
        .unwrap()
        .into_inner()
        .dirs;
    assert!(
        listed
            .iter()
            .any(|d| d.contains("/open") || d.contains("/flip")),
        "{listed:?}"
    );
    assert!(
        !listed.contains(&hidden.display().to_string()),
        "{listed:?}"
    );
    println!("WATCH-SWAP-DONE");
}

/// A peer that swaps its folders with links to a folder it may not read
/// while asking for them to be watched never gets that folder watched:
/// the watch is placed on the folder that was opened and judged (through
/// its handle), never on the path looked up again. A model root then
/// writes into that folder is named in no event. Nor does the peer see, in
/// the list of watched folders, one of root's it could not list.
#[test]
fn a_watch_lands_on_the_folder_that_was_checked() {
    if !uid_switch_or_skip() {
        return;
    }
    let mut d = daemon_for_nobody(&format!("max_watches_per_uid = {}\n", 2 * SWAPPED));
    let (top, mine) = nobodys_folder();
    let closed = top.path().join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let secret = closed.join("secret");
    std::fs::create_dir(&secret).unwrap();
    // Root's watch on a folder only root may list.
    let hidden = closed.join("hidden");
    std::fs::create_dir(&hidden).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = client_at(&d.socket).await;
        c.add_watch(api::WatchRequest {
            dir: hidden.display().to_string(),
        })
        .await
        .expect("root watches a folder of its own");
    });
    run_as_nobody(
        &d,
        "watch_swap_helper",
        &[
            ("CT_TEST_SOCKET", d.socket.as_path()),
            ("CT_TEST_MINE", mine.as_path()),
            ("CT_TEST_SECRET_DIR", secret.as_path()),
            (
                "CT_TEST_HIDDEN_WATCH",
                hidden.canonicalize().unwrap().as_path(),
            ),
        ],
        "WATCH-SWAP-DONE",
    );
    // A model appears in the folder only root may read, then one in the
    // admin's watched folder; every event up to the second's is checked.
    let named = rt.block_on(async {
        let mut c = client_at(&d.socket).await;
        let mut events = c.events(api::EventsRequest {}).await.unwrap().into_inner();
        write_model(&secret.join("leak.onnx"), &matmul_model(256, 256, 31));
        let sentinel = d.models.join("sentinel.onnx");
        write_model(&sentinel, &matmul_model(256, 256, 32));
        let sentinel = sentinel.canonicalize().unwrap().display().to_string();
        let mut named = Vec::new();
        loop {
            let e = next_event(&mut events, 60, "the sentinel's event").await;
            if e.model_path.contains("leak.onnx") || e.detail.contains("leak.onnx") {
                named.push(format!("{e:?}"));
            }
            if e.model_path == sentinel {
                break named;
            }
        }
    });
    assert!(
        named.is_empty(),
        "root's folder was watched for uid 65534: {named:#?}"
    );
    let watched = rt.block_on(async {
        let mut c = client_at(&d.socket).await;
        c.list_watches(api::ListWatchesRequest {})
            .await
            .unwrap()
            .into_inner()
            .dirs
    });
    let secret = secret.canonicalize().unwrap().display().to_string();
    assert!(!watched.contains(&secret), "{watched:?}");
    assert_eq!(d.stop(), Some(0));
}

/// The follower half of `events_show_a_user_only_models_it_may_list`.
#[tokio::test]
async fn events_view_helper() {
    let (Some(socket), Some(open)) = (env_path("CT_TEST_SOCKET"), env_path("CT_TEST_OPEN")) else {
        return;
    };
    let mut c = client_at(&socket).await;
    let mut events = c.events(api::EventsRequest {}).await.unwrap().into_inner();
    // Subscribed: root may now write its models.
    std::fs::write(open.join("subscribed"), b"").unwrap();
    let mut seen = Vec::new();
    loop {
        let e = next_event(&mut events, 120, "the last model's event").await;
        assert!(
            !e.model_path.contains("closed") && !e.detail.contains("closed"),
            "an event of a folder uid 65534 may not list: {e:?}"
        );
        seen.push(e.model_path.clone());
        if e.model_path.ends_with("last.onnx") {
            break;
        }
    }
    println!("EVENTS-VIEW-OK {seen:?}");
}

/// A user following the daemon's events is shown the models of folders it
/// may list, not those of others' private folders in the same watched tree.
#[test]
fn events_show_a_user_only_models_it_may_list() {
    if !uid_switch_or_skip() {
        return;
    }
    let mut d = daemon_for_nobody("");
    open_to_all(&d.models);
    let open = d.models.join("open");
    std::fs::create_dir(&open).unwrap();
    std::os::unix::fs::chown(&open, Some(NOBODY), Some(NOBODY)).unwrap();
    let closed = d.models.join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let socket = d.socket.clone();
    let (secret, last) = (closed.join("secret.onnx"), open.join("last.onnx"));
    let root = std::thread::spawn(move || {
        let flag = secret
            .parent()
            .unwrap()
            .with_file_name("open")
            .join("subscribed");
        wait_for_flag(&flag, "the follower's subscription");
        // Root's private model is packed while the user follows, then a
        // model the user may see closes its watch of the stream.
        write_model(&secret, &matmul_model(256, 256, 21));
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let c = client_at(&socket).await;
            wait_for_entries(&c, &digest_of(&secret, "W"), 2, "the private model packed").await;
        });
        write_model(&last, &matmul_model(256, 256, 22));
    });
    let out = run_as_nobody(
        &d,
        "events_view_helper",
        &[("CT_TEST_SOCKET", &d.socket), ("CT_TEST_OPEN", &open)],
        "EVENTS-VIEW-OK",
    );
    root.join().unwrap();
    assert!(out.contains("last.onnx"), "{out}");
    assert_eq!(d.stop(), Some(0));
}

/// The peer half of `embed_probes_no_file_outside_the_callers_folder`.
#[tokio::test]
async fn probing_helper() {
    let (Some(socket), Some(dir)) = (env_path("CT_TEST_SOCKET"), env_path("CT_TEST_DIR")) else {
        return;
    };
    let c = client_at(&socket).await.library().await;
    let err = c
        .embed(api::EmbedRequest {
            model_path: dir.join("m/probe.onnx").display().to_string(),
            output_path: dir.join("o/out.onnx").display().to_string(),
            ..Default::default()
        })
        .await
        .expect_err("an external-data location out of the folder is no file there");
    assert!(err.to_string().contains("does not have"), "{err:?}");
    println!("PROBE-REFUSED-OK");
}

/// A model's external-data location is the caller's to write: the root
/// daemon, checking that an embed output's folder has the model's data
/// files, looks for them beneath that folder only. Else a location through
/// a link the caller planted (`sub/secret`, `sub` -> a root-only folder)
/// would tell uid 65534 whether a file exists in a folder it cannot search
/// (the embed would be accepted or refused).
#[test]
fn embed_probes_no_file_outside_the_callers_folder() {
    if !uid_switch_or_skip() {
        return;
    }
    let mut d = daemon_for_nobody("");
    let (top, dir) = nobodys_folder();
    let private = top.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(private.join("secret"), b"root's").unwrap();
    let mut m = ctcache_testkit::MatMul::new(
        512,
        256,
        ctcache_testkit::xorshift(9).map(ctcache_testkit::unit_f32),
    )
    .proto();
    let g = m.graph.as_mut().unwrap();
    let entry = |k: &str, v: &str| ctcache::pb::StringStringEntryProto {
        key: k.into(),
        value: v.into(),
    };
    g.initializer.push(ctcache::pb::TensorProto {
        name: "probe".into(),
        data_type: 1,
        dims: vec![1],
        data_location: ctcache::pb::tensor_proto::DataLocation::External as i32,
        external_data: vec![entry("location", "sub/secret"), entry("length", "4")],
        ..Default::default()
    });
    // The model's own data file beside it; in the output folder, uid
    // 65534's link of the same name out to the folder it cannot search.
    let (model_dir, out_dir) = (dir.join("m"), dir.join("o"));
    std::fs::create_dir_all(model_dir.join("sub")).unwrap();
    std::fs::write(model_dir.join("sub/secret"), b"mine").unwrap();
    std::fs::create_dir(&out_dir).unwrap();
    std::os::unix::fs::symlink(&private, out_dir.join("sub")).unwrap();
    let model = model_dir.join("probe.onnx");
    write_model(&model, &prost::Message::encode_to_vec(&m));
    for p in [
        &model_dir,
        &model_dir.join("sub"),
        &model_dir.join("sub/secret"),
        &model,
        &out_dir,
    ] {
        std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    run_as_nobody(
        &d,
        "probing_helper",
        &[("CT_TEST_SOCKET", &d.socket), ("CT_TEST_DIR", &dir)],
        "PROBE-REFUSED-OK",
    );
    assert!(!out_dir.join("out.onnx").exists());
    assert_eq!(d.stop(), Some(0));
}

/// The peer half of `a_peer_gets_copies_not_hard_links_of_the_store`.
#[tokio::test]
async fn hard_link_helper() {
    let (Some(socket), Some(dir)) = (env_path("CT_TEST_SOCKET"), env_path("CT_TEST_LINKS")) else {
        return;
    };
    let req = api::MaterializeRequest {
        model_path: dir.join("m.onnx").display().to_string(),
        ..Default::default()
    };
    let hard = ctcache::materialize::LinkMode::Hard;
    let r = materialize_file(&socket, req, &dir.join("out.onnx"), hard)
        .await
        .expect("materialize with --link hard");
    assert!(r.nodes_rewritten > 0 && r.files_linked == 0, "{r:?}");
    assert!(r.files_copied > 0, "{r:?}");
    println!("HARD-LINKS-COPIED-OK");
}

/// A socket peer asking for hard links gets copies: a link of the store's
/// payload in the peer's folder would keep the payload's bytes on disk
/// after gc evicts it, outside the peer's quota and gc's reach (the kernel
/// itself refuses that user such a link under `fs.protected_hardlinks`).
#[test]
fn a_peer_gets_copies_not_hard_links_of_the_store() {
    if !uid_switch_or_skip() {
        return;
    }
    let mut d = daemon_for_nobody("");
    let (_top, dir) = nobodys_folder();
    let model = dir.join("m.onnx");
    write_model(&model, &matmul_model(512, 256, 3));
    std::os::unix::fs::chown(&model, Some(NOBODY), Some(NOBODY)).unwrap();
    run_as_nobody(
        &d,
        "hard_link_helper",
        &[("CT_TEST_SOCKET", &d.socket), ("CT_TEST_LINKS", &dir)],
        "HARD-LINKS-COPIED-OK",
    );
    let weights = dir.join("out.onnx.weights");
    for e in std::fs::read_dir(&weights).unwrap() {
        let m = e.unwrap().metadata().unwrap();
        assert_eq!(
            m.nlink(),
            1,
            "a payload of the store linked into the peer's folder"
        );
    }
    assert_eq!(d.stop(), Some(0));
}
