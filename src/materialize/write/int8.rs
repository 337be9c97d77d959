//! The `onnxruntime-int8` target, as `quantize_dynamic` writes it: the
//! quantized weight, scale and zero point of a weight (read from its
//! `ort.quantize_dynamic` payload), the DynamicQuantizeLinear /
//! MatMulInteger / Cast / Mul nodes replacing each target, and the
//! DequantizeLinear that later readers of a quantized weight read.

use std::collections::{HashMap, HashSet};

use super::names::Names;
use super::payload::{not_a_payload, Field, PayloadFields};
use super::proto::{find_opset_import, int_attr, node};
use super::{Additions, NewInputs, PackedWeight, Source, WeightKey};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::materialize::plan::{graph_value_names, GRAPH_OUTPUT};
use crate::materialize::{Int8Settings, Op, Step, Target, PACKER_INT8, TARGET_ORT_INT8};
use crate::onnx::Model;
use crate::pb;

/// Refuses a model whose ai.onnx opset (1 when it imports none, as onnx
/// reads it) has no DynamicQuantizeLinear.
pub(super) fn require_opset(model: &Model) -> Result<()> {
    let opset = find_opset_import(model, |o| o.domain.is_empty() || o.domain == "ai.onnx")?
        .map_or(1, |o| o.version);
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

fn layout(t: &Target, w: &PackedWeight, s: &Int8Settings) -> Result<Layout> {
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
/// `<B>_Transposed` for a Gemm B read transposed.
pub(super) fn inputs<'a>(
    t: &Target,
    w: &'a PackedWeight,
    s: &Int8Settings,
    add: &mut Additions<'a>,
) -> Result<NewInputs> {
    let l = layout(t, w, s)?;
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

/// The outputs of a DynamicQuantizeLinear of one input.
#[derive(Debug, Clone)]
pub(super) struct DynamicInput {
    quantized: String,
    scale: String,
    zero_point: String,
}

/// `quantize_dynamic`'s nodes for one MatMul (or Gemm): the input's
/// DynamicQuantizeLinear (once per input and graph), then
/// `Y = Cast(MatMulInteger(A_q, W_q, A_zp, W_zp)) * (A_scale * W_scale)`
/// (and, for a Gemm with C, `+ C`).
pub(super) fn replacement(
    t: &Target,
    ins: &NewInputs,
    quantized: &mut HashMap<(Vec<Step>, String), DynamicInput>,
    names: &mut Names,
) -> Vec<pb::NodeProto> {
    let a = t.node.input[0].clone();
    let y = t.node.output[0].clone();
    let mut nodes = Vec::new();
    let q = quantized
        .entry((t.scope.clone(), a.clone()))
        .or_insert_with(|| {
            let d = DynamicInput {
                quantized: names.fresh(format!("{a}_quantized")),
                scale: names.fresh(format!("{a}_scale")),
                zero_point: names.fresh(format!("{a}_zero_point")),
            };
            nodes.push(node(
                "DynamicQuantizeLinear",
                names.fresh(format!("{a}_QuantizeLinear")),
                vec![a.clone()],
                vec![d.quantized.clone(), d.scale.clone(), d.zero_point.clone()],
            ));
            d
        })
        .clone();
    // Gemm -> MatMul as the reference renames it.
    let base_name = match (&t.op, t.node.name.is_empty()) {
        (_, true) => String::new(),
        (Op::Gemm { .. }, false) => format!("{}_MatMul", t.node.name),
        (Op::MatMul, false) => t.node.name.clone(),
    };
    let named = |suffix: &str, names: &mut Names| {
        if base_name.is_empty() {
            String::new()
        } else {
            names.fresh(format!("{base_name}{suffix}"))
        }
    };
    let bias = match &t.op {
        Op::Gemm { bias: Some(c) } => Some(c.clone()),
        _ => None,
    };
    let out = match bias {
        Some(_) => names.fresh(format!("{y}_MatMul")),
        None => y.clone(),
    };
    let zp = ins.zero_points.clone().unwrap_or_default();
    let mm_name = named("_quant", names);
    let scales_out = if mm_name.is_empty() {
        names.fresh(format!("{}_{}_mul:0", q.scale, ins.scales))
    } else {
        names.fresh(format!("{mm_name}_scales_mul:0"))
    };
    nodes.push(node(
        "Mul",
        named("_quant_scales_mul", names),
        vec![q.scale.clone(), ins.scales.clone()],
        vec![scales_out.clone()],
    ));
    let mm_out = names.fresh(format!("{out}_output_quantized"));
    nodes.push(node(
        "MatMulInteger",
        mm_name,
        vec![q.quantized, ins.b.clone(), q.zero_point, zp],
        vec![mm_out.clone()],
    ));
    let cast_out = names.fresh(format!("{mm_out}_cast_output"));
    let mut cast = node(
        "Cast",
        names.fresh(format!("{mm_out}_cast")),
        vec![mm_out],
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
    if let Some(c) = bias {
        nodes.push(node(
            "Add",
            if t.node.name.is_empty() {
                String::new()
            } else {
                names.fresh(format!("{}_Add", t.node.name))
            },
            vec![out, c],
            vec![y],
        ));
    }
    nodes
}

/// quantize_dynamic's DequantizeLinear of a quantized weight: once a MatMul
/// has quantized W, every later top-level node that reads W (and a graph
/// output named W) reads `DequantizeLinear(W_quantized, W_scale,
/// W_zero_point)` instead, put before the first of them (after the last
/// node for an output only). Returns the weights so replaced (their FLOAT
/// initializer goes). A weight some node reads before it is quantized
/// keeps its FLOAT initializer for every reader (the reference would then
/// define W twice).
pub(super) fn dequantize_later_uses(
    src: &Source<'_>,
    s: &Int8Settings,
    inputs: &HashMap<WeightKey, NewInputs>,
    new_top: &mut HashMap<usize, Vec<pb::NodeProto>>,
    names: &mut Names,
) -> Result<HashSet<String>> {
    let top_nodes = &src.top_nodes;
    let mut first: HashMap<&str, usize> = HashMap::new();
    let mut rank: HashMap<&str, usize> = HashMap::new();
    let mut targets: HashSet<usize> = HashSet::new();
    for t in src.plan.targets.iter().filter(|t| t.scope.is_empty()) {
        targets.insert(t.node_index);
        if t.transposed {
            continue;
        }
        let f = first.entry(t.weight.as_str()).or_insert(t.node_index);
        *f = (*f).min(t.node_index);
        rank.insert(t.weight.as_str(), t.dims.len());
    }
    let outputs: HashSet<String> = graph_value_names(src.model, GRAPH_OUTPUT)?
        .into_iter()
        .collect();
    let mut done = HashSet::new();
    let mut weights: Vec<(&str, usize)> = first.into_iter().collect();
    weights.sort();
    for (w, q) in weights {
        let reads = |n: &pb::NodeProto| n.input.iter().any(|i| i == w);
        let readers: Vec<usize> = (0..top_nodes.len())
            .filter(|i| !targets.contains(i) && reads(&top_nodes[*i]))
            .collect();
        if readers.iter().any(|&i| i < q) {
            continue;
        }
        let at = match (readers.first(), outputs.contains(w)) {
            (Some(&i), _) => Some((i, true)),
            (None, true) => top_nodes.len().checked_sub(1).map(|i| (i, false)),
            (None, false) => None,
        };
        let Some((i, before)) = at else {
            continue;
        };
        let ins = &inputs[&(w.to_string(), false)];
        let mut dq = node(
            "DequantizeLinear",
            names.fresh(format!("{w}_DequantizeLinear")),
            vec![
                ins.b.clone(),
                ins.scales.clone(),
                ins.zero_points.clone().unwrap_or_default(),
            ],
            vec![w.to_string()],
        );
        if s.per_channel {
            dq.attribute
                .push(int_attr("axis", rank[w].saturating_sub(1) as i64));
        }
        let list = new_top
            .entry(i)
            .or_insert_with(|| vec![top_nodes[i].clone()]);
        if before {
            list.insert(0, dq);
        } else {
            list.push(dq);
        }
        done.insert(w.to_string());
    }
    Ok(done)
}
