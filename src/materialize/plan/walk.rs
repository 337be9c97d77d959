//! The walk that plans a model: every graph and subgraph visited once,
//! each node judged by `target`'s rules, the fp16 plan by `fp16`'s.

use std::collections::{HashMap, HashSet};

use super::fp16::plan_fp16;
use super::target::{target, Context};
use super::{graph_value_names, Op, Plan, Skipped, Step, PLACED_MIN_BYTES};
use crate::dtype::DataType;
use crate::error::Result;
use crate::materialize::{Int8Settings, Int8Weight, Recipe, Settings};
use crate::onnx::fields::{GRAPH_INPUT, GRAPH_OUTPUT};
use crate::onnx::graph::{is_default_domain, node_label};
use crate::onnx::{Model, TensorRef};
use crate::pb;

/// Decides the rewrite of the model's MatMul and Gemm nodes for the
/// `onnxruntime-int4` target.
pub fn plan(model: &Model) -> Result<Plan> {
    plan_for(model, &Recipe::Nbits(Settings::default()))
}

/// Decides the rewrite of the model's MatMul and Gemm nodes for `recipe`.
/// For `onnxruntime-int8` the rule is `quantize_dynamic`'s: MatMul (when
/// in the op types) with an initializer B and a computed A, and Gemm with
/// alpha = beta = 1 and transA = 0 (which it turns into MatMul, reading B
/// transposed when transB = 1); B must be FLOAT (the packer's type), and
/// nodes inside subgraphs are left alone.
pub fn plan_for(model: &Model, recipe: &Recipe) -> Result<Plan> {
    let mut plan = match recipe {
        Recipe::Fp16(s) => plan_fp16(model, s)?,
        _ => plan_nodes(model, recipe)?,
    };
    plan.placed = placed(model, &plan)?;
    Ok(plan)
}

/// The large initializers the rewrite keeps whole: neither a target's
/// weight nor converted, of whole-byte elements.
fn placed(model: &Model, plan: &Plan) -> Result<Vec<String>> {
    let rewritten: HashSet<&str> = plan
        .targets
        .iter()
        .map(|t| t.weight.as_str())
        .chain(plan.tensors.iter().map(String::as_str))
        .collect();
    Ok(model
        .initializers()?
        .into_iter()
        .filter(|t| !rewritten.contains(t.name.as_str()))
        .filter(|t| t.data_type.bit_width().is_some_and(|b| b % 8 == 0))
        .filter(|t| t.raw_size().is_some_and(|bytes| bytes >= PLACED_MIN_BYTES))
        .map(|t| t.name)
        .collect())
}

/// The MatMul / Gemm rewrite of `recipe`.
fn plan_nodes(model: &Model, recipe: &Recipe) -> Result<Plan> {
    let nodes = model.nodes()?;
    let inits: HashMap<String, TensorRef> = model
        .initializers()?
        .into_iter()
        .map(|t| (t.name.clone(), t))
        .collect();
    let inputs: HashSet<String> = graph_value_names(model, GRAPH_INPUT)?.into_iter().collect();
    let constants: HashSet<String> = nodes
        .iter()
        .filter(|n| n.op_type == "Constant" && is_default_domain(n))
        .flat_map(|n| n.output.iter().cloned())
        .collect();
    let ctx = Context {
        inits: &inits,
        constants: &constants,
        inputs: &inputs,
        recipe,
    };
    let mut out = Plan {
        op_types: ["MatMul", "Gemm", "Gather", "Conv"]
            .into_iter()
            .filter(|o| ctx.takes(o))
            .map(String::from)
            .collect(),
        ..Plan::default()
    };
    visit(&ctx, &nodes, &mut Vec::new(), &mut HashSet::new(), &mut out);
    if let Recipe::Int8(s) = recipe {
        skip_per_tensor_readers_of_per_channel_weights(&mut out, s);
    }
    out.int8_elsewhere = int8_elsewhere(&ctx, &nodes);
    Ok(out)
}

/// Top-level Conv and Gather nodes with an initializer weight that the
/// recipe does not rewrite and the int8 target does with `--op-types`:
/// (op type, nodes), for the "nothing to materialize" hint.
fn int8_elsewhere(ctx: &Context<'_>, nodes: &[pb::NodeProto]) -> Vec<(String, usize)> {
    let mut found: Vec<(String, usize)> = Vec::new();
    for n in nodes
        .iter()
        .filter(|n| is_default_domain(n) && !ctx.takes(&n.op_type))
    {
        let weight = match n.op_type.as_str() {
            "Conv" => n.input.get(1),
            "Gather" => n.input.first(),
            _ => None,
        };
        if weight.is_some_and(|w| {
            ctx.inits
                .get(w)
                .is_some_and(|t| t.data_type == DataType::FLOAT)
        }) {
            match found.iter_mut().find(|(o, _)| *o == n.op_type) {
                Some((_, count)) => *count += 1,
                None => found.push((n.op_type.clone(), 1)),
            }
        }
    }
    found
}

