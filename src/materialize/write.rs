//! Writing a materialized model: the graph is spliced at the wire level
//! (rewritten nodes re-encoded in place, replaced weights dropped, the new
//! initializers appended as external data), every other byte copied from
//! the source mapping, and the payload files placed in `<out>.weights/`.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};

use prost::Message;

use super::place::{place, LinkMode, Method, Placed};
use super::plan::{
    graph_value_names, used_names, Op, Plan, Step, Target, GRAPH_INPUT, GRAPH_VALUE_INFO,
};
use super::{Fp16Settings, Int8Settings, Recipe, Settings};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::onnx::fields::{GRAPH_INITIALIZER, GRAPH_NODE, MODEL_GRAPH};
use crate::onnx::rewrite::encoded_field;
use crate::onnx::{ExternalRef, Model, Storage};
use crate::outdir::{OutDir, OutFile};
use crate::pb;
use crate::structs::{leaves, LeafType, Limits};
use crate::wire::{put_len_prefix, Fields};

const MODEL_OPSET_IMPORT: u32 = 8;
const MS_DOMAIN: &str = "com.microsoft";

/// A packed weight: (initializer name, read transposed).
pub type WeightKey = (String, bool);

/// A cached `ort.matmul_nbits` payload for one weight.
#[derive(Debug, Clone)]
pub struct PackedWeight {
    /// The cache's payload file (what is reflinked, copied or linked).
    pub payload_path: PathBuf,
    /// The store's payload, when it comes from one: a copy then sends only
    /// checked bytes, and a link or reflink must be of the file hashed.
    pub checked: Option<std::sync::Arc<crate::store::Payload>>,
    /// Its name in the data folder; equal payloads share one name.
    pub file_name: String,
    /// The entry's physical type and dims (where B, scales and zero points lie).
    pub struct_type: pb::StructTypeProto,
    /// `StructProto.dims` of the entry.
    pub dims: Vec<u64>,
}

/// What a materialize wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// MatMul / Gemm nodes replaced by MatMulNBits.
    pub nodes_rewritten: usize,
    /// Float weights no node uses any more, dropped from the model.
    pub initializers_removed: usize,
    /// The folder beside the model that holds the payload files.
    pub data_dir: PathBuf,
    /// How files were asked to be placed.
    pub link: LinkMode,
    /// Every file placed in the data folder, and how.
    pub files: Vec<Placed>,
    /// Bytes copied into files (0 when every file is a reflink or a link).
    pub bytes_copied: u64,
    /// Size of the written model file.
    pub model_bytes: u64,
    /// Bytes of payload the new model references.
    pub payload_bytes: u64,
}

impl Report {
    /// How many files were placed by `method`.
    pub fn count(&self, method: Method) -> usize {
        self.files.iter().filter(|f| f.method == method).count()
    }
}

/// Where one field of a payload lies.
#[derive(Debug, Clone, Copy)]
struct Span {
    offset: u64,
    len: u64,
}

/// The byte ranges of B, scales and zero points in a payload, read from its
/// physical type and checked against the target's shape.
struct Layout {
    b: (Span, Vec<u64>),
    scales: (Span, Vec<u64>, DataType),
    zero_points: Option<(Span, Vec<u64>)>,
}

/// The entry is not a payload of `packer` for the target's weight.
fn not_a_payload(t: &Target, packer: &str, what: String) -> Error {
    Error::Rewrite(format!(
        "materialize: the cache entry for {:?} is not an {packer} payload for this weight: {what}",
        t.weight
    ))
}

/// The dense, byte-aligned tensor field `name` of a payload: its span,
/// shape and element type (`None` when the type has no such field).
fn dense_field(
    all: &[crate::structs::Leaf],
    name: &str,
    bad: &dyn Fn(String) -> Error,
) -> Result<Option<(Span, Vec<u64>, DataType)>> {
    let Some(l) = all.iter().find(|l| l.path == name) else {
        return Ok(None);
    };
    let LeafType::Tensor(dt) = l.elem else {
        return Err(bad(format!("{name} is a packed-bits field")));
    };
    let width = l.bit_width();
    // Dense row-major, byte aligned: the field is one contiguous range.
    let mut stride = width;
    for (dim, got) in l.shape.iter().zip(&l.strides_bits).rev() {
        if *got != stride && *dim > 1 {
            return Err(bad(format!("{name} is not stored densely")));
        }
        stride = stride.saturating_mul(*dim);
    }
    if l.offset_bits % 8 != 0 || stride % 8 != 0 {
        return Err(bad(format!("{name} is not byte aligned")));
    }
    let span = Span {
        offset: l.offset_bits / 8,
        len: stride / 8,
    };
    Ok(Some((span, l.shape.clone(), dt)))
}

