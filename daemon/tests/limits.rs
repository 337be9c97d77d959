//! The daemon's connection and call bounds driven as the attacks they stop
//! (issue 13): a peer holding every connection (`max_connections`), a peer
//! taking more than its uid's share (`max_connections_per_uid`), one
//! connection opening more streams than allowed
//! (`max_streams_per_connection`) and a call that never finishes
//! (`request_timeout_secs`). Each time the daemon stays bounded and keeps
//! answering everyone else.

mod support;

use std::time::{Duration, Instant};

use ctcache_api::v1 as api;
use ctcache_api::v1::compiled_tensor_cache_client::CompiledTensorCacheClient;
use support::*;
use tokio::time::timeout;
use tonic::Code;

/// How long a call that should be held is watched for not finishing.
const HELD: Duration = Duration::from_secs(2);
/// How long a call that should go through may take on a loaded machine.
const SERVED: Duration = Duration::from_secs(20);

/// A Status call on a fresh connection, within `SERVED`.
async fn status_on_new_connection(d: &InProc) -> api::StatusResponse {
    let mut c = d.client().await;
    timeout(SERVED, c.status(api::StatusRequest {}))
        .await
        .expect("the daemon answers another connection")
        .expect("Status")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_holding_every_connection_delays_others_until_it_lets_go() {
    let d = InProc::start_with(|c| c.max_connections = 4);
    // The hog: 10 connections that never say a word (not even the HTTP/2
    // preface). The daemon takes 4; the rest wait in the kernel's backlog.
    let mut hog = Vec::new();
    for _ in 0..10 {
        hog.push(tokio::net::UnixStream::connect(&d.socket).await.unwrap());
    }
    // The kernel's backlog is in order: whichever of them the daemon took
    // yet, the client below comes after all ten.

    // A well-behaved client queues behind them: not refused, not served.
    let socket = d.socket.clone();
    let mut polite = tokio::spawn(async move {
        let mut c = CompiledTensorCacheClient::new(channel(&socket).await);
        c.status(api::StatusRequest {}).await
    });
    assert!(
        timeout(HELD, &mut polite).await.is_err(),
        "a 5th connection was served while 4 were held (max_connections = 4)"
    );

    // Once the hog lets go, it is accepted and served.
    drop(hog);
    let answer = timeout(SERVED, polite)
        .await
        .expect("served once the hog's connections closed")
        .unwrap();
    answer.expect("Status once the hog left");
    status_on_new_connection(&d).await;
}

/// Opens `n` silent connections to `socket`; returns those the daemon kept
/// and how many it closed at once (read sees end of file), all judged
/// within `HELD` together.
async fn silent_connections(
    socket: &std::path::Path,
    n: usize,
) -> (Vec<tokio::net::UnixStream>, usize) {
    use tokio::io::AsyncReadExt;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
        tasks.spawn(async move {
            let mut b = [0u8; 64];
            match timeout(HELD, s.read(&mut b)).await {
                Ok(Ok(0)) | Ok(Err(_)) => None,
                // Kept: the daemon's HTTP/2 preface, or silence.
                Ok(Ok(_)) | Err(_) => Some(s),
            }
        });
    }
    let (mut kept, mut closed) = (Vec::new(), 0);
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            Some(s) => kept.push(s),
            None => closed += 1,
        }
    }
    (kept, closed)
}

/// Per-uid connection shares bind uid 65534 and not root (a trusted uid,
/// see `caller::is_trusted_uid`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_a_uids_share_are_closed_and_the_share_comes_back() {
    if !uid_switch_or_skip() {
        return;
    }
    let d = daemon_for_nobody("max_connections = 32\nmax_connections_per_uid = 3\n");
    // Root takes no places: all 8 of its connections are kept.
    let (root_kept, root_closed) = silent_connections(&d.socket, 8).await;
    assert_eq!(
        (root_kept.len(), root_closed),
        (8, 0),
        "root is not counted"
    );
    let socket = d.socket.display().to_string();
    run_as_nobody(
        &d,
        "connection_share_helper",
        &[("CTCACHE_TEST_SOCKET", socket.as_str())],
        "SHARE-BOUNDED",
    );
}

