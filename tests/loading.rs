//! The loading rules: each miss reason, in the proposal's order, and a hit.

mod common;

use bytes::Bytes;
use common::*;
use ctcache::check::CheckOptions;
use ctcache::device::RuntimeIdentity;
use ctcache::pb;
use ctcache::resolve::{classify, Host, Status};

fn host() -> Host {
    test_host()
}

fn status(m: &pb::ModelProto, host: &Host) -> Result<(), (String, String)> {
    let s = classify(&open(m), host, &CheckOptions::default());
    match &s[0].status {
        Status::Hit { .. } => Ok(()),
        Status::Miss(r) => Err((r.code().to_string(), r.to_string())),
    }
}

#[test]
fn reasons_in_order() {
    let h = host();
    assert_eq!(status(&compiled_model(), &h), Ok(()));

    let mut m = compiled_model();
    m.compiled_tensors[0].digest_algorithm = "md5".into();
    assert_eq!(status(&m, &h).unwrap_err().0, "unknown_digest_algorithm");

    let mut m = compiled_model();
    m.compiled_tensors[0].source_digest = Bytes::from(vec![0u8; 32]);
    // A stale digest wins over an incompatible device (digest is checked first).
    m.devices[0].architecture = "riscv64-rvv".into();
    assert_eq!(status(&m, &h).unwrap_err().0, "stale_digest");

    let mut m = compiled_model();
    m.devices[0].architecture = "riscv64-rvv".into();
    let (code, detail) = status(&m, &h).unwrap_err();
    assert_eq!(code, "incompatible_device");
    assert!(detail.contains("architecture"), "{detail}");

    let mut m = compiled_model();
    m.devices[0].metadata_props = vec![kv("cpu.features", "imaginary-isa-ext")];
    let (code, detail) = status(&m, &h).unwrap_err();
    assert_eq!(code, "incompatible_device");
    assert!(detail.contains("cpu.features"), "{detail}");

    let mut m = compiled_model();
    m.devices[0].runtime = "onnxruntime".into();
    m.devices[0].runtime_version = "2.0.0".into();
    let with_rt = Host::new(
        vec![cpu()],
        Some(RuntimeIdentity {
            name: "onnxruntime".into(),
            version: "1.20.0".into(),
        }),
        host().accept().clone(),
    );
    let (code, detail) = status(&m, &with_rt).unwrap_err();
    assert_eq!(code, "incompatible_device");
    assert!(detail.contains("runtime_version"), "{detail}");
    // Without a runtime named by the lookup, runtime checks are skipped.
    assert_eq!(status(&m, &h), Ok(()));

    let mut m = compiled_model();
    m.struct_types[0].metadata_props[0].value = "2".into();
    assert_eq!(status(&m, &h).unwrap_err().0, "unsupported_format_version");

    let mut m = compiled_model();
    m.struct_types[0].name = "vendor.secret".into();
    assert_eq!(status(&m, &h).unwrap_err().0, "unknown_physical_type");

    // Structural problems make the entry invalid (a miss), never an error.
    let mut m = compiled_model();
    m.compiled_tensors[0].device = 5;
    assert_eq!(status(&m, &h).unwrap_err().0, "invalid");
    let mut m = compiled_model();
    m.compiled_tensors[0].value.as_mut().unwrap().raw_data = Bytes::from_static(b"short");
    assert_eq!(status(&m, &h).unwrap_err().0, "invalid");
}

/// `m` encoded, with `extra` appended as a top-level field 1002 or 1000.
fn with_raw_field(m: &pb::ModelProto, number: u32, inner: &[u8]) -> ctcache::onnx::Model {
    use prost::Message;
    let mut bytes = m.encode_to_vec();
    ctcache::wire::put_len_prefix(&mut bytes, number, inner.len() as u64);
    bytes.extend_from_slice(inner);
    ctcache::onnx::Model::from_bytes(Bytes::from(bytes), ".").unwrap()
}

fn codes(model: &ctcache::onnx::Model) -> Vec<String> {
    classify(model, &host(), &CheckOptions::default())
        .iter()
        .map(|s| match &s.status {
            Status::Hit { .. } => "hit".to_string(),
            Status::Miss(r) => r.code().to_string(),
        })
        .collect()
}

