//! `ctcache::materialize::write` with real `ort.matmul_nbits` payloads: the
//! graph splice (shared weights, weights still used elsewhere, name
//! collisions, value_info, opset import), external data that points at the
//! exact payload ranges, how payload files are placed (one link each by
//! default, hard links on request), and reruns. Byte identity with
//! onnxruntime's quantizer is tested in tests/python/test_materialize.py.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use bytes::Bytes;
use ctcache::cancel::Cancel;
use ctcache::dtype::DataType;
use ctcache::materialize::{self as mat, LinkMode, PackedWeight, Settings};
use ctcache::onnx::Model;
use ctcache::pb;
use ctcache_kernels::{pack_to_vec, Params, SourceTensor};
use ctcache_testkit::{f32_tensor_from, node, unit_f32, xorshift};
use prost::Message;

/// `path` as an output of `mat::write`.
fn at(path: &Path) -> ctcache::outdir::OutFile {
    ctcache::outdir::OutFile::open(path).unwrap()
}

/// A FLOAT weight of pseudo-random values in [-1, 1].
fn weight(name: &str, dims: &[i64], seed: u32) -> pb::TensorProto {
    let n: i64 = dims.iter().product();
    let values = xorshift(seed.wrapping_mul(2_654_435_761).max(1)).map(unit_f32);
    f32_tensor_from(name, dims, values.take(n as usize))
}

fn value(name: &str) -> pb::ValueInfoProto {
    pb::ValueInfoProto {
        name: name.into(),
        ..Default::default()
    }
}