/// quantize_dynamic quantizes a weight once, as the first node that reads
/// it asks, and later nodes read that quantized weight: a Gather or Conv
/// would then read per-channel scales as one per tensor, so such a node is
/// left alone (and reads the weight dequantized).
fn skip_per_tensor_readers_of_per_channel_weights(plan: &mut Plan, s: &Int8Settings) {
    let mut first: HashMap<(String, bool), Int8Weight> = HashMap::new();
    let mut kept = Vec::new();
    for t in std::mem::take(&mut plan.targets) {
        let key = (t.weight.clone(), t.transposed);
        let q = *first.entry(key).or_insert_with(|| s.weight_for(&t.op));
        if q.per_channel && matches!(t.op, Op::Gather | Op::Conv { .. }) {
            plan.skipped.push(Skipped {
                node: node_label(&t.node, t.node_index),
                op_type: t.node.op_type.clone(),
                reason: "weight quantized per channel by an earlier MatMul".into(),
                detail: format!(
                    "{:?} is quantized per channel for an earlier MatMul; a {} reads one scale",
                    t.weight, t.node.op_type
                ),
            });
        } else {
            kept.push(t);
        }
    }
    plan.targets = kept;
}

/// Plans the nodes of one graph; `shadow` holds the names the enclosing
/// subgraphs define (so they are not the top-level initializers). A
/// subgraph's names are added for its visit and taken out after it, so the
/// walk stays linear in the model's size however deep subgraphs nest.
fn visit(
    ctx: &Context<'_>,
    nodes: &[pb::NodeProto],
    scope: &mut Vec<Step>,
    shadow: &mut HashSet<String>,
    out: &mut Plan,
) {
    for (i, n) in nodes.iter().enumerate() {
        let is_target_op = is_default_domain(n) && ctx.takes(&n.op_type);
        if is_target_op {
            let found = if !scope.is_empty() && matches!(ctx.recipe, Recipe::Int8(_)) {
                Err((
                    "inside a subgraph".to_string(),
                    format!(
                        "{} nodes inside subgraphs are not rewritten for this target",
                        n.op_type
                    ),
                ))
            } else {
                target(i, n, ctx, shadow)
            };
            match found {
                Ok(mut t) => {
                    t.scope = scope.clone();
                    out.targets.push(t);
                }
                Err((reason, detail)) => out.skipped.push(Skipped {
                    node: node_label(n, i),
                    op_type: n.op_type.clone(),
                    reason,
                    detail,
                }),
            }
        }
        for (a, attr) in n.attribute.iter().enumerate() {
            for (k, g) in attr.g.iter().chain(attr.graphs.iter()).enumerate() {
                let defined = g.input.iter().map(|v| &v.name);
                let defined = defined.chain(g.initializer.iter().map(|t| &t.name));
                let defined = defined.chain(g.node.iter().flat_map(|n| n.output.iter()));
                let added: Vec<String> = defined
                    .filter(|name| shadow.insert((*name).clone()))
                    .cloned()
                    .collect();
                scope.push(Step {
                    node: i,
                    attribute: a,
                    graph: k,
                });
                visit(ctx, &g.node, scope, shadow, out);
                scope.pop();
                for name in &added {
                    shadow.remove(name);
                }
            }
        }
    }
}

/// Every value name the graph reads, subgraphs included (outer-scope
/// references): its `nodes` (the top-level ones, in order), those in
/// `replaced` read from their replacements, and its outputs.
pub(crate) fn used_names(
    model: &Model,
    nodes: &[pb::NodeProto],
    replaced: &HashMap<usize, Vec<pb::NodeProto>>,
) -> Result<HashSet<String>> {
    fn visit(n: &pb::NodeProto, used: &mut HashSet<String>) {
        used.extend(n.input.iter().cloned());
        for a in &n.attribute {
            for g in a.g.iter().chain(a.graphs.iter()) {
                for sub in &g.node {
                    visit(sub, used);
                }
                used.extend(g.output.iter().map(|o| o.name.clone()));
            }
        }
    }
    let mut used = HashSet::new();
    for (i, n) in nodes.iter().enumerate() {
        match replaced.get(&i) {
            Some(new) => new.iter().for_each(|n| visit(n, &mut used)),
            None => visit(n, &mut used),
        }
    }
    used.extend(graph_value_names(model, GRAPH_OUTPUT)?);
    Ok(used)
}