#[test]
fn one_unreadable_initializer_spoils_only_its_own_entries() {
    let mut m = compiled_model();
    m.graph.as_mut().unwrap().initializer.push(pb::TensorProto {
        name: "bad".into(),
        data_type: 1,
        dims: vec![-2],
        ..Default::default()
    });
    let mut other = m.compiled_tensors[0].clone();
    other.source_name = "bad".into();
    m.compiled_tensors.push(other);
    let model = open(&m);
    assert!(model.initializers().is_err(), "the fixture must not parse");
    let s = classify(&model, &host(), &CheckOptions::default());
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].status, Status::Hit { host_device: 0 });
    match &s[1].status {
        Status::Miss(r) => {
            assert_eq!(r.code(), "not_a_source");
            assert!(r.detail().contains("negative"), "{r}");
        }
        other => panic!("{other:?}"),
    }
    let errors = ctcache::check::check_model(&model, &CheckOptions::default()).unwrap();
    assert_eq!(
        errors.iter().map(|e| e.rule).collect::<Vec<_>>(),
        ["source.readable"]
    );
}

#[test]
fn undecodable_extension_fields_are_misses_not_errors() {
    // A compiled tensor that does not decode: only that entry is a miss.
    let model = with_raw_field(&compiled_model(), 1002, &[0x0a, 0x05, 0x01]);
    assert_eq!(codes(&model), ["hit", "invalid"]);
    let s = classify(&model, &host(), &CheckOptions::default());
    assert!(
        matches!(&s[1].status, Status::Miss(ctcache::hit::MissReason::Invalid { rule, .. }) if *rule == "entry.decode")
    );
    // A struct type that does not decode: no entry can be trusted, the model
    // still loads with zero usable entries.
    let model = with_raw_field(&compiled_model(), 1000, &[0x0a, 0x05, 0x01]);
    assert_eq!(codes(&model), ["invalid"]);
    let rules: Vec<_> = ctcache::check::check_model(&model, &CheckOptions::default())
        .unwrap()
        .iter()
        .map(|e| e.rule)
        .collect();
    assert!(rules.contains(&"model.decode"), "{rules:?}");
}

#[test]
fn a_digest_of_the_wrong_length_for_its_algorithm_is_rejected() {
    for (alg, len, want) in [
        ("blake3", 16, "digest.length"),
        ("sha256", 64, "digest.length"),
        ("blake3", 32, ""),
    ] {
        let mut m = compiled_model();
        let e = &mut m.compiled_tensors[0];
        e.digest_algorithm = alg.into();
        let mut d = e.source_digest.to_vec();
        d.resize(len, 0);
        e.source_digest = Bytes::from(d);
        let errors = ctcache::check::check_model(&open(&m), &CheckOptions::default()).unwrap();
        let rules: Vec<_> = errors.iter().map(|e| e.rule).collect();
        if want.is_empty() {
            assert!(rules.is_empty(), "{rules:?}");
        } else {
            assert_eq!(rules, [want]);
            assert_eq!(status(&m, &host()).unwrap_err().0, "invalid");
        }
    }
    // An unknown algorithm is a miss, whatever the length.
    let mut m = compiled_model();
    m.compiled_tensors[0].digest_algorithm = "md5".into();
    m.compiled_tensors[0].source_digest = Bytes::from(vec![1u8; 16]);
    assert!(
        ctcache::check::check_model(&open(&m), &CheckOptions::default())
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_payload_checksum_is_checked_when_present() {
    let good = compiled_model();
    let payload = good.compiled_tensors[0]
        .value
        .as_ref()
        .unwrap()
        .raw_data
        .clone();
    let mut m = good.clone();
    m.compiled_tensors[0].metadata_props = vec![kv(
        "ctcache.payload.blake3",
        &ctcache::hit::payload_checksum(&payload),
    )];
    assert_eq!(status(&m, &host()), Ok(()));
    let mut flipped = payload.to_vec();
    flipped[3] ^= 1;
    m.compiled_tensors[0].value.as_mut().unwrap().raw_data = Bytes::from(flipped);
    let (code, detail) = status(&m, &host()).unwrap_err();
    assert_eq!(code, "payload_checksum", "{detail}");
    // Without the checksum the flipped bytes are not detectable here: the
    // digest is of the source, not of the payload.
    m.compiled_tensors[0].metadata_props.clear();
    assert_eq!(status(&m, &host()), Ok(()));
}
