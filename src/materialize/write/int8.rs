//! The `onnxruntime-int8` target, as `quantize_dynamic` writes it: the
//! quantized weight, scale and zero point of a weight (read from its
//! `ort.quantize_dynamic` payload), the DynamicQuantizeLinear /
//! MatMulInteger or ConvInteger / Cast / Mul nodes replacing each MatMul,
//! Gemm or Conv, the Gather on a quantized table, and the DequantizeLinear
//! that later float readers of a quantized weight or table row read.

use std::collections::{HashMap, HashSet};

use super::additions::Additions;
use super::fields::{not_a_payload, Field, PayloadFields};
use super::names::Names;
use super::proto::{int_attr, node};
use super::weight::{NewInputs, PackedWeight, Source, WeightKey};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::materialize::plan::graph_value_names;
use crate::materialize::{
    Int8Settings, Int8Weight, Op, Step, Target, PACKER_INT8, TARGET_ORT_INT8,
};
use crate::onnx::fields::GRAPH_OUTPUT;
use crate::onnx::Model;
use crate::pb;

/// Refuses a model whose ai.onnx opset (1 when it imports none, as onnx
/// reads it) has no DynamicQuantizeLinear.
pub(super) fn require_opset(model: &Model) -> Result<()> {
    let opset = model.default_opset()?.unwrap_or(1);
    if opset < 11 {
        return Err(Error::Rewrite(format!(
            "materialize: the model imports ai.onnx opset {opset}; {TARGET_ORT_INT8} needs 11 or later (DynamicQuantizeLinear)"
        )));
    }
    Ok(())
}

/// The fields of the quantized weight, scale and zero point of an
/// `ort.quantize_dynamic` payload, checked against the target; scale and
/// zero point with the dims the model gives them (`[]` per tensor, `[C]`
/// per channel).
struct Layout {
    quantized: Field,
    scale: Field,
    zero_point: Field,
}

fn layout(t: &Target, w: &PackedWeight, s: Int8Weight) -> Result<Layout> {
    let bad = |what: String| not_a_payload(t, PACKER_INT8, what);
    let fields = PayloadFields::read(w, &bad)?;
    let qt = if s.signed {
        DataType::INT8
    } else {
        DataType::UINT8
    };
    let want: Vec<u64> = if t.transposed {
        vec![t.k, t.n]
    } else {
        t.dims.clone()
    };
    let quantized = fields.get("quantized")?;
    if quantized.data_type != qt || quantized.shape != want {
        return Err(bad(format!(
            "quantized is {} {:?}, expected {qt} {want:?}",
            quantized.data_type, quantized.shape
        )));
    }
    let c = if s.per_channel { t.n } else { 1 };
    let mut scale = fields.get("scale")?;
    let mut zero_point = fields.get("zero_point")?;
    if scale.data_type != DataType::FLOAT
        || scale.shape != [c]
        || zero_point.data_type != qt
        || zero_point.shape != [c]
    {
        return Err(bad(format!(
            "scale {} {:?} and zero point {} {:?}, expected FLOAT [{c}] and {qt} [{c}]",
            scale.data_type, scale.shape, zero_point.data_type, zero_point.shape
        )));
    }
    let channel_dims = if s.per_channel { vec![c] } else { Vec::new() };
    scale.shape.clone_from(&channel_dims);
    zero_point.shape = channel_dims;
    Ok(Layout {
        quantized,
        scale,
        zero_point,
    })
}

/// The `quantize_dynamic` initializers of one weight, named as it names
/// them: `<W>_quantized`, `<W>_scale`, `<W>_zero_point`, with `<W>` =
/// `<B>_Transposed` for a Gemm B read transposed; quantized as `t` (the
/// first node that reads it) asks.
pub(super) fn inputs<'a>(
    t: &Target,
    w: &'a PackedWeight,
    s: &Int8Settings,
    add: &mut Additions<'a>,
) -> Result<NewInputs> {
    let l = layout(t, w, s.weight_for(&t.op))?;
    let base = if t.transposed {
        add.names.fresh(format!("{}_Transposed", t.weight))
    } else {
        t.weight.clone()
    };
    let b = add.append_fresh(format!("{base}_quantized"), w, l.quantized);
    let scales = add.append_fresh(format!("{base}_scale"), w, l.scale);
    let z = add.append_fresh(format!("{base}_zero_point"), w, l.zero_point);
    Ok(NewInputs {
        b,
        scales,
        zero_points: Some(z),
    })
}

