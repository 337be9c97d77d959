//! Use that means use (issue 29, point 3): a file event in a watched folder
//! reconsiders only the models it concerns, the daemon's own rescans are
//! not uses of the entries they find (LRU and age gc would keep every
//! watched model for ever), and a client's lookup or resolve is.

mod support;

use std::path::Path;
use std::time::Duration;

use ctcache_api::v1 as api;
use ctcache_testkit::clock_past;
use ctcache_testkit::digest_of_file;
use support::*;

/// A model whose weight W[k, n] is external data in `data` beside it.
fn external_model(dir: &Path, name: &str, data: &str, seed: u32) {
    use ctcache::pb::tensor_proto::DataLocation;
    let mut m = ctcache_testkit::MatMul::new(
        512,
        256,
        ctcache_testkit::xorshift(seed).map(ctcache_testkit::unit_f32),
    )
    .proto();
    let w = &mut m.graph.as_mut().unwrap().initializer[0];
    let bytes = std::mem::take(&mut w.raw_data);
    w.data_location = DataLocation::External as i32;
    w.external_data = vec![
        ctcache_testkit::kv("location", data),
        ctcache_testkit::kv("offset", "0"),
        ctcache_testkit::kv("length", &bytes.len().to_string()),
    ];
    std::fs::write(dir.join(data), &bytes).unwrap();
    write_model(&dir.join(name), &prost::Message::encode_to_vec(&m));
}

/// The model paths of watcher and job events that arrive within `for_`.
async fn models_named(events: &mut tonic::Streaming<api::Event>, for_: Duration) -> Vec<String> {
    let end = tokio::time::Instant::now() + for_;
    let mut named = Vec::new();
    while let Ok(Ok(Some(e))) = tokio::time::timeout_at(end, events.message()).await {
        if matches!(e.kind.as_str(), "watcher" | "job_progress") && !e.model_path.is_empty() {
            named.push(e.model_path);
        }
    }
    named
}

/// The event feed, once the events of what came before have passed (2 s
/// without one about a model).
async fn settled_events(c: &Client) -> tonic::Streaming<api::Event> {
    let mut events = follow_events(c).await;
    while !models_named(&mut events, Duration::from_secs(2))
        .await
        .is_empty()
    {}
    events
}

/// The latest last use in `uses`: a use from once the clock is past it is
/// stamped later.
fn newest(uses: &[(i64, u64)]) -> i64 {
    uses.iter().map(|u| u.0).max().unwrap_or(0)
}

/// Last use (ms) and use count of each entry of `digest`, as List (which
/// is no use) shows them.
async fn uses(c: &mut Client, digest: &[u8]) -> Vec<(i64, u64)> {
    let listed = c
        .list(api::ListRequest {
            source_digest: bytes::Bytes::copy_from_slice(digest),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.entries.len(), 2, "{listed:?}");
    let mut v: Vec<(i64, u64)> = listed
        .entries
        .iter()
        .map(|e| (e.last_access_unix_ms, e.access_count))
        .collect();
    v.sort();
    v
}

type Client = ctcache_api::v1::compiled_tensor_cache_client::CompiledTensorCacheClient<
    tonic::transport::Channel,
>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_beside_watched_models_rescans_only_the_models_that_read_it() {
    let d = InProc::start();
    let c = d.client().await;
    let (inline, external) = (d.models.join("inline.onnx"), d.models.join("external.onnx"));
    write_model(&inline, &matmul_model(512, 256, 3));
    external_model(&d.models, "external.onnx", "external.bin", 4);
    for m in [&inline, &external] {
        wait_for_entries(&c, &digest_of_file(m, "W"), 2, "watched").await;
    }
    let mut events = settled_events(&c).await;

    // A note beside them: neither model is read again.
    std::fs::write(d.models.join("notes.txt"), b"hi").unwrap();
    let named = models_named(&mut events, Duration::from_secs(3)).await;
    assert!(named.is_empty(), "a note rescanned {named:?}");

    // The external model's data file rewritten: that model only.
    external_model(&d.models, "external.onnx.tmp", "external.bin", 5);
    std::fs::remove_file(d.models.join("external.onnx.tmp")).unwrap();
    let named = models_named(&mut events, Duration::from_secs(5)).await;
    let external = external.display().to_string();
    assert!(named.contains(&external), "{named:?}");
    assert!(named.iter().all(|m| *m == external), "{named:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemons_rescans_are_no_use_and_a_clients_lookup_is() {
    let d = InProc::start();
    let mut c = d.client().await;
    let model = d.models.join("m.onnx");
    let bytes = matmul_model(512, 256, 6);
    write_model(&model, &bytes);
    let digest = digest_of_file(&model, "W");
    // Waited for with List, which is no use: the client's lookup below is
    // the first of its window (a lookup notes an entry once a minute).
    let listed = eventually(Duration::from_secs(60), || {
        let mut c = c.clone();
        let digest = digest.clone();
        async move {
            let r = c.list(api::ListRequest {
                source_digest: bytes::Bytes::from(digest),
                ..Default::default()
            });
            (r.await.unwrap().into_inner().entries.len() == 2).then_some(())
        }
    })
    .await;
    assert!(listed.is_some(), "the watcher packs both entries");
    let before = uses(&mut c, &digest).await;

    // The model written again with the same bytes: the watcher finds both
    // entries stored (and checks their payloads), which is not a use.
    let mut events = settled_events(&c).await;
    write_model(&model, &bytes);
    loop {
        let e = next_event(&mut events, 30, "the rescan").await;
        if e.kind == "watcher" && e.detail.contains("pack job(s)") {
            break;
        }
    }
    let idle = eventually(Duration::from_secs(30), || {
        let mut c = c.clone();
        async move {
            let s = c.status(api::StatusRequest {}).await.unwrap().into_inner();
            (s.jobs_running == 0 && s.jobs_queued == 0).then_some(())
        }
    })
    .await;
    assert!(idle.is_some(), "the rescan's jobs end");
    assert_eq!(
        uses(&mut c, &digest).await,
        before,
        "a rescan counted as use"
    );

    // A client's lookup is (stamped after every use so far).
    clock_past(newest(&before));
    let hits = c.lookup(lookup_req(&digest)).await.unwrap().into_inner();
    assert!(!hits.entries.is_empty());
    let after = uses(&mut c, &digest).await;
    assert!(
        after
            .iter()
            .zip(&before)
            .all(|(a, b)| a.0 > b.0 && a.1 > b.1),
        "{before:?} -> {after:?}"
    );

    // And so is a resolve that returns the entries.
    clock_past(newest(&after));
    let h = c.hand(&model).await;
    c.resolve_model(api::ResolveModelRequest {
        model_path: model.display().to_string(),
        handout: h.name().into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let resolved = uses(&mut c, &digest).await;
    assert!(
        resolved
            .iter()
            .zip(&after)
            .all(|(r, a)| r.0 > a.0 && r.1 > a.1),
        "{after:?} -> {resolved:?}"
    );
}
