//! The trust boundary of ctcached (issue 13): leases owned and bounded,
//! per-uid bounds on queued jobs and watches, payload and tensor size
//! limits, answers that do not reveal other users' files, and TCP only on
//! loopback unless TLS is configured (read-only without a verified client
//! certificate). Attacks run as uid 65534 by re-executing this test binary
//! under `setpriv`.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ctcache_api::v1 as api;
use ctcache_api::v1::compiled_tensor_cache_client::CompiledTensorCacheClient;
use support::*;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Code;

/// The client half of `leases_watches_and_jobs_are_owned_and_bounded`, as
/// uid 65534.
#[tokio::test]
async fn nobody_attacks_helper() {
    let Ok(socket) = std::env::var("CTCACHE_TEST_SOCKET") else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap();
    let mut c = Conn::at(Path::new(&socket)).await;

    // Another uid's lease can be neither renewed nor released, and answers
    // as a lease never issued does (no probing for live lease ids); the
    // test goes on to check that root's lease still protects its entry.
    let root_lease: u64 = var("CTCACHE_TEST_ROOT_LEASE").parse().unwrap();
    let never = root_lease.wrapping_add(1_000_003);
    let mut answers = Vec::new();
    for id in [root_lease, never] {
        let renew = c
            .renew_lease(api::RenewLeaseRequest {
                lease_id: id,
                ttl_ms: 1,
            })
            .await
            .unwrap_err();
        assert_eq!(renew.code(), Code::NotFound, "{renew:?}");
        let release = c
            .release_lease(api::ReleaseLeaseRequest { lease_id: id })
            .await;
        assert!(release.is_ok(), "{release:?}");
        answers.push(renew.message().replace(&id.to_string(), "<id>"));
    }
    assert_eq!(answers[0], answers[1], "one answer");

    // 2,000 leases with a cap of 1,000: the 1,001st and later are refused.
    let key = var("CTCACHE_TEST_OTHER_KEY");
    let mut mine = Vec::new();
    for i in 0..2000 {
        let r = c
            .acquire_lease(api::AcquireLeaseRequest {
                key: key.clone(),
                ttl_ms: 3_600_000,
            })
            .await;
        match r {
            Ok(l) if i < 1000 => mine.push(l.into_inner().lease_id),
            Err(e) if i >= 1000 => {
                assert_eq!(e.code(), Code::ResourceExhausted, "lease {i}: {e:?}");
                assert!(e.message().contains("1000"), "{e:?}");
            }
            other => panic!("lease {i}: {other:?}"),
        }
    }
    // Its own lease it may release and renew, and then take another.
    c.renew_lease(api::RenewLeaseRequest {
        lease_id: mine[1],
        ttl_ms: 60_000,
    })
    .await
    .expect("renew own lease");
    c.release_lease(api::ReleaseLeaseRequest { lease_id: mine[0] })
        .await
        .expect("release own lease");
    c.acquire_lease(api::AcquireLeaseRequest {
        key: key.clone(),
        ttl_ms: 1000,
    })
    .await
    .expect("a released lease frees a place");

    // Watches: at most 2 folders for this uid.
    let dirs: Vec<String> = var("CTCACHE_TEST_WATCH_DIRS")
        .split(':')
        .map(String::from)
        .collect();
    for d in &dirs[..2] {
        c.add_watch(api::WatchRequest { dir: d.clone() })
            .await
            .expect("a watch within the bound");
    }
    let e = c
        .add_watch(api::WatchRequest {
            dir: dirs[2].clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("max_watches_per_uid"), "{e:?}");

    // Jobs: at most 1 waiting; a model of 4 wanted pairs overflows it.
    let many = var("CTCACHE_TEST_MANY_WEIGHTS");
    let h = c.hand(Path::new(&many)).await;
    let e = c
        .prepack(api::PrepackRequest {
            model_path: many,
            handout: h.name().into(),
            ..Default::default()
        })
        .await
        .expect_err("the second waiting job of this uid is refused");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("pack jobs waiting"), "{e:?}");

    // Event followers: at most a quarter of the 8 places for one uid, so
    // others can still follow.
    let _followers = [
        c.events(api::EventsRequest {})
            .await
            .expect("a first follower"),
        c.events(api::EventsRequest {})
            .await
            .expect("a second follower"),
    ];
    let e = c.events(api::EventsRequest {}).await.err().unwrap();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("max_event_subscribers"), "{e:?}");

    // A model this uid may not read: the daemon opens no path a caller
    // names, so the same answer whether it exists.
    let resolve = |p: String| {
        let mut c = c.clone();
        async move {
            c.resolve_model(api::ResolveModelRequest {
                model_path: p,
                ..Default::default()
            })
            .await
            .unwrap_err()
        }
    };
    let secret = var("CTCACHE_TEST_SECRET");
    let missing = format!("{secret}.missing");
    let (a, b) = (
        resolve(secret.clone()).await,
        resolve(missing.clone()).await,
    );
    assert_eq!(a.code(), b.code(), "{a:?} / {b:?}");
    assert_eq!(a.code(), Code::InvalidArgument);
    assert_eq!(
        a.message().replace(&secret, "P"),
        b.message().replace(&missing, "P")
    );
    // Nor does AddWatch of a folder it may not read.
    let watch = |p: String| {
        let mut c = c.clone();
        async move { c.add_watch(api::WatchRequest { dir: p }).await.unwrap_err() }
    };
    let secret_dir = Path::new(&secret).parent().unwrap().display().to_string();
    let missing_dir = format!("{secret_dir}.missing");
    let (a, b) = (
        watch(secret_dir.clone()).await,
        watch(missing_dir.clone()).await,
    );
    assert_eq!(a.code(), Code::PermissionDenied, "{a:?}");
    assert_eq!(b.code(), Code::PermissionDenied, "{b:?}");
    assert_eq!(
        a.message().replace(&secret_dir, "P"),
        b.message().replace(&missing_dir, "P")
    );
    println!("NOBODY-ATTACKS-REFUSED");
}

