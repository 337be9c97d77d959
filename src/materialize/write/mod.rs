//! Writing a materialized model: the graph is spliced at the wire level
//! (rewritten nodes re-encoded in place, replaced weights dropped, the new
//! initializers appended as external data), every other byte copied from
//! the source mapping, and the payload files placed in `<out>.weights/`.
//!
//! This module runs the steps; each target's initializers and nodes are
//! `nbits`, `int8` and `fp16`'s, the splice `splice`'s, the data folder
//! `external`'s.

mod additions;
mod external;
mod fields;
mod fp16;
mod int8;
mod memory;
mod names;
mod nbits;
mod proto;
mod report;
mod splice;
mod weight;

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::path::Path;

use super::plan::{used_names, Plan, IDENTITY};
use super::Recipe;
use ctcache_files::answer::data_folder_name;
use ctcache_files::place::LinkMode;

use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::onnx::fields::MODEL_GRAPH;
use crate::onnx::shapes::inferred_value_info;
use crate::onnx::Model;
use crate::outdir::OutFile;
use crate::pb;
use additions::Additions;
pub use additions::PayloadTensor;
use external::DataFolder;
pub use memory::{build_in_memory, InMemory};
use names::Names;
pub use report::Report;
use splice::{Edits, Replacements};
use weight::{packed, NewInputs, Source};
pub use weight::{PackedWeight, WeightKey};

/// The data folder of `out`: `model.onnx` -> `model.onnx.weights`.
pub fn data_dir_name(out: &Path) -> Result<String> {
    out.file_name()
        .map(data_folder_name)
        .ok_or_else(|| Error::Rewrite(format!("{} has no file name", out.display())))
}

/// The rewrite of a model for a recipe, decided and encoded but not yet
/// written: what both the file and the in-memory result are made from.
struct Rewrite<'a> {
    src: Source<'a>,
    add: Additions<'a>,
    nodes: NodeEdits,
    dropped: HashSet<&'a str>,
    /// The value_info the reference tool's shape inference adds.
    inferred: Vec<pb::ValueInfoProto>,
    to_fp16: bool,
    import_ms_domain: bool,
}

impl<'a> Rewrite<'a> {
    /// Decides every new initializer (located in `data_name/`), node and
    /// dropped initializer.
    fn new(
        model: &'a Model,
        plan: &'a Plan,
        recipe: &Recipe,
        weights: &'a HashMap<WeightKey, PackedWeight>,
        data_name: String,
    ) -> Result<Self> {
        let src = Source {
            model,
            plan,
            initializers: model.initializers()?,
            top_nodes: model.nodes()?,
        };
        let mut add = Additions {
            names: Names::free_in(&src)?,
            data_name,
            initializers: Vec::new(),
            tensors: Vec::new(),
            files: Vec::new(),
            payload_bytes: 0,
        };
        let inputs = new_inputs(&src, recipe, weights, &mut add)?;
        fp16::add_initializers(&src, weights, &mut add)?;
        add_placed(&src, weights, &mut add)?;
        let nodes = new_nodes(&src, recipe, &inputs, &mut add)?;
        let dropped = dropped(&src, &nodes)?;
        // quantize_dynamic and convert_float_to_float16 run onnx's shape
        // inference first; onnxruntime optimizes by what it writes.
        let inferred = match recipe {
            Recipe::Int8(_) | Recipe::Fp16(_) => {
                inferred_value_info(model, &src.top_nodes, &src.initializers)?
            }
            Recipe::Nbits(_) => Vec::new(),
        };
        Ok(Rewrite {
            src,
            add,
            nodes,
            dropped,
            inferred,
            to_fp16: matches!(recipe, Recipe::Fp16(_)),
            import_ms_domain: matches!(recipe, Recipe::Nbits(_)),
        })
    }

    /// What the rewrite changes, and nothing written yet.
    fn report(&self) -> Report {
        Report {
            nodes_rewritten: self.nodes.rewritten,
            initializers_removed: self.dropped.len(),
            payload_bytes: self.add.payload_bytes,
            ..Default::default()
        }
    }

