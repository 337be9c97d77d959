//! The `onnxruntime-fp16` target, as `convert_float_to_float16
//! (keep_io_types=True)` writes it: FLOAT initializers appended as FLOAT16
//! (from their `ort.float16` payloads), FLOAT tensors and Casts in nodes
//! made FLOAT16, FLOAT graph inputs and outputs kept behind Casts, and
//! FLOAT value_info made FLOAT16.

use std::collections::HashMap;

use prost::Message;

use super::names::Names;
use super::payload::PayloadFields;
use super::proto::{int_attr, node};
use super::{packed, Additions, PackedWeight, Source, WeightKey};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::materialize::plan::{GRAPH_INPUT, GRAPH_OUTPUT};
use crate::materialize::{Fp16Settings, PACKER_FP16};
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
    for (i, r) in model.graph_fields(field)?.into_iter().enumerate() {
        let vi = pb::ValueInfoProto::decode(&model.bytes()[r])
            .map_err(|e| Error::decode("ValueInfoProto", e))?;
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

/// A node as the converter writes it: graph inputs and outputs read and
/// written through their Casts, Cast-to-FLOAT made Cast-to-FLOAT16, FLOAT
/// tensors in attributes made FLOAT16.
fn converted(
    n: &pb::NodeProto,
    rename: &HashMap<String, String>,
    s: &Fp16Settings,
) -> pb::NodeProto {
    let mut m = n.clone();
    for v in m.input.iter_mut().chain(m.output.iter_mut()) {
        if let Some(r) = rename.get(v.as_str()) {
            v.clone_from(r);
        }
    }
    let is_cast = m.op_type == "Cast" && is_default_domain(&m);
    for a in &mut m.attribute {
        if is_cast && a.name == "to" && a.i == i64::from(DataType::FLOAT.code()) {
            a.i = i64::from(DataType::FLOAT16.code());
        }
        if let Some(t) = a.t.as_mut() {
            tensor_to_fp16(t, s);
        }
        for t in &mut a.tensors {
            tensor_to_fp16(t, s);
        }
    }
    m
}

/// The float16 converter's node edits (keep_io_types): every top-level
/// node [`converted`], the input Casts before the first and the output
/// Casts after the last (see [`io_casts`]). Returns how many nodes changed.
pub(super) fn nodes(
    src: &Source<'_>,
    s: &Fp16Settings,
    new_top: &mut HashMap<usize, Vec<pb::NodeProto>>,
    names: &mut Names,
) -> Result<usize> {
    let top_nodes = &src.top_nodes;
    let IoCasts {
        rename,
        mut head,
        mut tail,
    } = io_casts(src.model, names)?;
    let mut changed = 0;
    for (i, n) in top_nodes.iter().enumerate() {
        let m = converted(n, &rename, s);
        if &m != n {
            changed += 1;
            new_top.insert(i, vec![m]);
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
