//! The `onnxruntime-fp16` plan, as `convert_float_to_float16
//! (keep_io_types=True)` decides: nodes of its op block list stay FLOAT
//! behind Casts, some inputs stay FLOAT (Resize's scales), every other node
//! is converted (its FLOAT attribute tensors, Casts to FLOAT, the
//! subgraphs in it), and a FLOAT initializer becomes FLOAT16 when a
//! converted use reads it. Casts go around the kept nodes for the values
//! the converter holds FLOAT16: those onnx's type inference calls FLOAT in
//! the graphs it converts, and the initializers it converts.
//!
//! Refused, naming the node: models whose converted form onnxruntime
//! refuses (a kept node inside a subgraph that needs Casts, which the
//! converter puts in the top-level graph; a FLOAT-only quantization op
//! reading a converted value; a model converted already), and FLOAT
//! initializers that are also graph inputs.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::Plan;
use crate::dtype::DataType;
use crate::error::Result;
use crate::materialize::Fp16Settings;
use crate::onnx::elem_types::{subgraphs, ElemTypes};
use crate::onnx::fields::{GRAPH_INPUT, GRAPH_OUTPUT, GRAPH_VALUE_INFO};
use crate::onnx::graph::node_label;
use crate::onnx::{Model, TensorRef};
use crate::pb;

/// The converter's `DEFAULT_OP_BLOCK_LIST`: op types kept in FLOAT (by
/// op type alone, whatever the domain).
pub(crate) const FP16_OP_BLOCK_LIST: &[&str] = &[
    "ArrayFeatureExtractor",
    "Binarizer",
    "CastMap",
    "CategoryMapper",
    "DictVectorizer",
    "FeatureVectorizer",
    "Imputer",
    "LabelEncoder",
    "LinearClassifier",
    "LinearRegressor",
    "Normalizer",
    "OneHotEncoder",
    "RandomUniformLike",
    "SVMClassifier",
    "SVMRegressor",
    "Scaler",
    "TreeEnsembleClassifier",
    "TreeEnsembleRegressor",
    "TreeEnsemble",
    "ZipMap",
    "NonMaxSuppression",
    "TopK",
    "RoiAlign",
    "Range",
    "CumSum",
    "Min",
    "Max",
    "Upsample",
];

/// Ops onnxruntime runs on FLOAT only, which the converter does not keep:
/// its model fails to load when one reads a converted value.
const FLOAT_ONLY_OPS: &[&str] = &[
    "DynamicQuantizeLinear",
    "DynamicQuantizeLSTM",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
];

/// How the converter treats one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fp16Node {
    /// In the block list: kept FLOAT, Casts around it; its attributes
    /// untouched.
    Kept,
    /// These inputs stay FLOAT (a Cast back where they are converted); its
    /// attributes untouched (the converter's `ALWAYS_FLOAT_INPUTS`).
    FloatInputs(&'static [usize]),
    /// Converted: attributes, Casts to FLOAT, subgraphs.
    Converted,
}

/// The converter's treatment of `n` in a model of ai.onnx opset `opset`.
pub(crate) fn fp16_node(n: &pb::NodeProto, opset: i64, s: &Fp16Settings) -> Fp16Node {
    let op = n.op_type.as_str();
    if s.keeps(op) {
        return Fp16Node::Kept;
    }
    match op {
        "Resize" if opset <= 10 => Fp16Node::FloatInputs(&[1]),
        "Resize" => Fp16Node::FloatInputs(&[2]),
        "GroupNorm" | "SkipGroupNorm" => Fp16Node::FloatInputs(&[1, 2]),
        _ => Fp16Node::Converted,
    }
}

/// What the fp16 writer needs beyond [`Plan::tensors`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fp16Plan {
    /// The ai.onnx opset (11 when the model imports none, as the
    /// converter assumes).
    pub opset: i64,
    /// The values the converter holds FLOAT16 (its `value_info_list`), by
    /// the names the source gives them; the graph's FLOAT inputs and
    /// outputs are among them (their Casts' FLOAT16 sides stand for them).
    pub float16: BTreeSet<String>,
    /// FLOAT initializers of subgraphs that are converted in place.
    pub sub_tensors: BTreeSet<String>,
}

