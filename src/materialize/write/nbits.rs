//! The `onnxruntime-int4` target: the MatMulNBits initializers of a weight
//! (read from its `ort.matmul_nbits` payload), the MatMulNBits node (and
//! Add of a Gemm's C) replacing each target, and the `com.microsoft` opset
//! import the model then needs.

use super::additions::Additions;
use super::fields::{not_a_payload, Field, PayloadFields};
use super::names::Names;
use super::proto::int_attr;
use super::weight::{NewInputs, PackedWeight};
use crate::dtype::DataType;
use crate::error::Result;
use crate::materialize::{Op, Settings, Target, PACKER};
use crate::onnx::fields::MODEL_OPSET_IMPORT;
use crate::onnx::rewrite::encoded_field;
use crate::onnx::Model;
use crate::pb;

/// The domain of MatMulNBits.
const MS_DOMAIN: &str = "com.microsoft";

/// The fields of B, scales and zero points in a payload, read from its
/// physical type and checked against the target's shape.
struct Layout {
    b: Field,
    scales: Field,
    zero_points: Option<Field>,
}

fn layout(t: &Target, w: &PackedWeight, s: &Settings) -> Result<Layout> {
    let bad = |what: String| not_a_payload(t, PACKER, what);
    let fields = PayloadFields::read(w, &bad)?;
    let kb = t.k.div_ceil(u64::from(s.block_size));
    let blob = u64::from(s.block_size * s.bits / 8);
    let b = fields.get("B")?;
    if b.data_type != DataType::UINT8 || b.shape != [t.n, kb, blob] {
        return Err(bad(format!(
            "B is {} {:?}, expected UINT8 [{}, {kb}, {blob}]",
            b.data_type, b.shape, t.n
        )));
    }
    let scales = fields.get("scales")?;
    if scales.data_type != t.data_type || scales.shape != [t.n, kb] {
        return Err(bad(format!(
            "scales are {} {:?}",
            scales.data_type, scales.shape
        )));
    }
    let zero_points = match (fields.find("zero_points")?, s.symmetric) {
        (None, true) => None,
        (Some(z), false) if z.data_type == DataType::UINT8 && z.shape.first() == Some(&t.n) => {
            Some(z)
        }
        (z, _) => {
            return Err(bad(format!(
                "zero points {} for a {} setting",
                if z.is_some() { "present" } else { "absent" },
                if s.symmetric {
                    "symmetric"
                } else {
                    "asymmetric"
                }
            )))
        }
    };
    Ok(Layout {
        b,
        scales,
        zero_points,
    })
}

/// The MatMulNBits initializers of one weight (external data in its
/// payload file).
pub(super) fn inputs<'a>(
    t: &Target,
    w: &'a PackedWeight,
    s: &Settings,
    add: &mut Additions<'a>,
) -> Result<NewInputs> {
    let l = layout(t, w, s)?;
    let base = if t.transposed {
        format!("{}_T", t.weight)
    } else {
        t.weight.clone()
    };
    let b = add.append_fresh(format!("{base}_Q{}", s.bits), w, l.b);
    let scales = add.append_fresh(format!("{base}_scales"), w, l.scales);
    let zero_points = l
        .zero_points
        .map(|z| add.append_fresh(format!("{base}_zero_points"), w, z));
    Ok(NewInputs {
        b,
        scales,
        zero_points,
    })
}

/// MatMulNBits (and, for a Gemm with C, the Add of C) replacing `t.node`.
pub(super) fn replacement(
    t: &Target,
    ins: &NewInputs,
    s: &Settings,
    names: &mut Names,
) -> Vec<pb::NodeProto> {
    let a = t.node.input[0].clone();
    let y = t.node.output[0].clone();
    let named = |suffix: &str| {
        if t.node.name.is_empty() {
            String::new()
        } else {
            format!("{}{suffix}", t.node.name)
        }
    };
    let mut inputs = vec![a, ins.b.clone(), ins.scales.clone()];
    inputs.extend(ins.zero_points.clone());
    // Sorted by name, as onnx.helper.make_node writes them.
    let mut attribute = vec![int_attr("K", t.k as i64), int_attr("N", t.n as i64)];
    if s.accuracy_level != 0 {
        attribute.push(int_attr("accuracy_level", s.accuracy_level));
    }
    attribute.push(int_attr("bits", i64::from(s.bits)));
    attribute.push(int_attr("block_size", i64::from(s.block_size)));
    let bias = match &t.op {
        Op::Gemm { bias: Some(c) } => Some(c.clone()),
        _ => None,
    };
    let mm_out = match bias {
        Some(_) => names.fresh(format!("{y}_matmulnbits")),
        None => y.clone(),
    };
    let mut nodes = vec![pb::NodeProto {
        input: inputs,
        output: vec![mm_out.clone()],
        name: named(&format!("_Q{}", s.bits)),
        op_type: "MatMulNBits".into(),
        domain: MS_DOMAIN.into(),
        attribute,
        ..Default::default()
    }];
    if let Some(c) = bias {
        nodes.push(pb::NodeProto {
            input: vec![mm_out, c],
            output: vec![y],
            name: named("_bias"),
            op_type: "Add".into(),
            ..Default::default()
        });
    }
    nodes
}

/// The encoded `com.microsoft` opset import (version 1) the model needs
/// for MatMulNBits; `None` when it imports that domain already.
pub(super) fn ms_domain_import(model: &Model) -> Result<Option<Vec<u8>>> {
    if model.opset_import(|o| o.domain == MS_DOMAIN)?.is_some() {
        return Ok(None);
    }
    let mut v = Vec::new();
    let opset = pb::OperatorSetIdProto {
        domain: MS_DOMAIN.into(),
        version: 1,
    };
    encoded_field(&mut v, MODEL_OPSET_IMPORT, &opset);
    Ok(Some(v))
}
