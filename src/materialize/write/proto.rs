//! The ONNX protos the rewrites share: node and int-attribute builders,
//! tensors whose data lies at a payload's span.

use super::fields::Span;
use crate::dtype::DataType;
use crate::onnx::ExternalRef;
use crate::pb;

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
