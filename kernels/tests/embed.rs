//! Embedding real formats with the byte-preserving rewrite, as `ctcachectl
//! embed` does locally (compile, then `rewrite::embed`), and judging the
//! result with this build's registry, as `inspect` and import do: every hit's
//! bytes are the packer's bytes for that initializer and layout, whatever
//! was embedded before and wherever the output goes; a known type name over
//! another layout, or bytes that do not match their checksum, are misses.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use ctcache::check::{check_model, payload_bytes, CheckOptions};
use ctcache::hit::{Accept, Host};
use ctcache::onnx::rewrite::{self, Mode, RewriteOptions};
use ctcache::onnx::Model;
use ctcache::pb;
use ctcache::resolve::{classify, importable, Status};
use ctcache_kernels::compile::{compile, host_devices};
use ctcache_kernels::registry::known_types;
use ctcache_kernels::{find, pack_to_vec, Params, SourceTensor};
use ctcache_testkit::{f32_tensor_from, unit_f32, xorshift, MatMul};
use prost::Message;

/// W1[64, 32] (read by a MatMul) and W2[32, 64]: both accepted by
/// `ort.matmul_nbits` and `ggml.q8_0`.
fn write_model(path: &Path) {
    let values = |seed: u32| xorshift(seed).map(unit_f32);
    let mut m = MatMul::new(64, 32, values(7)).with_io().proto();
    let w2 = f32_tensor_from("W2", &[32, 64], values(11).take(32 * 64));
    m.graph.as_mut().unwrap().initializer.push(w2);
    std::fs::write(path, m.encode_to_vec()).unwrap();
}

/// `ctcachectl embed MODEL -o OUT --format FORMAT [--sidecar]`, locally.
fn embed(model: &Path, out: &Path, format: &str, sidecar: bool) -> rewrite::Report {
    let m = Model::open(model).unwrap();
    let p = find(format).unwrap();
    let params = Params::new();
    let entries: Vec<_> = m
        .initializers()
        .unwrap()
        .iter()
        .filter(|t| p.check_source(t.data_type, &t.dims, &params).is_ok())
        .map(|t| compile(&m, t, None, p, &params).unwrap().to_embedded())
        .collect();
    let opts = RewriteOptions {
        all_to_sidecar: sidecar,
        ..Default::default()
    };
    rewrite::embed(&m, &entries, out, Mode::Add, &opts).unwrap()
}

fn host() -> Host {
    Host::new(host_devices(), None, Accept::Known(known_types()))
}

/// The miss reason codes (or "hit") of every entry.
fn statuses(m: &Model) -> Vec<String> {
    classify(m, &host(), &CheckOptions::default())
        .iter()
        .map(|s| match &s.status {
            Status::Hit { .. } => "hit".into(),
            Status::Miss(r) => r.code().into(),
        })
        .collect()
}

/// Checks `out` (checker clean) and returns its hits as (initializer,
/// format), each after checking its bytes against a fresh pack.
fn hits_packed_right(out: &Path) -> Vec<(String, String)> {
    let m = Model::open(out).unwrap();
    let errors = check_model(&m, &CheckOptions::default()).unwrap();
    assert!(errors.is_empty(), "{}: {errors:?}", out.display());
    let ext = m.extension().unwrap();
    let sources: HashMap<String, _> = m
        .initializers()
        .unwrap()
        .into_iter()
        .map(|t| (t.name.clone(), t))
        .collect();
    let mut hits = Vec::new();
    for s in classify(&m, &host(), &CheckOptions::default()) {
        assert!(
            matches!(s.status, Status::Hit { .. }),
            "{}: entry {} ({}) {:?}",
            out.display(),
            s.index,
            s.physical_type,
            s.status
        );
        let layout = s.layout.unwrap();
        let t = &sources[&s.source_name];
        let raw = ctcache::digest::raw_copy(&m, t).unwrap();
        let src = SourceTensor {
            data_type: t.data_type,
            dims: &t.dims,
            data: &raw,
        };
        let params = Params::parse(layout.params.split(',')).unwrap();
        let (_, want) = pack_to_vec(find(&layout.packer).unwrap(), &src, &params).unwrap();
        let value = ext.compiled_tensors[s.index].value.as_ref().unwrap();
        let got = payload_bytes(&m, value).unwrap();
        assert!(
            got[..] == want[..],
            "{}: entry {} ({} of {}) holds other bytes than its pack",
            out.display(),
            s.index,
            layout.type_name,
            s.source_name
        );
        hits.push((s.source_name.clone(), layout.packer.clone()));
    }
    hits.sort();
    hits
}

fn all_four() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = ["W", "W2"]
        .iter()
        .flat_map(|w| ["ggml.q8_0", "ort.matmul_nbits"].map(|f| (w.to_string(), f.to_string())))
        .collect();
    v.sort();
    v
}