#[test]
fn leases_watches_and_jobs_are_owned_and_bounded() {
    if !uid_switch_or_skip() {
        return;
    }
    let mut d = daemon_for_nobody(
        "workers = 1\nmax_leases_per_uid = 1000\nmax_watches_per_uid = 2\nmax_queued_jobs_per_uid = 1\nmax_event_subscribers = 8\nstable_secs = 0.02\nmax_tensor_bytes = 2097152\n",
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut c = rt.block_on(d.client());
    // Two packed models: one entry root leases, one uid 65534 leases.
    let (a, b) = (d.models.join("a.onnx"), d.models.join("b.onnx"));
    write_model(&a, &matmul_model(256, 256, 1));
    write_model(&b, &matmul_model(256, 256, 2));
    let ea = rt.block_on(wait_for_entries(&c, &digest_of(&a, "W"), 2, "a packed"));
    let eb = rt.block_on(wait_for_entries(&c, &digest_of(&b, "W"), 2, "b packed"));
    let root_lease = rt
        .block_on(c.acquire_lease(api::AcquireLeaseRequest {
            key: ea[0].key.clone(),
            ttl_ms: 600_000,
        }))
        .unwrap()
        .into_inner()
        .lease_id;

    // Files of uid 65534's world: folders to watch, a model it may read with
    // 4 wanted pairs, and root's private model.
    let world = tempfile::tempdir().unwrap();
    open_to_all(world.path());
    let dirs: Vec<PathBuf> = (0..3).map(|i| world.path().join(format!("w{i}"))).collect();
    for dir in &dirs {
        std::fs::create_dir(dir).unwrap();
        open_to_all(dir);
    }
    let many = world.path().join("many.onnx");
    write_model(&many, &two_weights_model());
    std::fs::set_permissions(&many, std::fs::Permissions::from_mode(0o644)).unwrap();
    let secret = std::env::temp_dir().join(format!("ctcache-secret-{}", std::process::id()));
    std::fs::create_dir_all(&secret).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o700)).unwrap();
    let secret_model = secret.join("secret.onnx");
    write_model(&secret_model, &matmul_model(256, 256, 3));

    let env = [
        ("CTCACHE_TEST_SOCKET", d.socket.display().to_string()),
        ("CTCACHE_TEST_ROOT_LEASE", root_lease.to_string()),
        ("CTCACHE_TEST_OTHER_KEY", eb[0].key.clone()),
        (
            "CTCACHE_TEST_WATCH_DIRS",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(":"),
        ),
        ("CTCACHE_TEST_MANY_WEIGHTS", many.display().to_string()),
        ("CTCACHE_TEST_SECRET", secret_model.display().to_string()),
    ];
    run_as_nobody(&d, "nobody_attacks_helper", &env, "NOBODY-ATTACKS-REFUSED");
    std::fs::remove_dir_all(&secret).unwrap();

    // The watch uid 65534 added finds a model of 4 wanted pairs: its jobs
    // wait as that uid's, so they meet the same bound of 1 as its Prepack;
    // the model waits and is tried again until all are packed.
    let watched = dirs[0].join("many.onnx");
    let waiting = rt.block_on(first_event_about(&c, &watched, &two_weights_model()));
    assert!(
        waiting.starts_with("waiting (") && waiting.contains("pack jobs waiting"),
        "{waiting}"
    );
    for name in ["W1", "W2"] {
        rt.block_on(wait_for_entries(
            &c,
            &digest_of(&watched, name),
            2,
            "the waiting model packed on a later try",
        ));
    }
    // A model over a size limit (4 MiB of weight, max_tensor_bytes 2 MiB)
    // is skipped at once: only a full queue is worth waiting for.
    let large = dirs[0].join("large.onnx");
    let skipped = rt.block_on(first_event_about(&c, &large, &matmul_model(1024, 1024, 41)));
    assert!(
        skipped.starts_with("skipped:") && skipped.contains("max_tensor_bytes"),
        "{skipped}"
    );

    // Root's lease still protects its entry from gc --max-size 0.
    let report = rt
        .block_on(c.gc(api::GcRequest {
            max_bytes: 0,
            has_max_bytes: true,
            ..Default::default()
        }))
        .unwrap()
        .into_inner();
    assert!(report.skipped_leased >= 2, "{report:?}");
    let left: Vec<_> = rt
        .block_on(entries_for(&mut c, &digest_of(&a, "W")))
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(
        left,
        vec![ea[0].key.clone()],
        "only the leased entry of a stays"
    );
    assert_eq!(d.stop(), Some(0));
}