/// x[?, 100] -> mm1(W1) -> h1[?, 48] -> mm2(W1 again, shared) is not
/// shape-valid, so the shared weight is square: W1[48, 48] after a first
/// projection P[100, 48]; Gemm(transB) with W2[32, 48] and C; W3 is read by
/// a MatMul and by an Add (so it stays).
fn model(with_ms_import: bool) -> pb::ModelProto {
    let mut gemm = node("Gemm", "fc", &["h2", "W2", "C"], "y");
    gemm.attribute = vec![pb::AttributeProto {
        name: "transB".into(),
        i: 1,
        r#type: 2,
        ..Default::default()
    }];
    let mut opset_import = vec![pb::OperatorSetIdProto {
        domain: String::new(),
        version: 17,
    }];
    if with_ms_import {
        opset_import.push(pb::OperatorSetIdProto {
            domain: "com.microsoft".into(),
            version: 1,
        });
    }
    pb::ModelProto {
        ir_version: 8,
        producer_name: "materialize-test".into(),
        doc_string: "kept as is".into(),
        opset_import,
        metadata_props: vec![pb::StringStringEntryProto {
            key: "k".into(),
            value: "v".into(),
        }],
        graph: Some(pb::GraphProto {
            name: "g".into(),
            node: vec![
                node("MatMul", "proj", &["x", "P"], "p"),
                node("MatMul", "mm1", &["p", "W1"], "h1"),
                node("MatMul", "", &["h1", "W1"], "h2"),
                gemm,
                node("MatMul", "mm3", &["p", "W3"], "z"),
                node("Add", "uses_w3", &["z", "W3"], "z2"),
            ],
            initializer: vec![
                weight("P", &[100, 48], 1),
                weight("W1", &[48, 48], 2),
                weight("W2", &[32, 48], 3),
                weight("C", &[32], 4),
                weight("W3", &[48, 48], 5),
                // Takes the name the quantizer would give W1's codes.
                weight("W1_Q4", &[2], 6),
            ],
            input: vec![value("x")],
            output: vec![value("y"), value("z2")],
            value_info: vec![value("W1"), value("h1")],
            ..Default::default()
        }),
        ..Default::default()
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    model: Model,
    weights: HashMap<mat::WeightKey, PackedWeight>,
    payloads: HashMap<mat::WeightKey, Vec<u8>>,
}

fn fixture(m: &pb::ModelProto, s: &Settings) -> (Fixture, mat::Plan) {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::from_bytes(Bytes::from(m.encode_to_vec()), dir.path()).unwrap();
    let plan = mat::plan(&model).unwrap();
    let inits = model.initializers().unwrap();
    let (mut weights, mut payloads) = (HashMap::new(), HashMap::new());
    let cache = dir.path().join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    for pack in plan.packs(&s.into()) {
        let (name, transposed) = pack.key;
        let packer = ctcache_kernels::find(pack.packer).unwrap();
        let params = Params::parse(pack.params).unwrap();
        let t = inits.iter().find(|t| t.name == name).unwrap();
        let ctcache::onnx::Storage::Raw(r) = &t.storage else {
            panic!("raw")
        };
        let src = SourceTensor {
            data_type: t.data_type,
            dims: &t.dims,
            data: &model.bytes()[r.clone()],
        };
        let (layout, payload) = pack_to_vec(packer, &src, &params).unwrap();
        let file_name = format!("{name}-{transposed}.bin");
        let path = cache.join(&file_name);
        std::fs::write(&path, &payload).unwrap();
        weights.insert(
            (name.clone(), transposed),
            PackedWeight {
                payload_path: path,
                checked: None,
                file_name,
                struct_type: layout.struct_type,
                dims: layout.dims,
            },
        );
        payloads.insert((name, transposed), payload);
    }
    (
        Fixture {
            dir,
            model,
            weights,
            payloads,
        },
        plan,
    )
}

/// `mat::write` of the fixture to `out`, never cancelled.
fn write(
    f: &Fixture,
    plan: &mat::Plan,
    s: Settings,
    out: &Path,
    mode: LinkMode,
) -> ctcache::Result<mat::Report> {
    mat::write(
        &f.model,
        plan,
        s,
        &f.weights,
        &at(out),
        mode,
        &Cancel::new(),
    )
}

fn external(t: &pb::TensorProto, out_dir: &Path) -> Vec<u8> {
    assert_eq!(t.data_location, 1, "{} is external", t.name);
    let get = |k: &str| {
        t.external_data
            .iter()
            .find(|e| e.key == k)
            .map(|e| e.value.clone())
            .unwrap()
    };
    let file = std::fs::read(out_dir.join(get("location"))).unwrap();
    let off: usize = get("offset").parse().unwrap();
    let len: usize = get("length").parse().unwrap();
    file[off..off + len].to_vec()
}

#[test]
fn splices_the_graph_and_points_into_the_payloads() {
    let s = Settings {
        symmetric: false,
        accuracy_level: 4,
        ..Default::default()
    };
    let (f, plan) = fixture(&model(false), &s);
    assert_eq!(plan.targets.len(), 5, "{:?}", plan.skipped);
    let out = f.dir.path().join("out").join("m4.onnx");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let report = write(&f, &plan, s, &out, LinkMode::Hard).unwrap();
    assert_eq!(report.nodes_rewritten, 5);
    assert_eq!(report.count(mat::Method::HardLink), 4);
    assert_eq!(report.bytes_copied, 0);
    // P, W1 and W2 are dropped; W3 is still read by the Add.
    assert_eq!(report.initializers_removed, 3);

    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(report.model_bytes, bytes.len() as u64);
    let m = pb::ModelProto::decode(bytes.as_slice()).unwrap();
    assert_eq!(m.producer_name, "materialize-test");
    assert_eq!(m.doc_string, "kept as is");
    assert_eq!(m.metadata_props.len(), 1);
    let ms: Vec<_> = m
        .opset_import
        .iter()
        .filter(|o| o.domain == "com.microsoft")
        .collect();
    assert_eq!(ms.len(), 1);
    let g = m.graph.unwrap();
    let ops: Vec<(&str, &str)> = g
        .node
        .iter()
        .map(|n| (n.op_type.as_str(), n.name.as_str()))
        .collect();
    assert_eq!(
        ops,
        [
            ("MatMulNBits", "proj_Q4"),
            ("MatMulNBits", "mm1_Q4"),
            ("MatMulNBits", ""),
            ("MatMulNBits", "fc_Q4"),
            ("Add", "fc_bias"),
            ("MatMulNBits", "mm3_Q4"),
            ("Add", "uses_w3"),
        ]
    );
    // The shared weight's inputs are the same initializers; the taken name
    // W1_Q4 is not reused.
    assert_eq!(g.node[1].input[1..], g.node[2].input[1..]);
    assert_eq!(g.node[1].input[1], "W1_Q4_1");
    assert_eq!(g.node[1].output, ["h1"]);
    // Gemm: MatMulNBits into a fresh value, then Add(C) into y.
    assert_eq!(g.node[3].input[1], "W2_T_Q4");
    assert_eq!(
        g.node[4].input,
        [g.node[3].output[0].clone(), "C".to_string()]
    );
    assert_eq!(g.node[4].output, ["y"]);
    let attrs: Vec<(&str, i64)> = g.node[3]
        .attribute
        .iter()
        .map(|a| (a.name.as_str(), a.i))
        .collect();
    assert_eq!(
        attrs,
        [
            ("K", 48),
            ("N", 32),
            ("accuracy_level", 4),
            ("bits", 4),
            ("block_size", 32)
        ]
    );
    assert_eq!(g.node[3].domain, "com.microsoft");
    // The dropped weight's value_info goes with it; others stay.
    assert_eq!(
        g.value_info
            .iter()
            .map(|v| v.name.as_str())
            .collect::<Vec<_>>(),
        ["h1"]
    );

    let names: Vec<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
    for kept in ["C", "W3", "W1_Q4"] {
        assert!(names.contains(&kept), "{kept} kept: {names:?}");
    }
    for gone in ["P", "W1", "W2"] {
        assert!(!names.contains(&gone), "{gone} dropped: {names:?}");
    }
    // B | scales | zero points are the payload, in order, with the
    // quantizer's shapes.
    let out_dir = out.parent().unwrap();
    for (key, base, k, n) in [
        (("W1".to_string(), false), "W1_Q4_1", 48u64, 48u64),
        (("W2".to_string(), true), "W2_T_Q4", 48, 32),
    ] {
        let init = |name: &str| g.initializer.iter().find(|t| t.name == name).unwrap();
        let prefix = base.trim_end_matches("_Q4_1").trim_end_matches("_Q4");
        let b = init(base);
        let scales = init(&format!("{prefix}_scales"));
        let zp = init(&format!("{prefix}_zero_points"));
        let kb = k.div_ceil(32) as i64;
        assert_eq!(b.dims, [n as i64, kb, 16]);
        assert_eq!(b.data_type, DataType::UINT8.code());
        assert_eq!(scales.dims, [n as i64, kb]);
        assert_eq!(scales.data_type, DataType::FLOAT.code());
        assert_eq!(zp.dims, [n as i64, (kb + 1) / 2]);
        let whole: Vec<u8> = [b, scales, zp]
            .iter()
            .flat_map(|t| external(t, out_dir))
            .collect();
        assert_eq!(whole, f.payloads[&key], "{base}");
    }
    // Every payload file is a hard link to the cache's file.
    for w in f.weights.values() {
        let linked = out_dir.join("m4.onnx.weights").join(&w.file_name);
        let a = std::fs::metadata(&linked).unwrap();
        let b = std::fs::metadata(&w.payload_path).unwrap();
        assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()));
    }
}