/// nbits then q8_0, both to the sidecar, with the second output at `second`.
/// The output stands on its own: its payloads are in its own sidecar, so it
/// stays right when the first output and its sidecar go away.
fn two_formats(second: impl Fn(&Path) -> PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.onnx");
    write_model(&m);
    let e1 = d.path().join("e1.onnx");
    embed(&m, &e1, "ort.matmul_nbits", true);
    let e2 = second(d.path());
    std::fs::create_dir_all(e2.parent().unwrap()).unwrap();
    embed(&e1, &e2, "ggml.q8_0", true);
    assert_eq!(hits_packed_right(&e2), all_four());
    let side = rewrite::sidecar_name(&e2).unwrap();
    let model = Model::open(&e2).unwrap();
    for c in model.extension().unwrap().compiled_tensors {
        let r = ctcache::check::payload_ref(c.value.as_ref().unwrap()).unwrap();
        assert_eq!(
            r.location,
            side,
            "{}: every payload in its own sidecar",
            e2.display()
        );
    }
    if e2 != e1 {
        std::fs::remove_file(&e1).unwrap();
        std::fs::remove_file(e1.with_file_name(rewrite::sidecar_name(&e1).unwrap())).unwrap();
        assert_eq!(hits_packed_right(&e2), all_four());
    }
}

#[test]
fn a_second_format_in_place_keeps_the_first_right() {
    two_formats(|d| d.join("e1.onnx"));
}

#[test]
fn a_second_format_beside_keeps_the_first_right() {
    two_formats(|d| d.join("e2.onnx"));
}

#[test]
fn a_second_format_in_another_folder_keeps_the_first_right() {
    two_formats(|d| d.join("elsewhere").join("e2.onnx"));
}

#[test]
fn inline_then_sidecar_in_place_and_replace() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.onnx");
    write_model(&m);
    let e = d.path().join("e.onnx");
    embed(&m, &e, "ort.matmul_nbits", false);
    embed(&e, &e, "ggml.q8_0", true);
    assert_eq!(hits_packed_right(&e), all_four());
    // A third format in place again: the sidecar is carried whole.
    let r = embed(&e, &e, "cast.f16", true);
    assert_eq!(r.entries, 2);
    assert_eq!(hits_packed_right(&e).len(), 6);
    // Replace keeps its meaning: only the new entries remain.
    let model = Model::open(&e).unwrap();
    let p = find("ggml.q8_0").unwrap();
    let entries: Vec<_> = model
        .initializers()
        .unwrap()
        .iter()
        .map(|t| {
            compile(&model, t, None, p, &Params::new())
                .unwrap()
                .to_embedded()
        })
        .collect();
    let opts = RewriteOptions {
        all_to_sidecar: true,
        ..Default::default()
    };
    rewrite::embed(&model, &entries, &e, Mode::Replace, &opts).unwrap();
    let hits = hits_packed_right(&e);
    assert_eq!(
        hits,
        [("W", "ggml.q8_0"), ("W2", "ggml.q8_0")].map(|(a, b)| (a.to_string(), b.to_string()))
    );
}

#[test]
fn every_written_entry_carries_its_payload_checksum() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("m.onnx");
    write_model(&m);
    let e = d.path().join("e.onnx");
    embed(&m, &e, "ggml.q8_0", false);
    let model = Model::open(&e).unwrap();
    for c in model.extension().unwrap().compiled_tensors {
        let want = ctcache::hit::payload_checksum(&c.value.as_ref().unwrap().raw_data);
        let got = ctcache::structs::metadata(&c.metadata_props, ctcache::hit::PAYLOAD_BLAKE3_KEY);
        assert_eq!(got, Some(want.as_str()));
    }
}

/// The embedded model of `format` (inline), decoded.
fn embedded_proto(dir: &Path, format: &str) -> pb::ModelProto {
    let m = dir.join("m.onnx");
    write_model(&m);
    let e = dir.join(format!("{format}.onnx"));
    embed(&m, &e, format, false);
    pb::ModelProto::decode(std::fs::read(&e).unwrap().as_slice()).unwrap()
}

fn reopen(dir: &Path, m: &pb::ModelProto) -> Model {
    let p = dir.join("tampered.onnx");
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    Model::open(&p).unwrap()
}

/// Every struct type of a model: the table's and those inline in values
/// (a second declaration under a taken name is written inline).
fn all_types(m: &mut pb::ModelProto) -> Vec<&mut pb::StructTypeProto> {
    let inline = m
        .compiled_tensors
        .iter_mut()
        .filter_map(|c| c.value.as_mut().and_then(|v| v.struct_type.as_mut()));
    m.struct_types.iter_mut().chain(inline).collect()
}