/// A value in its quantized form, as later quantized nodes read it: the
/// outputs of a DynamicQuantizeLinear, or a quantized Gather's output with
/// its table's scale and zero point.
#[derive(Debug, Clone)]
pub(super) struct QuantizedValue {
    quantized: String,
    scale: String,
    zero_point: String,
}

/// The quantized form of each value by (graph, name): quantize_dynamic's
/// value map.
pub(super) type QuantizedValues = HashMap<(Vec<Step>, String), QuantizedValue>;

/// quantize_dynamic's nodes for one target.
pub(super) fn replacement(
    t: &Target,
    ins: &NewInputs,
    values: &mut QuantizedValues,
    add: &mut Additions<'_>,
) -> Vec<pb::NodeProto> {
    match t.op {
        Op::Gather => vec![gather(t, ins, values, &mut add.names)],
        _ => integer_op(t, ins, values, add),
    }
}

/// The Gather on the quantized table; its output, `<Y>_quantized`, is the
/// quantized form of Y, with the table's scale and zero point.
fn gather(
    t: &Target,
    ins: &NewInputs,
    values: &mut QuantizedValues,
    names: &mut Names,
) -> pb::NodeProto {
    let y = &t.node.output[0];
    let quantized = names.fresh(format!("{y}_quantized"));
    values.insert(
        (t.scope.clone(), y.clone()),
        QuantizedValue {
            quantized: quantized.clone(),
            scale: ins.scales.clone(),
            zero_point: ins.zero_points.clone().unwrap_or_default(),
        },
    );
    let mut g = t.node.clone();
    g.input[0].clone_from(&ins.b);
    g.output[0] = quantized;
    g
}

/// The quantized form of input `a` of a node in `scope`: known already (a
/// quantized Gather's output, an input quantized for an earlier node), or a
/// new DynamicQuantizeLinear of it, pushed to `nodes`.
fn quantized_input(
    scope: &[Step],
    a: &str,
    values: &mut QuantizedValues,
    names: &mut Names,
    nodes: &mut Vec<pb::NodeProto>,
) -> QuantizedValue {
    values
        .entry((scope.to_vec(), a.to_string()))
        .or_insert_with(|| {
            let d = QuantizedValue {
                quantized: names.fresh(format!("{a}_quantized")),
                scale: names.fresh(format!("{a}_scale")),
                zero_point: names.fresh(format!("{a}_zero_point")),
            };
            nodes.push(node(
                "DynamicQuantizeLinear",
                names.fresh(format!("{a}_QuantizeLinear")),
                vec![a.to_string()],
                vec![d.quantized.clone(), d.scale.clone(), d.zero_point.clone()],
            ));
            d
        })
        .clone()
}

/// The nodes of one MatMul, Gemm or Conv: its input quantized, then
/// `Y = Cast(MatMulInteger(A_q, W_q, A_zp, W_zp)) * (A_scale * W_scale)`
/// (ConvInteger with the Conv's attributes for a Conv), and its bias
/// added: a Gemm's C as it is, a Conv's B reshaped to [1, -1, 1, ...].
fn integer_op(
    t: &Target,
    ins: &NewInputs,
    values: &mut QuantizedValues,
    add: &mut Additions<'_>,
) -> Vec<pb::NodeProto> {
    let names = &mut add.names;
    let y = t.node.output[0].clone();
    let mut nodes = Vec::new();
    let q = quantized_input(&t.scope, &t.node.input[0], values, names, &mut nodes);
    // Gemm -> MatMul as the reference renames it.
    let (op_type, base_name, bias) = match &t.op {
        Op::Conv { bias } => ("ConvInteger", t.node.name.clone(), bias.clone()),
        Op::Gemm { bias } if !t.node.name.is_empty() => (
            "MatMulInteger",
            format!("{}_MatMul", t.node.name),
            bias.clone(),
        ),
        Op::Gemm { bias } => ("MatMulInteger", String::new(), bias.clone()),
        Op::MatMul | Op::Gather => ("MatMulInteger", t.node.name.clone(), None),
    };
    let conv = matches!(t.op, Op::Conv { .. });
    let named = |suffix: &str, names: &mut Names| {
        if base_name.is_empty() {
            String::new()
        } else {
            names.fresh(format!("{base_name}{suffix}"))
        }
    };
    let out = match (&bias, conv) {
        (None, _) => y.clone(),
        (Some(_), true) => names.fresh(format!("{y}quant_scaled_output")),
        (Some(_), false) => names.fresh(format!("{y}_MatMul")),
    };
    let zp = ins.zero_points.clone().unwrap_or_default();
    let int_name = named("_quant", names);
    // The scales Mul is named even for an unnamed node, as the reference does.
    let scales_mul = if int_name.is_empty() {
        format!("{}_{}_mul", q.scale, ins.scales)
    } else {
        format!("{int_name}_scales_mul")
    };
    let scales_out = names.fresh(format!("{scales_mul}:0"));
    nodes.push(node(
        "Mul",
        names.fresh(scales_mul),
        vec![q.scale.clone(), ins.scales.clone()],
        vec![scales_out.clone()],
    ));
    // ConvInteger's output is named after the Conv's, MatMulInteger's after
    // the (Gemm's) MatMul output.
    let int_out = names.fresh(format!("{}_output_quantized", if conv { &y } else { &out }));
    let mut integer = node(
        op_type,
        int_name,
        vec![q.quantized, ins.b.clone(), q.zero_point, zp],
        vec![int_out.clone()],
    );
    if conv {
        integer.attribute.clone_from(&t.node.attribute);
    }
    nodes.push(integer);
    let cast_out = names.fresh(format!("{int_out}_cast_output"));
    let mut cast = node(
        "Cast",
        names.fresh(format!("{int_out}_cast")),
        vec![int_out],
        vec![cast_out.clone()],
    );
    cast.attribute
        .push(int_attr("to", i64::from(DataType::FLOAT.code())));
    nodes.push(cast);
    nodes.push(node(
        "Mul",
        named("_quant_output_scale_mul", names),
        vec![cast_out, scales_out],
        vec![out.clone()],
    ));
    match bias {
        Some(c) if conv => nodes.extend(conv_bias(t, &out, c, add)),
        Some(c) => {
            let add_name = if t.node.name.is_empty() {
                String::new()
            } else {
                names.fresh(format!("{}_Add", t.node.name))
            };
            nodes.push(node("Add", add_name, vec![out, c], vec![y]));
        }
        None => {}
    }
    nodes
}