#[test]
fn rerun_replaces_stale_files_and_keeps_an_existing_ms_import() {
    let s = Settings::default();
    let (f, plan) = fixture(&model(true), &s);
    let out = f.dir.path().join("m4.onnx");
    let data = f.dir.path().join("m4.onnx.weights");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("stale.bin"), b"old").unwrap();
    let r = write(&f, &plan, s, &out, LinkMode::Copy).unwrap();
    assert_eq!(r.count(mat::Method::Copy), 4);
    assert_eq!(r.files.len(), 4);
    assert!(!data.join("stale.bin").exists());
    let m = pb::ModelProto::decode(std::fs::read(&out).unwrap().as_slice()).unwrap();
    let ms = m
        .opset_import
        .iter()
        .filter(|o| o.domain == "com.microsoft")
        .count();
    assert_eq!(ms, 1);
    assert!(m.graph.unwrap().node[0]
        .attribute
        .iter()
        .all(|a| a.name != "accuracy_level"));
    // Copies are independent of the cache's files.
    for w in f.weights.values() {
        assert_eq!(std::fs::metadata(&w.payload_path).unwrap().nlink(), 1);
    }
    // Same folder as the source: a hard-link rerun links, and then reuses
    // what is there.
    for _ in 0..2 {
        let again = write(&f, &plan, s, &out, LinkMode::Hard).unwrap();
        assert_eq!(again.count(mat::Method::HardLink), 4);
    }
}