fn fields(t: &mut pb::StructTypeProto) -> &mut Vec<pb::struct_type_proto::Field> {
    match t.kind.as_mut() {
        Some(pb::struct_type_proto::Kind::Structure(s)) => &mut s.field,
        _ => panic!("a structure"),
    }
}

#[test]
fn a_known_name_over_another_layout_is_unknown() {
    let d = tempfile::tempdir().unwrap();
    let base = embedded_proto(d.path(), "ort.matmul_nbits");
    assert!(statuses(&reopen(d.path(), &base))
        .iter()
        .all(|s| s == "hit"));
    type Tamper = fn(&mut pb::StructTypeProto);
    let tampers: [(&str, Tamper); 3] = [
        // B and scales swapped: same size, same name.
        ("reordered", |t| fields(t).swap(0, 1)),
        // scales as INT32 instead of FLOAT: same size.
        ("resized", |t| {
            let f = &mut fields(t)[1];
            let Some(pb::struct_type_proto::field::Content::Type(tp)) = f.content.as_mut() else {
                panic!("a typed field")
            };
            let mut s = tp.clone();
            fn leaf(tp: &mut pb::TypeProto) {
                match tp.value.as_mut().unwrap() {
                    pb::type_proto::Value::TensorType(t) => t.elem_type = 6,
                    pb::type_proto::Value::StructType(s) => match s.kind.as_mut().unwrap() {
                        pb::struct_type_proto::Kind::Array(a) => {
                            leaf(a.element_type.as_mut().unwrap())
                        }
                        _ => panic!("arrays down to the leaf"),
                    },
                    _ => panic!("a type"),
                }
            }
            leaf(&mut s);
            *tp = s;
        }),
        ("renamed", |t| fields(t)[0].name = "codes".into()),
    ];
    for (what, tamper) in tampers {
        let mut m = base.clone();
        for t in all_types(&mut m) {
            tamper(t);
        }
        let model = reopen(d.path(), &m);
        assert!(
            check_model(&model, &CheckOptions::default())
                .unwrap()
                .is_empty(),
            "{what}: still structurally valid"
        );
        assert_eq!(
            statuses(&model),
            ["unknown_physical_type"; 2],
            "{what}: inspect"
        );
        let import_host = Host::any_device(Accept::Known(known_types()));
        for item in importable(
            &model,
            &import_host,
            &CheckOptions::default(),
            &HashMap::new(),
        ) {
            let code = item.entry.err().map(|m| m.code());
            assert_eq!(code, Some("unknown_physical_type"), "{what}: import");
        }
    }
    // Untampered, import takes both.
    let model = reopen(d.path(), &base);
    let import_host = Host::any_device(Accept::Known(known_types()));
    let ok = importable(
        &model,
        &import_host,
        &CheckOptions::default(),
        &HashMap::new(),
    );
    assert!(ok.iter().all(|i| i.entry.is_ok()));
}

#[test]
fn another_version_of_a_known_packer_is_unsupported() {
    let d = tempfile::tempdir().unwrap();
    let mut m = embedded_proto(d.path(), "ggml.q8_0");
    for t in all_types(&mut m) {
        for p in &mut t.metadata_props {
            if p.key == "ctcache.format_version" {
                p.value = "2".into();
            }
        }
    }
    assert_eq!(
        statuses(&reopen(d.path(), &m)),
        ["unsupported_format_version"; 2]
    );
}

#[test]
fn bytes_that_do_not_match_their_checksum_are_a_miss() {
    let d = tempfile::tempdir().unwrap();
    let mut m = embedded_proto(d.path(), "ort.matmul_nbits");
    let v = m.compiled_tensors[1].value.as_mut().unwrap();
    let mut b = v.raw_data.to_vec();
    b[0] ^= 0x11;
    v.raw_data = Bytes::from(b);
    assert_eq!(statuses(&reopen(d.path(), &m)), ["hit", "payload_checksum"]);
    let import_host = Host::any_device(Accept::Known(known_types()));
    let items = importable(
        &reopen(d.path(), &m),
        &import_host,
        &CheckOptions::default(),
        &HashMap::new(),
    );
    assert_eq!(
        items[1].entry.as_ref().err().map(|m| m.code()),
        Some("payload_checksum")
    );

    // In a sidecar too.
    let src = d.path().join("m.onnx");
    let side = d.path().join("side.onnx");
    embed(&src, &side, "ggml.q8_0", true);
    let sidecar = side.with_file_name(rewrite::sidecar_name(&side).unwrap());
    let mut bytes = std::fs::read(&sidecar).unwrap();
    bytes[5] ^= 0x01;
    std::fs::write(&sidecar, bytes).unwrap();
    assert_eq!(
        statuses(&Model::open(&side).unwrap()),
        ["payload_checksum", "hit"]
    );
}
