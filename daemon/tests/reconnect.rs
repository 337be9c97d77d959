//! The Rust client across a daemon restart (SIGKILL, then a new daemon on
//! the same folders, as systemd's `Restart=` does): calls that are safe to
//! repeat wait for the new daemon on a new channel, the others fail at once.

mod support;

use std::time::{Duration, Instant};

use ctcache_client::{api, Client, ResolveOptions};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_survives_a_daemon_restart() {
    let mut d = Daemon::start();
    let model = d.path("m.onnx");
    write_model(&model, &matmul_model(256, 256, 5));
    let client = Client::connect_to(&d.socket).await.unwrap();
    let impatient = client.clone().retry_for(Duration::ZERO);
    let first = client.status().await.unwrap().pid;
    prepack_all(&mut d.client().await, &model).await;

    drop(d.child.take()); // SIGKILL
                          // Not safe to repeat (it may have acted): fails at once, as does any
                          // call of a client that does not wait.
    let t = Instant::now();
    let gc = client
        .gc(api::GcRequest {
            dry_run: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(gc.is_unreachable(), "{gc}");
    let status = impatient.status().await.unwrap_err();
    assert!(status.is_unreachable(), "{status}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());

    let restart = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(500));
        d.spawn(&[], |_| {});
        d
    });
    let status = client
        .status()
        .await
        .expect("retried until the new daemon answers");
    let d = restart.await.unwrap();
    assert_ne!(status.pid, first);
    assert_eq!(Some(status.pid), d.child.as_ref().map(|c| c.0.id()));
    // The same clients go on, and the entries packed before are there.
    let r = client
        .resolve_model(&model, &ResolveOptions::default())
        .await
        .unwrap();
    assert!(r.tensors.iter().all(|t| !t.entries.is_empty()), "{r:?}");
    assert_eq!(impatient.status().await.unwrap().pid, status.pid);
}
