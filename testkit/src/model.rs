//! Synthetic models built through the prost types, written like an editor
//! saves, and the D3 digests of their initializers.

use std::path::Path;

use bytes::Bytes;
use ctcache::onnx::Model;
use ctcache::pb;
use ctcache::pb::tensor_shape_proto::{dimension, Dimension};
use ctcache::pb::type_proto::{Tensor, Value as TypeValue};
use prost::Message;

/// A metadata entry.
pub fn kv(k: &str, v: &str) -> pb::StringStringEntryProto {
    pb::StringStringEntryProto {
        key: k.into(),
        value: v.into(),
    }
}

/// A FLOAT tensor `name[dims]` holding `values` inline.
pub fn f32_tensor(name: &str, dims: &[i64], values: &[f32]) -> pb::TensorProto {
    f32_tensor_from(name, dims, values.iter().copied())
}

/// [`f32_tensor`] of generated values.
pub fn f32_tensor_from(
    name: &str,
    dims: &[i64],
    values: impl IntoIterator<Item = f32>,
) -> pb::TensorProto {
    let values = values.into_iter();
    let mut raw = Vec::with_capacity(values.size_hint().0 * 4);
    for v in values {
        raw.extend_from_slice(&v.to_le_bytes());
    }
    pb::TensorProto {
        name: name.into(),
        data_type: 1,
        dims: dims.to_vec(),
        raw_data: Bytes::from(raw),
        ..Default::default()
    }
}

/// A node `op` named `name` reading `inputs`, writing `output`.
pub fn node(op: &str, name: &str, inputs: &[&str], output: &str) -> pb::NodeProto {
    pb::NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    }
}

/// A graph input or output: FLOAT of static shape `dims`.
pub fn tensor_info(name: &str, dims: &[i64]) -> pb::ValueInfoProto {
    let dim = dims
        .iter()
        .map(|&d| Dimension {
            value: Some(dimension::Value::DimValue(d)),
            denotation: String::new(),
        })
        .collect();
    let tensor = Tensor {
        elem_type: 1,
        shape: Some(pb::TensorShapeProto { dim }),
    };
    pb::ValueInfoProto {
        name: name.into(),
        r#type: Some(pb::TypeProto {
            value: Some(TypeValue::TensorType(tensor)),
            denotation: String::new(),
        }),
        ..Default::default()
    }
}

/// The xorshift32 stream from state `x` (the state after each step); the
/// pseudo-random source of synthetic weights. A zero state stays zero.
pub fn xorshift(mut x: u32) -> impl Iterator<Item = u32> {
    std::iter::repeat_with(move || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    })
}

/// `x` mapped linearly onto [-1, 1].
pub fn unit_f32(x: u32) -> f32 {
    (x as f32 / u32::MAX as f32) * 2.0 - 1.0
}

/// A model `Y = X @ W` with `W[k, n]` FLOAT inline: one MatMul node in a
/// graph named `g`, ir_version 9 and default-domain opset 17 unless
/// [`MatMul::opset`] says otherwise, no declared inputs or outputs unless
/// [`MatMul::with_io`].
pub struct MatMul {
    k: i64,
    n: i64,
    model: pb::ModelProto,
}

impl MatMul {
    /// W's `k * n` values are the first of `w`.
    pub fn new(k: usize, n: usize, w: impl IntoIterator<Item = f32>) -> MatMul {
        let w = f32_tensor_from("W", &[k as i64, n as i64], w.into_iter().take(k * n));
        let node = pb::NodeProto {
            input: vec!["X".into(), "W".into()],
            output: vec!["Y".into()],
            op_type: "MatMul".into(),
            ..Default::default()
        };
        let graph = pb::GraphProto {
            name: "g".into(),
            node: vec![node],
            initializer: vec![w],
            ..Default::default()
        };
        let model = pb::ModelProto {
            graph: Some(graph),
            ..Default::default()
        };
        MatMul {
            k: k as i64,
            n: n as i64,
            model,
        }
        .opset(9, 17)
    }

    /// The model's ir_version and its default-domain opset version.
    pub fn opset(mut self, ir_version: i64, opset: i64) -> MatMul {
        self.model.ir_version = ir_version;
        self.model.opset_import = vec![pb::OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }];
        self
    }

    pub fn producer(mut self, name: &str) -> MatMul {
        self.model.producer_name = name.into();
        self
    }

    /// Declares the graph input `X[1, k]` and output `Y[1, n]`.
    pub fn with_io(mut self) -> MatMul {
        let g = self.model.graph.as_mut().expect("a graph");
        g.input = vec![tensor_info("X", &[1, self.k])];
        g.output = vec![tensor_info("Y", &[1, self.n])];
        self
    }

    /// Adds a model metadata entry.
    pub fn metadata(mut self, k: &str, v: &str) -> MatMul {
        self.model.metadata_props.push(kv(k, v));
        self
    }

    pub fn proto(self) -> pb::ModelProto {
        self.model
    }

    pub fn encode(self) -> Vec<u8> {
        self.model.encode_to_vec()
    }
}

/// Writes `bytes` to `path` atomically: a temp file beside it, then a rename
/// (like an editor's save; a watcher never sees a partial model).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// [`write_atomic`], panicking on an error.
pub fn write_model(path: &Path, bytes: &[u8]) {
    write_atomic(path, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// Opens an in-memory model (relative external data resolves against `.`).
pub fn open_proto(m: &pb::ModelProto) -> Model {
    Model::from_bytes(Bytes::from(m.encode_to_vec()), ".").unwrap()
}

/// The blake3 D3 digest of initializer `name` of `model`.
pub fn initializer_digest(model: &Model, name: &str) -> Vec<u8> {
    let t = model
        .initializers()
        .unwrap()
        .into_iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no initializer {name}"));
    ctcache::digest::digest_tensor(model, &t, ctcache::digest::Algorithm::Blake3)
        .unwrap()
        .bytes
        .to_vec()
}

/// [`initializer_digest`] of a model file.
pub fn digest_of_file(path: &Path, name: &str) -> Vec<u8> {
    initializer_digest(&Model::open(path).unwrap(), name)
}
