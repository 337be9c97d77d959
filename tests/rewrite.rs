//! The byte-preserving rewrite (D2): unknown fields survive add and strip,
//! strip(add(m)) == m byte for byte, sidecars are 4096-aligned, replace and
//! duplicate handling.

mod common;

use bytes::Bytes;
use common::*;
use ctcache::check::{check_model, CheckOptions};
use ctcache::onnx::rewrite::{self, Mode, NewEntry, RewriteOptions};
use ctcache::onnx::Model;
use ctcache::pb;
use ctcache::resolve::{classify, Host, Status};
use ctcache::wire::put_len_prefix;
use prost::Message;

/// `base_model` bytes with an unknown field 77 in ModelProto and in GraphProto.
fn model_with_unknown_fields() -> Vec<u8> {
    let mut m = base_model();
    let graph = m.graph.take().unwrap();
    let mut graph_bytes = graph.encode_to_vec();
    let unknown = b"future ONNX field";
    put_len_prefix(&mut graph_bytes, 77, unknown.len() as u64);
    graph_bytes.extend_from_slice(unknown);
    let mut out = m.encode_to_vec();
    put_len_prefix(&mut out, 7, graph_bytes.len() as u64);
    out.extend_from_slice(&graph_bytes);
    put_len_prefix(&mut out, 77, 3);
    out.extend_from_slice(b"xyz");
    out
}

fn entry(model: &Model) -> NewEntry {
    let t = model.initializers().unwrap().remove(0);
    let payload = ctcache::digest::raw_copy(model, &t).unwrap().into();
    let digest =
        ctcache::digest::digest_tensor(model, &t, ctcache::digest::Algorithm::Blake3).unwrap();
    NewEntry {
        source_name: t.name.clone(),
        device: cpu(),
        struct_type: copy_type(),
        dims: vec![t.elements],
        payload,
        source_digest: digest.bytes.to_vec(),
        digest_algorithm: "blake3".into(),
        metadata_props: vec![kv("ctcache.producer", "tests")],
    }
}

fn write_input(dir: &std::path::Path) -> (std::path::PathBuf, Vec<u8>) {
    let bytes = model_with_unknown_fields();
    let path = dir.join("in.onnx");
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes)
}

fn host() -> Host {
    test_host()
}

#[test]
fn add_then_strip_is_identity_and_keeps_unknown_fields() {
    let dir = tempfile::tempdir().unwrap();
    let (input, original) = write_input(dir.path());
    let model = Model::open(&input).unwrap();
    let out = dir.path().join("out.onnx");
    let report = rewrite::embed(
        &model,
        &[entry(&model)],
        &out,
        Mode::Add,
        &RewriteOptions::default(),
    )
    .unwrap();
    assert_eq!(report.entries, 1);
    assert_eq!(report.sidecar, None);
    let embedded = std::fs::read(&out).unwrap();
    // Every original byte is kept, in place; the extension is appended.
    assert_eq!(&embedded[..original.len()], &original[..]);
    assert!(embedded.len() > original.len());

    let embedded_model = Model::open(&out).unwrap();
    assert!(check_model(&embedded_model, &CheckOptions::default())
        .unwrap()
        .is_empty());
    let statuses = classify(&embedded_model, &host(), &CheckOptions::default());
    assert_eq!(statuses[0].status, Status::Hit { host_device: 0 });

    let stripped = dir.path().join("stripped.onnx");
    rewrite::strip(&embedded_model, &stripped).unwrap();
    assert_eq!(std::fs::read(&stripped).unwrap(), original);
    assert_eq!(rewrite::strip_to_vec(&embedded_model), original);
}

