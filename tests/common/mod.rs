//! Shared builders for the core crate's integration tests: small valid
//! models with and without compiled tensors, built through the prost types.

#![allow(dead_code, unused_imports)]

use bytes::Bytes;
use ctcache::pb;
use ctcache::pb::struct_type_proto::{self as st, Kind};
use ctcache::pb::type_proto::{Tensor, Value as TypeValue};
use ctcache_testkit::{initializer_digest, MatMul};

pub use ctcache_testkit::{f32_tensor, kv, open_proto as open};

pub fn scalar(elem: i32) -> pb::TypeProto {
    pb::TypeProto {
        value: Some(TypeValue::TensorType(Tensor {
            elem_type: elem,
            shape: None,
        })),
        denotation: String::new(),
    }
}

pub fn array(elem: pb::TypeProto, count: st::array::Count) -> Kind {
    Kind::Array(Box::new(st::Array {
        element_type: Some(Box::new(elem)),
        count: Some(count),
    }))
}

pub fn static_type(kind: Kind) -> pb::TypeProto {
    pb::TypeProto {
        value: Some(TypeValue::StructType(Box::new(pb::StructTypeProto {
            kind: Some(kind),
            ..Default::default()
        }))),
        denotation: String::new(),
    }
}

/// `test.copy.f32`: FLOAT[n], one dims_param.
pub fn copy_type() -> pb::StructTypeProto {
    pb::StructTypeProto {
        kind: Some(array(scalar(1), st::array::Count::DimsIndex(0))),
        name: "test.copy.f32".into(),
        dims_param: vec!["n".into()],
        metadata_props: vec![
            kv("ctcache.format_version", "1"),
            kv("ctcache.packer", "test.copy"),
        ],
        ..Default::default()
    }
}

/// A MatMul model Y = X @ W with W[4, 8] FLOAT.
pub fn base_model() -> pb::ModelProto {
    let w = (0..32).map(|i| i as f32 * 0.5 - 3.0);
    MatMul::new(4, 8, w)
        .opset(10, 21)
        .producer("ctcache-tests")
        .with_io()
        .proto()
}

/// The host CPU device, as entries built here record it.
pub fn cpu() -> pb::DeviceProto {
    ctcache::device::host_cpu()
}

/// D3 blake3 digest of W computed through the library.
pub fn digest_of(model: &pb::ModelProto, name: &str) -> Vec<u8> {
    initializer_digest(&open(model), name)
}

/// `base_model` with one valid compiled entry (a FLOAT copy of W, inline).
pub fn compiled_model() -> pb::ModelProto {
    let mut m = base_model();
    let digest = digest_of(&m, "W");
    let payload = m.graph.as_ref().unwrap().initializer[0].raw_data.clone();
    m.struct_types = vec![copy_type()];
    m.devices = vec![cpu()];
    m.compiled_tensors = vec![pb::CompiledTensorProto {
        source_name: "W".into(),
        value: Some(pb::StructProto {
            r#type: 0,
            raw_data: payload,
            dims: vec![32],
            ..Default::default()
        }),
        device: 0,
        source_digest: Bytes::from(digest),
        digest_algorithm: "blake3".into(),
        metadata_props: vec![],
    }];
    m
}
