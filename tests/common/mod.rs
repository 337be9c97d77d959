//! Shared builders for the core crate's integration tests: small valid
//! models with and without compiled tensors, built through the prost types.

#![allow(dead_code, unused_imports)]

use std::sync::Arc;

use bytes::Bytes;
use ctcache::dtype::DataType;
use ctcache::hit::{Accept, Host, KnownLayout, KnownTypes, MissReason, SourceShape, TypeRegistry};
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

/// The test types' registry: packer `test.copy` (format version 1) makes
/// [`copy_type`] with dims `[elements]` from a FLOAT source of any shape.
pub struct CopyTypes;

impl TypeRegistry for CopyTypes {
    fn candidates(
        &self,
        claimed: &pb::StructTypeProto,
        source: &SourceShape,
    ) -> Result<Vec<KnownLayout>, MissReason> {
        if ctcache::structs::metadata(&claimed.metadata_props, "ctcache.packer")
            != Some("test.copy")
        {
            return Err(MissReason::UnknownPhysicalType {
                name: claimed.name.clone(),
                detail: "not a test type".into(),
            });
        }
        let version = ctcache::structs::metadata(&claimed.metadata_props, "ctcache.format_version");
        if version != Some("1") {
            return Err(MissReason::UnsupportedFormatVersion {
                name: claimed.name.clone(),
                version: version.unwrap_or("").into(),
            });
        }
        if source.data_type != DataType::FLOAT {
            return Ok(vec![]);
        }
        let t = copy_type();
        Ok(vec![KnownLayout {
            key: ctcache::structs::physical_type_key(&t, &[], &Default::default()).unwrap(),
            type_name: t.name,
            dims: vec![source.dims.iter().product()],
            source: source.clone(),
            packer: "test.copy".into(),
            params: String::new(),
            format_version: 1,
        }])
    }
}

/// The host CPU, accepting the test types.
pub fn test_host() -> Host {
    Host::new(
        vec![cpu()],
        None,
        Accept::Known(Arc::new(KnownTypes::new(CopyTypes))),
    )
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