#[test]
fn sidecar_payloads_are_aligned_and_valid() {
    let dir = tempfile::tempdir().unwrap();
    let (input, original) = write_input(dir.path());
    let model = Model::open(&input).unwrap();
    let out = dir.path().join("side.onnx");
    let mut second = entry(&model);
    second.struct_type.name = "test.copy.f32.b".into();
    let opts = RewriteOptions {
        all_to_sidecar: true,
        ..Default::default()
    };
    let report = rewrite::embed(&model, &[entry(&model), second], &out, Mode::Add, &opts).unwrap();
    let sidecar = report.sidecar.clone().unwrap();
    assert_eq!(sidecar.file_name().unwrap(), "side.onnx.ctdata");
    assert_eq!(report.inline_bytes, 0);
    let m = Model::open(&out).unwrap();
    let ext = m.extension().unwrap();
    let offsets: Vec<u64> = ext
        .compiled_tensors
        .iter()
        .map(|c| {
            let r = ctcache::check::payload_ref(c.value.as_ref().unwrap()).unwrap();
            r.offset
        })
        .collect();
    assert_eq!(offsets, vec![0, 4096]);
    assert!(check_model(&m, &CheckOptions::default())
        .unwrap()
        .is_empty());
    // The sidecar holds the payload bytes at the recorded offsets.
    let side = std::fs::read(&sidecar).unwrap();
    let payload = entry(&model).payload;
    assert_eq!(&side[4096..4096 + payload.len()], &payload[..]);
    assert_eq!(rewrite::strip_to_vec(&m), original);
}

#[test]
fn replace_drops_previous_entries() {
    let dir = tempfile::tempdir().unwrap();
    let (input, original) = write_input(dir.path());
    let model = Model::open(&input).unwrap();
    let once = dir.path().join("once.onnx");
    rewrite::embed(
        &model,
        &[entry(&model)],
        &once,
        Mode::Add,
        &RewriteOptions::default(),
    )
    .unwrap();
    let once_model = Model::open(&once).unwrap();
    // Adding the same key again is refused; replacing works.
    let twice = dir.path().join("twice.onnx");
    let err = rewrite::embed(
        &once_model,
        &[entry(&once_model)],
        &twice,
        Mode::Add,
        &RewriteOptions::default(),
    );
    assert!(err.is_err());
    rewrite::embed(
        &once_model,
        &[entry(&once_model)],
        &twice,
        Mode::Replace,
        &RewriteOptions::default(),
    )
    .unwrap();
    let twice_model = Model::open(&twice).unwrap();
    assert_eq!(twice_model.extension().unwrap().compiled_tensors.len(), 1);
    assert_eq!(rewrite::strip_to_vec(&twice_model), original);
}

/// A registry that knows no type.
struct NoTypes;

impl ctcache::hit::TypeRegistry for NoTypes {
    fn candidates(
        &self,
        claimed: &pb::StructTypeProto,
        _: &ctcache::hit::SourceShape,
    ) -> Result<Vec<ctcache::hit::KnownLayout>, ctcache::hit::MissReason> {
        Err(ctcache::hit::MissReason::UnknownPhysicalType {
            name: claimed.name.clone(),
            detail: "no types".into(),
        })
    }
}

#[test]
fn stale_entry_is_a_miss_after_the_initializer_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (input, _) = write_input(dir.path());
    let model = Model::open(&input).unwrap();
    let mut e = entry(&model);
    e.source_digest[0] ^= 1;
    let out = dir.path().join("stale.onnx");
    rewrite::embed(&model, &[e], &out, Mode::Add, &RewriteOptions::default()).unwrap();
    let m = Model::open(&out).unwrap();
    let s = classify(&m, &host(), &CheckOptions::default());
    assert!(matches!(&s[0].status, Status::Miss(r) if r.code() == "stale_digest"));
    // An unknown type name is a miss, not an error.
    let other_host = Host::new(
        vec![cpu()],
        None,
        ctcache::hit::Accept::Known(std::sync::Arc::new(ctcache::hit::KnownTypes::new(NoTypes))),
    );
    let m2 = Model::from_bytes(Bytes::from(compiled_model().encode_to_vec()), ".").unwrap();
    let s = classify(&m2, &other_host, &CheckOptions::default());
    assert!(matches!(&s[0].status, Status::Miss(r) if r.code() == "unknown_physical_type"));
    let _ = pb::ModelProto::default();
}

