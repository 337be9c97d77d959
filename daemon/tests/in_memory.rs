//! Materialize with `in_memory`: the answer is the model's bytes and the
//! payload ranges its new initializers read, each payload leased to the
//! caller; the daemon writes nothing anywhere. Those ranges are the bytes
//! a client writes for a file (its locations then in the data folder it
//! names); a request that names an output, a link mode or no in_memory is
//! refused; the leases count against the peer's `max_leases_per_uid`
//! (an attacker cannot use in-memory answers to hold more), and a refusal
//! part way leaves none of them behind.

mod support;

use std::path::{Path, PathBuf};

use ctcache::pb;
use ctcache_api::v1 as api;
use ctcache_api::v1::compiled_tensor_cache_client::CompiledTensorCacheClient;
use prost::Message;
use support::*;
use tonic::transport::Channel;
use tonic::Code;

type Client = CompiledTensorCacheClient<Channel>;

const K: usize = 256;
const N: usize = 128;

/// `Y = X @ W` then `Z = Y @ W2`: two weights, two payloads.
fn two_matmuls(seed: u32) -> Vec<u8> {
    let values = |s: u32| ctcache_testkit::xorshift(s.max(1)).map(ctcache_testkit::unit_f32);
    let mut m = ctcache_testkit::MatMul::new(K, N, values(seed)).proto();
    let g = m.graph.as_mut().unwrap();
    g.node
        .push(ctcache_testkit::node("MatMul", "second", &["Y", "W2"], "Z"));
    g.initializer.push(ctcache_testkit::f32_tensor_from(
        "W2",
        &[N as i64, N as i64],
        values(seed.wrapping_add(7)).take(N * N),
    ));
    m.encode_to_vec()
}

/// An in-memory Materialize of `model`, handed over as `h`.
fn in_memory(model: &Path, h: &ctcache_client::Handout) -> api::MaterializeRequest {
    api::MaterializeRequest {
        model_path: model.display().to_string(),
        handout: h.name().into(),
        in_memory: true,
        lease_ttl_ms: 60_000,
        ..Default::default()
    }
}

async fn active_leases(c: &mut Client) -> u64 {
    c.stats(api::StatsRequest {})
        .await
        .unwrap()
        .into_inner()
        .active_leases
}

/// The bytes of initializer `name` of the model written at `out`.
fn written_bytes(out: &Path, name: &str) -> Vec<u8> {
    let m = pb::ModelProto::decode(std::fs::read(out).unwrap().as_slice()).unwrap();
    let t = m
        .graph
        .unwrap()
        .initializer
        .into_iter()
        .find(|t| t.name == name)
        .unwrap();
    let get = |k: &str| {
        let e = t.external_data.iter().find(|e| e.key == k).unwrap();
        e.value.clone()
    };
    let file = std::fs::read(out.parent().unwrap().join(get("location"))).unwrap();
    let (off, len): (usize, usize) = (
        get("offset").parse().unwrap(),
        get("length").parse().unwrap(),
    );
    file[off..off + len].to_vec()
}