/// A Conv's bias `c` added to its scaled output `out`: reshaped to
/// `[1, -1, 1, ...]` (the weight's rank) by a new INT64 initializer
/// `<Y>_bias_reshape_shape`, as quantize_dynamic adds it.
fn conv_bias(t: &Target, out: &str, c: String, add: &mut Additions<'_>) -> Vec<pb::NodeProto> {
    let y = &t.node.output[0];
    let names = &mut add.names;
    let shape_name = names.fresh(format!("{y}_bias_reshape_shape"));
    let reshaped = names.fresh(format!("{y}_bias_reshape_output"));
    let shape: Vec<i64> = (0..t.dims.len())
        .map(|i| if i == 1 { -1 } else { 1 })
        .collect();
    add.initializers.push(pb::TensorProto {
        name: shape_name.clone(),
        data_type: DataType::INT64.code(),
        dims: vec![shape.len() as i64],
        int64_data: shape,
        ..Default::default()
    });
    vec![
        node(
            "Reshape",
            String::new(),
            vec![c, shape_name],
            vec![reshaped.clone()],
        ),
        node(
            "Add",
            names.fresh(format!("{y}_bias_add")),
            vec![out.to_string(), reshaped],
            vec![y.clone()],
        ),
    ]
}

/// quantize_dynamic's DequantizeLinear of a quantized value for the nodes
/// that read it as FLOAT:
/// - a weight: once a target has quantized W, every later top-level node
///   that reads W (and a graph output named W) reads
///   `DequantizeLinear(W_quantized, W_scale, W_zero_point)` instead. A
///   weight some node reads before it is quantized keeps its FLOAT
///   initializer for every reader (the reference would then define W
///   twice).
/// - a quantized Gather's output Y: every node that reads Y other than as
///   the quantized input of a MatMul, Gemm or Conv target (inside its
///   subgraphs too), and a graph output named Y, reads
///   `DequantizeLinear(Y_quantized, table scale, table zero point)`.
///
/// Each is put before the first such node (after the last node for an
/// output only). Returns the weights so replaced (their FLOAT initializer
/// goes).
pub(super) fn dequantize_later_uses(
    src: &Source<'_>,
    s: &Int8Settings,
    inputs: &HashMap<WeightKey, NewInputs>,
    values: &QuantizedValues,
    new_top: &mut HashMap<usize, Vec<pb::NodeProto>>,
    names: &mut Names,
) -> Result<HashSet<String>> {
    let top_nodes = &src.top_nodes;
    let targets: HashMap<usize, &Target> = src
        .plan
        .targets
        .iter()
        .filter(|t| t.scope.is_empty())
        .map(|t| (t.node_index, t))
        .collect();
    // Each weight read as stored, with the target that quantized it.
    let mut weights: Vec<&Target> = targets
        .values()
        .copied()
        .filter(|t| {
            !t.transposed
                && src
                    .plan
                    .first_reader(&t.weight, false)
                    .is_some_and(|f| f.node_index == t.node_index)
        })
        .collect();
    weights.sort_by_key(|t| t.weight.as_str());
    let outputs: HashSet<String> = graph_value_names(src.model, GRAPH_OUTPUT)?
        .into_iter()
        .collect();
    let mut at = Placing {
        top_nodes,
        outputs: &outputs,
        new_top,
        names,
    };
    let mut done = HashSet::new();
    for t in weights {
        let w = t.weight.as_str();
        let readers: Vec<usize> = (0..top_nodes.len())
            .filter(|i| !targets.contains_key(i) && top_nodes[*i].input.iter().any(|v| v == w))
            .collect();
        if readers.iter().any(|&i| i < t.node_index) {
            continue;
        }
        let ins = &inputs[&(w.to_string(), false)];
        let weight = QuantizedValue {
            quantized: ins.b.clone(),
            scale: ins.scales.clone(),
            zero_point: ins.zero_points.clone().unwrap_or_default(),
        };
        let axis = s
            .weight_for(&t.op)
            .per_channel
            .then(|| t.dims.len().saturating_sub(1) as i64);
        if at.dequantize(w, &weight, axis, &readers) {
            done.insert(w.to_string());
        }
    }
    let mut gathers: Vec<&&Target> = targets.values().filter(|t| t.op == Op::Gather).collect();
    gathers.sort_by_key(|t| t.node_index);
    for g in gathers {
        let y = &g.node.output[0];
        let Some(rows) = values.get(&(Vec::new(), y.clone())) else {
            continue;
        };
        let readers: Vec<usize> = (0..top_nodes.len())
            .filter(|&i| reads_as_float(&top_nodes[i], targets.get(&i).copied(), y))
            .collect();
        at.dequantize(y, rows, None, &readers);
    }
    Ok(done)
}