/// A FLOAT initializer and how it is read.
#[derive(Default)]
struct Uses {
    float16: bool,
    top: bool,
}

/// The converter's walk, breadth first as it goes (each graph's nodes,
/// then the subgraphs of its converted nodes).
struct Walk<'a> {
    settings: &'a Fp16Settings,
    opset: i64,
    types: ElemTypes,
    /// FLOAT initializers (all graphs), in the order met.
    inits: Vec<String>,
    uses: HashMap<String, Uses>,
    float16: BTreeSet<String>,
    /// Values the top-level graph defines: what a Cast there may read.
    top_defined: HashSet<String>,
    /// Kept nodes (and float-input nodes) met inside subgraphs.
    nested_kept: Vec<(&'a pb::NodeProto, String)>,
    /// Nodes of FLOAT-only ops, with their labels.
    float_only: Vec<(&'a pb::NodeProto, String)>,
}

impl<'a> Walk<'a> {
    fn graph(
        &mut self,
        nodes: &'a [pb::NodeProto],
        inits: impl Iterator<Item = (&'a str, i32)>,
        values: impl Iterator<Item = &'a pb::ValueInfoProto>,
        nested: bool,
        next: &mut Vec<&'a pb::GraphProto>,
    ) {
        for (name, data_type) in inits {
            if data_type == DataType::FLOAT.code() {
                self.inits.push(name.to_string());
                self.uses.insert(
                    name.to_string(),
                    Uses {
                        float16: false,
                        top: !nested,
                    },
                );
            }
        }
        for (i, n) in nodes.iter().enumerate() {
            let class = fp16_node(n, self.opset, self.settings);
            for (k, input) in n.input.iter().enumerate() {
                let keeps_float = match class {
                    Fp16Node::Kept => true,
                    Fp16Node::FloatInputs(ins) => ins.contains(&k),
                    Fp16Node::Converted => false,
                };
                if let Some(u) = self.uses.get_mut(input) {
                    u.float16 |= !keeps_float;
                }
            }
            let label = node_label(n, i);
            match class {
                Fp16Node::Converted => next.extend(subgraphs(n)),
                _ if nested => self.nested_kept.push((n, label.clone())),
                _ => {}
            }
            if FLOAT_ONLY_OPS.contains(&n.op_type.as_str()) {
                self.float_only.push((n, label));
            }
            // onnx's inference records every node output it can type.
            let floats = n.output.iter().filter(|o| self.types.is_float(o));
            self.float16.extend(floats.cloned());
        }
        for vi in values {
            if self.types.is_float(&vi.name) {
                self.float16.insert(vi.name.clone());
            }
        }
    }
}

impl<'a> Walk<'a> {
    /// The top-level graph, then the subgraphs of its converted nodes,
    /// level by level.
    fn run(
        &mut self,
        nodes: &'a [pb::NodeProto],
        initializers: &'a [TensorRef],
        values: impl Iterator<Item = &'a pb::ValueInfoProto>,
    ) {
        let mut level = Vec::new();
        let inits = initializers
            .iter()
            .map(|t| (t.name.as_str(), t.data_type.code()));
        self.graph(nodes, inits, values, false, &mut level);
        while !level.is_empty() {
            let mut next = Vec::new();
            for g in level {
                self.graph(
                    &g.node,
                    g.initializer.iter().map(|t| (t.name.as_str(), t.data_type)),
                    g.input.iter().chain(&g.output).chain(&g.value_info),
                    true,
                    &mut next,
                );
            }
            level = next;
        }
    }

    /// The FLOAT initializers a converted use reads, now held FLOAT16:
    /// the top-level ones (converted from payloads) and the subgraphs'
    /// (converted in place). One that is also a graph input is refused.
    fn converted_initializers(
        &mut self,
        inputs: &[pb::ValueInfoProto],
    ) -> Result<(Vec<String>, BTreeSet<String>)> {
        let graph_inputs: HashSet<&str> = inputs.iter().map(|v| v.name.as_str()).collect();
        let (mut top, mut sub) = (Vec::new(), BTreeSet::new());
        for name in &self.inits {
            let u = &self.uses[name];
            if !u.float16 {
                continue;
            }
            if u.top && graph_inputs.contains(name.as_str()) {
                return Err(crate::Error::Rewrite(format!(
                    "FLOAT initializer {name:?} is also a graph input; onnxruntime-fp16 does not take it"
                )));
            }
            self.float16.insert(name.clone());
            if u.top {
                top.push(name.clone());
            } else {
                sub.insert(name.clone());
            }
        }
        Ok((top, sub))
    }
}

/// The `onnxruntime-fp16` plan of `model` (see the module's text).
pub(super) fn plan_fp16(model: &Model, settings: &Fp16Settings) -> Result<Plan> {
    let refuse = |what: String| Err(crate::Error::Rewrite(what));
    let nodes = model.nodes()?;
    let initializers = model.initializers()?;
    let (inputs, outputs) = (
        model.value_infos(GRAPH_INPUT)?,
        model.value_infos(GRAPH_OUTPUT)?,
    );
    let declared = model.value_infos(GRAPH_VALUE_INFO)?;
    if let Some(n) = nodes.iter().find(|n| n.name == "graph_input_cast0") {
        return refuse(format!(
            "the model has a node {:?} already: it was converted to float16 before, and the \
             converter's second pass gives two nodes of that name, which onnxruntime refuses",
            n.name
        ));
    }

    let mut types = ElemTypes::default();
    for vi in inputs.iter().chain(&declared).chain(&outputs) {
        types.declare(vi);
    }
    for t in &initializers {
        types.declare_tensor(&t.name, t.data_type.code());
    }
    types.infer(&nodes);

    let mut top_defined: HashSet<String> = initializers.iter().map(|t| t.name.clone()).collect();
    top_defined.extend(inputs.iter().map(|v| v.name.clone()));
    top_defined.extend(nodes.iter().flat_map(|n| n.output.iter().cloned()));
    let mut walk = Walk {
        settings,
        opset: model.default_opset()?.unwrap_or(11),
        types,
        inits: Vec::new(),
        uses: HashMap::new(),
        float16: BTreeSet::new(),
        top_defined,
        nested_kept: Vec::new(),
        float_only: Vec::new(),
    };
    walk.run(
        &nodes,
        &initializers,
        inputs.iter().chain(&outputs).chain(&declared),
    );
    let (tensors, sub_tensors) = walk.converted_initializers(&inputs)?;
    refuse_broken(&walk)?;
    if walk.float16.is_empty() {
        return refuse(
            "nothing to materialize: the model has no FLOAT value or weight to convert".into(),
        );
    }
    Ok(Plan {
        tensors,
        fp16: Some(Fp16Plan {
            opset: walk.opset,
            float16: walk.float16,
            sub_tensors,
        }),
        ..Plan::default()
    })
}

/// Refuses what makes the converter's model one onnxruntime does not load.
fn refuse_broken(walk: &Walk<'_>) -> Result<()> {
    let refuse = |what: String| Err(crate::Error::Rewrite(what));
    for (n, label) in &walk.nested_kept {
        // The inputs the converter casts back to FLOAT: all of a kept
        // node's, only the FLOAT ones (Resize's scales) of the others.
        let class = fp16_node(n, walk.opset, walk.settings);
        let cast = |k: usize| match class {
            Fp16Node::FloatInputs(ins) => ins.contains(&k),
            _ => true,
        };
        let cast_in = n.input.iter().enumerate().find_map(|(k, v)| {
            (cast(k) && walk.float16.contains(v) && !walk.top_defined.contains(v)).then_some(v)
        });
        let cast_out = match class {
            Fp16Node::Kept => n.output.iter().find(|v| walk.float16.contains(*v)),
            _ => None,
        };
        if let Some(v) = cast_in.or(cast_out) {
            return refuse(format!(
                "node {label} ({}) inside a subgraph stays FLOAT; the float16 converter puts the \
                 Cast of its value {v:?} in the top-level graph, where that value is not defined, \
                 and onnxruntime refuses its model",
                n.op_type
            ));
        }
    }
    for (n, label) in &walk.float_only {
        if let Some(v) = n.input.iter().find(|v| walk.float16.contains(*v)) {
            return refuse(format!(
                "node {label} ({}) reads {v:?}, which the float16 converter makes FLOAT16; \
                 {} takes FLOAT only, so onnxruntime refuses the converter's model (a quantized \
                 model is not converted to float16)",
                n.op_type, n.op_type
            ));
        }
    }
    Ok(())
}