/// The half of `a_peer_cannot_grow_the_digest_memo` that runs as uid 65534:
/// asks about one model under many names (hard links of its own).
#[tokio::test]
async fn memo_flood_helper() {
    let (Ok(socket), Ok(dir)) = (
        std::env::var("CTCACHE_TEST_SOCKET"),
        std::env::var("CTCACHE_TEST_FLOOD_DIR"),
    ) else {
        return;
    };
    let mut c = Conn::at(Path::new(&socket)).await;
    let first = Path::new(&dir).join("m0.onnx");
    write_model(&first, &two_weights_model());
    for i in 0..40 {
        let name = Path::new(&dir).join(format!("m{i}.onnx"));
        if i > 0 {
            std::fs::hard_link(&first, &name).unwrap();
        }
        let h = c.hand(&name).await;
        c.resolve_model(api::ResolveModelRequest {
            model_path: name.display().to_string(),
            handout: h.name().into(),
            ..Default::default()
        })
        .await
        .expect("resolving a model of its own");
    }
    println!("MEMO-FLOOD-DONE");
}

/// Each model path a peer asks about leaves a digest record; the memo keeps
/// at most `max_memo_entries` of them, in the index as in memory, however
/// many names the peer makes.
#[test]
fn a_peer_cannot_grow_the_digest_memo() {
    if !uid_switch_or_skip() {
        return;
    }
    let mut d = daemon_for_nobody("max_memo_entries = 8\n");
    let world = tempfile::tempdir().unwrap();
    open_to_all(world.path());
    let flood = world.path().join("flood");
    std::fs::create_dir(&flood).unwrap();
    std::os::unix::fs::chown(&flood, Some(NOBODY), Some(NOBODY)).unwrap();
    run_as_nobody(
        &d,
        "memo_flood_helper",
        &[
            ("CTCACHE_TEST_SOCKET", d.socket.display().to_string()),
            ("CTCACHE_TEST_FLOOD_DIR", flood.display().to_string()),
        ],
        "MEMO-FLOOD-DONE",
    );
    assert_eq!(d.stop(), Some(0));
    let store = ctcache::store::Store::open(&d.cache, Default::default()).unwrap();
    let mut records = 0;
    store
        .memo_scan(&mut |_, _| {
            records += 1;
            true
        })
        .unwrap();
    assert!(records <= 8, "{records} memo records");
}