#[tokio::test]
async fn an_in_memory_materialize_writes_nothing_and_leases_what_it_reads() {
    let d = InProc::start();
    let model = d.path("work/m.onnx");
    write_model(&model, &two_matmuls(3));
    let mut c = d.client().await;
    let h = c.hand(&model).await;
    // The cache's own files (payloads, records, index) are not the answer's.
    let outside_cache = || {
        let mut all = ctcache_testkit::paths_under(&d.path(""));
        all.retain(|p| !p.starts_with(&d.cache));
        all
    };
    let before = outside_cache();
    let r = c
        .materialize(in_memory(&model, &h))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(outside_cache(), before, "nothing written outside the cache");
    assert!(r.output_path.is_empty() && r.data_dir.is_empty() && r.files.is_empty());
    assert_eq!(r.nodes_rewritten, 2);
    // Locations are relative to the store's payload folder.
    assert!(Path::new(&r.external_data_dir).starts_with(&d.cache));
    assert_eq!(r.model_bytes, r.model.len() as u64);
    let graph = pb::ModelProto::decode(r.model.as_ref())
        .unwrap()
        .graph
        .unwrap();
    assert_eq!(
        graph
            .node
            .iter()
            .filter(|n| n.op_type == "MatMulNBits")
            .count(),
        2
    );
    // One lease per payload, held by the caller; every tensor's key leased.
    assert_eq!(r.leases.len(), 2, "{:?}", r.leases);
    assert_eq!(active_leases(&mut c).await, 2);
    let leased: Vec<&str> = r
        .leases
        .iter()
        .map(|l| l.entry.as_ref().unwrap().key.as_str())
        .collect();
    assert!(!r.tensors.is_empty());
    // The same bytes the file materialize writes under the same names.
    let out = d.path("out/m4.onnx");
    let req = api::MaterializeRequest {
        model_path: model.display().to_string(),
        ..Default::default()
    };
    materialize_file(&d.socket, req, &out, Default::default())
        .await
        .unwrap();
    for t in &r.tensors {
        assert!(
            leased.contains(&t.key.as_str()),
            "{} reads an unleased {}",
            t.name,
            t.key
        );
        // Its location names the leased payload's file.
        let location = location_of(&graph, &t.name);
        let lease = r
            .leases
            .iter()
            .find(|l| l.entry.as_ref().unwrap().key == t.key);
        assert_eq!(
            Path::new(&r.external_data_dir).join(location),
            Path::new(&lease.unwrap().entry.as_ref().unwrap().payload_path)
        );
        let payload = read_all(&mut c, &t.key).await;
        let range = t.offset as usize..(t.offset + t.length) as usize;
        assert_eq!(
            payload[range],
            written_bytes(&out, &t.name)[..],
            "{}",
            t.name
        );
        let init = graph.initializer.iter().find(|i| i.name == t.name).unwrap();
        assert_eq!(init.data_type, t.data_type);
        assert_eq!(
            init.dims,
            t.dims.iter().map(|&d| d as i64).collect::<Vec<_>>()
        );
    }
    for l in &r.leases {
        c.release_lease(api::ReleaseLeaseRequest {
            lease_id: l.lease_id,
        })
        .await
        .unwrap();
    }
    assert_eq!(active_leases(&mut c).await, 0);
}

#[tokio::test]
async fn the_daemon_writes_no_file_for_a_caller() {
    let d = InProc::start();
    let model = d.path("work/m.onnx");
    write_model(&model, &matmul_model(K, N, 5));
    let mut c = d.client().await;
    let h = c.hand(&model).await;
    let with_output = api::MaterializeRequest {
        output_path: d.path("work/out.onnx").display().to_string(),
        ..in_memory(&model, &h)
    };
    let with_link = api::MaterializeRequest {
        link: api::LinkMode::Hard as i32,
        ..in_memory(&model, &h)
    };
    let with_copy = api::MaterializeRequest {
        copy: true,
        ..in_memory(&model, &h)
    };
    let to_a_file = api::MaterializeRequest {
        output_path: d.path("work/out.onnx").display().to_string(),
        in_memory: false,
        ..in_memory(&model, &h)
    };
    for req in [with_output, with_link, with_copy, to_a_file] {
        let e = c.materialize(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("writes no file"), "{e:?}");
    }
    assert!(!d.path("work/out.onnx").exists());
    // A hold lasts while a handout's connection is open: none, no hold.
    let unheld = api::MaterializeRequest {
        hold: true,
        handout: String::new(),
        ..in_memory(&model, &h)
    };
    let e = c.materialize(unheld).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("hold lasts while a handout"), "{e:?}");
    for folder in ["..", "a/b", "/tmp", "."] {
        let req = api::MaterializeRequest {
            data_folder: folder.into(),
            ..in_memory(&model, &h)
        };
        let e = c.materialize(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{folder}: {e:?}");
    }
    assert_eq!(active_leases(&mut c).await, 0);
}

/// The external-data location of initializer `name`.
fn location_of<'g>(graph: &'g pb::GraphProto, name: &str) -> &'g str {
    let init = graph.initializer.iter().find(|i| i.name == name).unwrap();
    let location = init.external_data.iter().find(|e| e.key == "location");
    &location.unwrap().value
}

