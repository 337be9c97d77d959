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
//! This module holds what a plan is; `walk` walks the graphs, the rules for
//! one node are `target`'s, the `onnxruntime-fp16` plan `fp16`'s.

use std::collections::HashSet;

use crate::dtype::DataType;
use crate::error::Result;
use crate::onnx::Model;
use crate::pb;

use super::Recipe;

mod fp16;
mod skips;
mod target;
mod walk;

pub use fp16::Fp16Plan;
pub(crate) use fp16::{fp16_node, Fp16Node, FP16_OP_BLOCK_LIST};
pub use skips::{group_skips, SkipGroup, Skipped};
pub(crate) use walk::used_names;
pub use walk::{plan, plan_for};

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

/// The packer of placed initializers (the kernels' `identity`).
pub const IDENTITY: &str = "identity";

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
            packer: IDENTITY,
            params: Vec::new(),
        });
        targets.chain(placed).collect()
    }
}

/// Names of the graph's inputs or outputs (by `field`).
pub(crate) fn graph_value_names(model: &Model, field: u32) -> Result<Vec<String>> {
    Ok(model
        .value_infos(field)?
        .into_iter()
        .map(|vi| vi.name)
        .collect())
}