/// Writes `model` at `path` (in a watched folder) and returns the detail of
/// the first event that names it.
async fn first_event_about(
    c: &CompiledTensorCacheClient<tonic::transport::Channel>,
    path: &Path,
    model: &[u8],
) -> String {
    let mut events = follow_events(c).await;
    write_model(path, model);
    let real = path.canonicalize().unwrap().display().to_string();
    loop {
        let e = next_event(&mut events, 60, "an event about the model").await;
        if e.model_path == real {
            return e.detail;
        }
    }
}

/// A model with two MatMul weights (4 wanted pairs under the default policy).
fn two_weights_model() -> Vec<u8> {
    use ctcache_testkit::{f32_tensor_from, node, tensor_info, unit_f32, xorshift};
    let (k, n) = (512usize, 512usize);
    let w = |name: &str, seed| {
        f32_tensor_from(
            name,
            &[k as i64, n as i64],
            xorshift(seed).map(unit_f32).take(k * n),
        )
    };
    let (w1, w2) = (w("W1", 11), w("W2", 12));
    let model = ctcache::pb::ModelProto {
        ir_version: 8,
        opset_import: vec![ctcache::pb::OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(ctcache::pb::GraphProto {
            name: "two".into(),
            node: vec![
                node("MatMul", "m1", &["X", "W1"], "H"),
                node("MatMul", "m2", &["H", "W2"], "Y"),
            ],
            initializer: vec![w1, w2],
            input: vec![tensor_info("X", &[1, k as i64])],
            output: vec![tensor_info("Y", &[1, n as i64])],
            ..Default::default()
        }),
        ..Default::default()
    };
    prost::Message::encode_to_vec(&model)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packs_and_puts_over_the_payload_limit_are_refused_before_they_start() {
    // A 512 KiB entry, packed under the default limit.
    let mut d = InProc::start();
    let mut c = d.client().await;
    let first = d.path("work/first.onnx");
    write_model(&first, &matmul_model(512, 256, 5));
    prepack_all(&mut c, &first).await;
    let e = entries_for(&mut c, &digest_of(&first, "W"))
        .await
        .into_iter()
        .max_by_key(|e| e.payload_len)
        .unwrap();
    assert_eq!(e.payload_len, 512 << 10, "{}", e.physical_type);
    let data = read_all(&mut c, &e.key).await;
    assert_eq!(d.stop(), Some(0));

    d.config.max_payload_bytes = 64 << 10;
    d.restart();
    let mut c = d.client().await;
    let before = c.status(api::StatusRequest {}).await.unwrap().into_inner();
    let path = d.path("work/m.onnx");
    write_model(&path, &matmul_model(512, 256, 4));
    let h = c.hand(&path).await;
    let e_pack = c
        .prepack(api::PrepackRequest {
            model_path: path.display().to_string(),
            handout: h.name().into(),
            ..Default::default()
        })
        .await
        .expect_err("a 512 KiB payload over a 64 KiB limit is refused");
    assert_eq!(e_pack.code(), Code::ResourceExhausted, "{e_pack:?}");
    assert!(e_pack.message().contains("max_payload_bytes"), "{e_pack:?}");
    let e_put = c
        .put(tokio_stream::iter(put_requests(&e, 9, &[512, 256], data)))
        .await
        .expect_err("a 512 KiB Put over a 64 KiB limit is refused");
    assert_eq!(e_put.code(), Code::ResourceExhausted, "{e_put:?}");
    assert!(e_put.message().contains("max_payload_bytes"), "{e_put:?}");
    let after = c.status(api::StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(after.entries, before.entries, "nothing was stored");
    assert_eq!(d.stop(), Some(0));
}

/// A model whose W declares 64 GiB of external data in a sparse file.
fn sparse_model(dir: &Path) -> PathBuf {
    use ctcache::pb::tensor_proto::DataLocation;
    const SIDE: i64 = 131_072; // 131072^2 floats = 64 GiB
    let mut m = ctcache_testkit::MatMul::new(4, 4, [0.5f32; 16]).proto();
    let g = m.graph.as_mut().unwrap();
    let w = g.initializer.iter_mut().find(|t| t.name == "W").unwrap();
    w.dims = vec![SIDE, SIDE];
    w.raw_data = Default::default();
    w.float_data.clear();
    w.data_location = DataLocation::External as i32;
    let len = (SIDE * SIDE * 4) as u64;
    w.external_data = vec![
        ctcache_testkit::kv("location", "w.bin"),
        ctcache_testkit::kv("offset", "0"),
        ctcache_testkit::kv("length", &len.to_string()),
    ];
    let f = std::fs::File::create(dir.join("w.bin")).unwrap();
    f.set_len(len).unwrap();
    let path = dir.join("huge.onnx");
    std::fs::write(&path, prost::Message::encode_to_vec(&m)).unwrap();
    path
}

#[test]
fn a_sparse_64_gib_tensor_is_refused_with_rss_staying_low() {
    let mut d = Daemon::start();
    let pid = d.child.as_ref().unwrap().id();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut c = rt.block_on(d.client());
    let work = d.path("work");
    let path = sparse_model(&work);
    let before = usage(pid);
    let h = rt.block_on(c.hand(&path));
    for req in [
        api::ResolveModelRequest {
            model_path: path.display().to_string(),
            handout: h.name().into(),
            on_miss: api::OnMiss::Wait as i32,
            ..Default::default()
        },
        api::ResolveModelRequest {
            model_path: path.display().to_string(),
            handout: h.name().into(),
            ..Default::default()
        },
    ] {
        let mut r = tonic::Request::new(req);
        r.set_timeout(Duration::from_secs(30));
        let e = rt.block_on(c.resolve_model(r)).unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("max_tensor_bytes"), "{e:?}");
    }
    let e = rt
        .block_on(c.prepack(api::PrepackRequest {
            model_path: path.display().to_string(),
            handout: h.name().into(),
            ..Default::default()
        }))
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    // The watcher refuses it too: its event about the model says so.
    let mut events = rt.block_on(follow_events(&c));
    std::fs::rename(work.join("w.bin"), d.models.join("w.bin")).unwrap();
    let huge = d.models.join("huge.onnx");
    std::fs::rename(&path, &huge).unwrap();
    let huge = huge.canonicalize().unwrap().display().to_string();
    let skipped = rt.block_on(async {
        loop {
            let e = next_event(&mut events, 60, "the watcher's event about the model").await;
            if e.model_path == huge {
                return e.detail;
            }
        }
    });
    assert!(
        skipped.starts_with("skipped:") && skipped.contains("max_tensor_bytes"),
        "{skipped}"
    );
    // The daemon never held the tensor: its peak memory stays low.
    let after = usage(pid);
    assert!(
        after.peak_kib < before.peak_kib + (256 << 10),
        "daemon's peak memory grew from {before:?} to {after:?}"
    );
    let st = rt
        .block_on(c.status(api::StatusRequest {}))
        .unwrap()
        .into_inner();
    assert_eq!(st.entries, 0);
    assert_eq!(d.stop(), Some(0));
}

#[test]
fn tcp_beyond_loopback_without_tls_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin())
        .arg("--cache-dir")
        .arg(dir.path().join("cache"))
        .arg("--socket")
        .arg(dir.path().join("s.sock"))
        .args(["--listen-tcp", "0.0.0.0:0"])
        .env_remove("CTCACHE_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("listen_tcp") && err.contains("not a loopback") && err.contains("tls_cert"),
        "{err}"
    );
    assert!(!dir.path().join("s.sock").exists(), "nothing was served");
}