#[test]
fn by_default_every_file_has_one_link_and_the_payload_bytes() {
    let s = Settings::default();
    let (f, plan) = fixture(&model(false), &s);
    let out = f.dir.path().join("out").join("m4.onnx");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    // Over an earlier hard-linked output: the links are replaced.
    write(&f, &plan, s, &out, LinkMode::Hard).unwrap();
    let r = write(&f, &plan, s, &out, LinkMode::default()).unwrap();
    assert_eq!(r.link, LinkMode::Auto);
    assert_eq!(r.files.len(), 4);
    let copied = r.count(mat::Method::Copy);
    assert_eq!(copied + r.count(mat::Method::Reflink), 4, "{r:?}");
    for w in f.weights.values() {
        let placed = out.with_file_name("m4.onnx.weights").join(&w.file_name);
        assert_eq!(std::fs::metadata(&placed).unwrap().nlink(), 1);
        assert_eq!(std::fs::metadata(&w.payload_path).unwrap().nlink(), 1);
        assert_eq!(
            std::fs::read(&placed).unwrap(),
            std::fs::read(&w.payload_path).unwrap()
        );
        let p = r.files.iter().find(|p| p.path == placed).unwrap();
        let size = std::fs::metadata(&placed).unwrap().len();
        let expected = if p.method == mat::Method::Copy {
            size
        } else {
            0
        };
        assert_eq!(p.bytes_copied, expected);
    }
    assert_eq!(
        r.bytes_copied,
        r.files.iter().map(|p| p.bytes_copied).sum::<u64>()
    );
}

#[test]
fn a_refused_reflink_leaves_nothing_behind() {
    let s = Settings::default();
    let (f, plan) = fixture(&model(false), &s);
    let out_dir = f.dir.path().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join("m4.onnx");
    match write(&f, &plan, s, &out, LinkMode::Reflink) {
        Ok(r) => {
            // This filesystem reflinks (btrfs, XFS): every file is one.
            assert_eq!(r.count(mat::Method::Reflink), 4, "{r:?}");
            eprintln!("the temp folder reflinks; the refusal is tested where it does not");
        }
        Err(e) => {
            let e = e.to_string();
            assert!(e.starts_with("cannot reflink"), "{e}");
            let left: Vec<_> = std::fs::read_dir(&out_dir).unwrap().collect();
            assert!(left.is_empty(), "left behind: {left:?}");
        }
    }
}

#[test]
fn a_payload_of_the_wrong_shape_is_refused_before_writing() {
    let s = Settings::default();
    let (mut f, plan) = fixture(&model(false), &s);
    // Swap two weights' payloads: W2's layout (N = 32) for W1 (N = 48).
    let w2 = f.weights[&("W2".to_string(), true)].clone();
    f.weights.insert(("W1".to_string(), false), w2);
    let out = f.dir.path().join("bad.onnx");
    let e = write(&f, &plan, s, &out, LinkMode::Auto)
        .unwrap_err()
        .to_string();
    assert!(e.contains("W1") && e.contains("expected"), "{e}");
    assert!(!out.exists());
    assert!(!f.dir.path().join("bad.onnx.weights").exists());
}

