//! RemotePull, RemotePush and RemoteStatus on bad input: no remote
//! configured, model paths that are empty, relative, missing or not ONNX, a
//! caller that may not read the model or write the bucket, and a remote that
//! does not answer. Each gets a clear error (or an empty transfer), never a
//! hang past the remote's deadline. No S3 server is needed: these fail
//! before any request, or against a closed port (tests/python/test_fleet.py
//! runs the real transfers against moto).

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use ctcache_api::v1 as api;
use support::*;
use tonic::Code;

const TIMEOUT_MS: u64 = 400;

/// A port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The daemon binary with a remote on a closed port, set by flags alone
/// (no [remote] in any file), and dummy credentials.
fn daemon_with_dead_remote() -> Daemon {
    let endpoint = format!("http://127.0.0.1:{}", closed_port());
    let timeout = TIMEOUT_MS.to_string();
    Daemon::start_with(
        &[
            "--remote-url",
            "s3://ctc-bucket/fleet",
            "--remote-endpoint",
            &endpoint,
            "--remote-allow-http",
            "true",
            "--remote-timeout-ms",
            &timeout,
        ],
        |c| {
            c.env("AWS_ACCESS_KEY_ID", "test")
                .env("AWS_SECRET_ACCESS_KEY", "test")
                .env("AWS_REGION", "us-east-1");
        },
    )
}

/// RemotePull of `path` asked by path (the daemon opens none), which must
/// fail.
async fn pull(c: &mut Conn, path: &str) -> tonic::Status {
    let r = c
        .remote_pull(api::RemotePullRequest {
            model_path: path.into(),
            ..Default::default()
        })
        .await;
    r.expect_err(&format!("pull of {path:?} must fail"))
}

/// RemotePush of every entry, which must fail.
async fn push_all(c: &mut Conn) -> tonic::Status {
    let r = c.remote_push(api::RemotePushRequest::default()).await;
    r.expect_err("push must fail")
}

#[tokio::test]
async fn without_a_remote_pull_and_push_say_so_and_status_has_none() {
    let d = InProc::start();
    let mut c = d.client().await;
    let model = d.models.join("m.onnx");
    write_model(&model, &matmul_model(64, 64, 1));
    let e = pull(&mut c, &model.display().to_string()).await;
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("[remote]"), "{e:?}");
    let e = push_all(&mut c).await;
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("[remote]"), "{e:?}");
    let st = c.remote_status(api::RemoteStatusRequest {}).await.unwrap();
    assert!(st.into_inner().remote.is_none());
}

