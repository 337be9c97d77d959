//! The `onnxruntime-fp16` target, as `convert_float_to_float16
//! (keep_io_types=True)` writes it: FLOAT initializers appended as FLOAT16
//! (from their `ort.float16` payloads), FLOAT tensors and Casts in nodes
//! and their subgraphs made FLOAT16, FLOAT graph inputs and outputs kept
//! behind Casts, nodes the converter keeps FLOAT behind Casts, and FLOAT
//! value_info made FLOAT16. The plan (`plan/fp16.rs`) decides which.

use std::collections::HashMap;

use super::additions::Additions;
use super::fields::PayloadFields;
use super::names::Names;
use super::proto::{int_attr, node};
use super::weight::{packed, PackedWeight, Source, WeightKey};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::materialize::plan::{fp16_node, Fp16Node, Fp16Plan};
use crate::materialize::{Fp16Settings, PACKER_FP16};
use crate::onnx::fields::{GRAPH_INPUT, GRAPH_OUTPUT};
use crate::onnx::graph::is_default_domain;
use crate::onnx::Model;
use crate::pb;

/// Each FLOAT initializer of the plan, appended under its own name as
/// FLOAT16 (external data in its payload file).
pub(super) fn add_initializers<'a>(
    src: &Source<'_>,
    weights: &'a HashMap<WeightKey, PackedWeight>,
    add: &mut Additions<'a>,
) -> Result<()> {
    for name in &src.plan.tensors {
        let w = packed(weights, name, false)?;
        let float = src
            .initializers
            .iter()
            .find(|t| &t.name == name)
            .ok_or_else(|| Error::Rewrite(format!("materialize: no initializer {name:?}")))?;
        let bad = |what: String| {
            Error::Rewrite(format!(
                "materialize: the cache entry for {name:?} is not an {PACKER_FP16} payload for this tensor: {what}"
            ))
        };
        let values = PayloadFields::read(w, &bad)?.get("values")?;
        if values.data_type != DataType::FLOAT16 || values.shape != float.dims {
            return Err(bad(format!(
                "values are {} {:?}, expected FLOAT16 {:?}",
                values.data_type, values.shape, float.dims
            )));
        }
        add.append(name, w, values);
    }
    Ok(())
}

/// A FLOAT tensor (or sequence of FLOAT tensors) value_info made FLOAT16;
/// false when it is not one.
pub(super) fn float_to_fp16(vi: &mut pb::ValueInfoProto) -> bool {
    use pb::type_proto::Value;
    let Some(t) = vi.r#type.as_mut() else {
        return false;
    };
    let tensor = match t.value.as_mut() {
        Some(Value::TensorType(tt)) => tt,
        Some(Value::SequenceType(seq)) => {
            match seq.elem_type.as_mut().and_then(|e| e.value.as_mut()) {
                Some(Value::TensorType(tt)) => tt,
                _ => return false,
            }
        }
        _ => return false,
    };
    if tensor.elem_type != DataType::FLOAT.code() {
        return false;
    }
    tensor.elem_type = DataType::FLOAT16.code();
    true
}

/// A FLOAT tensor held in a node (a Constant's value) as the converter
/// writes it: FLOAT16 raw data through the clamped cast; false when it is
/// not a FLOAT tensor with its data inline.
fn tensor_to_fp16(t: &mut pb::TensorProto, s: &Fp16Settings) -> bool {
    if t.data_type != DataType::FLOAT.code() || !t.external_data.is_empty() {
        return false;
    }
    let raw: Vec<u8> = if t.raw_data.is_empty() {
        t.float_data.iter().flat_map(|v| v.to_le_bytes()).collect()
    } else {
        t.raw_data.to_vec()
    };
    t.raw_data = (s.convert)(&raw).into();
    t.float_data.clear();
    t.data_type = DataType::FLOAT16.code();
    true
}

/// The graph's FLOAT tensor inputs (or outputs, by `field`): index and name.
fn float_tensor_values(model: &Model, field: u32) -> Result<Vec<(usize, String)>> {
    let mut out = Vec::new();
    for (i, vi) in model.value_infos(field)?.into_iter().enumerate() {
        let mut probe = vi.clone();
        if float_to_fp16(&mut probe)
            && matches!(
                vi.r#type.as_ref().and_then(|t| t.value.as_ref()),
                Some(pb::type_proto::Value::TensorType(_))
            )
        {
            out.push((i, vi.name));
        }
    }
    Ok(out)
}

/// A Cast of `input` to `to`.
fn cast(name: String, input: String, output: String, to: DataType) -> pb::NodeProto {
    let mut c = node("Cast", name, vec![input], vec![output]);
    c.attribute.push(int_attr("to", i64::from(to.code())));
    c
}

