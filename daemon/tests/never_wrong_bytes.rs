//! "Never the wrong bytes" through the daemon's RPCs: an entry of other
//! parameters (8 bits) never answers a 4-bit request; a known type name
//! over another layout is `unknown_physical_type` for ResolveModel and
//! Import; a payload that rots on disk is never materialized and is packed
//! again as soon as serving finds it (never from a model the caller being
//! served may not read); with `daemon_produced_only`, a client's entry is
//! neither reused by a pack job nor handed out; a Lookup answer (made
//! from encodings the daemon keeps) is never older than the stored entry;
//! bytes that rot after their first serve are found on the next one.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ctcache::pb;
use ctcache_api::v1 as api;
use ctcache_api::v1::compiled_tensor_cache_client::CompiledTensorCacheClient;
use ctcache_kernels::Params;
use prost::Message;
use support::*;
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::Code;

const K: usize = 512;
const N: usize = 256;
const NBITS: &str = "ort.matmul_nbits";
const GEMM: &str = "gemm.pack_b.f32";

type Client = CompiledTensorCacheClient<Channel>;

fn format(id: &str, params: &[(&str, &str)]) -> api::FormatSpec {
    api::FormatSpec {
        id: id.into(),
        params: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// The ResolveModel of `model` for `formats` (empty: the policy), packing
/// nothing.
async fn resolve(
    c: &mut Conn,
    model: &Path,
    formats: Vec<api::FormatSpec>,
) -> api::TensorResolution {
    let h = c.hand(model).await;
    let mut r = c
        .resolve_model(api::ResolveModelRequest {
            model_path: model.display().to_string(),
            handout: h.name().into(),
            formats,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.tensors.len(), 1, "{r:?}");
    r.tensors.remove(0)
}

/// A MatMul model written to `work/NAME` (outside the watched folders: the
/// watcher does not pack it) and the digest of its weight `W`.
fn work_model(d: &InProc, name: &str, seed: u32) -> (PathBuf, Vec<u8>) {
    let model = d.path(&format!("work/{name}"));
    write_model(&model, &matmul_model(K, N, seed));
    let digest = digest_of(&model, "W");
    (model, digest)
}

/// Materializes `model` (4 bits) into `out`, as a client does.
async fn materialize(d: &InProc, model: &Path, out: &Path) -> api::MaterializeResponse {
    let req = api::MaterializeRequest {
        model_path: model.display().to_string(),
        ..Default::default()
    };
    materialize_file(&d.socket, req, out, Default::default())
        .await
        .unwrap()
}

/// The payload files a materialized model references: (name, bytes).
fn weight_files(m: &api::MaterializeResponse) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(&m.data_dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).unwrap())
        })
        .collect();
    files.sort();
    files
}

/// Every weight file holds the bytes its name (blake3 hex) says and is
/// the payload of one of `entries`.
fn weights_are(m: &api::MaterializeResponse, entries: &[api::Entry]) {
    let files = weight_files(m);
    assert!(!files.is_empty(), "{m:?}");
    for (name, bytes) in files {
        let hash = blake3::hash(&bytes).to_hex().to_string();
        assert_eq!(name, format!("{hash}.bin"), "the bytes of {name}");
        assert!(
            entries.iter().any(|e| e.payload_blake3 == hash),
            "{name} is none of {entries:?}"
        );
    }
}

/// The Put header of `W`'s entry as `packer` writes it with `params`, with
/// `tamper` applied to its type.
fn header_for(
    digest: &[u8],
    packer: &str,
    params: &[&str],
    tamper: impl FnOnce(&mut pb::StructTypeProto),
) -> api::PutHeader {
    let p = ctcache_kernels::find(packer).unwrap();
    let params = Params::parse(params).unwrap();
    let float = ctcache::dtype::DataType::from_i32(1).unwrap();
    let dims = [K as u64, N as u64];
    let layout = p.output(float, &dims, &params).unwrap();
    let mut ty = layout.struct_type;
    tamper(&mut ty);
    api::PutHeader {
        source_digest: bytes::Bytes::copy_from_slice(digest),
        digest_algorithm: "blake3".into(),
        struct_type: Some(ty.into()),
        dims: layout.dims,
        device: Some(p.device(&params).unwrap()),
        payload_len: layout.payload_len,
        source_name: "W".into(),
        model_path: String::new(),
        source_data_type: 1,
        source_dims: dims.to_vec(),
    }
}