/// The error of adding one entry to `model`, written into `dir/out.onnx`.
fn embed_add_error(model: &Model, dir: &std::path::Path) -> String {
    rewrite::embed(
        model,
        &[entry(model)],
        &dir.join("out.onnx"),
        Mode::Add,
        &RewriteOptions::default(),
    )
    .unwrap_err()
    .to_string()
}

/// A model whose extension has more fields of a kind than the limits allow
/// (here 4097 empty struct types, 2 bytes each) is refused by
/// `Model::extension` and by an embed that adds to it, from the field counts
/// alone: each such field decodes to a message many times its size.
#[test]
fn an_extension_over_the_limits_is_refused_before_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = base_model().encode_to_vec();
    let limit = ctcache::structs::Limits::default().max_struct_types;
    for _ in 0..=limit {
        put_len_prefix(&mut bytes, ctcache::onnx::fields::MODEL_STRUCT_TYPES, 0);
    }
    let path = dir.path().join("many.onnx");
    std::fs::write(&path, &bytes).unwrap();
    let model = Model::open(&path).unwrap();
    let counts = model.extension_counts();
    assert_eq!(counts.struct_types, limit + 1);
    let e = model.extension().unwrap_err().to_string();
    assert!(
        e.contains("exceed the limits") && e.contains("many.onnx"),
        "{e}"
    );
    let e = embed_add_error(&model, dir.path());
    assert!(e.contains("exceed the limits"), "{e}");
    assert!(!dir.path().join("out.onnx").exists());
    // At the limit it decodes.
    let mut bytes = base_model().encode_to_vec();
    for _ in 0..limit {
        put_len_prefix(&mut bytes, ctcache::onnx::fields::MODEL_STRUCT_TYPES, 0);
    }
    std::fs::write(&path, &bytes).unwrap();
    let ext = Model::open(&path).unwrap().extension().unwrap();
    assert_eq!(ext.struct_types.len(), limit);
}

/// A graph of more than 2^20 nodes (empty ones, 2 bytes each) is refused
/// before any is decoded; so is one of more than 2^20 initializers.
#[test]
fn a_graph_of_too_many_nodes_is_refused_before_decoding() {
    let dir = tempfile::tempdir().unwrap();
    for (field, what) in [(1u32, "nodes"), (5, "initializers")] {
        let mut graph = Vec::new();
        for _ in 0..=(1usize << 20) {
            put_len_prefix(&mut graph, field, 0);
        }
        let mut bytes = Vec::new();
        put_len_prefix(
            &mut bytes,
            ctcache::onnx::fields::MODEL_GRAPH,
            graph.len() as u64,
        );
        bytes.extend_from_slice(&graph);
        let path = dir.path().join(format!("{what}.onnx"));
        std::fs::write(&path, &bytes).unwrap();
        let model = Model::open(&path).unwrap();
        let e = match what {
            "nodes" => model.nodes().map(|_| ()).unwrap_err(),
            _ => model.initializers().map(|_| ()).unwrap_err(),
        }
        .to_string();
        assert!(e.contains(&format!("more than 1048576 {what}")), "{e}");
    }
}

/// An embed that adds to a model refuses one whose own compiled tensors do
/// not all decode before it reads any of their payloads: here the first
/// entry's payload file is missing, and the error is about the second,
/// undecodable entry.
#[test]
fn an_undecodable_entry_is_refused_before_any_payload_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = compiled_model();
    let value = m.compiled_tensors[0].value.as_mut().unwrap();
    value.raw_data = Bytes::new();
    value.external_data = vec![
        kv("location", "missing.bin"),
        kv("offset", "0"),
        kv("length", "128"),
    ];
    let mut bytes = m.encode_to_vec();
    // A compiled_tensors field whose value is not a message.
    put_len_prefix(&mut bytes, ctcache::onnx::fields::MODEL_COMPILED_TENSORS, 2);
    bytes.extend_from_slice(&[0xff, 0xff]);
    let path = dir.path().join("in.onnx");
    std::fs::write(&path, &bytes).unwrap();
    let model = Model::open(&path).unwrap();
    let e = embed_add_error(&model, dir.path());
    assert!(e.contains("compiled tensors cannot be read"), "{e}");
    assert!(!e.contains("missing.bin"), "{e}");
}