/// What keeps FLOAT graph inputs and outputs FLOAT.
struct IoCasts {
    /// A graph input or output -> the FLOAT16 value nodes use instead.
    rename: HashMap<String, String>,
    /// Casts of the inputs to FLOAT16, before the first node.
    head: Vec<pb::NodeProto>,
    /// Casts back to FLOAT of the outputs, after the last node.
    tail: Vec<pb::NodeProto>,
}

/// A Cast to FLOAT16 after each FLOAT graph input (`graph_input_cast<i>`
/// writing `graph_input_cast_<i>`, read instead of the input) and a Cast
/// back to FLOAT before each FLOAT graph output (`graph_output_cast<i>`
/// reading `graph_output_cast_<i>`).
fn io_casts(model: &Model, names: &mut Names) -> Result<IoCasts> {
    let mut c = IoCasts {
        rename: HashMap::new(),
        head: Vec::new(),
        tail: Vec::new(),
    };
    for (i, name) in float_tensor_values(model, GRAPH_INPUT)? {
        let out = names.fresh(format!("graph_input_cast_{i}"));
        c.rename.insert(name.clone(), out.clone());
        c.head.push(cast(
            names.fresh(format!("graph_input_cast{i}")),
            name,
            out,
            DataType::FLOAT16,
        ));
    }
    for (i, name) in float_tensor_values(model, GRAPH_OUTPUT)? {
        let inp = names.fresh(format!("graph_output_cast_{i}"));
        c.rename.insert(name.clone(), inp.clone());
        c.tail.push(cast(
            names.fresh(format!("graph_output_cast{i}")),
            inp,
            name,
            DataType::FLOAT,
        ));
    }
    Ok(c)
}

/// The converter's node edits, with the Casts it adds around the nodes it
/// keeps FLOAT. The converter appends those Casts to the graph's end; here
/// each goes just before the top-level node that first reads it, or just
/// after the one that writes its input, so the graph stays sorted.
struct Converter<'a> {
    plan: &'a Fp16Plan,
    settings: &'a Fp16Settings,
    rename: &'a HashMap<String, String>,
    names: &'a mut Names,
    /// A FLOAT16 value -> its Cast to FLOAT, made once and shared.
    to_float: HashMap<String, String>,
    /// Casts the current top-level node reads (made while converting it).
    before: Vec<pb::NodeProto>,
    /// Casts of what the current top-level node writes.
    after: Vec<pb::NodeProto>,
}