#[test]
fn kept_external_data_is_copied_not_linked_when_the_output_moves() {
    let s = Settings::default();
    let mut m = model(false);
    // W3 (kept: the Add still reads it) and W1 (rewritten) live in the
    // user's external data file.
    let g = m.graph.as_mut().unwrap();
    let mut data = Vec::new();
    let mut w3_bytes = Vec::new();
    for t in g
        .initializer
        .iter_mut()
        .filter(|t| t.name == "W3" || t.name == "W1")
    {
        let raw = std::mem::take(&mut t.raw_data);
        if t.name == "W3" {
            w3_bytes = raw.to_vec();
        }
        t.data_location = 1;
        t.external_data = vec![
            pb::StringStringEntryProto {
                key: "location".into(),
                value: "m.data".into(),
            },
            pb::StringStringEntryProto {
                key: "offset".into(),
                value: data.len().to_string(),
            },
            pb::StringStringEntryProto {
                key: "length".into(),
                value: raw.len().to_string(),
            },
        ];
        data.extend_from_slice(&raw);
    }
    // Same packed payloads; the model now reads W1 and W3 from m.data.
    let (mut f, plan) = fixture(&model(false), &s);
    std::fs::write(f.dir.path().join("m.data"), &data).unwrap();
    f.model = Model::from_bytes(Bytes::from(m.encode_to_vec()), f.dir.path()).unwrap();
    let out_dir = f.dir.path().join("elsewhere");
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join("m4.onnx");
    let r = write(&f, &plan, s, &out, LinkMode::Hard).unwrap();
    assert_eq!(r.count(mat::Method::Copy), 1, "{r:?}");
    assert_eq!(r.bytes_copied, w3_bytes.len() as u64);
    assert_eq!(
        std::fs::metadata(f.dir.path().join("m.data"))
            .unwrap()
            .nlink(),
        1
    );
    assert!(!out_dir.join("m.data").exists());
    let g = pb::ModelProto::decode(std::fs::read(&out).unwrap().as_slice())
        .unwrap()
        .graph
        .unwrap();
    let w3 = g.initializer.iter().find(|t| t.name == "W3").unwrap();
    assert_eq!(external(w3, &out_dir), w3_bytes);
    assert!(w3
        .external_data
        .iter()
        .any(|e| e.value == "m4.onnx.weights/kept.data"));
    // Output next to the model: the model's own data file is used as is.
    let beside = f.dir.path().join("m4.onnx");
    let r = write(&f, &plan, s, &beside, LinkMode::Hard).unwrap();
    assert_eq!(r.count(mat::Method::Copy), 0);
    let g = pb::ModelProto::decode(std::fs::read(&beside).unwrap().as_slice())
        .unwrap()
        .graph
        .unwrap();
    let w3 = g.initializer.iter().find(|t| t.name == "W3").unwrap();
    assert!(w3.external_data.iter().any(|e| e.value == "m.data"));
    // In memory: kept data is inlined (the model reads no file of the
    // source's; every location is a payload's).
    let built = mat::build_in_memory(&f.model, &plan, s, &f.weights, u64::MAX, "").unwrap();
    let g = pb::ModelProto::decode(built.model.as_slice())
        .unwrap()
        .graph
        .unwrap();
    let w3 = g.initializer.iter().find(|t| t.name == "W3").unwrap();
    assert_eq!((w3.data_location, &w3.raw_data[..]), (0, &w3_bytes[..]));
    assert!(w3.external_data.is_empty());
    assert!(built.tensors.iter().all(|t| t.name != "W3"));
}

/// A write asked to stop stops with `Cancelled` and leaves nothing: no
/// model, no data folder (it made it), and an earlier output untouched.
#[test]
fn a_cancelled_write_leaves_nothing_of_its_own() {
    let s = Settings::default();
    let (f, plan) = fixture(&model(false), &s);
    let out = f.dir.path().join("m4.onnx");
    let cancel = Cancel::new();
    cancel.cancel();
    let write = |cancel: &Cancel| {
        mat::write(
            &f.model,
            &plan,
            s,
            &f.weights,
            &at(&out),
            LinkMode::Copy,
            cancel,
        )
    };
    let e = write(&cancel).unwrap_err();
    assert!(matches!(e, ctcache::Error::Cancelled), "{e}");
    assert!(!out.exists());
    assert!(!f.dir.path().join("m4.onnx.weights").exists());

    let first = write(&Cancel::new()).unwrap();
    let before = std::fs::read(&out).unwrap();
    let e = write(&cancel).unwrap_err();
    assert!(matches!(e, ctcache::Error::Cancelled), "{e}");
    assert_eq!(
        std::fs::read(&out).unwrap(),
        before,
        "the earlier model stays"
    );
    for file in &first.files {
        assert!(file.path.exists(), "{} stays", file.path.display());
    }
}

