//! The value_info that onnx's `infer_shapes` writes into a model's graph:
//! each node output's type and shape, a dimension nothing fixes named with
//! a fresh symbol (`unk__N`) as onnx names it.
//!
//! onnxruntime's optimizer reads these shapes: it fuses two values only
//! where their shapes are known equal, and two dimensions with the same
//! symbol are. The reference tools (`quantize_dynamic`,
//! `convert_float_to_float16`) run `infer_shapes` before they convert, so
//! a model converted without it is optimized differently and gives other
//! outputs. This runs the same inference for the top-level graph: the ops
//! in [`ops`], in onnx's order, with onnx's symbol numbering. A node of an
//! op not written there, or of another domain, is left untyped (as onnx
//! leaves ops it has no schema for), and values after it may get other
//! symbol numbers than onnx's (their equalities, which the optimizer
//! reads, stay as onnx finds them where the ops are written here).

mod dims;
mod ops;

use std::collections::{HashMap, HashSet};

use crate::dtype::DataType;
use crate::error::Result;
use crate::onnx::elem_types::{subgraphs, ElemTypes};
use crate::onnx::fields::{GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_OUTPUT, GRAPH_VALUE_INFO};
use crate::onnx::graph::is_default_domain;
use crate::onnx::model::decode;
use crate::onnx::{Model, TensorRef};
use crate::pb;
use dims::{merge_shape, Dim, Shape};
use ops::{Inputs, Outcome};

/// Constant values longer than this are not read (no shape is that long).
const MAX_CONSTANT_VALUES: u64 = 4096;

/// Shapes of more dimensions are kept as a type without a shape: a chain
/// of Unsqueezes cannot make the inference hold more than a bound.
const MAX_RANK: usize = 256;

/// What the inferred shapes may hold in all (dimensions and symbol bytes):
/// past it a model gets no value_info at all (onnxruntime infers its own).
/// A hostile model of long symbols or a long chain of wide values would
/// otherwise make the inference hold gigabytes.
const MAX_INFERRED_BYTES: usize = 64 << 20;

/// The value_info onnx's `infer_shapes` adds to `model`'s top-level graph
/// (whose `nodes` and `initializers` the caller has decoded already), in
/// the order it adds them. Values declared already (graph inputs, outputs,
/// value_info, initializers) are not among them.
pub fn inferred_value_info(
    model: &Model,
    nodes: &[pb::NodeProto],
    initializers: &[TensorRef],
) -> Result<Vec<pb::ValueInfoProto>> {
    let declared = [
        model.value_infos(GRAPH_VALUE_INFO)?,
        model.value_infos(GRAPH_INPUT)?,
        model.value_infos(GRAPH_OUTPUT)?,
    ];

    let mut types = ElemTypes::default();
    for vi in declared.iter().flatten() {
        types.declare(vi);
    }
    for t in initializers {
        types.declare_tensor(&t.name, t.data_type.code());
    }
    types.infer(nodes);

    let mut state = State {
        shapes: HashMap::new(),
        data: HashMap::new(),
        symbols: Symbols::default(),
    };
    for vi in declared.iter().flatten() {
        state.symbols.add_from(vi);
        // onnx types an output declared without a type as a new value.
        if vi.r#type.is_some() {
            state.shapes.insert(vi.name.clone(), tensor_shape(vi));
        }
    }
    for n in nodes {
        for g in subgraphs(n) {
            state.symbols.add_from_graph(g);
        }
    }
    let ranges = model.graph_fields(GRAPH_INITIALIZER)?;
    for (t, range) in initializers.iter().zip(ranges) {
        state
            .shapes
            .entry(t.name.clone())
            .or_insert_with(|| Some(t.dims.iter().map(|&d| Dim::Value(d as i64)).collect()));
        let ints = matches!(t.data_type, DataType::INT64 | DataType::INT32);
        if ints && t.elements <= MAX_CONSTANT_VALUES {
            let tensor: pb::TensorProto = decode(model.bytes().slice(range), "TensorProto")?;
            if let Some(v) = int_values(&tensor) {
                state.data.insert(t.name.clone(), v);
            }
        }
    }

    let opset = model.default_opset()?.unwrap_or(1);
    Ok(state.walk(nodes, &types, opset))
}

/// The bytes a shape holds: its dimensions and its symbols.
fn bytes_held(s: &Shape) -> usize {
    s.iter()
        .map(|d| match d {
            Dim::Param(p) => 16 + p.len(),
            _ => 16,
        })
        .sum()
}

/// What the inference has found so far.
struct State {
    /// Each typed value's shape (`None`: a type without a shape).
    shapes: HashMap<String, Option<Shape>>,
    /// Constant INT64/INT32 values by name.
    data: HashMap<String, Vec<i64>>,
    symbols: Symbols,
}

