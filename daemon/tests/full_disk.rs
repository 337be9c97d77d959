//! A full disk and a model that is not one answer with the code that says
//! so, end to end over the socket (issue 28 point 2): RESOURCE_EXHAUSTED for
//! Put, Prepack (in the failed job's progress, `code`), Embed and
//! Materialize when the cache's file system or the output's is full;
//! INVALID_ARGUMENT for a model the caller names that cannot be parsed.
//! (PERMISSION_DENIED for what a caller may not read or write:
//! trust_boundary.rs and peer_files.rs.)

mod support;

use ctcache_api::v1 as api;
use ctcache_testkit::Tmpfs;
use support::*;
use tonic::Code;

/// Materializes `model` into `out` as a client does (the daemon builds
/// it, this process writes it).
async fn materialize_to(
    d: &InProc,
    model: &std::path::Path,
    out: &std::path::Path,
) -> Result<api::MaterializeResponse, ctcache_client::Error> {
    let req = api::MaterializeRequest {
        model_path: model.display().to_string(),
        ..Default::default()
    };
    materialize_file(&d.socket, req, out, Default::default()).await
}

fn embed_req(model: &std::path::Path, out: &std::path::Path) -> api::EmbedRequest {
    api::EmbedRequest {
        model_path: model.display().to_string(),
        output_path: out.display().to_string(),
        ..Default::default()
    }
}

/// How many progress messages are in `state`.
fn states(progress: &[api::PrepackProgress], state: api::JobState) -> usize {
    progress.iter().filter(|p| p.state() == state).count()
}

/// Each progress message as (format, state, code, error).
fn summary(progress: &[api::PrepackProgress]) -> Vec<(String, api::JobState, String, String)> {
    progress
        .iter()
        .map(|p| (p.format.clone(), p.state(), p.code.clone(), p.error.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_resource_exhausted_on_every_path() {
    let (Some(cache_fs), Some(out_fs)) = (Tmpfs::mount("32m"), Tmpfs::mount("4m")) else {
        return;
    };
    let d = InProc::start_with(|c| c.cache_dir = cache_fs.path().join("cache"));
    let mut c = d.client().await;
    let first = d.path("work/first.onnx");
    std::fs::write(&first, matmul_model(512, 256, 1)).unwrap();
    let packed = prepack_all(&mut c, &first).await;
    assert_eq!(
        states(&packed, api::JobState::Done),
        2,
        "{:?}",
        summary(&packed)
    );
    let e = packed.iter().find_map(|p| p.entry.clone()).unwrap();
    let data = read_all(&mut c, &e.key).await;

    // The cache's file system full.
    let ballast = cache_fs.fill();
    let put = c
        .put(tokio_stream::iter(put_requests(&e, 9, &[512, 256], data)))
        .await;
    assert_eq!(put.unwrap_err().code(), Code::ResourceExhausted);
    let second = d.path("work/second.onnx");
    std::fs::write(&second, matmul_model(512, 256, 2)).unwrap();
    let jobs = prepack_all(&mut c, &second).await;
    let failed: Vec<_> = jobs
        .iter()
        .filter(|p| p.state() == api::JobState::Failed)
        .collect();
    assert!(
        !failed.is_empty() && failed.iter().all(|p| p.code == "RESOURCE_EXHAUSTED"),
        "{:?}",
        summary(&jobs)
    );
    let m = materialize_to(&d, &second, &d.path("work/m2.onnx"))
        .await
        .unwrap_err();
    assert_eq!(m.code(), Some(Code::ResourceExhausted), "{m:?}");
    std::fs::remove_file(ballast).unwrap();

    // The output's file system full, the cache's with room again.
    let ballast = out_fs.fill();
    let out = out_fs.path().join("m.onnx");
    let lib = c.library().await;
    let em = lib.embed(embed_req(&first, &out)).await;
    assert_eq!(em.unwrap_err().code(), Some(Code::ResourceExhausted));
    // The client writes the model: its own disk is full.
    let m = materialize_to(&d, &first, &out).await.unwrap_err();
    assert!(m.to_string().contains("No space left"), "{m:?}");
    assert!(!out.exists() && !out_fs.path().join("m.onnx.weights").exists());
    // Room again: the same calls go through.
    std::fs::remove_file(ballast).unwrap();
    lib.embed(embed_req(&first, &out))
        .await
        .expect("Embed with room");
    materialize_to(&d, &first, &out_fs.path().join("mat.onnx"))
        .await
        .expect("Materialize with room");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_cannot_be_parsed_is_invalid_argument() {
    let d = InProc::start();
    let c = d.client().await.library().await;
    let bad = d.path("work/bad.onnx");
    std::fs::write(&bad, b"\xff\xff\xff not a model").unwrap();
    let out = d.path("work/out.onnx");
    let codes = [
        c.prepack(api::PrepackRequest {
            model_path: bad.display().to_string(),
            ..Default::default()
        })
        .await
        .map(|_| ())
        .unwrap_err()
        .code()
        .unwrap(),
        c.embed(embed_req(&bad, &out))
            .await
            .unwrap_err()
            .code()
            .unwrap(),
        materialize_to(&d, &bad, &out)
            .await
            .unwrap_err()
            .code()
            .unwrap(),
    ];
    assert_eq!(codes, [Code::InvalidArgument; 3]);
}