fn layout(t: &Target, w: &PackedWeight, s: &Settings) -> Result<Layout> {
    let bad = |what: String| not_a_payload(t, super::PACKER, what);
    let all = leaves(&w.struct_type, &w.dims, &[], &Limits::default())?;
    let find = |name: &str| dense_field(&all, name, &bad);
    let kb = t.k.div_ceil(u64::from(s.block_size));
    let blob = u64::from(s.block_size * s.bits / 8);
    let (b_span, b_shape, b_dt) = find("B")?.ok_or_else(|| bad("no field B".into()))?;
    if b_dt != DataType::UINT8 || b_shape != [t.n, kb, blob] {
        return Err(bad(format!(
            "B is {b_dt} {b_shape:?}, expected UINT8 [{}, {kb}, {blob}]",
            t.n
        )));
    }
    let scales = find("scales")?.ok_or_else(|| bad("no field scales".into()))?;
    if scales.2 != t.data_type || scales.1 != [t.n, kb] {
        return Err(bad(format!("scales are {} {:?}", scales.2, scales.1)));
    }
    let zero_points = match (find("zero_points")?, s.symmetric) {
        (None, true) => None,
        (Some((span, shape, DataType::UINT8)), false) if shape.first() == Some(&t.n) => {
            Some((span, shape))
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
        b: (b_span, b_shape),
        scales,
        zero_points,
    })
}

/// Where the quantized weight, scale and zero point of an
/// `ort.quantize_dynamic` payload lie, checked against the target.
struct Int8Layout {
    quantized: (Span, Vec<u64>, DataType),
    scale: Span,
    zero_point: Span,
    /// Dims of scale and zero point: `[]` per tensor, `[C]` per channel.
    channel_dims: Vec<u64>,
}

fn int8_layout(t: &Target, w: &PackedWeight, s: &Int8Settings) -> Result<Int8Layout> {
    let bad = |what: String| not_a_payload(t, super::PACKER_INT8, what);
    let all = leaves(&w.struct_type, &w.dims, &[], &Limits::default())?;
    let find =
        |name: &str| dense_field(&all, name, &bad)?.ok_or_else(|| bad(format!("no field {name}")));
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
    let quantized = find("quantized")?;
    if quantized.2 != qt || quantized.1 != want {
        return Err(bad(format!(
            "quantized is {} {:?}, expected {qt} {want:?}",
            quantized.2, quantized.1
        )));
    }
    let c = if s.per_channel { t.n } else { 1 };
    let scale = find("scale")?;
    let zero_point = find("zero_point")?;
    if scale.2 != DataType::FLOAT || scale.1 != [c] || zero_point.2 != qt || zero_point.1 != [c] {
        return Err(bad(format!(
            "scale {} {:?} and zero point {} {:?}, expected FLOAT [{c}] and {qt} [{c}]",
            scale.2, scale.1, zero_point.2, zero_point.1
        )));
    }
    Ok(Int8Layout {
        quantized,
        scale: scale.0,
        zero_point: zero_point.0,
        channel_dims: if s.per_channel { vec![c] } else { Vec::new() },
    })
}

fn int_attr(name: &str, i: i64) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        i,
        r#type: pb::attribute_proto::AttributeType::Int as i32,
        ..Default::default()
    }
}

fn external_tensor(
    name: &str,
    data_type: DataType,
    dims: &[u64],
    location: &str,
    span: Span,
) -> pb::TensorProto {
    pb::TensorProto {
        name: name.into(),
        data_type: data_type.code(),
        dims: dims.iter().map(|&d| d as i64).collect(),
        external_data: ExternalRef {
            location: location.into(),
            offset: span.offset,
            length: Some(span.len),
        }
        .to_entries(),
        data_location: pb::tensor_proto::DataLocation::External as i32,
        ..Default::default()
    }
}

/// Names not yet taken in the graph.
struct Names(HashSet<String>);

impl Names {
    fn fresh(&mut self, base: String) -> String {
        let mut name = base.clone();
        let mut i = 1;
        while self.0.contains(&name) {
            name = format!("{base}_{i}");
            i += 1;
        }
        self.0.insert(name.clone());
        name
    }
}

/// The MatMulNBits inputs of one weight, as initializer names.
struct NewInputs {
    b: String,
    scales: String,
    zero_points: Option<String>,
}

/// One piece of the output: bytes of the source model, or new bytes.
enum Piece {
    Source(Range<usize>),
    New(Vec<u8>),
}

