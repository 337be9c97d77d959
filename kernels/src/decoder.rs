//! A small builder for decoder `FunctionProto`s: standard ONNX ops (opset
//! 21) from a type's leaves (inputs named by field path) to the FLOAT tensor
//! of the source shape (output `output`).

use bytes::Bytes;
use ctcache::dtype::DataType;
use ctcache::pb;
use ctcache::pb::attribute_proto::AttributeType;

/// Domain of every decoder function.
pub const DOMAIN: &str = "ctcache";
/// The ai.onnx opset the decoders use.
pub const OPSET: i64 = 21;
/// Name of the decoded value.
pub const OUTPUT: &str = "output";

pub(crate) struct Builder {
    nodes: Vec<pb::NodeProto>,
    next: usize,
}

pub(crate) fn int(name: &str, v: i64) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        r#type: AttributeType::Int as i32,
        i: v,
        ..Default::default()
    }
}

pub(crate) fn ints(name: &str, v: &[i64]) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        r#type: AttributeType::Ints as i32,
        ints: v.to_vec(),
        ..Default::default()
    }
}

pub(crate) fn string(name: &str, v: &str) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        r#type: AttributeType::String as i32,
        s: Bytes::copy_from_slice(v.as_bytes()),
        ..Default::default()
    }
}

fn tensor(dt: DataType, dims: &[i64], raw: Vec<u8>) -> pb::TensorProto {
    pb::TensorProto {
        dims: dims.to_vec(),
        data_type: dt.code(),
        raw_data: Bytes::from(raw),
        ..Default::default()
    }
}

impl Builder {
    pub(crate) fn new() -> Builder {
        Builder {
            nodes: Vec::new(),
            next: 0,
        }
    }

    /// Adds `op` and returns the name of its (single) output.
    pub(crate) fn op(
        &mut self,
        op: &str,
        inputs: &[&str],
        attrs: Vec<pb::AttributeProto>,
    ) -> String {
        let out = format!("t{}", self.next);
        self.next += 1;
        self.op_to(op, inputs, &out, attrs);
        out
    }

    /// Adds `op` writing `out`.
    pub(crate) fn op_to(
        &mut self,
        op: &str,
        inputs: &[&str],
        out: &str,
        attrs: Vec<pb::AttributeProto>,
    ) {
        self.nodes.push(pb::NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![out.to_string()],
            op_type: op.into(),
            attribute: attrs,
            ..Default::default()
        });
    }

    fn constant(&mut self, t: pb::TensorProto) -> String {
        let attr = pb::AttributeProto {
            name: "value".into(),
            r#type: AttributeType::Tensor as i32,
            t: Some(t),
            ..Default::default()
        };
        self.op("Constant", &[], vec![attr])
    }

    /// A 1-D INT64 constant.
    pub(crate) fn i64s(&mut self, v: &[i64]) -> String {
        let raw = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.constant(tensor(DataType::INT64, &[v.len() as i64], raw))
    }

    /// A scalar FLOAT constant.
    pub(crate) fn f32(&mut self, v: f32) -> String {
        self.constant(tensor(DataType::FLOAT, &[], v.to_le_bytes().to_vec()))
    }

    /// A scalar UINT8 constant.
    pub(crate) fn u8(&mut self, v: u8) -> String {
        self.constant(tensor(DataType::UINT8, &[], vec![v]))
    }

    /// `Cast(x, to=FLOAT)`.
    pub(crate) fn cast_f32(&mut self, x: &str) -> String {
        self.op("Cast", &[x], vec![int("to", DataType::FLOAT.code() as i64)])
    }

    /// Low and high nibbles of a UINT8 tensor, as two UINT8 tensors.
    pub(crate) fn nibbles(&mut self, x: &str) -> (String, String) {
        let m = self.u8(0x0f);
        let s = self.u8(4);
        let lo = self.op("BitwiseAnd", &[x, &m], vec![]);
        let hi = self.op("BitShift", &[x, &s], vec![string("direction", "RIGHT")]);
        (lo, hi)
    }

    pub(crate) fn finish(self, type_name: &str, inputs: &[&str]) -> pb::FunctionProto {
        pb::FunctionProto {
            name: type_name.replace('.', "_"),
            domain: DOMAIN.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![OUTPUT.into()],
            node: self.nodes,
            opset_import: vec![pb::OperatorSetIdProto {
                domain: String::new(),
                version: OPSET,
            }],
            doc_string: "decodes the payload leaves to the FLOAT source tensor".into(),
            ..Default::default()
        }
    }
}
