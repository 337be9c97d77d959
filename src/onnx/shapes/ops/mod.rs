//! The output shapes of one node, as the shape inference function of its
//! op's onnx schema gives them (data propagation off, as `infer_shapes`
//! runs by default). Ops not written here are [`Outcome::Unsupported`]:
//! the caller leaves their outputs without a type.

mod inputs;
mod math;
mod nn;
mod tensor;

use inputs::int_attr;
pub(crate) use inputs::{Inputs, Outcome};

use super::dims::{broadcast, Dim, Shape};
use crate::pb;

const UNARY: &[&str] = &[
    "Identity",
    "Cast",
    "CastLike",
    "Erf",
    "Sqrt",
    "Relu",
    "Sigmoid",
    "Tanh",
    "Exp",
    "Log",
    "Reciprocal",
    "Neg",
    "Abs",
    "Floor",
    "Ceil",
    "Not",
    "Softmax",
    "LogSoftmax",
    "Clip",
    "LeakyRelu",
    "Elu",
    "Selu",
    "HardSigmoid",
    "HardSwish",
    "Gelu",
    "Softplus",
    "Softsign",
    "Sign",
    "Round",
    "Sin",
    "Cos",
    "IsNaN",
    "IsInf",
    "Mish",
];

const BROADCAST: &[&str] = &[
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Equal",
    "Less",
    "Greater",
    "LessOrEqual",
    "GreaterOrEqual",
    "And",
    "Or",
    "Xor",
    "Mod",
    "Max",
    "Min",
    "Sum",
    "Mean",
    "Where",
];

const REDUCE: &[&str] = &[
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
];

/// The output shapes of `n` (ai.onnx opset `opset`) from `inputs`.
pub(crate) fn infer(n: &pb::NodeProto, opset: i64, inputs: &Inputs<'_>) -> Outcome {
    let op = n.op_type.as_str();
    let one = |s: Option<Shape>| Outcome::Shapes(vec![s]);
    if UNARY.contains(&op) {
        return one(inputs.shape(0).cloned());
    }
    if BROADCAST.contains(&op) {
        return match inputs.all_shapes() {
            Some(s) => broadcast(&s).map_or(Outcome::Fails, |s| one(Some(s))),
            None => one(None),
        };
    }
    if REDUCE.contains(&op) {
        return math::reduce(n, inputs);
    }
    match op {
        "Constant" => one(constant(n)),
        "Shape" => one(Some(vec![shape_length(n, inputs.shape(0))])),
        "Size" => one(Some(Vec::new())),
        // onnx refuses a negative dimension here (not in Expand's shape).
        "ConstantOfShape" => match inputs.shape_input(0) {
            Some(s) if s.iter().any(|d| matches!(d, Dim::Value(v) if *v < 0)) => Outcome::Fails,
            s => one(s),
        },
        "Gather" => tensor::gather(n, inputs),
        "Unsqueeze" => tensor::unsqueeze(n, opset, inputs),
        "Squeeze" => tensor::squeeze(n, opset, inputs),
        "Concat" => tensor::concat(n, inputs),
        "Reshape" if opset >= 5 => tensor::reshape(n, inputs),
        "Transpose" => tensor::transpose(n, inputs),
        "Expand" => match (inputs.shape(0), inputs.shape(1), inputs.shape_input(1)) {
            (Some(a), Some(_), Some(b)) => {
                broadcast(&[a, &b]).map_or(Outcome::Fails, |s| one(Some(s)))
            }
            _ => one(None),
        },
        "Slice" if opset >= 10 => tensor::slice(inputs),
        "MatMul" => math::matmul(inputs),
        "Gemm" => math::gemm(n, inputs),
        "LayerNormalization" => math::layer_norm(n, inputs),
        "Conv" | "ConvInteger" => nn::conv_pool(n, inputs, nn::Kind::Conv),
        "MaxPool" => nn::conv_pool(n, inputs, nn::Kind::pool(true, opset)),
        "AveragePool" => nn::conv_pool(n, inputs, nn::Kind::pool(opset >= 19, opset)),
        "LpPool" => nn::conv_pool(n, inputs, nn::Kind::pool(opset >= 18, opset)),
        "GlobalMaxPool" | "GlobalAveragePool" | "GlobalLpPool" => one(inputs.shape(0).map(|x| {
            let mut s = x.iter().take(2).cloned().collect::<Shape>();
            s.resize(x.len(), Dim::Value(1));
            s
        })),
        _ => Outcome::Unsupported,
    }
}

/// A Constant's shape from its value attribute.
fn constant(n: &pb::NodeProto) -> Option<Shape> {
    let a = n.attribute.first()?;
    match a.name.as_str() {
        "value" => {
            a.t.as_ref()
                .map(|t| t.dims.iter().map(|&d| Dim::Value(d)).collect())
        }
        "value_int" | "value_float" | "value_string" => Some(Vec::new()),
        "value_ints" => Some(vec![Dim::Value(a.ints.len() as i64)]),
        "value_floats" => Some(vec![Dim::Value(a.floats.len() as i64)]),
        "value_strings" => Some(vec![Dim::Value(a.strings.len() as i64)]),
        _ => None,
    }
}

/// Shape's one output dimension: its length when the input's rank is
/// known (start and end clamped as onnx clamps them).
fn shape_length(n: &pb::NodeProto, input: Option<&Shape>) -> Dim {
    let Some(s) = input else {
        return Dim::Unknown;
    };
    let rank = s.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank);
    let start = clamp(int_attr(n, "start").unwrap_or(0));
    let end = clamp(int_attr(n, "end").unwrap_or(rank));
    Dim::Value((end - start).max(0))
}
