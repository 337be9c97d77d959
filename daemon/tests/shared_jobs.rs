//! One caller cannot fail another's pack (issue 27, point 4), tested as the
//! attack that worked before: uid 65534 Prepacks its copy of a public model
//! without waiting for it, changes the copy while the job is queued, and
//! root's Embed of the original must not join that job and fail with it.
//! The attacker half runs by re-executing this test binary under `setpriv`.

mod support;

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use ctcache_api::v1 as api;
use support::*;

/// The weights' shape of the shared model; the blocker's is far bigger.
const K: usize = 512;
const N: usize = 256;
const BLOCKER: usize = 3072;

/// Many jobs on one initializer, to keep the one worker busy.
fn blocker_formats() -> Vec<api::FormatSpec> {
    let format = |id: &str, params: &[(&str, &str)]| api::FormatSpec {
        id: id.into(),
        params: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    let mut all = vec![
        format("ggml.q8_0", &[]),
        format("ggml.q4_0", &[]),
        format("cast.f16", &[]),
        format("cast.bf16", &[]),
        format("ort.float16", &[]),
        format("gemm.pack_b.f32", &[]),
    ];
    for bits in ["4", "8"] {
        for block_size in ["16", "32", "64", "128"] {
            for symmetric in ["true", "false"] {
                all.push(format(
                    "ort.matmul_nbits",
                    &[
                        ("bits", bits),
                        ("block_size", block_size),
                        ("symmetric", symmetric),
                    ],
                ));
            }
        }
    }
    all
}

/// The attacker half: Prepacks its copy, sees the job queued, rewrites the
/// copy in place (same file, other weights), says READY and keeps following
/// the job until it ends.
#[tokio::test]
async fn changing_copy_helper() {
    let Some(socket) = std::env::var_os("CT_TEST_SOCKET").map(PathBuf::from) else {
        return;
    };
    let copy = PathBuf::from(std::env::var("CT_TEST_COPY").unwrap());
    let mut c = Conn::at(&socket).await;
    let h = c.hand(&copy).await;
    let mut progress = c
        .prepack(api::PrepackRequest {
            model_path: copy.display().to_string(),
            handout: h.name().into(),
            ..Default::default()
        })
        .await
        .expect("Prepack of the peer's own copy")
        .into_inner();
    let first = progress.message().await.unwrap().expect("a first progress");
    assert_eq!(first.state(), api::JobState::Queued, "{first:?}");

    let other = matmul_model(K, N, 99);
    assert_eq!(other.len() as u64, std::fs::metadata(&copy).unwrap().len());
    let mut f = std::fs::OpenOptions::new().write(true).open(&copy).unwrap();
    f.write_all(&other).unwrap();
    f.sync_all().unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    while let Some(p) = progress.message().await.unwrap() {
        println!("ATTACKER-JOB {:?} {} {}", p.state(), p.code, p.error);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_changing_its_copy_fails_only_its_own_job() {
    if !uid_switch_or_skip() {
        return;
    }
    let d = daemon_for_nobody("workers = 1\n");
    let public = tempfile::tempdir().unwrap();
    open_to_all(public.path());
    let original = public.path().join("shared.onnx");
    write_model(&original, &matmul_model(K, N, 7));
    let blocker = public.path().join("blocker.onnx");
    write_model(&blocker, &matmul_model(BLOCKER, BLOCKER, 8));
    let attacker = public.path().join("nobody");
    std::fs::create_dir(&attacker).unwrap();
    let copy = attacker.join("copy.onnx");
    std::fs::copy(&original, &copy).unwrap();
    for p in [&attacker, &copy] {
        std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    }

    // The one worker is busy with the blocker while the rest happens.
    let mut c = Conn::at(&d.socket).await;
    let h = c.hand(&blocker).await;
    let mut blocking = c
        .prepack(api::PrepackRequest {
            model_path: blocker.display().to_string(),
            handout: h.name().into(),
            formats: blocker_formats(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let total = blocker_formats().len() as u32;
    let first = blocking
        .message()
        .await
        .unwrap()
        .expect("the blocker's state");
    assert_eq!(first.done, 0, "{first:?}");

    let mut peer = helper_as(NOBODY, "changing_copy_helper")
        .env("CT_TEST_SOCKET", &d.socket)
        .env("CT_TEST_COPY", &copy)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = std::io::BufReader::new(peer.stdout.take().unwrap());
    let mut line = String::new();
    // libtest may start the line ("test changing_copy_helper ... ").
    while !line.trim_end().ends_with("READY") {
        line.clear();
        assert!(said.read_line(&mut line).unwrap() > 0, "the peer stopped");
    }

    // Root's Embed of the original, submitted while both are queued.
    let out = tempfile::tempdir().unwrap();
    let root = c.library().await;
    let output = out.path().join("embedded.onnx");
    let request = api::EmbedRequest {
        model_path: original.display().to_string(),
        output_path: output.display().to_string(),
        ..Default::default()
    };
    let embed = tokio::spawn(async move { root.embed(request).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    while let Ok(m) = tokio::time::timeout(Duration::ZERO, blocking.message()).await {
        let m = m
            .unwrap()
            .expect("the blocker's stream ends with its last job");
        assert!(
            m.done + 1 < total,
            "the blocker ended before the Embed was submitted, the test proves nothing: {m:?}"
        );
    }

    let answer = tokio::time::timeout(Duration::from_secs(600), embed)
        .await
        .expect("the Embed ends")
        .unwrap();
    answer.expect("root's Embed of the original, whatever the peer did to its copy");
    assert!(output.exists());

    let mut rest = String::new();
    std::io::Read::read_to_string(&mut said, &mut rest).unwrap();
    assert!(peer.wait().unwrap().success(), "{rest}");
    // The peer's own job failed, as a changed source is: try again.
    assert!(
        rest.contains("ATTACKER-JOB Failed UNAVAILABLE W") && rest.contains("the source changed"),
        "{rest}"
    );
    println!("the peer's job: {rest}");
}
