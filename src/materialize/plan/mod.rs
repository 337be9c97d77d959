//! Which nodes a materialize rewrites, and why the others are left alone.
//!
//! The rule follows onnxruntime's `MatMulNBitsQuantizer` (default RTN
//! config, QOperator format): a node is rewritten when its input B is a
//! graph initializer (directly, no Identity in between). ctcache is
//! stricter where the quantizer's output could differ from what a cache
//! entry holds: B must be 2-D FLOAT or FLOAT16 and must not also be a graph
//! input (a value a caller may override). It adds Gemm, which the quantizer
//! leaves alone: Gemm with transA = 0, alpha = 1 and beta = 1 (or no C)
//! becomes MatMulNBits followed by Add(C), reading B as W[N, K] when
//! transB = 1. Nodes inside subgraphs (If / Loop / Scan bodies) are
//! rewritten too when their B is a top-level initializer that nothing in
//! the enclosing subgraphs shadows (as the quantizer's graph stack does);
//! initializers of subgraphs themselves are left alone.
//!
//! This module walks the graphs; the rules for one node are `target`'s,
//! the `onnxruntime-fp16` plan `fp16`'s.

use std::collections::{HashMap, HashSet};

use prost::Message;

use crate::dtype::DataType;
use crate::error::Result;
use crate::onnx::graph::{is_default_domain, node_label};
use crate::onnx::{Model, TensorRef};
use crate::pb;

use super::{Int8Settings, Int8Weight, Recipe, Settings};

mod fp16;
mod skips;
mod target;

use fp16::plan_fp16;
pub use fp16::Fp16Plan;
pub(crate) use fp16::{fp16_node, Fp16Node, FP16_OP_BLOCK_LIST};
pub use skips::{group_skips, SkipGroup, Skipped};
use target::target;

/// What kind of node a target replaces.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// MatMul with the weight as input B.
    MatMul,
    /// Gemm; `bias` is its input C, when present.
    Gemm {
        /// The initializer name of input C.
        bias: Option<String>,
    },
    /// Conv (int8 target) with the weight as input W; `bias` is its input
    /// B, when present.
    Conv {
        /// The name of input B.
        bias: Option<String>,
    },
    /// Gather (int8 target) with the weight as its data (the table).
    Gather,
}

/// One step down into a subgraph: the node (by index in its graph), its
/// attribute (by index) and the graph in it (0 for `g`, else the index in
/// `graphs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Step {
    /// The node's index in its graph.
    pub node: usize,
    /// The attribute's index in the node.
    pub attribute: usize,
    /// 0 for the attribute's `g`, else the index in its `graphs`.
    pub graph: usize,
}

/// One node to rewrite.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The subgraphs the node is in, from the top-level graph down (empty
    /// for a top-level node).
    pub scope: Vec<Step>,
    /// Position among its graph's nodes (file order).
    pub node_index: usize,
    /// The node as found, to be replaced.
    pub node: pb::NodeProto,
    /// Which operator it is.
    pub op: Op,
    /// The initializer holding the weight.
    pub weight: String,
    /// The weight is stored W[N, K] (Gemm transB = 1).
    pub transposed: bool,
    /// The weight's element type (FLOAT or FLOAT16).
    pub data_type: DataType,
    /// Rows of the logical B (the MatMul's inner dimension).
    pub k: u64,
    /// Columns of the logical B (the output features).
    pub n: u64,
    /// The weight's dims as stored.
    pub dims: Vec<u64>,
}

/// The rewrite decided for a model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// The nodes to rewrite, in file order.
    pub targets: Vec<Target>,
    /// The MatMul / Gemm nodes left as they are.
    pub skipped: Vec<Skipped>,
    /// `onnxruntime-fp16`: the FLOAT initializers converted whole, in file
    /// order.
    pub tensors: Vec<String>,
    /// `onnxruntime-fp16`: the rest of the converter's decisions.
    pub fp16: Option<Fp16Plan>,
    /// Op types of nodes this recipe leaves and the int8 target quantizes
    /// when asked (`--op-types`), with how many: (op type, nodes).
    pub int8_elsewhere: Vec<(String, usize)>,
    /// The op types whose nodes the recipe rewrites (`MatMul`, `Gemm`, and
    /// for the int8 target the other op types asked), for messages.
    pub op_types: Vec<String>,
    /// Initializers the new model keeps as they are, large enough
    /// ([`PLACED_MIN_BYTES`]) to be placed beside it like the packed weights
    /// (cached with the `identity` packer, then linked or copied) rather
    /// than written into it again, in file order.
    pub placed: Vec<String>,
}

/// One payload a materialize reads: the initializer (and whether it is read
/// transposed), its packer and the packer's parameters (`k=v`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pack {
    /// (initializer, read transposed): the key of its packed payload.
    pub key: (String, bool),
    /// The packer id.
    pub packer: &'static str,
    /// The packer's parameters, `k=v`.
    pub params: Vec<String>,
}

/// Kept initializers of at least this much data are placed beside the model.
pub const PLACED_MIN_BYTES: u64 = 1 << 20;

impl Plan {
    /// The distinct (weight, transposed) pairs the targets need, in first-use order.
    pub fn weights(&self) -> Vec<(String, bool)> {
        let mut seen = HashSet::new();
        self.targets
            .iter()
            .map(|t| (t.weight.clone(), t.transposed))
            .chain(self.tensors.iter().map(|t| (t.clone(), false)))
            .filter(|w| seen.insert(w.clone()))
            .collect()
    }

    /// The first target reading `weight` (transposed or not): the one whose
    /// packing every later reader of it shares.
    pub fn first_reader(&self, weight: &str, transposed: bool) -> Option<&Target> {
        self.targets
            .iter()
            .find(|t| t.weight == weight && t.transposed == transposed)
    }

    /// Every payload the write of this plan for `recipe` reads: each
    /// (weight, transposed) pair the targets need with the recipe's packer
    /// and parameters (those of the first node that reads it), then each
    /// placed initializer with the identity packer.
    pub fn packs(&self, recipe: &Recipe) -> Vec<Pack> {
        let targets = self.weights().into_iter().map(|key| {
            let op = self
                .first_reader(&key.0, key.1)
                .map_or(Op::MatMul, |t| t.op.clone());
            Pack {
                packer: recipe.packer(),
                params: recipe.packer_params(&op, key.1),
                key,
            }
        });
        let placed = self.placed.iter().map(|name| Pack {
            key: (name.clone(), false),
            packer: crate::materialize::IDENTITY,
            params: Vec::new(),
        });
        targets.chain(placed).collect()
    }
}

/// Names of the graph's inputs (`GraphProto.input`).
pub(crate) fn graph_value_names(model: &Model, field: u32) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for r in model.graph_fields(field)? {
        let vi = pb::ValueInfoProto::decode(&model.bytes()[r])
            .map_err(|e| crate::Error::decode("ValueInfoProto", e))?;
        names.push(vi.name);
    }
    Ok(names)
}

pub(crate) const GRAPH_INPUT: u32 = 11;
pub(crate) const GRAPH_OUTPUT: u32 = 12;
pub(crate) const GRAPH_VALUE_INFO: u32 = 13;

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

struct Context<'a> {
    inits: &'a HashMap<String, TensorRef>,
    /// Outputs of top-level Constant nodes.
    constants: &'a HashSet<String>,
    inputs: &'a HashSet<String>,
    recipe: &'a Recipe,
}

impl Context<'_> {
    /// Whether the recipe rewrites nodes of this op type at all.
    fn takes(&self, op_type: &str) -> bool {
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