/// A large initializer the rewrite keeps (an embedding table read by
/// Gather) is placed beside the model like the packed weights: the new
/// model reads it from its identity payload's file, byte for byte, and the
/// model file no longer holds it; a small one stays inline.
#[test]
fn large_kept_initializers_are_placed_not_written_again() {
    let s = Settings::default();
    let mut m = model(false);
    let g = m.graph.as_mut().unwrap();
    let table = weight("table", &[1024, 256], 41);
    let small = weight("small", &[16, 16], 42);
    g.initializer.extend([table.clone(), small]);
    g.node
        .push(node("Gather", "embed", &["table", "ids"], "emb"));
    g.node
        .push(node("Gather", "embed2", &["small", "ids"], "emb2"));
    let (f, plan) = fixture(&m, &s);
    assert_eq!(plan.placed, ["table"]);
    let out = f.dir.path().join("out").join("m4.onnx");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let r = write(&f, &plan, s, &out, LinkMode::Hard).unwrap();
    assert!(r.model_bytes < 64 * 1024, "{r:?}");
    let g = pb::ModelProto::decode(std::fs::read(&out).unwrap().as_slice())
        .unwrap()
        .graph
        .unwrap();
    let placed = g.initializer.iter().find(|t| t.name == "table").unwrap();
    assert_eq!(external(placed, out.parent().unwrap()), table.raw_data);
    assert_eq!(
        (placed.data_type, &placed.dims),
        (table.data_type, &table.dims)
    );
    let small = g.initializer.iter().find(|t| t.name == "small").unwrap();
    assert_eq!(small.data_location, 0, "a small initializer stays inline");
    assert_eq!(
        g.initializer.iter().filter(|t| t.name == "table").count(),
        1
    );
}

/// The in-memory build is the model `write` writes, but for where its new
/// initializers' bytes come from: each is a payload range the caller
/// feeds, named in `tensors`; nothing is written.
#[test]
fn an_in_memory_model_is_the_written_one_and_writes_nothing() {
    let s = Settings::default();
    let (f, plan) = fixture(&model(false), &s);
    let before = ctcache_testkit::paths_under(f.dir.path());
    let built = mat::build_in_memory(&f.model, &plan, s, &f.weights, u64::MAX, "").unwrap();
    assert_eq!(
        ctcache_testkit::paths_under(f.dir.path()),
        before,
        "nothing written"
    );
    assert_eq!(built.report.model_bytes, built.model.len() as u64);
    let out = f.dir.path().join("m4.onnx");
    let written = write(&f, &plan, s, &out, LinkMode::Copy).unwrap();
    assert_eq!(built.report.nodes_rewritten, written.nodes_rewritten);
    assert_eq!(built.report.payload_bytes, written.payload_bytes);
    let file_model = pb::ModelProto::decode(std::fs::read(&out).unwrap().as_slice()).unwrap();
    let mut mem_model = pb::ModelProto::decode(built.model.as_slice()).unwrap();
    let fed: u64 = built.tensors.iter().map(|t| t.length).sum();
    assert_eq!(fed, written.payload_bytes);
    let g = mem_model.graph.as_mut().unwrap();
    let mut seen = 0;
    for t in g.initializer.iter_mut().filter(|t| t.data_location == 1) {
        let fed = built.tensors.iter().find(|p| p.name == t.name).unwrap();
        let (key, payload) = f
            .weights
            .iter()
            .find(|(_, w)| w.file_name == fed.file_name)
            .map(|(k, _)| (k, &f.payloads[k]))
            .unwrap();
        let bytes = &payload[fed.offset as usize..(fed.offset + fed.length) as usize];
        let on_disk = file_model.graph.as_ref().unwrap().initializer.iter();
        let same = on_disk.clone().find(|x| x.name == t.name).unwrap();
        assert_eq!(
            external(same, f.dir.path()),
            bytes,
            "{} from {key:?}",
            t.name
        );
        assert_eq!(
            (fed.data_type, fed.dims.clone()),
            (t.data_type, t.dims.iter().map(|&d| d as u64).collect())
        );
        for e in t.external_data.iter_mut().filter(|e| e.key == "location") {
            // In memory the location is the payload's file name.
            assert_eq!(e.value, fed.file_name);
            e.value = format!("m4.onnx.weights/{}", fed.file_name);
        }
        seen += 1;
    }
    assert_eq!(seen, built.tensors.len());
    assert_eq!(
        mem_model, file_model,
        "the same model but for the locations"
    );
}