/// For a file its caller writes, the model's locations are in its data
/// folder and the answer names the entry behind each file there.
#[tokio::test]
async fn an_answer_for_a_file_names_its_data_folder() {
    let d = InProc::start();
    let model = d.path("work/m.onnx");
    write_model(&model, &matmul_model(K, N, 6));
    let mut c = d.client().await;
    let h = c.hand(&model).await;
    let req = api::MaterializeRequest {
        data_folder: "m4.onnx.weights".into(),
        ..in_memory(&model, &h)
    };
    let r = c.materialize(req).await.unwrap().into_inner();
    let graph = pb::ModelProto::decode(r.model.as_ref())
        .unwrap()
        .graph
        .unwrap();
    let names: Vec<&str> = r.payload_files.iter().map(|f| f.name.as_str()).collect();
    assert!(!names.is_empty(), "{r:?}");
    for t in &r.tensors {
        let location = location_of(&graph, &t.name);
        let file = location.strip_prefix("m4.onnx.weights/").unwrap();
        let named = r.payload_files.iter().find(|f| f.name == file).unwrap();
        assert_eq!(named.key, t.key);
        let e = r
            .leases
            .iter()
            .find_map(|l| l.entry.as_ref().filter(|e| e.key == t.key));
        assert_eq!(file, format!("{}.bin", e.unwrap().payload_blake3));
    }
}

