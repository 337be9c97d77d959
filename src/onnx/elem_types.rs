//! Element types of a graph's values, as onnx's type inference gives them:
//! declared types first (inputs, initializers, value_info, outputs), then
//! each node's outputs from its inputs' types and attributes, subgraphs
//! included. A value whose type onnx could not infer (an op of another
//! domain, an input of unknown type) has none here either.
//!
//! Only element types: the float16 conversion asks which values are FLOAT,
//! not their shapes.

use std::collections::HashMap;

use crate::dtype::DataType;
use crate::onnx::graph::{attr, is_default_domain};
use crate::pb;

/// Value name -> ONNX element type code, over a graph and its subgraphs
/// (names are unique across them in a valid model).
#[derive(Debug, Clone, Default)]
pub struct ElemTypes(HashMap<String, i32>);

impl ElemTypes {
    /// The element type of `name`, if known.
    pub fn get(&self, name: &str) -> Option<i32> {
        self.0.get(name).copied()
    }

    /// Whether `name` is a FLOAT tensor.
    pub fn is_float(&self, name: &str) -> bool {
        self.get(name) == Some(DataType::FLOAT.code())
    }

    /// Declares `vi`'s type (a tensor, or a sequence of tensors).
    pub fn declare(&mut self, vi: &pb::ValueInfoProto) {
        if let Some(t) = value_elem_type(vi) {
            self.0.insert(vi.name.clone(), t);
        }
    }

    /// Declares an initializer's type.
    pub fn declare_tensor(&mut self, name: &str, data_type: i32) {
        self.0.insert(name.to_string(), data_type);
    }

    /// Infers the outputs of `nodes` (in order; a node whose inputs come
    /// later is inferred from what is known when it is reached, as onnx
    /// does for a sorted graph) and of every subgraph in them.
    pub fn infer(&mut self, nodes: &[pb::NodeProto]) {
        for n in nodes {
            for g in subgraphs(n) {
                self.infer_graph(g);
            }
            let outs = self.outputs(n);
            for (name, t) in n.output.iter().zip(outs) {
                if let (false, Some(t)) = (name.is_empty(), t) {
                    self.0.entry(name.clone()).or_insert(t);
                }
            }
        }
    }

    /// A subgraph: its declared values, then its nodes.
    fn infer_graph(&mut self, g: &pb::GraphProto) {
        for vi in g.input.iter().chain(&g.value_info) {
            self.declare(vi);
        }
        for t in &g.initializer {
            self.declare_tensor(&t.name, t.data_type);
        }
        self.infer(&g.node);
        for vi in &g.output {
            self.declare(vi);
        }
    }

    /// The output types of one node, by position.
    fn outputs(&self, n: &pb::NodeProto) -> Vec<Option<i32>> {
        let input = |i: usize| n.input.get(i).and_then(|x| self.get(x));
        // onnx's schemas mostly type outputs as input 0 (and fail when it
        // is unknown).
        let first = input(0);
        let int_attr = |name: &str| attr(n, name).map(|a| a.i as i32);
        let count = n.output.len();
        let all = |t: Option<i32>| vec![t; count];
        let int64 = Some(DataType::INT64.code());
        let float = Some(DataType::FLOAT.code());
        if !is_default_domain(n) {
            return all(match n.domain.as_str() {
                "com.microsoft" => ms_op(n, first),
                _ => None,
            });
        }
        match n.op_type.as_str() {
            "Constant" => all(constant_type(n)),
            "Cast" => all(int_attr("to")),
            "CastLike" => all(input(1)),
            "ConstantOfShape" => all(attr(n, "value")
                .and_then(|a| a.t.as_ref())
                .map_or(float, |t| Some(t.data_type))),
            "Shape" | "Size" | "NonZero" | "ArgMax" | "ArgMin" | "NonMaxSuppression" => all(int64),
            "Equal" | "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" | "Not" | "And"
            | "Or" | "Xor" | "IsNaN" | "IsInf" => all(Some(DataType::BOOL.code())),
            "RandomNormal" | "RandomUniform" => all(int_attr("dtype").or(float)),
            "RandomNormalLike" | "RandomUniformLike" | "EyeLike" | "Bernoulli" => {
                all(int_attr("dtype").or(input(0)))
            }
            "Multinomial" => all(int_attr("dtype").or(Some(DataType::INT32.code()))),
            "Where" => all(input(1)),
            "OneHot" => all(input(2)),
            "TopK" | "MaxPool" => vec![input(0), int64],
            "Unique" => vec![input(0), int64, int64, int64],
            "Dropout" => vec![input(0), Some(DataType::BOOL.code())],
            "LayerNormalization" => {
                let stash = int_attr("stash_type").or(float);
                vec![input(0), stash, stash]
            }
            "DynamicQuantizeLinear" => vec![
                Some(DataType::UINT8.code()),
                float,
                Some(DataType::UINT8.code()),
            ],
            "QuantizeLinear" => all(int_attr("output_dtype")
                .filter(|t| *t != 0)
                .or(input(2))
                .or(Some(DataType::UINT8.code()))),
            "DequantizeLinear" => all(input(1)),
            "MatMulInteger" | "ConvInteger" => all(Some(DataType::INT32.code())),
            "QLinearConv" | "QLinearMatMul" => all(input(7)),
            "If" => self.branch_outputs(n, "then_branch", 0),
            "Loop" => self.branch_outputs(n, "body", 1),
            "Scan" => self.branch_outputs(n, "body", 0),
            "StringNormalizer" => all(Some(DataType::STRING.code())),
            "TfIdfVectorizer" => all(float),
            "SequenceEmpty" | "SequenceConstruct" | "SequenceInsert" | "SequenceAt"
            | "SequenceErase" | "SequenceLength" | "SplitToSequence" | "ConcatFromSequence"
            | "Optional" | "OptionalGetElement" | "OptionalHasElement" => all(None),
            _ => all(first),
        }
    }
}