    /// The splice's edits, with kept initializers `relocated`.
    fn edits<'e>(&'e self, relocated: &'e HashMap<usize, Vec<u8>>) -> Edits<'e> {
        Edits {
            replaced: &self.nodes.top,
            dropped: &self.dropped,
            relocated,
            new_inits: &self.add.initializers,
            value_info: &self.inferred,
            to_fp16: self.to_fp16,
            import_ms_domain: self.import_ms_domain,
        }
    }
}

/// Writes the materialized model to `out` with its payload files in
/// `<out>.weights/`. Nothing is written when the plan has no target. Once
/// `cancel` is set the write stops between files with [`Error::Cancelled`];
/// a write that fails or stops removes the files it made (and the data
/// folder, when it made it), and the model file is written last.
pub fn write(
    model: &Model,
    plan: &Plan,
    recipe: impl Into<Recipe>,
    weights: &HashMap<WeightKey, PackedWeight>,
    output: &OutFile,
    mode: LinkMode,
    cancel: &Cancel,
) -> Result<Report> {
    let recipe: Recipe = recipe.into();
    let graph = graph_to_splice(model, plan, &recipe)?;
    output.refuse_input(model.stamp(), "model", None)?;
    let folder = DataFolder::of(output);
    let rewrite = Rewrite::new(model, plan, &recipe, weights, folder.name().into())?;
    let mut report = Report {
        data_dir: folder.shown(),
        link: mode,
        ..rewrite.report()
    };
    // Payload files first, then the model that refers to them.
    let (src, add) = (&rewrite.src, &rewrite.add);
    let filled = folder.fill(src, &add.files, &rewrite.dropped, mode, cancel, &mut report)?;
    let edits = rewrite.edits(&filled.relocated);
    let written = cancel
        .check()
        .and_then(|()| splice::write_model(src, graph, &edits, output));
    match written {
        Ok(n) => report.model_bytes = n,
        Err(e) => {
            filled.discard(&report);
            return Err(e);
        }
    }
    filled.prune();
    Ok(report)
}

/// Refuses, before anything is read or written, what cannot be
/// materialized; returns the span of the model's one graph field.
fn graph_to_splice(model: &Model, plan: &Plan, recipe: &Recipe) -> Result<Range<usize>> {
    recipe.validate()?;
    if let Some(why) = plan.why_nothing() {
        return Err(Error::Rewrite(format!("nothing to materialize: {why}")));
    }
    if let Recipe::Int8(_) = recipe {
        int8::require_opset(model)?;
    }
    let graphs: Vec<_> = model
        .top_fields()
        .iter()
        .filter(|f| f.number == MODEL_GRAPH)
        .collect();
    let [graph] = graphs.as_slice() else {
        return Err(Error::Rewrite(
            "the model's graph field occurs more than once; re-save it with onnx first".into(),
        ));
    };
    Ok(graph.value.clone())
}

/// The new initializers of every (weight, transposed) pair the targets
/// read, appended to `add`; the new inputs by pair.
fn new_inputs<'a>(
    src: &Source<'_>,
    recipe: &Recipe,
    weights: &'a HashMap<WeightKey, PackedWeight>,
    add: &mut Additions<'a>,
) -> Result<HashMap<WeightKey, NewInputs>> {
    let mut inputs: HashMap<WeightKey, NewInputs> = HashMap::new();
    for t in &src.plan.targets {
        let key = (t.weight.clone(), t.transposed);
        if inputs.contains_key(&key) {
            continue;
        }
        let w = packed(weights, &t.weight, t.transposed)?;
        let new = match recipe {
            Recipe::Nbits(s) => nbits::inputs(t, w, s, add)?,
            Recipe::Int8(s) => int8::inputs(t, w, s, add)?,
            Recipe::Fp16(_) => {
                return Err(Error::Rewrite(
                    "materialize: onnxruntime-fp16 rewrites no MatMul node".into(),
                ))
            }
        };
        inputs.insert(key, new);
    }
    Ok(inputs)
}

