//! ctcached benchmark: Lookup latency p50/p99 over the Unix socket and
//! BatchLookup lookups per second, each beside its anchor: a no-op RPC
//! (grpc.health.v1 Check) on the same connection in the same run, the
//! transport's floor (for batches, no-op calls per second: the ratio says
//! how many lookups a batch answers in one empty round trip's time);
//! ResolveModel of a 300-initializer model with a warm digest memo (target
//! p50 < 5 ms), and the time from a model landing in a watched folder to
//! all its entries ready, minus the pure packing time (target < 1 s).
//! Beside them, tonic's own floor: the same no-op RPC answered by a bare
//! tonic health server (a copy of this bench, on its own Unix socket, with
//! the daemon's runtime flavour and none of its layers), so the report can
//! say how much of the anchor is the daemon's edge and how much gRPC.
//! The client runs on a current-thread runtime (as ctcachectl's); Lookup
//! latency is timed again from a multi-thread client runtime, whose thread
//! hops the round trip pays too. Lookups and both no-ops are timed in
//! alternating blocks of back-to-back calls (and, printed beside, one by one
//! in turn); then the CPU time each side spends per Lookup and per no-op,
//! which says where a round trip goes.
//! Run: `cargo bench -p ctcached --bench daemon_bench`. Each figure is also
//! printed as a `RESULT` line (`ctcache_testkit::Figure`) for bench/all.sh;
//! the Lookup and BatchLookup targets are issue #17's.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ctcache::pb;
use ctcache_api::v1 as api;
use ctcache_api::v1::compiled_tensor_cache_client::CompiledTensorCacheClient;
use ctcache_testkit::{Figure, On};
use prost::Message;
use support::*;
use tonic::transport::Channel;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// A model with `n` small FLOAT initializers (none selected by the policy).
fn many_initializers(n: usize) -> Vec<u8> {
    let initializer = (0..n)
        .map(|i| pb::TensorProto {
            name: format!("w{i}"),
            data_type: 1,
            dims: vec![16, 16],
            raw_data: Bytes::from(vec![(i % 251) as u8; 1024]),
            ..Default::default()
        })
        .collect();
    pb::ModelProto {
        ir_version: 9,
        graph: Some(pb::GraphProto {
            name: "many".into(),
            initializer,
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// Set in the copy of this bench that serves as the bare tonic server: its
/// socket path.
const BARE_SOCKET_ENV: &str = "CTCACHED_BENCH_BARE_HEALTH_SOCKET";

fn main() {
    if let Some(socket) = std::env::var_os(BARE_SOCKET_ENV) {
        return serve_bare_health(Path::new(&socket));
    }
    // The client calls one at a time from a current-thread runtime, as
    // ctcachectl does; Lookup is timed from a multi-thread one as well.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench());
}

/// grpc.health.v1 alone, served by tonic on a Unix socket from a
/// multi-thread runtime as the daemon's; runs until killed.
fn serve_bare_health(socket: &Path) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (_reporter, health) = tonic_health::server::health_reporter();
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await
            .unwrap();
    });
}

/// The bare server's process, killed when dropped.
struct BareServer(Child);

impl BareServer {
    fn start(socket: &Path) -> BareServer {
        let child = Command::new(std::env::current_exe().unwrap())
            .env(BARE_SOCKET_ENV, socket)
            .spawn()
            .unwrap();
        let t = Instant::now();
        while !socket.exists() {
            assert!(t.elapsed() < Duration::from_secs(10), "bare server not up");
            std::thread::sleep(Duration::from_millis(5));
        }
        BareServer(child)
    }
}

impl Drop for BareServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Calls of one kind timed back to back before the next kind's block.
/// Blocks of the three kinds alternate, so load on the machine hits all
/// alike, while each call follows one of its own kind on the same server:
/// timed one by one in turn, every Lookup followed the bare server's call,
/// the daemon's threads idle since, and paid waking them (printed too).
const BLOCK: usize = 100;

/// Latencies (sorted) of `calls` Lookups, no-op calls on the same connection
/// and no-op calls to the bare server, in alternating blocks of `block`.
async fn timed_calls(
    c: &mut CompiledTensorCacheClient<Channel>,
    health: &mut HealthClient<Channel>,
    bare: &mut HealthClient<Channel>,
    req: &api::LookupRequest,
    calls: usize,
    block: usize,
) -> [Vec<Duration>; 3] {
    let [mut lat, mut floor, mut bare_floor] = [(); 3].map(|_| Vec::with_capacity(calls));
    for _ in 0..calls / block {
        for _ in 0..block {
            let t = Instant::now();
            let r = c.lookup(req.clone()).await.unwrap().into_inner();
            lat.push(t.elapsed());
            assert_eq!(r.entries.len(), 2);
        }
        for (client, times) in [(&mut *health, &mut floor), (&mut *bare, &mut bare_floor)] {
            for _ in 0..block {
                let t = Instant::now();
                client.check(HealthCheckRequest::default()).await.unwrap();
                times.push(t.elapsed());
            }
        }
    }
    [lat, floor, bare_floor].map(|mut t| {
        t.sort();
        t
    })
}

/// Lookup latency p50/p99 from a client on the calling runtime, timed
/// beside the anchor (the no-op RPC on the same connection) and tonic's
/// floor (the bare health server), in blocks (see [`BLOCK`]); prints the
/// figures `{figure}_p50` (with `p50_target`, in µs, where given) and
/// `{figure}_p99` and returns the anchor's p50 in µs.
async fn lookup_latency(
    socket: &Path,
    bare_socket: &Path,
    req: &api::LookupRequest,
    client: &str,
    figure: &str,
    p50_target: Option<f64>,
) -> f64 {
    // One connection for the calls and the anchor's no-op calls.
    let ch = channel(socket).await;
    let mut c = CompiledTensorCacheClient::new(ch.clone());
    let mut health = HealthClient::new(ch);
    let mut bare = HealthClient::new(channel(bare_socket).await);
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    timed_calls(&mut c, &mut health, &mut bare, req, 600, BLOCK).await; // warm-up
    let [one_lat, one_floor, _] = timed_calls(&mut c, &mut health, &mut bare, req, 3000, 1).await;
    let [lat, floor, bare_floor] =
        timed_calls(&mut c, &mut health, &mut bare, req, 3000, BLOCK).await;
    let (p50, p99) = (us(percentile(&lat, 0.5)), us(percentile(&lat, 0.99)));
    let (f50, f99) = (us(percentile(&floor, 0.5)), us(percentile(&floor, 0.99)));
    println!(
        "Lookup over the Unix socket{client}: p50 {p50:.1} us, p99 {p99:.1} us ({} requests); \
         no-op RPC on the same socket: p50 {f50:.1} us, p99 {f99:.1} us",
        lat.len()
    );
    let (b50, b99) = (
        us(percentile(&bare_floor, 0.5)),
        us(percentile(&bare_floor, 0.99)),
    );
    println!(
        "The same no-op RPC from a bare tonic health server (no daemon layers){client}: \
         p50 {b50:.1} us, p99 {b99:.1} us; the daemon's edge adds {:.1} us at p50",
        f50 - b50
    );
    println!(
        "Timed one by one in turn{client} (each Lookup after the bare server's call): \
         Lookup p50 {:.1} us, no-op p50 {:.1} us",
        us(percentile(&one_lat, 0.5)),
        us(percentile(&one_floor, 0.5))
    );
    let mut p50_figure = Figure::new(
        &format!("{figure}_p50"),
        &format!("Lookup over the Unix socket{client}, p50"),
        p50,
        "µs",
    )
    .anchor(f50, f50 / p50);
    if let Some(bound) = p50_target {
        p50_figure = p50_figure.target(On::Value, "<=", bound);
    }
    p50_figure.print();
    Figure::new(
        &format!("{figure}_p99"),
        &format!("Lookup over the Unix socket{client}, p99"),
        p99,
        "µs",
    )
    .anchor(f99, f99 / p99)
    .print();
    f50
}

/// CPU time of every live thread of process `pid` ("self": this one), from
/// the scheduler's per-thread accounting (ns resolution).
fn cpu_time(pid: &str) -> Duration {
    let mut ns = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        // A thread that ended between the listing and the read counts 0.
        if let Ok(s) = std::fs::read_to_string(t.unwrap().path().join("schedstat")) {
            ns += s
                .split_whitespace()
                .next()
                .map_or(0, |v| v.parse().unwrap());
        }
    }
    Duration::from_nanos(ns)
}