/// Run as uid 65534 by the test above: its share is 3 connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_share_helper() {
    let Ok(socket) = std::env::var("CTCACHE_TEST_SOCKET") else {
        return;
    };
    let socket = std::path::PathBuf::from(socket);
    // The hog opens 8 silent connections: 3 are kept, the other 5 are
    // closed by the daemon at once.
    let (mut kept, closed) = silent_connections(&socket, 8).await;
    assert_eq!((kept.len(), closed), (3, 5), "3 kept, 5 closed");

    // The uid's fourth connection, a real client, is refused too ...
    let lazy = ctcache_client::lazy_channel_to(&socket);
    let refused = timeout(
        SERVED,
        CompiledTensorCacheClient::new(lazy).status(api::StatusRequest {}),
    )
    .await
    .expect("refused at once, not held");
    assert!(refused.is_err(), "served beyond the uid's share");

    // ... and served once the hog gives a place back.
    // (The daemon frees the place when it sees the close: a client refused
    // before that tries again.)
    drop(kept.pop());
    let served = eventually(SERVED, || {
        let socket = socket.clone();
        async move {
            let lazy = ctcache_client::lazy_channel_to(&socket);
            let mut c = CompiledTensorCacheClient::new(lazy);
            c.status(api::StatusRequest {}).await.ok()
        }
    })
    .await;
    assert!(served.is_some(), "not served within its share");
    println!("SHARE-BOUNDED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_beyond_the_connection_limit_wait_and_other_connections_are_served() {
    let d = InProc::start_with(|c| c.max_streams_per_connection = 2);
    let mut c = d.client().await;
    // Two long-lived streams fill the connection (Events never ends).
    let first = c.events(api::EventsRequest {}).await.unwrap().into_inner();
    let _second = c.events(api::EventsRequest {}).await.unwrap().into_inner();

    // A third call on the same connection is held by HTTP/2 flow control.
    let mut third = {
        let mut c = c.clone();
        tokio::spawn(async move { c.status(api::StatusRequest {}).await })
    };
    assert!(
        timeout(HELD, &mut third).await.is_err(),
        "a 3rd stream ran on a connection limited to 2"
    );

    // Another connection is answered meanwhile.
    let before = Instant::now();
    status_on_new_connection(&d).await;
    assert!(before.elapsed() < HELD, "{:?}", before.elapsed());

    // Ending one stream lets the held call through.
    drop(first);
    timeout(SERVED, third)
        .await
        .expect("the held call runs once a stream ended")
        .unwrap()
        .expect("Status on the freed connection");
}

/// A Put of `e`'s payload (see `put_requests`) sending `data` and then
/// staying open while the returned sender lives.
fn put_stream(
    e: &api::Entry,
    n: u8,
    data: Vec<u8>,
) -> (
    tokio::sync::mpsc::Sender<api::PutRequest>,
    tokio_stream::wrappers::ReceiverStream<api::PutRequest>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    for r in put_requests(e, n, &[512, 256], data) {
        tx.try_send(r).unwrap();
    }
    (tx, tokio_stream::wrappers::ReceiverStream::new(rx))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_never_finishes_is_ended_at_the_request_timeout() {
    let mut d = InProc::start_with(|c| c.request_timeout_secs = 1);
    let mut c = d.client().await;
    let model = d.path("work/m.onnx");
    write_model(&model, &matmul_model(512, 256, 3));
    prepack_all(&mut c, &model).await;
    let e = entries_for(&mut c, &digest_of(&model, "W"))
        .await
        .into_iter()
        .max_by_key(|e| e.payload_len)
        .unwrap();
    let data = read_all(&mut c, &e.key).await;

    // A slow Put: header and half the payload, then nothing, never ending.
    let (stalled, requests) = put_stream(&e, 9, data[..data.len() / 2].to_vec());
    let before = Instant::now();
    let err = timeout(SERVED, c.put(requests))
        .await
        .expect("the daemon ended the stalled Put")
        .expect_err("a Put that never finishes cannot succeed");
    let took = before.elapsed();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert!(err.message().contains("request_timeout_secs"), "{err:?}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(10),
        "ended after {took:?} with a 1 s limit"
    );
    drop(stalled);

    // The daemon stays healthy: the same connection and a new one are
    // answered, and a whole Put of the same entry goes through.
    c.status(api::StatusRequest {}).await.expect("Status");
    status_on_new_connection(&d).await;
    let (sender, requests) = put_stream(&e, 9, data.clone());
    drop(sender);
    let put = c.put(requests).await.expect("a whole Put").into_inner();
    let stored = put.entry.expect("the stored entry");
    assert_eq!(read_all(&mut c, &stored.key).await, data);
    assert_eq!(d.stop(), Some(0));
}