/// Puts a payload of `fill` bytes under `h` (as a client: the test runs as
/// root, a trusted caller); returns the stored entry.
async fn put(c: &mut Client, h: api::PutHeader, fill: u8) -> api::Entry {
    let data = vec![fill; h.payload_len as usize];
    let msgs = put_messages(h, data);
    let r = c.put(tokio_stream::iter(msgs)).await.unwrap().into_inner();
    r.entry.unwrap()
}

/// The fields of a structure type.
fn fields(t: &mut pb::StructTypeProto) -> &mut Vec<pb::struct_type_proto::Field> {
    match t.kind.as_mut() {
        Some(pb::struct_type_proto::Kind::Structure(s)) => &mut s.field,
        other => panic!("a structure, not {other:?}"),
    }
}

/// Puts zero-filled entries of `W` in both default formats, as a client.
async fn put_both(c: &mut Client, digest: &[u8]) -> HashMap<&'static str, api::Entry> {
    let mut keys = HashMap::new();
    for f in [NBITS, GEMM] {
        let e = put(c, header_for(digest, f, &[], |_| {}), 0).await;
        assert!(e.producer.starts_with("uid:"), "{e:?}");
        keys.insert(f, e);
    }
    keys
}

fn reasons(t: &api::TensorResolution) -> Vec<&str> {
    t.misses.iter().map(|m| m.reason.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_8_bit_entry_never_answers_a_4_bit_request() {
    let mut d = InProc::start();
    let mut c = d.client().await;
    let (model, digest) = work_model(&d, "m.onnx", 21);
    let h = c.hand(&model).await;
    let mut s = c
        .prepack(api::PrepackRequest {
            model_path: model.display().to_string(),
            handout: h.name().into(),
            formats: vec![format(NBITS, &[("bits", "8")])],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    while let Some(p) = s.next().await {
        let p = p.unwrap();
        assert_ne!(p.state(), api::JobState::Failed, "{p:?}");
    }
    let b8 = entries_for(&mut c, &digest).await;
    assert_eq!(b8.len(), 1);
    assert_eq!(b8[0].physical_type, "ort.matmul_nbits.b8.bs32.sym");

    // ResolveModel: the 4-bit format is missing, nothing else stands in.
    let t = resolve(&mut c, &model, vec![format(NBITS, &[("bits", "4")])]).await;
    assert_eq!(reasons(&t), ["no_entry"], "{t:?}");
    let t = resolve(&mut c, &model, vec![format(NBITS, &[("bits", "8")])]).await;
    assert!(t.misses.is_empty(), "{t:?}");

    // Lookup of the 4-bit type: a miss.
    let mut want_b4 = lookup_req(&digest);
    want_b4.accepted = vec![api::AcceptedType {
        name: "ort.matmul_nbits.b4.bs32.sym".into(),
        versions: vec![],
    }];
    let r = c.lookup(want_b4.clone()).await.unwrap().into_inner();
    assert!(r.entries.is_empty(), "{r:?}");
    assert!(r.miss.is_some(), "{r:?}");

    // Materialize (4 bits): packs its own entry, links only its bytes.
    let m = materialize(&d, &model, &d.path("work/out/m.q.onnx")).await;
    assert_eq!((m.bits, m.packed, m.cached), (4, 1, 0), "{m:?}");
    let b4 = c.lookup(want_b4).await.unwrap().into_inner().entries;
    assert_eq!(b4.len(), 1);
    weights_are(&m, &b4);
    assert!(weight_files(&m)
        .iter()
        .all(|(name, _)| !name.starts_with(&b8[0].payload_blake3)));
    assert_eq!(d.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_name_over_another_layout_is_unknown_to_resolve_and_import() {
    let mut d = InProc::start();
    let mut c = d.client().await;
    let (model, digest) = work_model(&d, "m.onnx", 22);

    // Same name, same size, fields in another order: stored (the type is
    // valid), never a hit.
    let reordered = header_for(&digest, NBITS, &[], |t| fields(t).swap(0, 1));
    let name = reordered
        .struct_type
        .as_ref()
        .unwrap()
        .decode()
        .unwrap()
        .name;
    assert_eq!(name, "ort.matmul_nbits.b4.bs32.sym");
    let stored = put(&mut c, reordered, 0x11).await;
    assert_eq!(stored.physical_type, name);
    let t = resolve(&mut c, &model, vec![format(NBITS, &[])]).await;
    assert!(t.entries.is_empty(), "{t:?}");
    assert_eq!(reasons(&t), ["unknown_physical_type"], "{t:?}");
    // Renamed field: the same.
    let renamed = header_for(&digest, NBITS, &[], |t| fields(t)[0].name = "codes".into());
    put(&mut c, renamed, 0x22).await;
    let t = resolve(&mut c, &model, vec![format(NBITS, &[])]).await;
    assert!(t.entries.is_empty(), "{t:?}");
    assert_eq!(reasons(&t), ["unknown_physical_type"], "{t:?}");
    // Another format's miss is not explained by these entries.
    let t = resolve(&mut c, &model, vec![format(GEMM, &[])]).await;
    assert_eq!(reasons(&t), ["no_entry"], "{t:?}");

    // Import: a model whose embedded types were reordered the same way.
    let embedded = d.path("work/e.onnx");
    let e = c
        .library()
        .await
        .embed(api::EmbedRequest {
            model_path: model.display().to_string(),
            output_path: embedded.display().to_string(),
            formats: vec![format(NBITS, &[])],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(e.entries, 1, "{e:?}");
    let mut proto = pb::ModelProto::decode(std::fs::read(&embedded).unwrap().as_slice()).unwrap();
    let inline = proto
        .compiled_tensors
        .iter_mut()
        .filter_map(|c| c.value.as_mut().and_then(|v| v.struct_type.as_mut()));
    let types: Vec<_> = proto.struct_types.iter_mut().chain(inline).collect();
    assert!(!types.is_empty());
    for t in types {
        fields(t).swap(0, 1);
    }
    let tampered = d.path("work/tampered.onnx");
    std::fs::write(&tampered, proto.encode_to_vec()).unwrap();
    let mut fresh = InProc::start();
    let mut fc = fresh.client().await;
    let imp = import(&mut fc, &tampered).await;
    assert_eq!(imp.imported + imp.already_present, 0, "{imp:?}");
    let skipped: Vec<_> = imp
        .skipped
        .iter()
        .map(|s| s.reason.as_ref().unwrap().reason.as_str())
        .collect();
    assert_eq!(skipped, ["unknown_physical_type"], "{imp:?}");
    // The untampered model imports.
    let imp = import(&mut fc, &embedded).await;
    assert_eq!(imp.imported, 1, "{imp:?}");
    assert_eq!(fresh.stop(), Some(0));
    assert_eq!(d.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotted_payload_is_never_materialized_and_comes_back_when_asked() {
    // Outside the watched folders: the watcher does not pack it, and the
    // model is read with the caller's rights.
    let mut d = InProc::start();
    let mut c = d.client().await;
    let (model, digest) = work_model(&d, "m.onnx", 23);
    let first = materialize(&d, &model, &d.path("work/a/m.q.onnx")).await;
    assert_eq!(first.packed, 1, "{first:?}");
    let packed = entries_for(&mut c, &digest).await;
    assert_eq!(packed.len(), 1);
    weights_are(&first, &packed);
    drop(c);
    assert_eq!(d.stop(), Some(0));

    // One byte flipped, same length; a restart forgets what was hashed.
    rot_payload(&packed[0].payload_path);
    assert!(!intact(&packed[0]));
    d.restart();
    let mut c = d.client().await;
    let again = materialize(&d, &model, &d.path("work/b/m.q.onnx")).await;
    assert_eq!((again.packed, again.cached), (1, 0), "{again:?}");
    let fresh = entries_for(&mut c, &digest).await;
    assert_eq!(fresh.len(), 1);
    assert!(intact(&fresh[0]), "{fresh:?}");
    weights_are(&again, &fresh);
    let v = c
        .verify(api::VerifyRequest { repair: false })
        .await
        .unwrap()
        .into_inner();
    assert!(v.clean && v.orphans.is_empty(), "{v:?}");
    drop(c);
    assert_eq!(d.stop(), Some(0));

    // Rot found by a read: DATA_LOSS, and the entry comes back at the next
    // request that hands its model over (the model is the caller's: the
    // daemon opens no path to pack it again by itself).
    rot_payload(&fresh[0].payload_path);
    d.restart();
    let mut c = d.client().await;
    let read = lease_refused(&mut c, &fresh[0].key).await;
    assert_eq!(read.code(), Code::DataLoss, "{read:?}");
    let third = materialize(&d, &model, &d.path("work/c/m.q.onnx")).await;
    assert_eq!((third.packed, third.cached), (1, 0), "{third:?}");
    let back = entries_for(&mut c, &digest).await;
    assert!(intact(&back[0]), "{back:?}");
    assert_eq!(back[0].key, fresh[0].key);
    assert_eq!(
        read_all(&mut c, &back[0].key).await.len() as u64,
        back[0].payload_len
    );
    let v = c
        .verify(api::VerifyRequest { repair: false })
        .await
        .unwrap()
        .into_inner();
    assert!(v.clean && v.orphans.is_empty(), "{v:?}");
    assert_eq!(d.stop(), Some(0));
}

/// A rotted entry of a model in the admin's watched folder comes back by
/// itself: the daemon packs it again from that model, which it reads with
/// its own rights (a caller's model it never opens by itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotted_entry_of_an_admin_watched_model_comes_back_by_itself() {
    let mut d = InProc::start();
    let mut c = d.client().await;
    let model = d.models.join("m.onnx");
    write_model(&model, &matmul_model(K, N, 41));
    let digest = digest_of(&model, "W");
    let packed = wait_for_entries(&c, &digest, 2, "the watcher packed it").await;
    let rotted = &packed[0];
    rot_payload(&rotted.payload_path);
    let read = lease_refused(&mut c, &rotted.key).await;
    assert_eq!(read.code(), Code::DataLoss, "{read:?}");
    let back = eventually(std::time::Duration::from_secs(60), || {
        let mut c = c.clone();
        let (digest, key) = (digest.clone(), rotted.key.clone());
        async move {
            let e = entries_for(&mut c, &digest).await;
            e.into_iter().find(|e| e.key == key && intact(e))
        }
    })
    .await
    .expect("packed again within 60 s");
    assert_eq!(
        read_all(&mut c, &back.key).await.len() as u64,
        back.payload_len
    );
    assert_eq!(d.stop(), Some(0));
}

/// Whether streaming `key`'s payload ends in DATA_LOSS.
async fn read_fails_with_data_loss(c: &mut Client, key: &str) -> bool {
    let mut chunks = match c
        .read_payload(api::ReadPayloadRequest {
            key: key.to_string(),
            ..Default::default()
        })
        .await
    {
        Ok(s) => s.into_inner(),
        Err(e) => return e.code() == Code::DataLoss,
    };
    while let Some(ch) = chunks.next().await {
        if let Err(e) = ch {
            return e.code() == Code::DataLoss;
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_rot_after_their_first_serve_are_never_served() {
    // D12: a payload served once in this run and then damaged on disk is
    // checked again on its next serve, by every path, without a restart.
    let mut d = InProc::start();
    let mut c = d.client().await;
    let (model, digest) = work_model(&d, "m.onnx", 31);
    let first = materialize(&d, &model, &d.path("work/a/m.q.onnx")).await;
    assert_eq!(first.packed, 1, "{first:?}");
    let packed = entries_for(&mut c, &digest).await;
    weights_are(&first, &packed);
    assert_eq!(
        read_all(&mut c, &packed[0].key).await.len() as u64,
        packed[0].payload_len
    );

    // Materialize (the prepack under it finds the damage and packs again:
    // never CACHED over a rotted file), and the output holds good bytes.
    rot_payload(&packed[0].payload_path);
    let again = materialize(&d, &model, &d.path("work/b/m.q.onnx")).await;
    assert_eq!((again.packed, again.cached), (1, 0), "{again:?}");
    let fresh = entries_for(&mut c, &digest).await;
    assert!(intact(&fresh[0]), "{fresh:?}");
    weights_are(&again, &fresh);

    // ReadPayload and AcquireLease of a payload damaged after a serve.
    assert_eq!(
        read_all(&mut c, &fresh[0].key).await.len() as u64,
        fresh[0].payload_len
    );
    rot_payload(&fresh[0].payload_path);
    assert!(read_fails_with_data_loss(&mut c, &fresh[0].key).await);
    let third = materialize(&d, &model, &d.path("work/c/m.q.onnx")).await;
    assert_eq!((third.packed, third.cached), (1, 0), "{third:?}");
    let back = entries_for(&mut c, &digest).await;
    assert_eq!(back.len(), 1);
    assert!(intact(&back[0]), "{back:?}");
    c.acquire_lease(api::AcquireLeaseRequest {
        key: back[0].key.clone(),
        ttl_ms: 60_000,
    })
    .await
    .unwrap();
    rot_payload(&back[0].payload_path);
    let refused = lease_refused(&mut c, &back[0].key).await;
    assert_eq!(refused.code(), Code::DataLoss, "{refused:?}");
    drop(c);
    assert_eq!(d.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_daemon_produced_only_a_clients_entry_is_never_used() {
    let mut d = InProc::start_with(|c| c.daemon_produced_only = true);
    let mut c = d.client().await;
    let zeros = |len: u64| blake3::hash(&vec![0u8; len as usize]).to_hex().to_string();

    // A prepack packs the daemon's own entries over the client's.
    let (m1, d1) = work_model(&d, "m1.onnx", 24);
    let theirs = put_both(&mut c, &d1).await;
    for p in prepack_all(&mut c, &m1).await {
        if p.state().is_final() {
            assert_eq!(p.state(), api::JobState::Done, "{p:?}");
        }
    }
    let ours = entries_for(&mut c, &d1).await;
    assert_eq!(ours.len(), 2);
    for e in &ours {
        assert!(!e.producer.starts_with("uid:"), "{e:?}");
        assert!(theirs.values().any(|t| t.key == e.key), "{e:?}");
        assert_ne!(e.payload_blake3, zeros(e.payload_len));
    }

    // ResolveModel names the client's entries as misses; Materialize and
    // Embed pack their own.
    let (m2, d2) = work_model(&d, "m2.onnx", 25);
    put_both(&mut c, &d2).await;
    let t = resolve(&mut c, &m2, vec![]).await;
    assert!(t.entries.is_empty(), "{t:?}");
    assert_eq!(
        reasons(&t),
        ["not_daemon_produced", "not_daemon_produced"],
        "{t:?}"
    );
    let miss = c.lookup(lookup_req(&d2)).await.unwrap().into_inner();
    assert_eq!(miss.miss.unwrap().reason, "not_daemon_produced");
    let m = materialize(&d, &m2, &d.path("work/out/m2.q.onnx")).await;
    assert_eq!((m.packed, m.cached), (1, 0), "{m:?}");
    let e = c
        .library()
        .await
        .embed(api::EmbedRequest {
            model_path: m2.display().to_string(),
            output_path: d.path("work/out/m2.e.onnx").display().to_string(),
            formats: vec![format(GEMM, &[])],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!((e.entries, e.packed), (1, 1), "{e:?}");
    let ours = entries_for(&mut c, &d2).await;
    assert_eq!(ours.len(), 2);
    for e in &ours {
        assert!(!e.producer.starts_with("uid:"), "{e:?}");
        assert_ne!(e.payload_blake3, zeros(e.payload_len));
    }
    weights_are(&m, &ours);
    let embedded = ctcache::onnx::Model::open(d.path("work/out/m2.e.onnx")).unwrap();
    let ext = embedded.extension().unwrap();
    assert_eq!(ext.compiled_tensors.len(), 1);
    let value = ext.compiled_tensors[0].value.as_ref().unwrap();
    let bytes = ctcache::check::payload_bytes(&embedded, value).unwrap();
    let gemm = ours
        .iter()
        .find(|e| e.physical_type.starts_with(GEMM))
        .unwrap();
    assert_eq!(
        blake3::hash(&bytes).to_hex().to_string(),
        gemm.payload_blake3
    );
    drop(c);
    assert_eq!(d.stop(), Some(0));
}

/// The uid-65534 half of `a_repack_never_reads_what_the_served_caller_cannot`
/// (a no-op otherwise): leases the rotted entry, gets DATA_LOSS.
#[tokio::test]
async fn rotted_lease_helper() {
    let Ok(socket) = std::env::var("CTCACHE_TEST_ROT_SOCKET") else {
        return;
    };
    let key = std::env::var("CTCACHE_TEST_ROT_KEY").unwrap();
    let mut c = Client::new(channel(Path::new(&socket)).await);
    let err = lease_refused(&mut c, &key).await;
    assert_eq!(err.code(), Code::DataLoss, "{err:?}");
    println!("ROT-SEEN-OK");
}

#[test]
fn a_repack_never_reads_what_the_served_caller_cannot() {
    if !uid_switch_or_skip() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut d = daemon_for_nobody("");
    // Packed for root from a folder only root may read (not a watched one).
    let private = d.path("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let model = private.join("m.onnx");
    write_model(&model, &matmul_model(K, N, 26));
    let digest = digest_of(&model, "W");
    let packed = rt.block_on(async {
        let mut c = d.client().await;
        prepack_all(&mut c, &model).await;
        entries_for(&mut c, &digest).await
    });
    assert_eq!(packed.len(), 2);
    assert_eq!(d.stop(), Some(0));
    rot_payload(&packed[0].payload_path);
    d.spawn(&[], |c| {
        c.env("CTCACHE_SOCKET_GROUP", NOBODY.to_string());
    });

    // Served to uid 65534, which may not read the model: DATA_LOSS, and
    // the daemon does not read it on that uid's behalf.
    run_as_nobody(
        &d,
        "rotted_lease_helper",
        &[
            ("CTCACHE_TEST_ROT_SOCKET", d.socket.display().to_string()),
            ("CTCACHE_TEST_ROT_KEY", packed[0].key.clone()),
        ],
        "ROT-SEEN-OK",
    );
    ctcache_testkit::eventually("the daemon's word on the repack", || {
        d.log().contains("rotted: not packed again")
    });
    let left = rt.block_on(async {
        let mut c = d.client().await;
        entries_for(&mut c, &digest).await
    });
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].key, packed[1].key);
    assert_eq!(d.stop(), Some(0));
}

/// Lookup and BatchLookup answers, full and brief, as a client decodes
/// them.
async fn answers(c: &mut Client, digest: &[u8]) -> Vec<Vec<api::Entry>> {
    let mut out = Vec::new();
    for brief in [false, true] {
        let req = api::LookupRequest {
            brief,
            ..lookup_req(digest)
        };
        out.push(c.lookup(req.clone()).await.unwrap().into_inner().entries);
        let batch = c
            .batch_lookup(api::BatchLookupRequest {
                requests: vec![req.clone(), req],
            })
            .await
            .unwrap()
            .into_inner();
        out.extend(batch.responses.into_iter().map(|r| r.entries));
    }
    out
}

/// The daemon answers hits with encodings it keeps beside the cached entry:
/// an answer is never older than the entry. A put that adds a source name
/// shows in the next answers; after gc removed the entry there is none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_answers_follow_the_stored_entry() {
    let mut d = InProc::start();
    let mut c = d.client().await;
    let digest = blake3::hash(b"answers follow the entry")
        .as_bytes()
        .to_vec();
    let stored = put(&mut c, header_for(&digest, NBITS, &[], |_| {}), 3).await;
    let first = answers(&mut c, &digest).await;
    for (i, a) in first.iter().enumerate() {
        assert_eq!(a.len(), 1, "answer {i}: {a:?}");
        let e = &a[0];
        assert_eq!(
            (&e.key, &e.payload_blake3, &e.payload_path, &e.dims),
            (
                &stored.key,
                &stored.payload_blake3,
                &stored.payload_path,
                &stored.dims
            )
        );
        let full = i < 3;
        assert_eq!(e.struct_type.is_some(), full, "answer {i}");
        assert_eq!(e.device, if full { stored.device.clone() } else { None });
        assert_eq!(
            e.source_names,
            if full { vec!["W".to_string()] } else { vec![] }
        );
    }

    let mut h = header_for(&digest, NBITS, &[], |_| {});
    h.source_name = "W2".into();
    put(&mut c, h, 3).await;
    for (i, a) in answers(&mut c, &digest).await.iter().enumerate() {
        let want: &[&str] = if i < 3 { &["W", "W2"] } else { &[] };
        assert_eq!(a[0].source_names, want, "answer {i}");
        assert_eq!(a[0].key, stored.key);
    }

    c.gc(api::GcRequest {
        max_bytes: 0,
        has_max_bytes: true,
        ..Default::default()
    })
    .await
    .unwrap();
    for (i, a) in answers(&mut c, &digest).await.iter().enumerate() {
        assert!(a.is_empty(), "answer {i}: {a:?}");
    }
    assert_eq!(d.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapped_payload_checked_as_read_catches_bytes_changed_under_the_map() {
    // The client's checked reads: what changes on disk after the lease was
    // granted is never returned by `checked`, group by group.
    let d = InProc::start();
    let (model, digest) = work_model(&d, "m.onnx", 41);
    let client = ctcache_client::Client::connect_to(&d.socket).await.unwrap();
    let mut c = d.client().await;
    let packed = prepack_all(&mut c, &model).await;
    assert!(!packed.is_empty());
    let gemm = entries_for(&mut c, &digest)
        .await
        .into_iter()
        .find(|e| e.physical_type.starts_with(GEMM))
        .expect("a gemm.pack_b.f32 entry");
    let group = ctcache::chunks::GROUP;
    assert!(
        gemm.payload_len as usize >= 2 * group,
        "{}",
        gemm.payload_len
    );
    let p = client.open_payload(&gemm).await.unwrap();
    assert!(p.is_mapped());
    let all = p.checked(0..p.len()).unwrap().to_vec();
    assert_eq!(blake3::hash(&all).to_hex().as_str(), gemm.payload_blake3);

    // One byte of the second group changes on disk under the live map.
    let path = PathBuf::from(&gemm.payload_path);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[group + 7] ^= 0x10;
    rewrite_in_place(&path, &bytes);
    assert_eq!(p[group + 7], bytes[group + 7], "the map shows the change");
    assert_eq!(p.checked(0..group).unwrap(), &all[..group]);
    let e = p.checked(group..group + 8).unwrap_err();
    assert!(
        matches!(&e, ctcache_client::Error::PayloadMismatch { detail, .. }
            if detail.contains(&format!("{group}..{}", 2 * group))),
        "{e}"
    );
    assert!(p.checked(10..group + 1).is_err(), "a read across the group");
    assert!(p.checked(0..p.len() + 1).is_err(), "past the end");
    drop(p);
}

/// Writes `bytes` over the file at `path` (same inode: maps see them).
fn rewrite_in_place(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
}
