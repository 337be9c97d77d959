//! Shared builders for the core crate's integration tests: small valid
//! models with and without compiled tensors, built through the prost types.

#![allow(dead_code)]

use bytes::Bytes;
use ctcache::pb;
use ctcache::pb::struct_type_proto::{self as st, Kind};
use ctcache::pb::type_proto::{Tensor, Value as TypeValue};
use prost::Message;

pub fn kv(k: &str, v: &str) -> pb::StringStringEntryProto {
    pb::StringStringEntryProto {
        key: k.into(),
        value: v.into(),
    }
}

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

pub fn f32_tensor(name: &str, dims: &[i64], values: &[f32]) -> pb::TensorProto {
    pb::TensorProto {
        name: name.into(),
        data_type: 1,
        dims: dims.to_vec(),
        raw_data: Bytes::from(
            values
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        ),
        ..Default::default()
    }
}

/// A MatMul model Y = X @ W with W[4, 8] FLOAT.
pub fn base_model() -> pb::ModelProto {
    let w: Vec<f32> = (0..32).map(|i| i as f32 * 0.5 - 3.0).collect();
    let io = |name: &str, dims: &[i64]| pb::ValueInfoProto {
        name: name.into(),
        r#type: Some(pb::TypeProto {
            value: Some(TypeValue::TensorType(Tensor {
                elem_type: 1,
                shape: Some(pb::TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| pb::tensor_shape_proto::Dimension {
                            value: Some(pb::tensor_shape_proto::dimension::Value::DimValue(d)),
                            denotation: String::new(),
                        })
                        .collect(),
                }),
            })),
            denotation: String::new(),
        }),
        ..Default::default()
    };
    pb::ModelProto {
        ir_version: 10,
        opset_import: vec![pb::OperatorSetIdProto {
            domain: String::new(),
            version: 21,
        }],
        producer_name: "ctcache-tests".into(),
        graph: Some(pb::GraphProto {
            name: "g".into(),
            node: vec![pb::NodeProto {
                input: vec!["X".into(), "W".into()],
                output: vec!["Y".into()],
                op_type: "MatMul".into(),
                ..Default::default()
            }],
            initializer: vec![f32_tensor("W", &[4, 8], &w)],
            input: vec![io("X", &[1, 4])],
            output: vec![io("Y", &[1, 8])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The host CPU device, as entries built here record it.
pub fn cpu() -> pb::DeviceProto {
    ctcache::device::host_cpu()
}

/// D3 blake3 digest of W computed through the library.
pub fn digest_of(model: &pb::ModelProto, name: &str) -> Vec<u8> {
    let m = ctcache::onnx::Model::from_bytes(Bytes::from(model.encode_to_vec()), ".").unwrap();
    let t = m
        .initializers()
        .unwrap()
        .into_iter()
        .find(|t| t.name == name)
        .unwrap();
    ctcache::digest::digest_tensor(&m, &t, ctcache::digest::Algorithm::Blake3)
        .unwrap()
        .bytes
        .to_vec()
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

pub fn open(m: &pb::ModelProto) -> ctcache::onnx::Model {
    ctcache::onnx::Model::from_bytes(Bytes::from(m.encode_to_vec()), ".").unwrap()
}