#[tokio::test]
async fn bad_model_paths_are_refused_before_the_remote_is_asked() {
    let d = daemon_with_dead_remote();
    let mut c = d.client().await;
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.onnx");
    std::fs::write(&garbage, b"\xff\xff\xff not onnx").unwrap();
    let missing = dir.path().join("missing.onnx");
    for path in [
        String::new(),
        "relative/m.onnx".to_string(),
        missing.display().to_string(),
    ] {
        let e = pull(&mut c, &path).await;
        assert_eq!(e.code(), Code::InvalidArgument, "{path:?}: {e:?}");
    }
    // Through the client library: a missing model is its own open's error,
    // one that is no model the daemon's refusal of the hand-over.
    let lib = c.library().await;
    let e = lib.remote_pull(&missing).await.unwrap_err();
    assert!(
        matches!(&e, ctcache_client::Error::Io { source, .. }
            if source.kind() == std::io::ErrorKind::NotFound),
        "{e:?}"
    );
    let e = lib.remote_pull(&garbage).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e:?}");
    // No fetch was tried: none failed, none missed.
    let st = c.status(api::StatusRequest {}).await.unwrap().into_inner();
    let r = st.remote.expect("the flags configured a remote");
    assert_eq!(
        (r.errors, r.misses, r.hits, r.skipped),
        (0, 0, 0, 0),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_dead_remote_is_reported_unreachable_and_fails_transfers_within_the_deadline() {
    let d = daemon_with_dead_remote();
    let mut c = d.client().await;
    let t = Instant::now();
    let st = c
        .remote_status(api::RemoteStatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .remote
        .expect("the flags configured a remote");
    assert!(st.probed && !st.reachable, "{st:?}");
    assert!(!st.probe_error.is_empty(), "{st:?}");
    // One retry at most within the deadline; slack for a busy host.
    assert!(t.elapsed() < Duration::from_millis(3 * TIMEOUT_MS + 2000));
    // The plain Status does not probe.
    let plain = c.status(api::StatusRequest {}).await.unwrap().into_inner();
    assert!(!plain.remote.expect("remote").probed);

    // A model packed here; pulling it finds every entry present (no
    // request), and pushing fails each entry by name: no signing key.
    let model = d.models.join("m.onnx");
    write_model(&model, &matmul_model(256, 256, 2));
    let packed = prepack_all(&mut c, &model).await;
    assert!(!packed.is_empty());
    let n = entries_for(&mut c, &digest_of(&model, "W")).await.len() as u32;
    assert!(n >= 1);
    let h = c.hand(&model).await;
    let req = api::RemotePullRequest {
        model_path: model.display().to_string(),
        handout: h.name().into(),
    };
    let p = c.remote_pull(req).await.unwrap().into_inner();
    assert_eq!((p.present, p.done, p.missing), (n, 0, 0), "{p:?}");
    let push = c
        .remote_push(api::RemotePushRequest {
            model_path: model.display().to_string(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((push.failed, push.done), (n, 0), "{push:?}");
    assert!(push.first_error.contains("signing_key_file"), "{push:?}");
    // A model path no entry was packed from uploads nothing.
    let none = c
        .remote_push(api::RemotePushRequest {
            model_path: "/nowhere/else.onnx".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (none.done, none.failed, none.present, none.missing),
        (0, 0, 0, 0)
    );
}

/// The client half of `another_user_may_neither_pull_a_model_it_cannot_read_nor_push`,
/// as uid 65534.
#[tokio::test]
async fn nobody_remote_helper() {
    let Ok(socket) = std::env::var("CTCACHE_TEST_SOCKET") else {
        return;
    };
    let secret = std::env::var("CTCACHE_TEST_SECRET").unwrap();
    let missing = std::env::var("CTCACHE_TEST_MISSING").unwrap();
    let mut c = Conn::at(Path::new(&socket)).await;
    // Root's unreadable model and a missing one: the daemon opens neither
    // path, and answers both alike.
    let a = pull(&mut c, &secret).await;
    let b = pull(&mut c, &missing).await;
    assert_eq!(a.code(), Code::InvalidArgument, "{a:?}");
    assert_eq!(
        a.message().replace(&secret, "<p>"),
        b.message().replace(&missing, "<p>")
    );
    // This uid cannot open root's model: it has nothing to hand over.
    let e = c.library().await.remote_pull(Path::new(&secret)).await;
    assert!(
        matches!(&e, Err(ctcache_client::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::PermissionDenied),
        "{e:?}"
    );
    let e = push_all(&mut c).await;
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("remote push"), "{e:?}");
    println!("NOBODY-REMOTE-REFUSED");
}

#[test]
fn another_user_may_neither_pull_a_model_it_cannot_read_nor_push() {
    if !uid_switch_or_skip() {
        return;
    }
    let endpoint = format!("http://127.0.0.1:{}", closed_port());
    let d = daemon_for_nobody(&format!(
        "[remote]\nurl = \"s3://ctc-bucket/fleet\"\nendpoint = \"{endpoint}\"\nallow_http = true\ntimeout_ms = {TIMEOUT_MS}\n"
    ));
    let secret = tempfile::tempdir().unwrap();
    std::fs::set_permissions(secret.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let model = secret.path().join("secret.onnx");
    write_model(&model, &matmul_model(64, 64, 3));
    let env = [
        ("CTCACHE_TEST_SOCKET", d.socket.display().to_string()),
        ("CTCACHE_TEST_SECRET", model.display().to_string()),
        (
            "CTCACHE_TEST_MISSING",
            secret.path().join("missing.onnx").display().to_string(),
        ),
    ];
    run_as_nobody(&d, "nobody_remote_helper", &env, "NOBODY-REMOTE-REFUSED");
}
