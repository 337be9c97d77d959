//! End-to-end tests of ctcached on temp dirs, driven over its Unix socket
//! with the generated gRPC client: in this process through `ctcached::run`
//! where no separate process is needed, the real binary for signals,
//! sd_notify, socket and cache-dir conflicts and config errors.

mod support;

use std::path::Path;
use std::time::Duration;

use ctcache_api::v1 as api;
use support::*;
use tokio_stream::StreamExt;
use tonic::Code;

const K: usize = 512;
const N: usize = 256;

#[test]
fn ready_notification_and_clean_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut d = Daemon::start_with(&[], |c| {
        c.env("NOTIFY_SOCKET", &notify);
    });
    let mut buf = [0u8; 4096];
    let mut got = String::new();
    while !got.contains("READY=1") {
        // A handled signal (another test's SIGCHLD) fails a timed wait.
        let n = match sock.recv(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            got => got.expect("no READY=1 notification"),
        };
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert_eq!(d.stop(), Some(0));
    assert!(!d.socket.exists(), "socket removed on exit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_packs_models_without_client_calls() {
    let mut d = InProc::start();
    let mut c = d.client().await;
    let path = d.models.join("mlp.onnx");
    write_model(&path, &matmul_model(K, N, 1));
    let digest = digest_of(&path, "W");
    let entries = wait_for_entries(
        &c,
        &digest,
        2,
        "the watcher packed both formats of the tests' policy",
    )
    .await;
    let mut types: Vec<_> = entries.iter().map(|e| e.physical_type.clone()).collect();
    types.sort();
    assert!(types[0].starts_with("gemm.pack_b.f32"), "{types:?}");
    assert_eq!(types[1], "ort.matmul_nbits.b4.bs32.sym");

    // Replace the initializer: new entries for the new content; the old ones
    // stay (content-keyed) but no longer match the model.
    write_model(&path, &matmul_model(K, N, 2));
    let new_digest = digest_of(&path, "W");
    assert_ne!(new_digest, digest);
    wait_for_entries(&c, &new_digest, 2, "the changed model was packed again").await;
    assert_eq!(
        entries_for(&mut c, &digest).await.len(),
        2,
        "old entries stay until gc"
    );
    let h = c.hand(&path).await;
    let r = c
        .resolve_model(api::ResolveModelRequest {
            model_path: path.display().to_string(),
            handout: h.name().into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.tensors[0].source_digest.as_ref(), &new_digest[..]);
    assert_eq!(r.tensors[0].entries.len(), 2);
    assert!(r.tensors[0].misses.is_empty());
    assert_eq!(d.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn identical_prepacks_share_one_job() {
    let mut d = InProc::start();
    let c = d.client().await;
    let other = tempfile::tempdir().unwrap();
    let path = other.path().join("m.onnx");
    write_model(&path, &matmul_model(1024, 512, 3));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut c = c.clone();
        let p = path.clone();
        tasks.push(tokio::spawn(async move { prepack_all(&mut c, &p).await }));
    }
    // Requests that arrive while the job runs join it (same job id, DONE);
    // one that arrives after it finished finds the entry (CACHED). Either
    // way each format is packed exactly once.
    let mut packed: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    let mut answers = 0;
    for t in tasks {
        for p in t.await.unwrap() {
            if !p.state().is_final() {
                continue;
            }
            answers += 1;
            match p.state() {
                api::JobState::Done => {
                    packed.entry(p.format.clone()).or_default().insert(p.job_id);
                }
                api::JobState::Cached => {}
                other => panic!("{}: {other:?} {}", p.format, p.error),
            }
        }
    }
    assert_eq!(answers, 16, "8 requests x 2 formats, each answered once");
    assert_eq!(packed.len(), 2, "{packed:?}");
    for (format, ids) in &packed {
        assert_eq!(
            ids.len(),
            1,
            "{format}: 8 identical prepacks packed as {ids:?}"
        );
    }
    let digest = digest_of(&path, "W");
    let mut c = c.clone();
    assert_eq!(entries_for(&mut c, &digest).await.len(), 2);
    assert_eq!(d.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_success_and_errors() {
    let mut d = InProc::start();
    let mut c = d.client().await;
    let work = tempfile::tempdir().unwrap();
    let path = work.path().join("m.onnx");
    write_model(&path, &matmul_model(K, N, 4));
    let digest = digest_of(&path, "W");

    // Host devices and formats.
    let devices = c
        .get_host_devices(api::GetHostDevicesRequest {})
        .await
        .unwrap()
        .into_inner()
        .devices;
    assert_eq!(devices[0].r#type, "cpu");
    let formats = c
        .list_formats(api::ListFormatsRequest {})
        .await
        .unwrap()
        .into_inner()
        .formats;
    assert!(formats.iter().any(|f| f.id == "ort.matmul_nbits"));

    // Lookup: a miss with a reason, then errors.
    let miss = c.lookup(lookup_req(&digest)).await.unwrap().into_inner();
    assert!(miss.entries.is_empty());
    assert_eq!(miss.miss.unwrap().reason, "no_entry");
    let bad = c.lookup(lookup_req(b"short")).await.unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    let mut unknown = lookup_req(&digest);
    unknown.digest_algorithm = "md5".into();
    assert_eq!(
        c.lookup(unknown)
            .await
            .unwrap()
            .into_inner()
            .miss
            .unwrap()
            .reason,
        "unknown_digest_algorithm"
    );

    // ResolveModel with on_miss = wait packs what is missing.
    let h = c.hand(&path).await;
    let r = c
        .resolve_model(api::ResolveModelRequest {
            model_path: path.display().to_string(),
            handout: h.name().into(),
            on_miss: api::OnMiss::Wait as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.jobs_started, 2);
    assert_eq!(r.tensors[0].entries.len(), 2, "{r:?}");
    let rel = c
        .resolve_model(api::ResolveModelRequest {
            model_path: "relative/m.onnx".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(rel.code(), Code::InvalidArgument);
    // The daemon opens no path a caller names (D14): a path alone is
    // refused with the way out, a model the caller cannot open is its own
    // error before anything reaches the daemon.
    let by_path = c
        .resolve_model(api::ResolveModelRequest {
            model_path: path.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(by_path.code(), Code::InvalidArgument);
    assert!(
        by_path
            .message()
            .contains("opens no path a caller names; hand the model over"),
        "{by_path:?}"
    );
    let missing = c
        .try_hand(Path::new("/nonexistent/m.onnx"))
        .await
        .unwrap_err();
    assert!(
        matches!(&missing, ctcache_client::Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
        "{missing:?}"
    );

    // Lookup and BatchLookup hit.
    let hits = entries_for(&mut c, &digest).await;
    assert_eq!(hits.len(), 2);
    let batch = c
        .batch_lookup(api::BatchLookupRequest {
            requests: vec![lookup_req(&digest), lookup_req(&[0u8; 32])],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(batch.responses[0].entries.len(), 2);
    assert_eq!(batch.responses[1].miss.as_ref().unwrap().reason, "no_entry");

    // ReadPayload: whole, range, out of range, bad key.
    let e = hits
        .iter()
        .find(|e| e.physical_type.starts_with("ort."))
        .unwrap()
        .clone();
    let mut s = c
        .read_payload(api::ReadPayloadRequest {
            key: e.key.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut all = Vec::new();
    while let Some(ch) = s.next().await {
        all.extend_from_slice(&ch.unwrap().data);
    }
    assert_eq!(all.len() as u64, e.payload_len);
    assert_eq!(blake3::hash(&all).to_hex().to_string(), e.payload_blake3);
    assert_eq!(
        std::fs::read(&e.payload_path).unwrap(),
        all,
        "payload_path maps the same bytes"
    );
    let mut s = c
        .read_payload(api::ReadPayloadRequest {
            key: e.key.clone(),
            offset: 10,
            length: 20,
        })
        .await
        .unwrap()
        .into_inner();
    let part = s.next().await.unwrap().unwrap();
    assert_eq!(&part.data[..], &all[10..30]);
    let oob = c
        .read_payload(api::ReadPayloadRequest {
            key: e.key.clone(),
            offset: e.payload_len + 1,
            length: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(oob.code(), Code::OutOfRange);
    let badkey = c
        .read_payload(api::ReadPayloadRequest {
            key: "zz".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(badkey.code(), Code::InvalidArgument);

    // Leases.
    let lease = c
        .acquire_lease(api::AcquireLeaseRequest {
            key: e.key.clone(),
            ttl_ms: 60_000,
        })
        .await
        .unwrap()
        .into_inner();
    c.renew_lease(api::RenewLeaseRequest {
        lease_id: lease.lease_id,
        ttl_ms: 60_000,
    })
    .await
    .unwrap();
    let listed = c
        .list(api::ListRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert!(listed.iter().any(|x| x.key == e.key && x.leased));
    // gc with a zero budget keeps the leased entry.
    let gc = c
        .gc(api::GcRequest {
            max_bytes: 0,
            has_max_bytes: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(gc.skipped_leased >= 1, "{gc:?}");
    assert_eq!(
        entries_for(&mut c, &digest).await.len(),
        1,
        "only the leased entry survives"
    );
    c.release_lease(api::ReleaseLeaseRequest {
        lease_id: lease.lease_id,
    })
    .await
    .unwrap();
    assert_eq!(
        c.renew_lease(api::RenewLeaseRequest {
            lease_id: lease.lease_id,
            ttl_ms: 1000
        })
        .await
        .unwrap_err()
        .code(),
        Code::NotFound
    );

    // Prepack again (the gc'd entry comes back), Embed, Import into a fresh daemon.
    prepack_all(&mut c, &path).await;
    let out = work.path().join("embedded.onnx");
    let em = c
        .library()
        .await
        .embed(api::EmbedRequest {
            model_path: path.display().to_string(),
            output_path: out.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(em.entries, 2);
    let m = ctcache::onnx::Model::open(&out).unwrap();
    assert!(ctcache::check::check_model(&m, &Default::default())
        .unwrap()
        .is_empty());
    let original = std::fs::read(&path).unwrap();
    assert_eq!(
        &std::fs::read(&out).unwrap()[..original.len()],
        &original[..]
    );

    let mut fresh = InProc::start();
    let mut fc = fresh.client().await;
    let imp = import(&mut fc, &out).await;
    assert_eq!(imp.imported, 2, "{imp:?}");
    assert_eq!(
        entries_for(&mut fc, &digest).await.len(),
        2,
        "hits without any pack job"
    );
    let st = fc.status(api::StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(st.entries, 2);
    assert_eq!(fresh.stop(), Some(0));

    // Stats, Verify, Gc dry run.
    let stats = c.stats(api::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!(stats.entries, 2);
    assert!(stats.by_format.len() == 2);
    let v = c
        .verify(api::VerifyRequest { repair: false })
        .await
        .unwrap()
        .into_inner();
    assert!(v.clean && v.checked >= 2, "{v:?}");
    let dry = c
        .gc(api::GcRequest {
            max_bytes: 0,
            has_max_bytes: true,
            dry_run: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(dry.dry_run && dry.removed.len() >= 2);
    assert_eq!(
        entries_for(&mut c, &digest).await.len(),
        2,
        "dry run changes nothing"
    );

    // Put: structural validation.
    let ty = listed
        .iter()
        .find(|x| x.key == e.key)
        .unwrap()
        .struct_type
        .clone()
        .unwrap();
    let header = api::PutHeader {
        struct_type: Some(ty),
        ..put_header(&e, 7, &[K as u64, N as u64])
    };
    let put = |h: api::PutHeader, data: Vec<u8>| {
        let mut c = c.clone();
        async move { c.put(tokio_stream::iter(put_messages(h, data))).await }
    };
    let ok = put(header.clone(), all.clone()).await.unwrap().into_inner();
    assert!(ok.entry.unwrap().producer.starts_with("uid:"));
    let short = put(header.clone(), all[..10].to_vec()).await.unwrap_err();
    assert_eq!(short.code(), Code::InvalidArgument);
    let mut wrong_len = header.clone();
    wrong_len.payload_len += 1;
    assert_eq!(
        put(wrong_len, all.clone()).await.unwrap_err().code(),
        Code::InvalidArgument
    );

    // Watches and events.
    let extra = tempfile::tempdir().unwrap();
    let w = c
        .add_watch(api::WatchRequest {
            dir: extra.path().display().to_string(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(w.dirs.len(), 2);
    let mut events = c.events(api::EventsRequest {}).await.unwrap().into_inner();
    write_model(&extra.path().join("new.onnx"), &matmul_model(K, N, 9));
    let ev = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(e) = events.next().await {
            let e = e.unwrap();
            if e.kind == "entry_added" {
                return e;
            }
        }
        panic!("event stream ended");
    })
    .await
    .expect("an entry_added event");
    assert!(ev.model_path.ends_with("new.onnx"), "{ev:?}");
    c.remove_watch(api::WatchRequest {
        dir: extra.path().display().to_string(),
    })
    .await
    .unwrap();
    assert_eq!(
        c.list_watches(api::ListWatchesRequest {})
            .await
            .unwrap()
            .into_inner()
            .dirs
            .len(),
        1
    );
    assert_eq!(
        c.add_watch(api::WatchRequest {
            dir: "/no/such/dir".into()
        })
        .await
        .unwrap_err()
        .code(),
        Code::InvalidArgument
    );
    let st = c.status(api::StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(st.pid, std::process::id());
    assert_eq!(d.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_cache_and_memo() {
    let mut d = InProc::start();
    let path = d.models.join("m.onnx");
    write_model(&path, &matmul_model(K, N, 5));
    let digest = digest_of(&path, "W");
    let c = d.client().await;
    wait_for_entries(&c, &digest, 2, "packed").await;
    drop(c);
    assert_eq!(d.stop(), Some(0));
    // The digest memo is in the index, keyed by the model path.
    {
        let store = ctcache::store::Store::open(&d.cache, Default::default()).unwrap();
        let key = path.canonicalize().unwrap();
        let memo = store
            .memo_get(key.as_os_str().as_encoded_bytes())
            .unwrap()
            .expect("memo record persisted");
        let memo = String::from_utf8(memo).unwrap();
        assert!(
            memo.contains(&hex::encode(&digest)),
            "memo persisted: {memo}"
        );
    }
    assert!(!d.cache.join("digest-memo.json").exists());
    d.restart();
    let mut c = d.client().await;
    assert_eq!(entries_for(&mut c, &digest).await.len(), 2);
    assert_eq!(d.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_check_is_served() {
    let mut d = InProc::start();
    let ch = channel(&d.socket).await;
    let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
    let r = h
        .check(tonic_health::pb::HealthCheckRequest {
            service: "ctcache.v1.CompiledTensorCache".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    assert_eq!(d.stop(), Some(0));
}

#[test]
fn second_daemon_refuses_same_socket_or_cache() {
    let mut d = Daemon::start();
    // Same socket, other cache dir.
    let other = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin())
        .arg("--cache-dir")
        .arg(other.path())
        .arg("--socket")
        .arg(&d.socket)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already listening"), "{err}");
    // Same cache dir, other socket in folders that do not exist yet: the
    // reason once, and no socket folder left behind (issue 29, point 7).
    let socket_dir = other.path().join("run/ctcache");
    let out = std::process::Command::new(bin())
        .arg("--cache-dir")
        .arg(&d.cache)
        .arg("--socket")
        .arg(socket_dir.join("s.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let pid = d.child.as_ref().unwrap().id().to_string();
    assert!(err.contains(&pid) && err.contains("in use"), "{err}");
    assert_eq!(err.matches("in use").count(), 1, "said once: {err}");
    assert!(!other.path().join("run").exists(), "{err}");
    assert_eq!(d.stop(), Some(0));
}

#[test]
fn invalid_config_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "workers = 2\nsokcet = \"/x\"\n").unwrap();
    let out = std::process::Command::new(bin())
        .arg("--config")
        .arg(&cfg)
        .arg("--print-config")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("sokcet"));
    let out = std::process::Command::new(bin())
        .arg("--print-config")
        .env("CTCACHE_WORKERS", "lots")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("CTCACHE_WORKERS"));
    let out = std::process::Command::new(bin())
        .args(["--print-config", "--workers", "3"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("workers = 3"));
}

/// Runs as the client half of `admin_rpcs_from_untrusted_uid_are_refused`
/// when re-executed under another uid; a no-op otherwise.
#[tokio::test]
async fn untrusted_client_helper() {
    let Ok(socket) = std::env::var("CTCACHE_TEST_PUT_SOCKET") else {
        return;
    };
    let mut c = api::compiled_tensor_cache_client::CompiledTensorCacheClient::new(
        channel(std::path::Path::new(&socket)).await,
    );
    let denied = |what: &str, r: Result<(), tonic::Status>| {
        let err = r.expect_err(what);
        assert_eq!(err.code(), Code::PermissionDenied, "{what}: {err:?}");
        assert!(err.message().contains("trusted_uids"), "{what}: {err:?}");
    };
    let msgs = vec![api::PutRequest {
        part: Some(api::put_request::Part::Header(api::PutHeader::default())),
    }];
    denied("put", c.put(tokio_stream::iter(msgs)).await.map(drop));
    let import = api::ImportRequest {
        model_path: socket.clone(),
        ..Default::default()
    };
    denied("import", c.import(import).await.map(drop));
    let gc = api::GcRequest {
        max_bytes: 0,
        has_max_bytes: true,
        ..Default::default()
    };
    denied("gc", c.gc(gc).await.map(drop));
    denied(
        "verify",
        c.verify(api::VerifyRequest::default()).await.map(drop),
    );
    let watch = api::WatchRequest { dir: "/tmp".into() };
    denied("remove watch", c.remove_watch(watch).await.map(drop));
    // Reading is what the socket group is for.
    c.status(api::StatusRequest {}).await.expect("status");
    let dry = api::GcRequest {
        dry_run: true,
        ..Default::default()
    };
    c.gc(dry).await.expect("a dry-run gc only reads");
    println!("UNTRUSTED-REFUSED-OK");
}

#[test]
fn admin_rpcs_from_untrusted_uid_are_refused() {
    if !uid_switch_or_skip() {
        return;
    }
    let mut d = daemon_for_nobody("");
    run_as_nobody(
        &d,
        "untrusted_client_helper",
        &[("CTCACHE_TEST_PUT_SOCKET", &d.socket)],
        "UNTRUSTED-REFUSED-OK",
    );
    assert_eq!(d.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_without_limits_applies_the_configured_budget() {
    let mut d = InProc::start_with(|c| c.gc_max_bytes = 1);
    let mut c = d.client().await;
    let work = tempfile::tempdir().unwrap();
    let path = work.path().join("m.onnx");
    write_model(&path, &matmul_model(K, N, 6));
    prepack_all(&mut c, &path).await;
    let digest = digest_of(&path, "W");
    assert_eq!(entries_for(&mut c, &digest).await.len(), 2);
    // No limit in the request: the configured 1-byte budget applies.
    let gc = c.gc(api::GcRequest::default()).await.unwrap().into_inner();
    assert!(
        gc.removed
            .iter()
            .filter(|i| i.reason == "size_budget")
            .count()
            >= 2,
        "{gc:?}"
    );
    assert!(entries_for(&mut c, &digest).await.is_empty());
    assert_eq!(d.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_hit_rate_counts_only_wanted_tensors_of_a_resolve() {
    use prost::Message;
    let mut d = InProc::start();
    let path = d.models.join("m.onnx");
    // W is wanted (two formats); the bias is not (rank 1), so a resolve's
    // look at it is not a miss.
    let mut m = ctcache::pb::ModelProto::decode(matmul_model(K, N, 11).as_slice()).unwrap();
    let g = m.graph.as_mut().unwrap();
    g.initializer.push(ctcache::pb::TensorProto {
        name: "bias".into(),
        data_type: 1,
        dims: vec![N as i64],
        raw_data: vec![0u8; N * 4].into(),
        ..Default::default()
    });
    g.node.push(ctcache::pb::NodeProto {
        input: vec!["Y".into(), "bias".into()],
        output: vec!["Z".into()],
        op_type: "Add".into(),
        ..Default::default()
    });
    write_model(&path, &m.encode_to_vec());
    let digest = digest_of(&path, "W");
    let c = d.client().await;
    wait_for_entries(&c, &digest, 2, "packed").await;
    let mut c = c.clone();
    let status = |mut c: api::compiled_tensor_cache_client::CompiledTensorCacheClient<_>| async move {
        let s = c.status(api::StatusRequest {}).await.unwrap().into_inner();
        (s.hits, s.misses)
    };
    let before = status((*c).clone()).await;
    let h = c.hand(&path).await;
    c.resolve_model(api::ResolveModelRequest {
        model_path: path.display().to_string(),
        handout: h.name().into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let after = status((*c).clone()).await;
    assert_eq!((after.0 - before.0, after.1 - before.1), (2, 0));
    assert_eq!(d.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_event_followers_without_waiting_out_the_grace() {
    let mut d = Daemon::start();
    let mut c = d.client().await;
    let mut events = c
        .events(api::EventsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let started = std::time::Instant::now();
    let code = tokio::task::spawn_blocking(move || d.stop()).await.unwrap();
    assert_eq!(code, Some(0));
    // The grace for open calls is 3 s; an Events follower must not hold
    // the shutdown that long.
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "exit took {:?}",
        started.elapsed()
    );
    // The stream ended (cleanly or with the connection), it did not hang.
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(_)) = events.next().await {}
    })
    .await;
    assert!(end.is_ok(), "the Events stream ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepack_backends_are_honoured_or_refused_with_the_reason() {
    let mut d = InProc::start();
    let mut c = d.client().await;
    let path = d.path("work/m.onnx");
    write_model(&path, &matmul_model(K, N, 12));
    let h = c.hand(&path).await;
    let prepack = |backend: api::Backend| api::PrepackRequest {
        model_path: path.display().to_string(),
        handout: h.name().into(),
        formats: vec![api::FormatSpec {
            id: "ggml.q8_0".into(),
            params: Default::default(),
        }],
        backend: backend.into(),
        ..Default::default()
    };
    // This machine has no hardware wgpu adapter: refused, with the reason.
    let err = c.prepack(prepack(api::Backend::Wgpu)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("wgpu"), "{err:?}");
    // An explicit CPU pack reports the backend that packed it.
    let mut s = c
        .prepack(prepack(api::Backend::Cpu))
        .await
        .unwrap()
        .into_inner();
    let mut last = None;
    while let Some(p) = s.next().await {
        last = Some(p.unwrap());
    }
    let last = last.unwrap();
    assert_eq!(last.state(), api::JobState::Done, "{last:?}");
    assert_eq!(last.backend(), api::Backend::Cpu, "{last:?}");
    assert_eq!(d.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reports_orphans_and_removes_them_only_with_repair() {
    let mut d = InProc::start();
    let mut c = d.client().await;
    // The start-up reconcile ends before the orphan is planted (it would
    // remove it): Status says when.
    let reconciled = eventually(Duration::from_secs(60), || {
        let mut c = c.clone();
        async move {
            let s = c.status(api::StatusRequest {}).await.ok()?.into_inner();
            (!s.reconciling).then_some(())
        }
    })
    .await;
    assert!(reconciled.is_some(), "the start-up reconcile never ended");
    let bytes = b"a payload file no entry references";
    let hash = blake3::hash(bytes);
    let shard = d
        .cache
        .join("blobs")
        .join(hex::encode(&hash.as_bytes()[..1]));
    std::fs::create_dir_all(&shard).unwrap();
    let orphan = shard.join(payload_file_name(&d.cache, hash.as_bytes()));
    std::fs::write(&orphan, bytes).unwrap();
    let report = c
        .verify(api::VerifyRequest { repair: false })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        report.orphans,
        vec![orphan.display().to_string()],
        "{report:?}"
    );
    assert!(!report.repaired, "{report:?}");
    assert!(orphan.exists(), "verify without repair changes nothing");
    let report = c
        .verify(api::VerifyRequest { repair: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        report.orphans,
        vec![orphan.display().to_string()],
        "{report:?}"
    );
    assert!(report.repaired, "{report:?}");
    assert!(!orphan.exists());
    assert_eq!(d.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotted_payloads_are_never_served_and_are_packed_again() {
    let mut d = InProc::start();
    let path = d.models.join("m.onnx");
    write_model(&path, &matmul_model(K, N, 7));
    let digest = digest_of(&path, "W");
    let c = d.client().await;
    let packed = wait_for_entries(&c, &digest, 2, "packed").await;
    drop(c);
    assert_eq!(d.stop(), Some(0));

    // Rot, restart: a prepack does not reuse the rotted entries (their
    // files are hashed before reuse) but packs them again.
    for e in &packed {
        rot_payload(&e.payload_path);
    }
    d.restart();
    let mut c = d.client().await;
    // (The watcher's start-up scan may get there first: either way the
    // files must be good again.)
    prepack_all(&mut c, &path).await;
    let fresh = entries_for(&mut c, &digest).await;
    assert_eq!(fresh.len(), 2);
    assert!(fresh.iter().all(intact), "{fresh:?}");
    let v = c
        .verify(api::VerifyRequest { repair: false })
        .await
        .unwrap()
        .into_inner();
    assert!(
        v.clean && v.corrupt.is_empty() && v.orphans.is_empty(),
        "{v:?}"
    );
    drop(c);
    assert_eq!(d.stop(), Some(0));

    // Rot again, restart: neither ReadPayload nor AcquireLease serves the
    // bytes (DATA_LOSS), and the entries are gone from lookups.
    for e in &fresh {
        rot_payload(&e.payload_path);
    }
    d.restart();
    let mut c = d.client().await;
    assert_eq!(
        entries_for(&mut c, &digest).await.len(),
        2,
        "lookups do not hash"
    );
    let lease = lease_refused(&mut c, &fresh[0].key).await;
    assert_eq!(lease.code(), Code::DataLoss, "{lease:?}");
    let read = match c
        .read_payload(api::ReadPayloadRequest {
            key: fresh[1].key.clone(),
            ..Default::default()
        })
        .await
    {
        Err(e) => e,
        Ok(s) => {
            let mut s = s.into_inner();
            let mut got = None;
            while let Some(ch) = s.next().await {
                if let Err(e) = ch {
                    got = Some(e);
                    break;
                }
            }
            got.expect("an error, not the bytes")
        }
    };
    assert_eq!(read.code(), Code::DataLoss, "{read:?}");
    // Both files went to quarantine, and the daemon packs both entries
    // again from their model (under a watched folder: with its own rights)
    // without anyone asking; verify is clean after.
    let again = wait_for_entries(&c, &digest, 2, "packed again after the rot was served").await;
    assert!(again.iter().all(intact), "{again:?}");
    let v = c
        .verify(api::VerifyRequest { repair: false })
        .await
        .unwrap()
        .into_inner();
    assert!(v.clean && v.orphans.is_empty(), "{v:?}");
    assert_eq!(d.stop(), Some(0));
}

/// A FIFO named like a model, in a watched folder and asked for by path:
/// opening it would block until a writer came (the watcher's one thread, a
/// blocking-pool thread per request). It is refused as not a regular file,
/// at once, and the watcher goes on to the next model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_named_like_a_model_blocks_nothing() {
    let mut d = InProc::start();
    let fifo = d.models.join("stall.onnx");
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo has no other precondition.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
    let c = d.client().await;
    let asked = tokio::time::timeout(Duration::from_secs(20), c.try_hand(&fifo)).await;
    let Ok(asked) = asked else {
        // A writer releases every open blocked on the FIFO, so that this
        // fails instead of hanging at the daemon's stop.
        let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        panic!("handing a FIFO over blocked");
    };
    let e = asked.map(drop).unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e:?}");
    assert!(e.to_string().contains("not a regular file"), "{e:?}");

    let path = d.models.join("m.onnx");
    write_model(&path, &matmul_model(K, N, 12));
    wait_for_entries(&c, &digest_of(&path, "W"), 2, "the model after the FIFO").await;
    assert_eq!(d.stop(), Some(0));
}

/// A symbolic link in the admin's watched folder to a model elsewhere (made
/// by anyone who may write in that folder, to a file they may not read):
/// the daemon does not read it with the admin's rights. The watcher says
/// why and packs nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_out_of_the_admins_folder_is_not_read_with_the_admins_rights() {
    let mut d = InProc::start();
    let mut c = d.client().await;
    let mut events = c.events(api::EventsRequest {}).await.unwrap().into_inner();
    let elsewhere = tempfile::tempdir().unwrap();
    let target = elsewhere.path().join("private.onnx");
    write_model(&target, &matmul_model(K, N, 31));
    std::os::unix::fs::symlink(&target, d.models.join("link.onnx")).unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(e) = events.next().await {
            let e = e.unwrap();
            if e.model_path.ends_with("link.onnx") {
                return e;
            }
        }
        panic!("the event stream ended");
    })
    .await
    .expect("a watcher event for the link");
    assert!(ev.detail.contains("outside the watched folders"), "{ev:?}");
    assert!(entries_for(&mut c, &digest_of(&target, "W"))
        .await
        .is_empty());
    assert_eq!(d.stop(), Some(0));
}

/// A file in a watched folder that never stops changing (a slow copy, or
/// a user touching it on purpose) holds up no other model: the one beside
/// it is packed while the first still changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_keeps_changing_holds_up_no_other() {
    let mut d = InProc::start();
    let c = d.client().await;
    let churn = d.models.join("churn.onnx");
    std::fs::write(&churn, b"growing").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (churn, stop) = (churn.clone(), stop.clone());
        std::thread::spawn(move || {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&churn)
                .unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                f.write_all(b"x").unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let path = d.models.join("m.onnx");
    write_model(&path, &matmul_model(K, N, 21));
    let digest = digest_of(&path, "W");
    let packed = eventually(Duration::from_secs(30), || {
        let (mut c, digest) = (c.clone(), digest.clone());
        async move { (entries_for(&mut c, &digest).await.len() == 2).then_some(()) }
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert!(
        packed.is_some(),
        "the model beside a changing file was not packed in 30 s"
    );
    assert_eq!(d.stop(), Some(0));
}

/// The daemon raises its soft limit on open files to the hard one (it holds
/// each user's watched folder open besides its connections and mappings).
#[test]
fn the_open_files_limit_is_raised_to_the_hard_one() {
    use std::os::unix::process::CommandExt;
    let mut d = Daemon::start_with(&[], |c| {
        // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
        unsafe {
            c.pre_exec(|| {
                let limit = libc::rlimit {
                    rlim_cur: 256,
                    rlim_max: 4096,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    });
    let pid = d.child.as_ref().unwrap().id();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&fields[3..5], ["4096", "4096"], "{line}");
    assert_eq!(d.stop(), Some(0));
}