/// Wall time, daemon CPU and client CPU per call (µs) over `n` calls made
/// one after another (`call` makes one).
async fn per_call<F: std::future::Future>(
    daemon_pid: &str,
    n: u32,
    call: impl Fn() -> F,
) -> [f64; 3] {
    let (d0, c0, t) = (cpu_time(daemon_pid), cpu_time("self"), Instant::now());
    for _ in 0..n {
        call().await;
    }
    let wall = t.elapsed();
    let us = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(n);
    [
        us(wall),
        us(cpu_time(daemon_pid) - d0),
        us(cpu_time("self") - c0),
    ]
}

/// Where a Lookup's round trip goes: wall time and the CPU time each side
/// spends per call, for Lookups and for no-op calls, each over a block of
/// back-to-back calls on one connection. One call at a time, a round trip
/// takes about the sum of both sides' CPU: each waits for the other.
async fn cpu_per_call(socket: &Path, daemon_pid: &str, req: &api::LookupRequest) {
    let ch = channel(socket).await;
    let (c, health) = (
        CompiledTensorCacheClient::new(ch.clone()),
        HealthClient::new(ch),
    );
    let n = 2000;
    let lookup = per_call(daemon_pid, n, || {
        let (mut c, req) = (c.clone(), req.clone());
        async move { c.lookup(req).await.unwrap() }
    })
    .await;
    let noop = per_call(daemon_pid, n, || {
        let mut h = health.clone();
        async move { h.check(HealthCheckRequest::default()).await.unwrap() }
    })
    .await;
    let show = |[wall, daemon, client]: [f64; 3]| {
        format!(
            "{wall:.1} us wall, CPU {daemon:.1} us in the daemon + {client:.1} us in the client"
        )
    };
    println!(
        "Per call, {n} back-to-back calls each: Lookup {}; no-op {}",
        show(lookup),
        show(noop)
    );
}