impl Converter<'_> {
    /// A node as the converter writes it: graph inputs and outputs read and
    /// written through their Casts; a kept node behind Casts; a converted
    /// node with Cast-to-FLOAT made Cast-to-FLOAT16, FLOAT tensors in
    /// attributes made FLOAT16, and its subgraphs converted.
    fn node(&mut self, n: &pb::NodeProto) -> pb::NodeProto {
        let mut m = n.clone();
        for v in m.input.iter_mut().chain(m.output.iter_mut()) {
            if let Some(r) = self.rename.get(v.as_str()) {
                v.clone_from(r);
            }
        }
        match fp16_node(n, self.plan.opset, self.settings) {
            Fp16Node::Kept => {
                for (k, v) in n.input.iter().enumerate() {
                    if self.plan.float16.contains(v) {
                        m.input[k] = self.cast_to_float(&m.input[k]);
                    }
                }
                for (k, v) in n.output.iter().enumerate() {
                    if self.plan.float16.contains(v) {
                        m.output[k] = self.cast_from_float(&m.output[k]);
                    }
                }
            }
            Fp16Node::FloatInputs(ins) => {
                for &k in ins {
                    if n.input
                        .get(k)
                        .is_some_and(|v| self.plan.float16.contains(v))
                    {
                        m.input[k] = self.cast_to_float(&m.input[k]);
                    }
                }
            }
            Fp16Node::Converted => self.convert(&mut m),
        }
        m
    }

    fn convert(&mut self, m: &mut pb::NodeProto) {
        let float = i64::from(DataType::FLOAT.code());
        let float16 = i64::from(DataType::FLOAT16.code());
        let is_cast = m.op_type == "Cast";
        let typed = RANDOM_OPS.contains(&m.op_type.as_str());
        for a in &mut m.attribute {
            if (is_cast && a.name == "to" || typed && a.name == "dtype") && a.i == float {
                a.i = float16;
            }
            if let Some(t) = a.t.as_mut() {
                tensor_to_fp16(t, self.settings);
            }
            for t in &mut a.tensors {
                tensor_to_fp16(t, self.settings);
            }
            for g in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                self.graph(g);
            }
        }
        let has = |m: &pb::NodeProto, name: &str| m.attribute.iter().any(|a| a.name == name);
        if matches!(
            m.op_type.as_str(),
            "RandomNormal" | "RandomUniform" | "SequenceEmpty"
        ) && !has(m, "dtype")
        {
            m.attribute.push(int_attr("dtype", float16));
        }
        if m.op_type == "ConstantOfShape" && is_default_domain(m) && !has(m, "value") {
            m.attribute.push(pb::AttributeProto {
                name: "value".into(),
                r#type: pb::attribute_proto::AttributeType::Tensor as i32,
                t: Some(pb::TensorProto {
                    name: "value".into(),
                    data_type: DataType::FLOAT16.code(),
                    dims: vec![1],
                    int32_data: vec![0],
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }

    /// A subgraph of a converted node: its nodes, its FLOAT inputs,
    /// outputs and value_info, and the initializers the plan converts.
    fn graph(&mut self, g: &mut pb::GraphProto) {
        let nodes = std::mem::take(&mut g.node);
        g.node = nodes.iter().map(|n| self.node(n)).collect();
        for vi in g
            .input
            .iter_mut()
            .chain(&mut g.output)
            .chain(&mut g.value_info)
        {
            float_to_fp16(vi);
        }
        for t in &mut g.initializer {
            if self.plan.sub_tensors.contains(&t.name) {
                tensor_to_fp16(t, self.settings);
            }
        }
    }

    /// `<v>_cast_to_fp32`, the FLOAT Cast of FLOAT16 `v`, made once.
    fn cast_to_float(&mut self, v: &str) -> String {
        if let Some(out) = self.to_float.get(v) {
            return out.clone();
        }
        let out = self.names.fresh(format!("{v}_cast_to_fp32"));
        let name = self.names.fresh(format!("{v}_cast_to_fp32_node"));
        self.before
            .push(cast(name, v.into(), out.clone(), DataType::FLOAT));
        self.to_float.insert(v.into(), out.clone());
        out
    }

    /// `<v>_cast_to_fp16`, what a kept node writes for `v`, Cast to
    /// FLOAT16 as `v`.
    fn cast_from_float(&mut self, v: &str) -> String {
        let out = self.names.fresh(format!("{v}_cast_to_fp16"));
        let name = self.names.fresh(format!("{v}_cast_to_fp16_node"));
        self.after
            .push(cast(name, out.clone(), v.into(), DataType::FLOAT16));
        out
    }
}

/// Ops whose `dtype` attribute the converter makes FLOAT16.
const RANDOM_OPS: &[&str] = &[
    "EyeLike",
    "Multinomial",
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "SequenceEmpty",
    "Bernoulli",
];

/// The float16 converter's node edits (keep_io_types): every top-level
/// node as [`Converter::node`] writes it with the Casts around it, the
/// input Casts before the first and the output Casts after the last (see
/// [`io_casts`]). Returns how many nodes changed.
pub(super) fn nodes(
    src: &Source<'_>,
    s: &Fp16Settings,
    new_top: &mut HashMap<usize, Vec<pb::NodeProto>>,
    names: &mut Names,
) -> Result<usize> {
    let plan = src
        .plan
        .fp16
        .as_ref()
        .ok_or_else(|| Error::Rewrite("materialize: no onnxruntime-fp16 plan".into()))?;
    let top_nodes = &src.top_nodes;
    let IoCasts {
        rename,
        mut head,
        mut tail,
    } = io_casts(src.model, names)?;
    let mut conv = Converter {
        plan,
        settings: s,
        rename: &rename,
        names,
        to_float: HashMap::new(),
        before: Vec::new(),
        after: Vec::new(),
    };
    let mut changed = 0;
    for (i, n) in top_nodes.iter().enumerate() {
        let m = conv.node(n);
        let edited = &m != n;
        changed += usize::from(edited);
        if edited || !conv.before.is_empty() || !conv.after.is_empty() {
            let mut here = std::mem::take(&mut conv.before);
            here.push(m);
            here.append(&mut conv.after);
            new_top.insert(i, here);
        }
    }
    if !head.is_empty() {
        let first = new_top
            .entry(0)
            .or_insert_with(|| top_nodes.first().cloned().into_iter().collect());
        head.append(first);
        *first = head;
    }
    if !tail.is_empty() {
        let last = top_nodes.len().saturating_sub(1);
        new_top
            .entry(last)
            .or_insert_with(|| top_nodes.get(last).cloned().into_iter().collect())
            .append(&mut tail);
    }
    Ok(changed)
}
