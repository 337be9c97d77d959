//! What one peer can make the daemon spend is bounded (issue 27, point 5),
//! tested as the attacks that worked before, by uid 65534 (the attacker
//! halves run by re-executing this test binary under `setpriv`):
//!
//! - CPU: small models whose weights are sparse external files (no byte
//!   stored, every byte hashed). Hashing is charged at the declared size
//!   against `max_hashed_bytes_per_uid_per_hour`; what the digest memo
//!   knows is free; trusted callers are not charged.
//! - Storage: packs of the peer's own models. Entries packed for its
//!   requests count against `max_stored_bytes_per_uid`, and gc removes the
//!   peer's over it before anyone else's, however recently the others were
//!   used.

mod support;

use std::path::{Path, PathBuf};

use ctcache_api::v1 as api;
use support::*;
use tonic::Code;

/// Each model declares K x N f32 weights: 32 MiB.
const K: usize = 4096;
const N: usize = 2048;
const DECLARED: u64 = (K * N * 4) as u64;

/// A model in `dir` whose weights are external data in a sparse file of
/// the declared size, both owned by uid 65534.
fn sparse_model(dir: &Path, name: &str) -> PathBuf {
    use ctcache::pb::tensor_proto::DataLocation;
    let data = dir.join(format!("{name}.bin"));
    std::fs::File::create(&data)
        .unwrap()
        .set_len(DECLARED)
        .unwrap();
    let mut m = ctcache_testkit::MatMul::new(K, N, std::iter::repeat_n(0.0, K * N)).proto();
    let w = &mut m.graph.as_mut().unwrap().initializer[0];
    w.float_data.clear();
    w.raw_data = Default::default();
    w.data_location = DataLocation::External as i32;
    w.external_data = vec![
        ctcache_testkit::kv("location", &format!("{name}.bin")),
        ctcache_testkit::kv("offset", "0"),
        ctcache_testkit::kv("length", &DECLARED.to_string()),
    ];
    let path = dir.join(format!("{name}.onnx"));
    std::fs::write(&path, prost::Message::encode_to_vec(&m)).unwrap();
    for p in [&path, &data] {
        std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    path
}

async fn resolve(c: &mut Conn, model: &str) -> Result<api::ResolveModelResponse, tonic::Status> {
    let h = c
        .try_hand(Path::new(model))
        .await
        .map_err(|e| tonic::Status::new(e.code().unwrap_or(tonic::Code::Unknown), e.to_string()))?;
    c.resolve_model(api::ResolveModelRequest {
        model_path: model.into(),
        handout: h.name().into(),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner())
}

/// The attacker half: the first model fits the hour's budget (and asking
/// again is free), the second does not.
#[tokio::test]
async fn sparse_models_helper() {
    let Some(socket) = std::env::var_os("CT_TEST_SOCKET").map(PathBuf::from) else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap();
    let mut c = Conn::at(&socket).await;
    resolve(&mut c, &var("CT_TEST_FIRST"))
        .await
        .expect("a model within the budget");
    resolve(&mut c, &var("CT_TEST_FIRST"))
        .await
        .expect("the same model again: the memo knows it, nothing is hashed");
    let e = resolve(&mut c, &var("CT_TEST_SECOND"))
        .await
        .expect_err("a second model over the budget");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("max_hashed_bytes_per_uid_per_hour")
            && e.message().contains("try again in"),
        "{e:?}"
    );
    println!("HASHING-BOUNDED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_hashes_at_most_its_budget_of_declared_bytes() {
    if !uid_switch_or_skip() {
        return;
    }
    // 48 MiB an hour: one of the 32 MiB models, not two.
    let d = daemon_for_nobody(&format!(
        "max_hashed_bytes_per_uid_per_hour = {}\n",
        48u64 << 20
    ));
    let top = tempfile::tempdir().unwrap();
    open_to_all(top.path());
    let own = top.path().join("nobody");
    std::fs::create_dir(&own).unwrap();
    std::os::unix::fs::chown(&own, Some(NOBODY), Some(NOBODY)).unwrap();
    let first = sparse_model(&own, "first");
    let second = sparse_model(&own, "second");

    run_as_nobody(
        &d,
        "sparse_models_helper",
        &[
            ("CT_TEST_SOCKET", d.socket.display().to_string()),
            ("CT_TEST_FIRST", first.display().to_string()),
            ("CT_TEST_SECOND", second.display().to_string()),
        ],
        "HASHING-BOUNDED",
    );
    // Root is not charged: it may have the second model hashed.
    let mut c = Conn::at(&d.socket).await;
    resolve(&mut c, &second.display().to_string())
        .await
        .expect("root's request is not bounded");
}

/// The attacker half of `a_peer_uses_at_most_its_hour_of_the_daemons_cpu`:
/// packs model after model (each job's CPU time is its own) until the
/// daemon refuses it for its hour of CPU.
#[tokio::test]
async fn cpu_hog_helper() {
    let Some(socket) = std::env::var_os("CT_TEST_CPU_SOCKET").map(PathBuf::from) else {
        return;
    };
    let dir = PathBuf::from(std::env::var("CT_TEST_DIR").unwrap());
    let mut c = Conn::at(&socket).await;
    for seed in 0..200 {
        let model = dir.join(format!("m{seed}.onnx"));
        write_model(&model, &matmul_model(1024, 1024, seed + 1));
        let refused = match c.try_hand(&model).await {
            Err(e) => e.code().map(|code| (code, e.to_string())),
            Ok(h) => c
                .prepack(api::PrepackRequest {
                    model_path: model.display().to_string(),
                    handout: h.name().into(),
                    ..Default::default()
                })
                .await
                .err()
                .map(|e| (e.code(), e.message().to_string())),
        };
        let Some((code, message)) = refused else {
            continue;
        };
        assert_eq!(code, Code::ResourceExhausted, "{message}");
        assert!(
            message.contains("max_cpu_secs_per_uid_per_hour (1 s)"),
            "{message}"
        );
        println!("CPU-BOUNDED after {seed} models");
        return;
    }
    panic!("200 models packed within one CPU second an hour");
}

/// CPU time is charged to the uid the daemon works for (its requests'
/// work and its pack jobs, from the threads' CPU clocks): past its
/// `max_cpu_secs_per_uid_per_hour`, the uid is refused, naming the key,
/// while root is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_uses_at_most_its_hour_of_the_daemons_cpu() {
    if !uid_switch_or_skip() {
        return;
    }
    let d =
        daemon_for_nobody("max_cpu_secs_per_uid_per_hour = 1\nmax_queued_jobs_per_uid = 1000\n");
    let top = tempfile::tempdir().unwrap();
    open_to_all(top.path());
    let own = top.path().join("nobody");
    std::fs::create_dir(&own).unwrap();
    std::os::unix::fs::chown(&own, Some(NOBODY), Some(NOBODY)).unwrap();
    let pid = d.child.as_ref().unwrap().id();
    let before = usage(pid);
    run_as_nobody(
        &d,
        "cpu_hog_helper",
        &[
            ("CT_TEST_CPU_SOCKET", d.socket.display().to_string()),
            ("CT_TEST_DIR", own.display().to_string()),
        ],
        "CPU-BOUNDED",
    );
    let mut c = Conn::at(&d.socket).await;
    let model = d.path("work/root.onnx");
    write_model(&model, &matmul_model(256, 256, 7));
    prepack_ok(&mut c, &model.display().to_string()).await;
    // What the attacker made the daemon spend (root's small pack aside):
    // its budget and the jobs running when its hour ran out; the jobs it
    // had queued are refused, not run.
    let spent = usage(pid).cpu - before.cpu;
    assert!(
        spent < std::time::Duration::from_secs(10),
        "a one-second budget cost the daemon {spent:?} of CPU"
    );
}

/// Prepacks `model` and follows it to the end: every job packed.
async fn prepack_ok(c: &mut Conn, model: &str) {
    for p in prepack_all(c, Path::new(model)).await {
        assert!(
            !matches!(p.state(), api::JobState::Failed | api::JobState::Cancelled),
            "{model}: {p:?}"
        );
    }
}

/// The attacker half of the storage quota test: packs its own models.
#[tokio::test]
async fn own_models_helper() {
    let Some(socket) = std::env::var_os("CT_TEST_PACK_SOCKET").map(PathBuf::from) else {
        return;
    };
    let mut c = Conn::at(&socket).await;
    for model in std::env::var("CT_TEST_MODELS").unwrap().lines() {
        prepack_ok(&mut c, model).await;
    }
    println!("PACKED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_takes_a_peer_over_its_storage_quota_back_under_it_first() {
    if !uid_switch_or_skip() {
        return;
    }
    const QUOTA: u64 = 1 << 20;
    let d = daemon_for_nobody(&format!("max_stored_bytes_per_uid = {QUOTA}\n"));
    let mut c = Conn::at(&d.socket).await;
    // Root's model, packed first: the least recently used of all.
    let public = tempfile::tempdir().unwrap();
    open_to_all(public.path());
    let root_model = public.path().join("root.onnx");
    write_model(&root_model, &matmul_model(512, 256, 1));
    let root_model = root_model.display().to_string();
    prepack_ok(&mut c, &root_model).await;

    // The peer's three models: about 0.6 MiB of packs each.
    let own = public.path().join("nobody");
    std::fs::create_dir(&own).unwrap();
    std::os::unix::fs::chown(&own, Some(NOBODY), Some(NOBODY)).unwrap();
    let models: Vec<String> = (0..3u32)
        .map(|i| {
            let p = own.join(format!("m{i}.onnx"));
            write_model(&p, &matmul_model(512, 256, 10 + i));
            std::os::unix::fs::chown(&p, Some(NOBODY), Some(NOBODY)).unwrap();
            p.display().to_string()
        })
        .collect();
    run_as_nobody(
        &d,
        "own_models_helper",
        &[
            ("CT_TEST_PACK_SOCKET", d.socket.display().to_string()),
            ("CT_TEST_MODELS", models.join("\n")),
        ],
        "PACKED",
    );
    let listed = |l: &api::ListResponse, model: &str| -> (usize, u64) {
        l.entries
            .iter()
            .filter(|e| e.model_paths.iter().any(|p| p == model))
            .fold((0, 0), |(n, b), e| (n + 1, b + e.payload_len))
    };
    let before = c
        .list(api::ListRequest::default())
        .await
        .unwrap()
        .into_inner();
    let peer_before: u64 = models.iter().map(|m| listed(&before, m).1).sum();
    assert!(peer_before > QUOTA, "{peer_before}");

    // A gc with no limits (the store is far under its size budget).
    let gc = c.gc(api::GcRequest::default()).await.unwrap().into_inner();
    let entries: Vec<_> = gc
        .removed
        .iter()
        .filter(|i| !matches!(i.reason.as_str(), "orphan_file" | "temp_file"))
        .collect();
    assert!(!entries.is_empty(), "{gc:?}");
    for i in &entries {
        assert_eq!(i.reason, "uid_quota", "{i:?}");
        assert!(
            i.model_paths.iter().all(|p| models.contains(p)),
            "only the peer's entries go: {i:?}"
        );
    }
    let after = c
        .list(api::ListRequest::default())
        .await
        .unwrap()
        .into_inner();
    let peer_after: u64 = models.iter().map(|m| listed(&after, m).1).sum();
    assert!(peer_after <= QUOTA, "{peer_after} > {QUOTA}");
    assert_eq!(
        listed(&after, &root_model),
        listed(&before, &root_model),
        "root's entries stay"
    );
}