async fn bench() {
    let mut d = Daemon::start();
    let mut c = Conn::at(&d.socket).await;
    let work = tempfile::tempdir().unwrap();

    // Entries to look up: prepack one model.
    let model = work.path().join("m.onnx");
    write_model(&model, &matmul_model(1024, 1024, 1));
    prepack_all(&mut c, &model).await;
    let digest = digest_of(&model, "W");
    let req = api::LookupRequest {
        source_digest: Bytes::copy_from_slice(&digest),
        digest_algorithm: "blake3".into(),
        ..Default::default()
    };

    let bare_socket = work.path().join("bare.sock");
    let _bare = BareServer::start(&bare_socket);
    let sample = c.lookup(req.clone()).await.unwrap().into_inner();
    println!(
        "A full entry is {} bytes on the wire, its struct type {} of them",
        sample.entries[0].encoded_len(),
        sample.entries[0]
            .struct_type
            .as_ref()
            .map_or(0, |t| t.encoded_len())
    );
    // The target is for the client as ctcachectl runs it (one call at a
    // time on a current-thread runtime).
    let f50 = lookup_latency(
        &d.socket,
        &bare_socket,
        &req,
        "",
        "daemon.lookup",
        Some(100.0),
    )
    .await;
    let pid = d.child.as_ref().unwrap().id().to_string();
    cpu_per_call(&d.socket, &pid, &req).await;
    // The same calls from a multi-thread client runtime (its own thread and
    // connections): what a caller's runtime adds to each round trip.
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap()
                .block_on(lookup_latency(
                    &d.socket,
                    &bare_socket,
                    &req,
                    " (client on a multi-thread runtime)",
                    "daemon.lookup_mt",
                    None,
                ))
        })
        .join()
        .unwrap()
    });
    // No-op calls per second, for the batches' anchor.
    let noop_per_s = 1e6 / f50;

    // BatchLookup throughput, full entries and brief ones.
    for brief in [false, true] {
        let one = api::LookupRequest {
            brief,
            ..req.clone()
        };
        let batch = api::BatchLookupRequest {
            requests: vec![one; 1000],
        };
        let rounds = 20;
        let entries = std::cell::Cell::new(0);
        let [wall_us, daemon_us, client_us] = per_call(&pid, rounds, || {
            let (mut c, batch, entries) = (c.clone(), batch.clone(), &entries);
            async move {
                let r = c.batch_lookup(batch).await.unwrap().into_inner();
                assert_eq!(r.responses.len(), 1000);
                entries.set(
                    entries.get() + r.responses.iter().map(|x| x.entries.len()).sum::<usize>(),
                );
            }
        })
        .await;
        let per_s = 1000.0 * 1e6 / wall_us;
        println!(
            "BatchLookup{}: {per_s:.0} lookups/s, {:.0} entries/s (batches of 1000); CPU per \
             batch {:.1} ms in the daemon + {:.1} ms in the client",
            if brief { " brief" } else { "" },
            entries.get() as f64 * 1e6 / (wall_us * f64::from(rounds)),
            daemon_us / 1e3,
            client_us / 1e3,
        );
        let (name, label) = if brief {
            (
                "daemon.batch_brief",
                "BatchLookup of brief entries, batches of 1000",
            )
        } else {
            (
                "daemon.batch_full",
                "BatchLookup of full entries, batches of 1000",
            )
        };
        let figure =
            Figure::new(name, label, per_s, "lookups/s").anchor(noop_per_s, per_s / noop_per_s);
        if brief {
            figure.print();
        } else {
            figure.target(On::Value, ">=", 50_000.0).print();
        }
    }

    // ResolveModel with a warm memo.
    let many = work.path().join("many.onnx");
    write_model(&many, &many_initializers(300));
    // As users call it: the client library hands the model over each time.
    let lib = c.library().await;
    let opts = Default::default();
    let resolve = || lib.resolve_model(&many, &opts);
    resolve().await.unwrap(); // fills the memo
    let mut lat = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let r = resolve().await.unwrap();
        lat.push(t.elapsed());
        assert_eq!(r.tensors.len(), 300);
    }
    lat.sort();
    let p50 = percentile(&lat, 0.5);
    println!(
        "ResolveModel, 300 initializers, warm memo, handed over: p50 {:.2} ms, p99 {:.2} ms (target p50 < 5 ms: {})",
        p50.as_secs_f64() * 1e3,
        percentile(&lat, 0.99).as_secs_f64() * 1e3,
        if p50 < Duration::from_millis(5) { "met" } else { "NOT met" }
    );
    Figure::new(
        "daemon.resolve_p50",
        "ResolveModel of 300 initializers, warm memo, p50",
        p50.as_secs_f64() * 1e3,
        "ms",
    )
    .target(On::Value, "<", 5.0)
    .print();

    // Watched folder: landing -> all entries ready, minus packing time.
    let landed = d.models.join("watched.onnx");
    let bytes = matmul_model(1024, 1024, 2);
    let t = Instant::now();
    write_model(&landed, &bytes);
    let digest = digest_of(&landed, "W");
    let entries = loop {
        let r = c
            .lookup(api::LookupRequest {
                source_digest: Bytes::copy_from_slice(&digest),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        if r.entries.len() == 2 {
            break r.entries;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "watched model not packed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let total = t.elapsed();
    let packing: Duration = entries
        .iter()
        .map(|e| Duration::from_micros(e.pack_duration_us))
        .sum();
    let overhead = total.saturating_sub(packing);
    println!(
        "Watched model ready in {:.0} ms, of which packing {:.0} ms: overhead {:.0} ms (target < 1000 ms: {}; includes the {:.1} s stability wait)",
        total.as_secs_f64() * 1e3,
        packing.as_secs_f64() * 1e3,
        overhead.as_secs_f64() * 1e3,
        if overhead < Duration::from_secs(1) { "met" } else { "NOT met" },
        0.3
    );
    Figure::new(
        "daemon.watched_overhead",
        "model landing in a watched folder to all entries ready, minus packing",
        overhead.as_secs_f64() * 1e3,
        "ms",
    )
    .target(On::Value, "<", 1000.0)
    .print();
    assert_eq!(d.stop(), Some(0));
}