impl State {
    /// The value_info of `nodes`, in onnx's order (none at all past
    /// [`MAX_INFERRED_BYTES`]).
    fn walk(
        &mut self,
        nodes: &[pb::NodeProto],
        types: &ElemTypes,
        opset: i64,
    ) -> Vec<pb::ValueInfoProto> {
        let mut added = Vec::new();
        let mut held = 0usize;
        for n in nodes {
            if !is_default_domain(n) {
                continue;
            }
            let shapes = {
                let inputs = self.inputs(n, types);
                match ops::infer(n, opset, &inputs) {
                    Outcome::Shapes(s) => s,
                    Outcome::Fails | Outcome::Unsupported => continue,
                }
            };
            for (name, shape) in n.output.iter().zip(shapes) {
                let Some(elem) = types.get(name).filter(|_| !name.is_empty()) else {
                    continue;
                };
                let shape = shape
                    .filter(|s| s.len() <= MAX_RANK)
                    .map(|s| self.symbols.materialize(s));
                held += name.len() + shape.as_ref().map_or(0, bytes_held);
                if held > MAX_INFERRED_BYTES {
                    return Vec::new();
                }
                match self.shapes.get_mut(name) {
                    Some(existing) => {
                        // A declared number the inference contradicts: onnx
                        // fails the node there (its later outputs untyped).
                        if merge_shape(shape.as_ref(), existing).is_err() {
                            break;
                        }
                    }
                    None => {
                        added.push(value_info(name, elem, shape.as_ref()));
                        self.shapes.insert(name.clone(), shape);
                    }
                }
            }
            if n.op_type == "Constant" && n.output.len() == 1 {
                if let Some(v) = constant_ints(n) {
                    self.data.insert(n.output[0].clone(), v);
                }
            }
        }
        added
    }
    fn inputs<'a>(&'a self, n: &pb::NodeProto, types: &ElemTypes) -> Inputs<'a> {
        let known = |name: &String| !name.is_empty() && types.get(name).is_some();
        Inputs {
            shapes: n
                .input
                .iter()
                .map(|i| {
                    known(i)
                        .then(|| self.shapes.get(i).and_then(Option::as_ref))
                        .flatten()
                })
                .collect(),
            data: n
                .input
                .iter()
                .map(|i| self.data.get(i).map(Vec::as_slice))
                .collect(),
            typed: n.input.iter().map(known).collect(),
        }
    }
}

/// onnx's symbol table: the symbols the model uses, and fresh ones
/// (`unk__0`, `unk__1`, ...) that none of them is.
#[derive(Default)]
struct Symbols {
    existing: HashSet<String>,
    next: u64,
}

impl Symbols {
    fn add_from(&mut self, vi: &pb::ValueInfoProto) {
        for d in tensor_shape(vi).into_iter().flatten() {
            if let Dim::Param(p) = d {
                self.existing.insert(p);
            }
        }
    }

    fn add_from_graph(&mut self, g: &pb::GraphProto) {
        for vi in g.input.iter().chain(&g.output).chain(&g.value_info) {
            self.add_from(vi);
        }
        for n in &g.node {
            for sub in subgraphs(n) {
                self.add_from_graph(sub);
            }
        }
    }

    fn fresh(&mut self) -> String {
        loop {
            let s = format!("unk__{}", self.next);
            self.next += 1;
            if self.existing.insert(s.clone()) {
                return s;
            }
        }
    }

    /// Every dimension with nothing known named with a fresh symbol.
    fn materialize(&mut self, shape: Shape) -> Shape {
        shape
            .into_iter()
            .map(|d| match d {
                Dim::Unknown => Dim::Param(self.fresh()),
                d => d,
            })
            .collect()
    }
}

/// A tensor value_info's shape, if it has one.
fn tensor_shape(vi: &pb::ValueInfoProto) -> Option<Shape> {
    use pb::type_proto::Value;
    match vi.r#type.as_ref()?.value.as_ref()? {
        Value::TensorType(t) => t
            .shape
            .as_ref()
            .map(|s| s.dim.iter().map(Dim::from_proto).collect()),
        _ => None,
    }
}

fn value_info(name: &str, elem: i32, shape: Option<&Shape>) -> pb::ValueInfoProto {
    use pb::type_proto::{Tensor, Value};
    pb::ValueInfoProto {
        name: name.to_string(),
        r#type: Some(pb::TypeProto {
            value: Some(Value::TensorType(Tensor {
                elem_type: elem,
                shape: shape.map(|s| pb::TensorShapeProto {
                    dim: s.iter().map(Dim::to_proto).collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An INT64 or INT32 tensor's values held in the model.
fn int_values(t: &pb::TensorProto) -> Option<Vec<i64>> {
    if !t.external_data.is_empty() {
        return None;
    }
    let raw = &t.raw_data;
    match DataType::from_i32(t.data_type).ok()? {
        DataType::INT64 if !raw.is_empty() => Some(
            raw.chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect(),
        ),
        DataType::INT64 => Some(t.int64_data.clone()),
        DataType::INT32 if !raw.is_empty() => Some(
            raw.chunks_exact(4)
                .map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap_or_default())))
                .collect(),
        ),
        DataType::INT32 => Some(t.int32_data.iter().map(|&v| i64::from(v)).collect()),
        _ => None,
    }
}

/// A Constant node's INT64 values (or INT32 tensor's), as onnx tracks them.
fn constant_ints(n: &pb::NodeProto) -> Option<Vec<i64>> {
    let a = n.attribute.first()?;
    match a.name.as_str() {
        "value" => {
            a.t.as_ref()
                .filter(|t| {
                    t.dims
                        .iter()
                        .try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?))
                        .is_some_and(|n| n <= MAX_CONSTANT_VALUES)
                })
                .and_then(int_values)
        }
        "value_int" => Some(vec![a.i]),
        "value_ints" => Some(a.ints.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
