//! A lease of an untrusted uid ends `max_lease_lifetime_secs` after it was
//! taken, however often it is renewed, so gc can always collect the entry
//! in the end (#27): the attack is uid 65534 renewing for ever.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use ctcache_api::v1 as api;
use ctcache_api::v1::compiled_tensor_cache_client::CompiledTensorCacheClient;
use support::*;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_for_ever_helper() {
    let Ok(socket) = std::env::var("CTCACHE_TEST_SOCKET") else {
        return;
    };
    let key = std::env::var("CTCACHE_TEST_KEY").unwrap();
    let mut c = CompiledTensorCacheClient::new(channel(Path::new(&socket)).await);
    let lease = c
        .acquire_lease(api::AcquireLeaseRequest { key, ttl_ms: 1000 })
        .await
        .unwrap()
        .into_inner();
    let start = Instant::now();
    let refused = loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let r = c
            .renew_lease(api::RenewLeaseRequest {
                lease_id: lease.lease_id,
                ttl_ms: 1000,
            })
            .await;
        match r {
            Ok(r) => {
                // Never past the cap of 2 s after the lease was taken.
                let end = lease.expires_unix_ms - 1000 + 2000;
                assert!(r.into_inner().expires_unix_ms <= end + 50);
            }
            Err(s) => break s,
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "renewed for 10 s"
        );
    };
    assert!(
        matches!(refused.code(), Code::FailedPrecondition | Code::NotFound),
        "{refused:?}"
    );
    assert!(start.elapsed() >= Duration::from_millis(1700));
    println!("LEASE-CAPPED");
}

#[test]
fn an_untrusted_lease_renewed_for_ever_ends_at_its_lifetime() {
    if !uid_switch_or_skip() {
        return;
    }
    let d = daemon_for_nobody("max_lease_lifetime_secs = 2\n");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let world = tempfile::tempdir().unwrap();
    open_to_all(world.path());
    let model = world.path().join("m.onnx");
    write_model(&model, &matmul_model(256, 256, 21));
    std::fs::set_permissions(&model, std::fs::Permissions::from_mode(0o644)).unwrap();
    let key = rt.block_on(async {
        let mut c = d.client().await;
        prepack_all(&mut c, &model).await;
        entries_for(&mut c, &digest_of(&model, "W")).await[0]
            .key
            .clone()
    });
    let env = [
        ("CTCACHE_TEST_SOCKET", d.socket.display().to_string()),
        ("CTCACHE_TEST_KEY", key.clone()),
    ];
    run_as_nobody(&d, "renew_for_ever_helper", &env, "LEASE-CAPPED");
    // The lease is over: gc may take the entry.
    let removed = rt.block_on(async {
        let mut c = d.client().await;
        c.gc(api::GcRequest {
            max_bytes: 0,
            has_max_bytes: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .removed
    });
    assert!(removed.iter().any(|r| r.key == key), "{removed:?}");
}
