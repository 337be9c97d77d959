//! Whether one MatMul or Gemm (or, for the int8 target, Conv or Gather) is
//! a target, and if not why: the rules on its inputs, on its weight (B; a
//! Conv's W; a Gather's data: a top-level constant of a type and shape the
//! target takes) and, for Gemm, on its attributes.

use std::collections::{HashMap, HashSet};

use super::{Op, Target};
use crate::dtype::DataType;
use crate::materialize::Recipe;
use crate::onnx::graph::attr;
use crate::onnx::TensorRef;
use crate::pb;

pub(super) struct Context<'a> {
    pub(super) inits: &'a HashMap<String, TensorRef>,
    /// Outputs of top-level Constant nodes.
    pub(super) constants: &'a HashSet<String>,
    pub(super) inputs: &'a HashSet<String>,
    pub(super) recipe: &'a Recipe,
}

impl Context<'_> {
    /// Whether the recipe rewrites nodes of this op type at all.
    pub(super) fn takes(&self, op_type: &str) -> bool {
        match self.recipe {
            Recipe::Nbits(_) => matches!(op_type, "MatMul" | "Gemm"),
            Recipe::Fp16(_) => false,
            // quantize_dynamic turns Gemm into MatMul before quantizing.
            Recipe::Int8(s) => {
                let asked = |o: &str| s.op_types.iter().any(|t| t == o);
                match op_type {
                    "MatMul" | "Gemm" => asked("MatMul"),
                    other => matches!(other, "Gather" | "Conv") && asked(other),
                }
            }
        }
    }
}

/// Why a node is not a target: the rule (the same words for every node it
/// stops) and this node's case.
pub(super) type Refusal = (String, String);

/// A rule's outcome: what it found, or why the node is not a target.
type Decided<T> = std::result::Result<T, Refusal>;

/// How a target reads its weight.
struct Reading {
    op: Op,
    /// B is stored W[N, K].
    transposed: bool,
    /// Rows of the logical B.
    k: u64,
    /// Columns of the logical B.
    n: u64,
}

/// Node `n` (at `index` in its graph) as a target, or why it is not one;
/// `shadow` holds the names the enclosing subgraphs define.
pub(super) fn target(
    index: usize,
    n: &pb::NodeProto,
    ctx: &Context<'_>,
    shadow: &HashSet<String>,
) -> Decided<Target> {
    let int8 = matches!(ctx.recipe, Recipe::Int8(_));
    // The weight's input and name, the computed input quantized with it.
    let (w_index, role, data) = match n.op_type.as_str() {
        "Gather" => (0, "data", None),
        "Conv" => (1, "W", Some("X")),
        _ => (1, "B", Some("A")),
    };
    let b = present(n, w_index, role)?;
    if let Some(data) = data {
        present(n, 0, data)?;
    }
    if n.output.first().is_none_or(|y| y.is_empty()) {
        return Err(("output missing".into(), String::new()));
    }
    let t = constant_weight(ctx, role, b, shadow)?;
    if let Some(data) = data.filter(|_| int8 && ctx.inits.contains_key(&n.input[0])) {
        return Err((
            format!("{data} is a constant"),
            format!(
                "input {data} {:?} is an initializer (only computed inputs are quantized dynamically)",
                n.input[0]
            ),
        ));
    }
    weight_type(role, b, t, int8)?;
    let reading = match n.op_type.as_str() {
        "Gather" | "Conv" => whole_weight(n, role, b, &t.dims)?,
        _ if int8 && n.op_type != "Gemm" && !t.dims.is_empty() => any_rank_matmul(b, &t.dims)?,
        _ => two_d(n, b, &t.dims, int8)?,
    };
    Ok(Target {
        scope: Vec::new(),
        node_index: index,
        node: n.clone(),
        op: reading.op,
        weight: b.clone(),
        transposed: reading.transposed,
        data_type: t.data_type,
        k: reading.k,
        n: reading.n,
        dims: t.dims.clone(),
    })
}

/// The node's input `i` (the operator's `role`), present.
fn present<'n>(n: &'n pb::NodeProto, i: usize, role: &str) -> Decided<&'n String> {
    n.input.get(i).filter(|v| !v.is_empty()).ok_or_else(|| {
        (
            format!("no input {role}"),
            format!("the node has no input {role}"),
        )
    })
}

/// The weight's top-level initializer, which no subgraph shadows and no
/// caller may override as a graph input.
fn constant_weight<'c>(
    ctx: &Context<'c>,
    role: &str,
    b: &str,
    shadow: &HashSet<String>,
) -> Decided<&'c TensorRef> {
    if shadow.contains(b) {
        return Err((
            format!("{role} is defined inside a subgraph"),
            format!(
                "input {role} {b:?} is defined inside the subgraph (only top-level initializers are rewritten)"
            ),
        ));
    }
    let t = ctx.inits.get(b).ok_or_else(|| {
        if ctx.constants.contains(b) {
            (
                format!("{role} is a Constant node, not an initializer"),
                format!(
                    "input {role} {b:?} is the output of a Constant node; weights are read from \
                     initializers, as the reference tools read them"
                ),
            )
        } else if ctx.inputs.contains(b) {
            (
                format!("{role} is a graph input, not a weight"),
                format!(
                    "input {role} {b:?} is a graph input (fed by the caller), not an initializer"
                ),
            )
        } else {
            (
                format!("{role} is computed, not a weight"),
                format!("input {role} {b:?} is computed by the graph (as attention scores are)"),
            )
        }
    })?;
    if ctx.inputs.contains(b) {
        return Err((
            format!("{role} is also a graph input"),
            format!("initializer {b:?} is also a graph input, so a caller may override it"),
        ));
    }
    Ok(t)
}