/// The attacker half: an in-memory materialize of a two-payload model
/// when one lease is all it may hold.
#[tokio::test]
async fn lease_bound_helper() {
    let Some(socket) = std::env::var_os("CT_TEST_SOCKET").map(PathBuf::from) else {
        return;
    };
    let model = PathBuf::from(std::env::var("CT_TEST_MODEL").unwrap());
    let mut c = Conn::at(&socket).await;
    let h = c.hand(&model).await;
    let e = c.materialize(in_memory(&model, &h)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    println!("REFUSED");
}

#[tokio::test]
async fn in_memory_leases_count_against_the_peers_bound() {
    if !uid_switch_or_skip() {
        return;
    }
    let mut d = daemon_for_nobody("max_leases_per_uid = 1\n");
    let dir = d.path("models");
    std::fs::create_dir_all(&dir).unwrap();
    open_to_all(&dir);
    let model = dir.join("m.onnx");
    write_model(&model, &two_matmuls(9));
    open_to_all(&model);
    run_as_nobody(
        &d,
        "lease_bound_helper",
        &[
            ("CT_TEST_SOCKET", d.socket.as_os_str()),
            ("CT_TEST_MODEL", model.as_os_str()),
        ],
        "REFUSED",
    );
    let mut c = d.client().await;
    assert_eq!(
        active_leases(&mut c).await,
        0,
        "the lease granted first is released"
    );
    d.stop();
}

#[tokio::test]
async fn a_model_too_large_for_one_answer_is_refused_with_no_lease_left() {
    let d = InProc::start_with(|c| c.max_message_bytes = (1 << 20) + 4096);
    let model = d.path("work/m.onnx");
    // A 64 KiB tensor the rewrite keeps inline: the model is over 4 KiB.
    let mut m = ctcache_testkit::MatMul::new(K, N, std::iter::repeat(0.5)).proto();
    let g = m.graph.as_mut().unwrap();
    g.node
        .push(ctcache_testkit::node("Add", "bias", &["Y", "C"], "Z"));
    g.initializer.push(ctcache_testkit::f32_tensor_from(
        "C",
        &[16, 1024],
        std::iter::repeat_n(0.25, 16 * 1024),
    ));
    write_model(&model, &m.encode_to_vec());
    let mut c = d.client().await;
    let h = c.hand(&model).await;
    let e = c.materialize(in_memory(&model, &h)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("raise the daemon's"), "{e:?}");
    assert_eq!(active_leases(&mut c).await, 0);
}

/// The session half of `sessions_hold_one_lease_each_until_their_client_goes`:
/// as uid 65534, `CT_TEST_SESSIONS` in-memory Materializes of a two-payload
/// model, each holding both payloads with one lease for as long as its
/// handout lives; says `HELD n`, then waits to be killed.
#[tokio::test]
async fn sessions_helper() {
    let Some(socket) = std::env::var_os("CT_TEST_SESSIONS_SOCKET").map(PathBuf::from) else {
        return;
    };
    let model = PathBuf::from(std::env::var("CT_TEST_MODEL").unwrap());
    let n: usize = std::env::var("CT_TEST_SESSIONS").unwrap().parse().unwrap();
    // A thousand sessions hold a thousand sockets.
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: both calls get a valid pointer to an rlimit of this process.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
    let mut c = Conn::at(&socket).await;
    let mut sessions = Vec::with_capacity(n);
    for _ in 0..n {
        let h = c.hand(&model).await;
        let req = api::MaterializeRequest {
            hold: true,
            ..in_memory(&model, &h)
        };
        let r = c.materialize(req).await.unwrap().into_inner();
        let ids: std::collections::BTreeSet<u64> = r.leases.iter().map(|l| l.lease_id).collect();
        assert!(r.held && ids.len() == 1 && r.leases.len() == 2, "{r:?}");
        sessions.push(h);
    }
    println!("HELD {n}");
    std::io::Write::flush(&mut std::io::stdout()).unwrap();
    let _ = std::io::stdin().read_line(&mut String::new());
}

/// A session's payloads are one lease (a hold): a service holding 1,000
/// sessions of one model stays under `max_leases_per_uid` (1,024), and
/// each hold ends when the connection of its client closes: the client is
/// killed with SIGKILL and the test waits on the holds' end events.
#[test]
fn sessions_hold_one_lease_each_until_their_client_goes() {
    if !uid_switch_or_skip() {
        return;
    }
    const SESSIONS: usize = 1000;
    let mut d = daemon_for_nobody("");
    let dir = d.path("models");
    std::fs::create_dir_all(&dir).unwrap();
    open_to_all(&dir);
    let model = dir.join("m.onnx");
    write_model(&model, &two_matmuls(11));
    open_to_all(&model);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut c = rt.block_on(d.client());
    let mut events = rt.block_on(follow_events(&c));
    let mut client = helper_as(NOBODY, "sessions_helper")
        .env("CT_TEST_SESSIONS_SOCKET", &d.socket)
        .env("CT_TEST_MODEL", &model)
        .env("CT_TEST_SESSIONS", SESSIONS.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = std::io::BufReader::new(client.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains(&format!("HELD {SESSIONS}")) {
        line.clear();
        let n = std::io::BufRead::read_line(&mut said, &mut line).unwrap();
        assert!(n > 0, "the client stopped before holding its sessions");
    }
    assert_eq!(rt.block_on(active_leases(&mut c)), SESSIONS as u64);
    let held = usage(d.child.as_ref().unwrap().id());
    assert!(
        held.peak_kib < 512 << 10,
        "the daemon holds 1,000 sessions in {} KiB at its peak",
        held.peak_kib
    );
    client.kill().unwrap();
    client.wait().unwrap();
    let mut ended = 0;
    while ended < SESSIONS {
        let e = rt.block_on(next_event(&mut events, 60, "the end of a session's hold"));
        if e.kind == "lease_ended" {
            assert_eq!(e.model_path, model.display().to_string(), "{e:?}");
            ended += 1;
        }
    }
    assert_eq!(rt.block_on(active_leases(&mut c)), 0);
    d.stop();
}

/// A Materialize that packs tells its progress on the event feed: one
/// `job_progress` event about the model per job as it finishes (`done` of
/// `total`), so a client can show a bar while a cold materialize packs; a
/// warm one reports its jobs as cached.
#[tokio::test]
async fn a_materialize_publishes_its_jobs_progress() {
    let d = InProc::start();
    let model = d.path("work/m.onnx");
    write_model(&model, &two_matmuls(17));
    let path = model.display().to_string();
    let mut c = d.client().await;
    for (round, phase) in [(0, "done"), (1, "cached")] {
        let mut events = follow_events(&c).await;
        let h = c.hand(&model).await;
        c.materialize(in_memory(&model, &h)).await.unwrap();
        let mut seen = Vec::new();
        while seen.len() < 2 {
            let e = next_event(&mut events, 60, "the materialize's job events").await;
            if e.kind == "job_progress" && e.model_path == path {
                let p = e.progress.unwrap();
                seen.push((e.detail, p.done, p.total, p.initializer));
            }
        }
        assert_eq!(
            seen.iter()
                .map(|s| (s.0.as_str(), s.1, s.2))
                .collect::<Vec<_>>(),
            [(phase, 1, 2), (phase, 2, 2)],
            "round {round}: {seen:?}"
        );
        let mut names: Vec<&str> = seen.iter().map(|s| s.3.as_str()).collect();
        names.sort();
        assert_eq!(names, ["W", "W2"], "round {round}");
    }
}