/// Whether `n` (the node of `target`, when it is one) reads `y` as FLOAT:
/// anywhere but as the quantized input of a MatMul, Gemm or Conv target.
fn reads_as_float(n: &pb::NodeProto, target: Option<&Target>, y: &str) -> bool {
    let quantizes_input = target.is_some_and(|t| t.op != Op::Gather);
    let skip = usize::from(quantizes_input);
    n.input.iter().skip(skip).any(|v| v == y) || reads_inside(n, y)
}

/// Whether a subgraph of `n` reads `y` (an outer-scope value).
fn reads_inside(n: &pb::NodeProto, y: &str) -> bool {
    n.attribute
        .iter()
        .flat_map(|a| a.g.iter().chain(a.graphs.iter()))
        .flat_map(|g| g.node.iter())
        .any(|inner| inner.input.iter().any(|v| v == y) || reads_inside(inner, y))
}

/// Where DequantizeLinear nodes go among the top-level nodes.
struct Placing<'a> {
    top_nodes: &'a [pb::NodeProto],
    outputs: &'a HashSet<String>,
    new_top: &'a mut HashMap<usize, Vec<pb::NodeProto>>,
    names: &'a mut Names,
}

impl Placing<'_> {
    /// `y = DequantizeLinear(q)` (along `axis`, when per channel) before the
    /// first of `readers`, or after the last node when only a graph output
    /// reads `y`; whether it was placed.
    fn dequantize(
        &mut self,
        y: &str,
        q: &QuantizedValue,
        axis: Option<i64>,
        readers: &[usize],
    ) -> bool {
        let at = match (readers.first(), self.outputs.contains(y)) {
            (Some(&i), _) => Some((i, true)),
            (None, true) => self.top_nodes.len().checked_sub(1).map(|i| (i, false)),
            (None, false) => None,
        };
        let Some((i, before)) = at else {
            return false;
        };
        let mut dq = node(
            "DequantizeLinear",
            self.names.fresh(format!("{y}_DequantizeLinear")),
            vec![q.quantized.clone(), q.scale.clone(), q.zero_point.clone()],
            vec![y.to_string()],
        );
        if let Some(axis) = axis {
            dq.attribute.push(int_attr("axis", axis));
        }
        let top_nodes = self.top_nodes;
        let list = self
            .new_top
            .entry(i)
            .or_insert_with(|| vec![top_nodes[i].clone()]);
        if before {
            list.insert(0, dq);
        } else {
            list.push(dq);
        }
        true
    }
}