impl ElemTypes {
    /// The outputs of a control-flow node: its body's outputs (as declared,
    /// else as inferred), less the first `skip` (Loop's condition).
    fn branch_outputs(&self, n: &pb::NodeProto, body: &str, skip: usize) -> Vec<Option<i32>> {
        let outs: Vec<Option<i32>> = attr(n, body)
            .and_then(|a| a.g.as_ref())
            .map(|g| {
                g.output
                    .iter()
                    .skip(skip)
                    .map(|o| value_elem_type(o).or_else(|| self.get(&o.name)))
                    .collect()
            })
            .unwrap_or_default();
        (0..n.output.len())
            .map(|i| outs.get(i).copied().flatten())
            .collect()
    }
}

/// The element type of a tensor value_info.
fn value_elem_type(vi: &pb::ValueInfoProto) -> Option<i32> {
    use pb::type_proto::Value;
    match vi.r#type.as_ref()?.value.as_ref()? {
        Value::TensorType(t) if t.elem_type != 0 => Some(t.elem_type),
        _ => None,
    }
}

/// A Constant's type from whichever value attribute it has.
fn constant_type(n: &pb::NodeProto) -> Option<i32> {
    let a = n.attribute.first()?;
    match a.name.as_str() {
        "value" => a.t.as_ref().map(|t| t.data_type),
        "value_float" | "value_floats" => Some(DataType::FLOAT.code()),
        "value_int" | "value_ints" => Some(DataType::INT64.code()),
        "value_string" | "value_strings" => Some(DataType::STRING.code()),
        "sparse_value" => a
            .sparse_tensor
            .as_ref()
            .and_then(|s| s.values.as_ref())
            .map(|t| t.data_type),
        _ => None,
    }
}

/// onnx knows the contrib ops whose schemas onnxruntime registers with it
/// only when onnxruntime is imported; onnx's own inference leaves them
/// unknown, so only a few are answered here, as their schemas say.
fn ms_op(n: &pb::NodeProto, first: Option<i32>) -> Option<i32> {
    match n.op_type.as_str() {
        "MatMulNBits" => first,
        _ => None,
    }
}

/// The graphs in a node's attributes.
pub(crate) fn subgraphs(n: &pb::NodeProto) -> impl Iterator<Item = &pb::GraphProto> {
    n.attribute
        .iter()
        .flat_map(|a| a.g.iter().chain(a.graphs.iter()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> pb::NodeProto {
        pb::NodeProto {
            op_type: op.into(),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn types_flow_through_nodes_and_stop_at_unknown_ops() {
        let mut t = ElemTypes::default();
        t.declare_tensor("x", DataType::FLOAT.code());
        let mut custom = node("Custom", &["x"], &["c"]);
        custom.domain = "example.org".into();
        t.infer(&[
            node("Shape", &["x"], &["s"]),
            node("Relu", &["x"], &["r"]),
            node("Equal", &["r", "r"], &["e"]),
            node("Where", &["e", "r", "r"], &["w"]),
            custom,
            node("Relu", &["c"], &["after"]),
            node("TopK", &["w", "s"], &["v", "i"]),
        ]);
        assert_eq!(t.get("s"), Some(DataType::INT64.code()));
        assert!(t.is_float("r") && t.is_float("w") && t.is_float("v"));
        assert_eq!(t.get("e"), Some(DataType::BOOL.code()));
        assert_eq!(t.get("i"), Some(DataType::INT64.code()));
        assert_eq!(t.get("c"), None);
        assert_eq!(t.get("after"), None);
    }
}