/// A CA and certificates it signs, as PEM files in `dir`.
struct Pki {
    ca: String,
}

impl Pki {
    fn new() -> (Pki, rcgen::CertifiedIssuer<'static, rcgen::KeyPair>) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
            .unwrap();
        (Pki { ca: ca.pem() }, ca)
    }
}

/// A certificate for `name` signed by `ca`: (cert PEM, key PEM).
fn issue(ca: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>, name: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&key, &**ca)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A daemon serving TLS on 0.0.0.0 (port chosen at start); `client_ca`
/// turns on client certificates.
fn tls_daemon(dir: &Path, pki: &Pki, server: &(String, String), client_ca: bool) -> InProc {
    std::fs::write(dir.join("server.pem"), &server.0).unwrap();
    std::fs::write(dir.join("server.key"), &server.1).unwrap();
    std::fs::write(dir.join("ca.pem"), &pki.ca).unwrap();
    InProc::start_with(|c| {
        c.listen_tcp = Some("0.0.0.0:0".into());
        c.tls_cert = Some(dir.join("server.pem"));
        c.tls_key = Some(dir.join("server.key"));
        c.tls_client_ca = client_ca.then(|| dir.join("ca.pem"));
    })
}

async fn tls_client(
    d: &InProc,
    pki: &Pki,
    identity: Option<&(String, String)>,
) -> Result<CompiledTensorCacheClient<Channel>, tonic::transport::Error> {
    let port = d.tcp_addr.unwrap().port();
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let ch = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))?
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(CompiledTensorCacheClient::new(ch))
}

