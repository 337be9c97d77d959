//! The ONNX protos the rewrites share: node and int-attribute builders,
//! tensors whose data lies at a payload's span, and the model's opset
//! imports.

use prost::Message;

use super::payload::Span;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::onnx::{ExternalRef, Model};
use crate::pb;

/// `ModelProto.opset_import`.
pub(super) const MODEL_OPSET_IMPORT: u32 = 8;

/// An INT attribute.
pub(super) fn int_attr(name: &str, i: i64) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        i,
        r#type: pb::attribute_proto::AttributeType::Int as i32,
        ..Default::default()
    }
}

/// A node of the default domain, without attributes.
pub(super) fn node(
    op: &str,
    name: String,
    inputs: Vec<String>,
    outputs: Vec<String>,
) -> pb::NodeProto {
    pb::NodeProto {
        input: inputs,
        output: outputs,
        name,
        op_type: op.into(),
        ..Default::default()
    }
}

/// A tensor whose data is `span` of the file at `location`.
pub(super) fn external_tensor(
    name: &str,
    data_type: DataType,
    dims: &[u64],
    location: &str,
    span: Span,
) -> pb::TensorProto {
    pb::TensorProto {
        name: name.into(),
        data_type: data_type.code(),
        dims: dims.iter().map(|&d| d as i64).collect(),
        external_data: ExternalRef {
            location: location.into(),
            offset: span.offset,
            length: Some(span.len),
        }
        .to_entries(),
        data_location: pb::tensor_proto::DataLocation::External as i32,
        ..Default::default()
    }
}

/// The model's first opset import that `wanted` accepts.
pub(super) fn find_opset_import(
    model: &Model,
    wanted: impl Fn(&pb::OperatorSetIdProto) -> bool,
) -> Result<Option<pb::OperatorSetIdProto>> {
    for f in model
        .top_fields()
        .iter()
        .filter(|f| f.number == MODEL_OPSET_IMPORT)
    {
        let o = pb::OperatorSetIdProto::decode(&model.bytes()[f.value.clone()])
            .map_err(|e| Error::decode("OperatorSetIdProto", e))?;
        if wanted(&o) {
            return Ok(Some(o));
        }
    }
    Ok(None)
}