/// The weight's element type: FLOAT for the int8 target, else FLOAT or
/// FLOAT16.
fn weight_type(role: &str, b: &str, t: &TensorRef, int8: bool) -> Decided<()> {
    if int8 && t.data_type != DataType::FLOAT {
        return Err((
            format!("{role} is not FLOAT"),
            format!(
                "weight {b:?} is {}; the int8 target quantizes FLOAT weights",
                t.data_type
            ),
        ));
    }
    if t.data_type != DataType::FLOAT && t.data_type != DataType::FLOAT16 {
        return Err((
            format!("{role} is not FLOAT or FLOAT16"),
            format!(
                "weight {b:?} is {}; MatMulNBits weights must be FLOAT or FLOAT16",
                t.data_type
            ),
        ));
    }
    Ok(())
}

/// A Gather table or Conv weight, quantized whole (per tensor): any shape
/// with at least one element; a Conv's bias is its input B.
fn whole_weight(n: &pb::NodeProto, role: &str, b: &str, dims: &[u64]) -> Decided<Reading> {
    if dims.is_empty() || dims.contains(&0) {
        return Err((
            format!("{role} is empty or a scalar"),
            format!("weight {b:?} has shape {dims:?}"),
        ));
    }
    let op = if n.op_type == "Conv" {
        Op::Conv {
            bias: n.input.get(2).filter(|c| !c.is_empty()).cloned(),
        }
    } else {
        Op::Gather
    };
    Ok(Reading {
        op,
        transposed: false,
        k: 1,
        n: *dims.last().expect("not empty"),
    })
}

/// An int8 MatMul's B, which quantize_dynamic quantizes at any rank (not
/// 0): K and N are its last two dims (K = 1 for 1-D).
fn any_rank_matmul(b: &str, dims: &[u64]) -> Decided<Reading> {
    if dims.contains(&0) {
        return Err((
            "B is empty".into(),
            format!("weight {b:?} is empty ({dims:?})"),
        ));
    }
    let n_cols = *dims.last().expect("not empty");
    let k = if dims.len() >= 2 {
        dims[dims.len() - 2]
    } else {
        1
    };
    Ok(Reading {
        op: Op::MatMul,
        transposed: false,
        k,
        n: n_cols,
    })
}

/// A 2-D, non-empty B, read as the node reads it.
fn two_d(n: &pb::NodeProto, b: &str, dims: &[u64], int8: bool) -> Decided<Reading> {
    let [d0, d1] = *dims else {
        return Err((
            "B is not 2-D".into(),
            format!("weight {b:?} has shape {dims:?}; only 2-D weights are rewritten"),
        ));
    };
    if d0 == 0 || d1 == 0 {
        return Err((
            "B is empty".into(),
            format!("weight {b:?} is empty ({d0} x {d1})"),
        ));
    }
    let (op, transposed) = if n.op_type == "Gemm" {
        gemm(n, int8)?
    } else {
        (Op::MatMul, false)
    };
    let (k, n_cols) = if transposed { (d1, d0) } else { (d0, d1) };
    Ok(Reading {
        op,
        transposed,
        k,
        n: n_cols,
    })
}

/// A Gemm with transA = 0, alpha = 1 and beta = 1 (with C, or always for
/// int8, which takes beta = 1 only): its C, and whether B is W[N, K].
fn gemm(n: &pb::NodeProto, int8: bool) -> Decided<(Op, bool)> {
    let int = |name: &str| attr(n, name).map_or(0, |a| a.i);
    let float = |name: &str| attr(n, name).map_or(1.0, |a| a.f);
    if int("transA") != 0 {
        return Err((
            "transA = 1".into(),
            "Gemm with transA = 1 is not rewritten".into(),
        ));
    }
    if float("alpha") != 1.0 {
        return Err((
            "alpha is not 1".into(),
            format!("Gemm alpha = {} (only 1 is rewritten)", float("alpha")),
        ));
    }
    let bias = n.input.get(2).filter(|c| !c.is_empty()).cloned();
    // quantize_dynamic takes beta = 1 only, with or without C.
    if (bias.is_some() || int8) && float("beta") != 1.0 {
        return Err((
            "beta is not 1".into(),
            format!("Gemm beta = {} (only 1 is rewritten)", float("beta")),
        ));
    }
    Ok((Op::Gemm { bias }, int("transB") != 0))
}