fn gc_all() -> api::GcRequest {
    api::GcRequest {
        max_bytes: 0,
        has_max_bytes: true,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_without_client_certificates_only_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (pki, ca) = Pki::new();
    let mut d = tls_daemon(dir.path(), &pki, &issue(&ca, "localhost"), false);
    let mut c = tls_client(&d, &pki, None).await.unwrap();
    c.status(api::StatusRequest {}).await.expect("status");
    let lookup = c
        .lookup(api::LookupRequest {
            source_digest: bytes::Bytes::from(vec![1u8; 32]),
            digest_algorithm: "blake3".into(),
            ..Default::default()
        })
        .await
        .expect("lookup");
    assert!(lookup.into_inner().entries.is_empty());
    let denied = |what: &str, r: Result<(), tonic::Status>| {
        let e = r.expect_err(what);
        assert_eq!(e.code(), Code::PermissionDenied, "{what}: {e:?}");
        assert!(e.message().contains("may only read"), "{what}: {e:?}");
    };
    denied("gc", c.gc(gc_all()).await.map(drop));
    let put = vec![api::PutRequest {
        part: Some(api::put_request::Part::Header(api::PutHeader::default())),
    }];
    denied("put", c.put(tokio_stream::iter(put)).await.map(drop));
    denied(
        "acquire lease",
        c.acquire_lease(api::AcquireLeaseRequest::default())
            .await
            .map(drop),
    );
    denied(
        "events",
        c.events(api::EventsRequest::default()).await.map(drop),
    );
    // A plain-text client gets nothing.
    let port = d.tcp_addr.unwrap().port();
    let plain = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await;
    if let Ok(ch) = plain {
        let mut p = CompiledTensorCacheClient::new(ch);
        assert!(p.status(api::StatusRequest {}).await.is_err());
    }
    assert_eq!(d.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_clients_without_a_certificate_and_trusts_signed_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (pki, ca) = Pki::new();
    let mut d = tls_daemon(dir.path(), &pki, &issue(&ca, "localhost"), true);
    // A packed entry to copy (over the Unix socket).
    let mut local = d.client().await;
    let path = d.path("work/m.onnx");
    write_model(&path, &matmul_model(512, 256, 6));
    prepack_all(&mut local, &path).await;
    let e = entries_for(&mut local, &digest_of(&path, "W"))
        .await
        .remove(0);
    let data = read_all(&mut local, &e.key).await;

    // Without a certificate: no call gets through.
    if let Ok(mut anon) = tls_client(&d, &pki, None).await {
        let r = anon.status(api::StatusRequest {}).await;
        assert!(
            r.is_err(),
            "a client without a certificate was served: {r:?}"
        );
    }
    // With a certificate the CA signed: trusted, Put works.
    let (other_pki, other_ca) = Pki::new();
    let stranger = issue(&other_ca, "client");
    if let Ok(mut s) = tls_client(&d, &pki, Some(&stranger)).await {
        assert!(
            s.status(api::StatusRequest {}).await.is_err(),
            "a certificate of another CA was accepted"
        );
    }
    drop(other_pki);
    let mut c = tls_client(&d, &pki, Some(&issue(&ca, "client")))
        .await
        .unwrap();
    let put = c
        .put(tokio_stream::iter(put_requests(&e, 9, &[512, 256], data)))
        .await
        .expect("put")
        .into_inner();
    assert!(!put.already_present);
    assert_eq!(entries_for(&mut local, &[9u8; 32]).await.len(), 1);
    assert_eq!(d.stop(), Some(0));
}

/// Initializers each within `max_tensor_bytes` that declare more than
/// `max_model_bytes` together (many of them can name one sparse range): the
/// model is refused before any of its data is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_over_max_model_bytes_in_all_is_refused() {
    let mut d = InProc::start_with(|c| c.max_model_bytes = 1 << 20);
    let mut c = d.client().await;
    let path = d.path("work/two.onnx");
    // Two weights of 1 MiB each: each within every limit, 2 MiB together.
    write_model(&path, &two_weights_model());
    let h = c.hand(&path).await;
    let e = c
        .resolve_model(api::ResolveModelRequest {
            model_path: path.display().to_string(),
            handout: h.name().into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("max_model_bytes"), "{e:?}");
    assert_eq!(d.stop(), Some(0));
}

/// TCP peers holding every TCP place (issue 27 point 7) leave the Unix
/// socket's places alone: a socket client is still served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_connections_cannot_starve_the_socket() {
    let mut d = InProc::start_with(|c| {
        c.listen_tcp = Some("127.0.0.1:0".into());
        c.max_connections = 8;
    });
    let addr = d.tcp_addr.unwrap();
    // Twice the whole of max_connections as gRPC connections: the first
    // ones take every TCP place, the rest wait in the backlog.
    let mut held = Vec::new();
    for _ in 0..16 {
        let endpoint = Endpoint::from_shared(format!("http://{addr}")).unwrap();
        let served = async {
            let mut c = CompiledTensorCacheClient::new(endpoint.connect().await.ok()?);
            c.status(api::StatusRequest {}).await.ok()?;
            Some(c)
        };
        if let Ok(Some(c)) = tokio::time::timeout(Duration::from_millis(500), served).await {
            held.push(c);
        }
    }
    assert!(!held.is_empty(), "no TCP connection was served");
    let served = tokio::time::timeout(Duration::from_secs(5), async {
        let mut c = d.client().await;
        c.status(api::StatusRequest {}).await
    })
    .await;
    assert!(
        matches!(served, Ok(Ok(_))),
        "the socket was starved: {served:?}"
    );
    drop(held);
    assert_eq!(d.stop(), Some(0));
}
