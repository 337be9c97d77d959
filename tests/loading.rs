//! The loading rules: each miss reason, in the proposal's order, and a hit.

mod common;

use bytes::Bytes;
use common::*;
use ctcache::check::CheckOptions;
use ctcache::device::RuntimeIdentity;
use ctcache::pb;
use ctcache::resolve::{classify, Host, Status};

fn host() -> Host {
    Host {
        devices: vec![cpu()],
        runtime: None,
        recognized: [("test.copy.f32", 1)].into_iter().collect(),
    }
}

fn status(m: &pb::ModelProto, host: &Host) -> Result<(), (String, String)> {
    let s = classify(&open(m), host, &CheckOptions::default()).unwrap();
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
    let with_rt = Host {
        runtime: Some(RuntimeIdentity {
            name: "onnxruntime".into(),
            version: "1.20.0".into(),
        }),
        ..host()
    };
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