/// The nodes a materialize changes.
struct NodeEdits {
    /// Replacement nodes by top-level node index.
    top: HashMap<usize, Vec<pb::NodeProto>>,
    /// How many nodes were rewritten.
    rewritten: usize,
    /// int8: weights that later readers read dequantized (their FLOAT
    /// initializer goes).
    dequantized: HashSet<String>,
}

/// Every target's replacement nodes, put in place among the top-level
/// nodes, and the target's other node edits.
fn new_nodes(
    src: &Source<'_>,
    recipe: &Recipe,
    inputs: &HashMap<WeightKey, NewInputs>,
    add: &mut Additions<'_>,
) -> Result<NodeEdits> {
    let mut inner: Replacements = HashMap::new();
    let mut quantized_values = HashMap::new();
    for t in &src.plan.targets {
        let ins = &inputs[&(t.weight.clone(), t.transposed)];
        let nodes = match recipe {
            Recipe::Nbits(settings) => nbits::replacement(t, ins, settings, &mut add.names),
            Recipe::Int8(_) => int8::replacement(t, ins, &mut quantized_values, add),
            Recipe::Fp16(_) => Vec::new(),
        };
        inner.insert((t.scope.clone(), t.node_index), nodes);
    }
    let mut rewritten = inner.len();
    let mut top = splice::top_level(&src.plan.targets, &inner, &src.top_nodes);
    // int8: a quantized weight or Gather output that later nodes still read
    // as FLOAT is dequantized for them, as quantize_dynamic does.
    let names = &mut add.names;
    let dequantized = match recipe {
        Recipe::Int8(s) => {
            int8::dequantize_later_uses(src, s, inputs, &quantized_values, &mut top, names)?
        }
        Recipe::Nbits(_) | Recipe::Fp16(_) => HashSet::new(),
    };
    if let Recipe::Fp16(s) = recipe {
        rewritten = fp16::nodes(src, s, &mut top, names)?;
    }
    Ok(NodeEdits {
        top,
        rewritten,
        dequantized,
    })
}

/// The initializers the new model drops: replaced weights nothing else
/// reads any more (or that is read dequantized), and the converted ones.
fn dropped<'p>(src: &Source<'p>, nodes: &NodeEdits) -> Result<HashSet<&'p str>> {
    let still_used = used_names(src.model, &src.top_nodes, &nodes.top)?;
    Ok(src
        .plan
        .targets
        .iter()
        .map(|t| t.weight.as_str())
        .filter(|w| !still_used.contains(*w) || nodes.dequantized.contains(*w))
        .chain(src.plan.tensors.iter().map(String::as_str))
        .chain(src.plan.placed.iter().map(String::as_str))
        .collect())
}

/// Each placed initializer again, its data now its identity payload's
/// `values` field: the whole file (the original goes with the dropped ones).
fn add_placed<'a>(
    src: &Source<'_>,
    weights: &'a HashMap<WeightKey, PackedWeight>,
    add: &mut Additions<'a>,
) -> Result<()> {
    for name in &src.plan.placed {
        let w = packed(weights, name, false)?;
        let bad = |what: String| {
            Error::Rewrite(format!(
                "materialize: the cache entry for {name:?} is not its identity payload: {what}"
            ))
        };
        let t = src
            .initializers
            .iter()
            .find(|t| &t.name == name)
            .ok_or_else(|| Error::Rewrite(format!("materialize: no initializer {name:?}")))?;
        let field = fields::PayloadFields::read(w, &bad)?.get("values")?;
        if w.struct_type.name != IDENTITY
            || field.data_type != t.data_type
            || field.shape != t.dims
            || Some(field.span.len) != t.raw_size()
        {
            return Err(bad(format!(
                "{} values {:?}",
                w.struct_type.name, field.shape
            )));
        }
        add.append(name, w, field);
    }
    Ok(())
}