impl Piece {
    fn len(&self) -> usize {
        match self {
            Piece::Source(r) => r.len(),
            Piece::New(v) => v.len(),
        }
    }
}

/// The data folder of `out`: `model.onnx` -> `model.onnx.weights`.
pub fn data_dir_name(out: &Path) -> Result<String> {
    out.file_name()
        .map(weights_name)
        .ok_or_else(|| Error::Rewrite(format!("{} has no file name", out.display())))
}

fn weights_name(model_name: &OsStr) -> String {
    format!("{}.weights", model_name.to_string_lossy())
}

/// Writes the materialized model to `out` with its payload files in
/// `<out>.weights/`. Nothing is written when the plan has no target.
pub fn write(
    model: &Model,
    plan: &Plan,
    recipe: impl Into<Recipe>,
    weights: &HashMap<WeightKey, PackedWeight>,
    output: &OutFile,
    mode: LinkMode,
) -> Result<Report> {
    let recipe: Recipe = recipe.into();
    let out = &output.path();
    recipe.validate()?;
    if let Some(why) = plan.why_nothing() {
        return Err(Error::Rewrite(format!("nothing to materialize: {why}")));
    }
    output.refuse_input(model.stamp(), "model", None)?;
    if let Recipe::Int8(_) = recipe {
        let opset = default_opset(model)?;
        if opset < 11 {
            return Err(Error::Rewrite(format!(
                "materialize: the model imports ai.onnx opset {opset}; {} needs 11 or later (DynamicQuantizeLinear)",
                recipe.target()
            )));
        }
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
    let out_dir = output.dir.path();
    let data_name = weights_name(&output.name);
    let data_dir = output.dir.shown(data_name.as_ref());

    let initializers = model.initializers()?;
    let top_nodes = model.nodes()?;
    let mut taken: HashSet<String> = initializers.iter().map(|t| t.name.clone()).collect();
    taken.extend(graph_value_names(model, GRAPH_INPUT)?);
    defined_names(&top_nodes, &mut taken);
    let mut names = Names(taken);

    // New initializers, one set per packed weight.
    let mut report = Report {
        data_dir: data_dir.clone(),
        link: mode,
        ..Default::default()
    };
    let mut new_inits = Vec::new();
    let mut inputs: HashMap<WeightKey, NewInputs> = HashMap::new();
    let mut files: Vec<&PackedWeight> = Vec::new();
    for t in &plan.targets {
        let key = (t.weight.clone(), t.transposed);
        if inputs.contains_key(&key) {
            continue;
        }
        let w = weights.get(&key).ok_or_else(|| {
            Error::Rewrite(format!("materialize: no packed payload for {:?}", t.weight))
        })?;
        let location = format!("{data_name}/{}", w.file_name);
        if !files.iter().any(|f| f.file_name == w.file_name) {
            files.push(w);
        }
        let new = match &recipe {
            Recipe::Nbits(settings) => nbits_inputs(
                t,
                w,
                settings,
                &location,
                &mut names,
                &mut new_inits,
                &mut report,
            )?,
            Recipe::Int8(s) => {
                int8_inputs(t, w, s, &location, &mut names, &mut new_inits, &mut report)?
            }
            Recipe::Fp16(_) => {
                return Err(Error::Rewrite(
                    "materialize: onnxruntime-fp16 rewrites no MatMul node".into(),
                ))
            }
        };
        inputs.insert(key, new);
    }

    // onnxruntime-fp16: each FLOAT initializer, same name, as FLOAT16.
    for name in &plan.tensors {
        let w = weights.get(&(name.clone(), false)).ok_or_else(|| {
            Error::Rewrite(format!("materialize: no packed payload for {name:?}"))
        })?;
        let src = initializers
            .iter()
            .find(|t| &t.name == name)
            .ok_or_else(|| Error::Rewrite(format!("materialize: no initializer {name:?}")))?;
        let all = leaves(&w.struct_type, &w.dims, &[], &Limits::default())?;
        let bad = |what: String| {
            Error::Rewrite(format!(
                "materialize: the cache entry for {name:?} is not an {} payload for this tensor: {what}",
                super::PACKER_FP16
            ))
        };
        let (span, shape, dt) =
            dense_field(&all, "values", &bad)?.ok_or_else(|| bad("no field values".into()))?;
        if dt != DataType::FLOAT16 || shape != src.dims {
            return Err(bad(format!(
                "values are {dt} {shape:?}, expected FLOAT16 {:?}",
                src.dims
            )));
        }
        let location = format!("{data_name}/{}", w.file_name);
        if !files.iter().any(|f| f.file_name == w.file_name) {
            files.push(w);
        }
        new_inits.push(external_tensor(
            name,
            DataType::FLOAT16,
            &shape,
            &location,
            span,
        ));
        report.payload_bytes += span.len;
    }

    // Replacement nodes by (scope, index), then the top-level nodes they
    // change: a target itself, or a node whose subgraphs hold targets.
    let mut inner: HashMap<(Vec<Step>, usize), Vec<pb::NodeProto>> = HashMap::new();
    let mut quantized_inputs: HashMap<(Vec<Step>, String), DynamicInput> = HashMap::new();
    for t in &plan.targets {
        let ins = &inputs[&(t.weight.clone(), t.transposed)];
        let nodes = match &recipe {
            Recipe::Nbits(settings) => replacement(t, ins, settings, &mut names),
            Recipe::Int8(_) => int8_replacement(t, ins, &mut quantized_inputs, &mut names),
            Recipe::Fp16(_) => Vec::new(),
        };
        inner.insert((t.scope.clone(), t.node_index), nodes);
    }
    report.nodes_rewritten = inner.len();
    let mut new_top: HashMap<usize, Vec<pb::NodeProto>> = HashMap::new();
    for t in &plan.targets {
        let i = t.scope.first().map_or(t.node_index, |s| s.node);
        if new_top.contains_key(&i) {
            continue;
        }
        let nodes = if t.scope.is_empty() {
            inner[&(Vec::new(), i)].clone()
        } else {
            let mut n = top_nodes[i].clone();
            rewrite_subgraphs(&mut n, &mut Vec::new(), i, &inner);
            vec![n]
        };
        new_top.insert(i, nodes);
    }
    // int8: a quantized weight that later nodes still read as FLOAT is
    // dequantized for them, as quantize_dynamic does.
    let dequantized = match &recipe {
        Recipe::Int8(s) => dequantize_later_uses(
            model,
            plan,
            s,
            &inputs,
            &top_nodes,
            &mut new_top,
            &mut names,
        )?,
        Recipe::Nbits(_) | Recipe::Fp16(_) => HashSet::new(),
    };
    if let Recipe::Fp16(s) = &recipe {
        report.nodes_rewritten = fp16_nodes(model, s, &top_nodes, &mut new_top, &mut names)?;
    }
    let replaced: HashMap<usize, Vec<u8>> = new_top
        .iter()
        .map(|(&i, nodes)| {
            let mut enc = Vec::new();
            for n in nodes {
                encoded_field(&mut enc, GRAPH_NODE, n);
            }
            (i, enc)
        })
        .collect();

    // Weights nothing else reads any more are dropped.
    let still_used = used_names(model, &top_nodes, &new_top)?;
    let dropped: HashSet<&str> = plan
        .targets
        .iter()
        .map(|t| t.weight.as_str())
        .filter(|w| !still_used.contains(*w) || dequantized.contains(*w))
        .chain(plan.tensors.iter().map(String::as_str))
        .collect();
    report.initializers_removed = dropped.len();

    // Payload files first, then the model that refers to them. What a
    // failure leaves half done is removed: only what this call made.
    let (weights_dir, made_dir) = output
        .dir
        .subdir(data_name.as_ref())
        .map_err(|e| Error::write(&data_dir, e))?;
    let mut keep: Vec<&OsStr> = Vec::new();
    let placed = place_all(&files, &weights_dir, mode, &mut report).and_then(|()| {
        relocate_external(
            model,
            &initializers,
            &dropped,
            out_dir,
            &weights_dir,
            &data_name,
            &mut report,
        )
    });
    let relocated = match placed {
        Ok(r) => r,
        Err(e) => {
            if made_dir {
                for f in &report.files {
                    let _ = weights_dir.remove(f.path.file_name().unwrap_or_default());
                }
                let _ = output.dir.remove_dir(data_name.as_ref());
            }
            return Err(e);
        }
    };
    keep.extend(files.iter().map(|w| OsStr::new(&w.file_name)));
    if !relocated.is_empty() {
        keep.push(OsStr::new(KEPT_DATA));
    }
    weights_dir.sync().map_err(|e| Error::write(&data_dir, e))?;
    let mut pieces = splice_graph(
        model,
        graph.value.clone(),
        &initializers,
        Edits {
            replaced: &replaced,
            dropped: &dropped,
            relocated: &relocated,
            new_inits: &new_inits,
            to_fp16: matches!(recipe, Recipe::Fp16(_)),
        },
    )?;
    let graph_len: usize = pieces.iter().map(Piece::len).sum();
    let mut top = Vec::new();
    for f in model.top_fields() {
        if f.number == MODEL_GRAPH {
            let mut header = Vec::new();
            put_len_prefix(&mut header, MODEL_GRAPH, graph_len as u64);
            top.push(Piece::New(header));
            top.append(&mut pieces);
        } else {
            top.push(Piece::Source(f.span.clone()));
        }
    }
    if matches!(recipe, Recipe::Nbits(_)) && !imports_ms_domain(model)? {
        let mut v = Vec::new();
        let opset = pb::OperatorSetIdProto {
            domain: MS_DOMAIN.into(),
            version: 1,
        };
        encoded_field(&mut v, MODEL_OPSET_IMPORT, &opset);
        top.push(Piece::New(v));
    }

    let bytes = model.bytes();
    output
        .dir
        .write(&output.name, |w| {
            for p in &top {
                match p {
                    Piece::Source(r) => w.write_all(&bytes[r.clone()])?,
                    Piece::New(v) => w.write_all(v)?,
                }
            }
            crate::onnx::ensure_intact([&bytes[..]])
        })
        .map_err(|e| Error::write(out, e))?;
    report.model_bytes = top.iter().map(|p| p.len() as u64).sum();
    // Files an earlier materialize to this path left behind.
    let _ = weights_dir.prune(&keep);
    Ok(report)
}

/// Every value a node list (and its subgraphs) defines or declares.
fn defined_names(nodes: &[pb::NodeProto], out: &mut HashSet<String>) {
    for n in nodes {
        out.extend(n.output.iter().cloned());
        for a in &n.attribute {
            for g in a.g.iter().chain(a.graphs.iter()) {
                out.extend(g.input.iter().map(|v| v.name.clone()));
                out.extend(g.initializer.iter().map(|t| t.name.clone()));
                defined_names(&g.node, out);
            }
        }
    }
}

/// Replaces, inside `node`'s subgraphs, the nodes `inner` has replacements
/// for; `index` is `node`'s position in its graph, `scope` the path to that
/// graph.
fn rewrite_subgraphs(
    node: &mut pb::NodeProto,
    scope: &mut Vec<Step>,
    index: usize,
    inner: &HashMap<(Vec<Step>, usize), Vec<pb::NodeProto>>,
) {
    for (a, attr) in node.attribute.iter_mut().enumerate() {
        for (k, g) in attr.g.iter_mut().chain(attr.graphs.iter_mut()).enumerate() {
            scope.push(Step {
                node: index,
                attribute: a,
                graph: k,
            });
            for (j, mut child) in std::mem::take(&mut g.node).into_iter().enumerate() {
                match inner.get(&(scope.clone(), j)) {
                    Some(new) => g.node.extend(new.iter().cloned()),
                    None => {
                        rewrite_subgraphs(&mut child, scope, j, inner);
                        g.node.push(child);
                    }
                }
            }
            scope.pop();
        }
    }
}

/// MatMulNBits (and, for a Gemm with C, the Add of C) replacing `t.node`.
fn replacement(t: &Target, ins: &NewInputs, s: &Settings, names: &mut Names) -> Vec<pb::NodeProto> {
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

/// What [`splice_graph`] changes in a graph.
struct Edits<'a> {
    /// Encoded replacement nodes by node index.
    replaced: &'a HashMap<usize, Vec<u8>>,
    /// Initializers (and their value_info) left out.
    dropped: &'a HashSet<&'a str>,
    /// Re-encoded initializers by initializer index.
    relocated: &'a HashMap<usize, Vec<u8>>,
    /// Initializers appended.
    new_inits: &'a [pb::TensorProto],
    /// FLOAT value_info becomes FLOAT16 (onnxruntime-fp16).
    to_fp16: bool,
}

/// The graph's bytes with nodes replaced, weights dropped (with their
/// value_info) and the new initializers appended.
fn splice_graph(
    model: &Model,
    graph: Range<usize>,
    initializers: &[crate::onnx::TensorRef],
    edits: Edits<'_>,
) -> Result<Vec<Piece>> {
    let Edits {
        replaced,
        dropped,
        relocated,
        new_inits,
        to_fp16,
    } = edits;
    let bytes = model.bytes();
    let wire = |e: crate::wire::WireError| Error::Wire {
        context: "GraphProto".into(),
        offset: e.offset,
        problem: e.problem,
    };
    let mut pieces = Vec::new();
    let (mut node_i, mut init_i) = (0usize, 0usize);
    for f in Fields::with_base(&bytes[graph.clone()], graph.start) {
        let f = f.map_err(wire)?;
        let piece = match f.number {
            GRAPH_NODE => {
                node_i += 1;
                match replaced.get(&(node_i - 1)) {
                    Some(enc) => Piece::New(enc.clone()),
                    None => Piece::Source(f.span),
                }
            }
            GRAPH_INITIALIZER => {
                init_i += 1;
                let name = initializers
                    .get(init_i - 1)
                    .map(|t| t.name.as_str())
                    .unwrap_or_default();
                if dropped.contains(name) {
                    continue;
                }
                match relocated.get(&(init_i - 1)) {
                    Some(enc) => Piece::New(enc.clone()),
                    None => Piece::Source(f.span),
                }
            }
            GRAPH_VALUE_INFO => {
                let vi = pb::ValueInfoProto::decode(f.bytes().map_err(wire)?)
                    .map_err(|e| Error::decode("ValueInfoProto", e))?;
                if dropped.contains(vi.name.as_str()) {
                    continue;
                }
                let mut vi = vi;
                if to_fp16 && float_to_fp16(&mut vi) {
                    let mut enc = Vec::new();
                    encoded_field(&mut enc, GRAPH_VALUE_INFO, &vi);
                    Piece::New(enc)
                } else {
                    Piece::Source(f.span)
                }
            }
            _ => Piece::Source(f.span),
        };
        // Adjacent source ranges are written as one.
        match (pieces.last_mut(), piece) {
            (Some(Piece::Source(r)), Piece::Source(s)) if r.end == s.start => r.end = s.end,
            (_, p) => pieces.push(p),
        }
    }
    let mut tail = Vec::new();
    for t in new_inits {
        encoded_field(&mut tail, GRAPH_INITIALIZER, t);
    }
    pieces.push(Piece::New(tail));
    Ok(pieces)
}

/// The MatMulNBits initializers of one weight (external data in the
/// payload file at `location`).
fn nbits_inputs(
    t: &Target,
    w: &PackedWeight,
    settings: &Settings,
    location: &str,
    names: &mut Names,
    new_inits: &mut Vec<pb::TensorProto>,
    report: &mut Report,
) -> Result<NewInputs> {
    let l = layout(t, w, settings)?;
    let base = if t.transposed {
        format!("{}_T", t.weight)
    } else {
        t.weight.clone()
    };
    let b = names.fresh(format!("{base}_Q{}", settings.bits));
    new_inits.push(external_tensor(
        &b,
        DataType::UINT8,
        &l.b.1,
        location,
        l.b.0,
    ));
    let scales = names.fresh(format!("{base}_scales"));
    new_inits.push(external_tensor(
        &scales,
        l.scales.2,
        &l.scales.1,
        location,
        l.scales.0,
    ));
    report.payload_bytes +=
        l.b.0.len + l.scales.0.len + l.zero_points.as_ref().map_or(0, |(s, _)| s.len);
    let zero_points = l.zero_points.map(|(span, shape)| {
        let z = names.fresh(format!("{base}_zero_points"));
        new_inits.push(external_tensor(&z, DataType::UINT8, &shape, location, span));
        z
    });
    Ok(NewInputs {
        b,
        scales,
        zero_points,
    })
}

/// The `quantize_dynamic` initializers of one weight, named as it names
/// them: `<W>_quantized`, `<W>_scale`, `<W>_zero_point`, with `<W>` =
/// `<B>_Transposed` for a Gemm B read transposed.
fn int8_inputs(
    t: &Target,
    w: &PackedWeight,
    s: &Int8Settings,
    location: &str,
    names: &mut Names,
    new_inits: &mut Vec<pb::TensorProto>,
    report: &mut Report,
) -> Result<NewInputs> {
    let l = int8_layout(t, w, s)?;
    let base = if t.transposed {
        names.fresh(format!("{}_Transposed", t.weight))
    } else {
        t.weight.clone()
    };
    let qt = l.quantized.2;
    let b = names.fresh(format!("{base}_quantized"));
    new_inits.push(external_tensor(
        &b,
        qt,
        &l.quantized.1,
        location,
        l.quantized.0,
    ));
    let scales = names.fresh(format!("{base}_scale"));
    new_inits.push(external_tensor(
        &scales,
        DataType::FLOAT,
        &l.channel_dims,
        location,
        l.scale,
    ));
    let z = names.fresh(format!("{base}_zero_point"));
    new_inits.push(external_tensor(
        &z,
        qt,
        &l.channel_dims,
        location,
        l.zero_point,
    ));
    report.payload_bytes += l.quantized.0.len + l.scale.len + l.zero_point.len;
    Ok(NewInputs {
        b,
        scales,
        zero_points: Some(z),
    })
}

/// The outputs of a DynamicQuantizeLinear of one input.
#[derive(Debug, Clone)]
struct DynamicInput {
    quantized: String,
    scale: String,
    zero_point: String,
}

fn node(op: &str, name: String, inputs: Vec<String>, outputs: Vec<String>) -> pb::NodeProto {
    pb::NodeProto {
        input: inputs,
        output: outputs,
        name,
        op_type: op.into(),
        ..Default::default()
    }
}

/// `quantize_dynamic`'s nodes for one MatMul (or Gemm): the input's
/// DynamicQuantizeLinear (once per input and graph), then
/// `Y = Cast(MatMulInteger(A_q, W_q, A_zp, W_zp)) * (A_scale * W_scale)`
/// (and, for a Gemm with C, `+ C`).
fn int8_replacement(
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
fn dequantize_later_uses(
    model: &Model,
    plan: &Plan,
    s: &Int8Settings,
    inputs: &HashMap<WeightKey, NewInputs>,
    top_nodes: &[pb::NodeProto],
    new_top: &mut HashMap<usize, Vec<pb::NodeProto>>,
    names: &mut Names,
) -> Result<HashSet<String>> {
    let mut first: HashMap<&str, usize> = HashMap::new();
    let mut rank: HashMap<&str, usize> = HashMap::new();
    let mut targets: HashSet<usize> = HashSet::new();
    for t in plan.targets.iter().filter(|t| t.scope.is_empty()) {
        targets.insert(t.node_index);
        if t.transposed {
            continue;
        }
        let f = first.entry(t.weight.as_str()).or_insert(t.node_index);
        *f = (*f).min(t.node_index);
        rank.insert(t.weight.as_str(), t.dims.len());
    }
    let outputs: HashSet<String> = graph_value_names(model, super::plan::GRAPH_OUTPUT)?
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

/// A FLOAT tensor (or sequence of FLOAT tensors) value_info made FLOAT16;
/// false when it is not one.
fn float_to_fp16(vi: &mut pb::ValueInfoProto) -> bool {
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

/// The float16 converter's node edits (keep_io_types): a Cast to FLOAT16
/// after each FLOAT graph input (`graph_input_cast<i>` writing
/// `graph_input_cast_<i>`, read instead of the input) and a Cast back to
/// FLOAT before each FLOAT graph output (`graph_output_cast<i>` reading
/// `graph_output_cast_<i>`); Cast-to-FLOAT becomes Cast-to-FLOAT16; FLOAT
/// tensors in attributes become FLOAT16. Returns how many nodes changed.
fn fp16_nodes(
    model: &Model,
    s: &Fp16Settings,
    top_nodes: &[pb::NodeProto],
    new_top: &mut HashMap<usize, Vec<pb::NodeProto>>,
    names: &mut Names,
) -> Result<usize> {
    let float_io = |field: u32| -> Result<Vec<(usize, String)>> {
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
    };
    let mut rename: HashMap<String, String> = HashMap::new();
    let mut head = Vec::new();
    let mut tail = Vec::new();
    let cast = |name: String, input: String, output: String, to: DataType| {
        let mut c = node("Cast", name, vec![input], vec![output]);
        c.attribute.push(int_attr("to", i64::from(to.code())));
        c
    };
    for (i, name) in float_io(GRAPH_INPUT)? {
        let out = names.fresh(format!("graph_input_cast_{i}"));
        rename.insert(name.clone(), out.clone());
        head.push(cast(
            names.fresh(format!("graph_input_cast{i}")),
            name,
            out,
            DataType::FLOAT16,
        ));
    }
    for (i, name) in float_io(super::plan::GRAPH_OUTPUT)? {
        let inp = names.fresh(format!("graph_output_cast_{i}"));
        rename.insert(name.clone(), inp.clone());
        tail.push(cast(
            names.fresh(format!("graph_output_cast{i}")),
            inp,
            name,
            DataType::FLOAT,
        ));
    }
    let mut changed = 0;
    for (i, n) in top_nodes.iter().enumerate() {
        let mut m = n.clone();
        for v in m.input.iter_mut().chain(m.output.iter_mut()) {
            if let Some(r) = rename.get(v.as_str()) {
                v.clone_from(r);
            }
        }
        let is_cast = m.op_type == "Cast" && is_default_domain_node(&m);
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

fn is_default_domain_node(n: &pb::NodeProto) -> bool {
    n.domain.is_empty() || n.domain == "ai.onnx"
}

/// The model's ai.onnx opset (1 when it imports none, as onnx reads it).
fn default_opset(model: &Model) -> Result<i64> {
    for f in model
        .top_fields()
        .iter()
        .filter(|f| f.number == MODEL_OPSET_IMPORT)
    {
        let o = pb::OperatorSetIdProto::decode(&model.bytes()[f.value.clone()])
            .map_err(|e| Error::decode("OperatorSetIdProto", e))?;
        if o.domain.is_empty() || o.domain == "ai.onnx" {
            return Ok(o.version);
        }
    }
    Ok(1)
}

fn imports_ms_domain(model: &Model) -> Result<bool> {
    for f in model
        .top_fields()
        .iter()
        .filter(|f| f.number == MODEL_OPSET_IMPORT)
    {
        let o = pb::OperatorSetIdProto::decode(&model.bytes()[f.value.clone()])
            .map_err(|e| Error::decode("OperatorSetIdProto", e))?;
        if o.domain == MS_DOMAIN {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Places every payload file in the weights folder, noting each in `report`.
fn place_all(
    files: &[&PackedWeight],
    dir: &OutDir,
    mode: LinkMode,
    report: &mut Report,
) -> Result<()> {
    for w in files {
        let p = place(
            &w.payload_path,
            w.checked.as_deref(),
            dir,
            OsStr::new(&w.file_name),
            mode,
        )?;
        report.bytes_copied += p.bytes_copied;
        report.files.push(p);
    }
    Ok(())
}

/// Name of the file holding kept initializers' external data (below).
const KEPT_DATA: &str = "kept.data";

/// External data of the initializers the new model keeps, when it lives in
/// another folder (locations are relative to the model's folder). Their
/// bytes are copied into `<out>.weights/kept.data` and the initializers
/// re-encoded to point there: linking the user's own data file instead
/// would tie the new model to a mutable file and give that file a second
/// link (which onnx.load then refuses, for the original model too).
/// Returns the re-encoded initializer fields by initializer index.
fn relocate_external(
    model: &Model,
    initializers: &[crate::onnx::TensorRef],
    dropped: &HashSet<&str>,
    out_dir: &Path,
    data_dir: &OutDir,
    data_name: &str,
    report: &mut Report,
) -> Result<HashMap<usize, Vec<u8>>> {
    let mut encoded = HashMap::new();
    if fs::canonicalize(model.dir()).ok() == fs::canonicalize(out_dir).ok() {
        return Ok(encoded);
    }
    let ranges = model.graph_fields(GRAPH_INITIALIZER)?;
    let mut parts: Vec<(u64, bytes::Bytes)> = Vec::new();
    let mut len = 0u64;
    let location = format!("{data_name}/{KEPT_DATA}");
    for (i, t) in initializers.iter().enumerate() {
        if dropped.contains(t.name.as_str()) || !matches!(t.storage, Storage::External(_)) {
            continue;
        }
        let data = model
            .mapped_data(t)?
            .ok_or_else(|| Error::external(&t.name, "no data"))?;
        let offset = len.next_multiple_of(KEPT_ALIGN);
        len = offset + data.len() as u64;
        let mut proto = pb::TensorProto::decode(&model.bytes()[ranges[i].clone()])
            .map_err(|e| Error::decode("TensorProto", e))?;
        proto.external_data = ExternalRef {
            location: location.clone(),
            offset,
            length: Some(data.len() as u64),
        }
        .to_entries();
        let mut field = Vec::new();
        encoded_field(&mut field, GRAPH_INITIALIZER, &proto);
        encoded.insert(i, field);
        parts.push((offset, data));
    }
    if parts.is_empty() {
        return Ok(encoded);
    }
    let kept = data_dir.shown(KEPT_DATA.as_ref());
    data_dir
        .write(KEPT_DATA.as_ref(), |w| {
            let mut pos = 0u64;
            for (offset, data) in &parts {
                w.write_all(&vec![0u8; (offset - pos) as usize])?;
                w.write_all(data)?;
                pos = offset + data.len() as u64;
            }
            crate::onnx::ensure_intact(parts.iter().map(|(_, d)| &d[..]))
        })
        .map_err(|e| Error::write(&kept, e))?;
    report.files.push(Placed {
        path: kept,
        method: Method::Copy,
        bytes_copied: len,
    });
    report.bytes_copied += len;
    Ok(encoded)
}

/// Alignment of kept tensors in `kept.data` (any element type reads aligned).
const KEPT_ALIGN: u64 = 64;
