//! Splicing the materialized model at the wire level: replacement nodes
//! put in place (inside subgraphs too), the graph's fields re-encoded only
//! where they change (nodes replaced, weights and their value_info dropped,
//! kept initializers relocated, new initializers appended), every other
//! byte copied from the source mapping, and the model file written.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::ops::Range;

use prost::Message;

use super::fp16::float_to_fp16;
use super::nbits;
use super::weight::Source;
use crate::error::{Error, Result};
use crate::materialize::{Step, Target};
use crate::onnx::fields::{GRAPH_INITIALIZER, GRAPH_NODE, GRAPH_VALUE_INFO, MODEL_GRAPH};
use crate::onnx::rewrite::encoded_field;
use crate::outdir::OutFile;
use crate::pb;
use crate::wire::{put_len_prefix, Fields};

/// Replacement nodes by (scope, index in their graph).
pub(super) type Replacements = HashMap<(Vec<Step>, usize), Vec<pb::NodeProto>>;

/// The top-level nodes the replacements change, by index: a target itself
/// (its replacement), or a node whose subgraphs hold targets (the node
/// with them replaced).
pub(super) fn top_level(
    targets: &[Target],
    inner: &Replacements,
    top_nodes: &[pb::NodeProto],
) -> HashMap<usize, Vec<pb::NodeProto>> {
    let mut new_top: HashMap<usize, Vec<pb::NodeProto>> = HashMap::new();
    for t in targets {
        let i = t.scope.first().map_or(t.node_index, |s| s.node);
        if new_top.contains_key(&i) {
            continue;
        }
        let nodes = if t.scope.is_empty() {
            inner[&(Vec::new(), i)].clone()
        } else {
            let mut n = top_nodes[i].clone();
            rewrite_subgraphs(&mut n, &mut Vec::new(), i, inner);
            vec![n]
        };
        new_top.insert(i, nodes);
    }
    new_top
}

/// Replaces, inside `node`'s subgraphs, the nodes `inner` has replacements
/// for; `index` is `node`'s position in its graph, `scope` the path to that
/// graph.
fn rewrite_subgraphs(
    node: &mut pb::NodeProto,
    scope: &mut Vec<Step>,
    index: usize,
    inner: &Replacements,
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

/// What the splice changes in the model.
pub(super) struct Edits<'a> {
    /// Replacement nodes by top-level node index.
    pub(super) replaced: &'a HashMap<usize, Vec<pb::NodeProto>>,
    /// Initializers (and their value_info) left out.
    pub(super) dropped: &'a HashSet<&'a str>,
    /// Re-encoded initializers by initializer index.
    pub(super) relocated: &'a HashMap<usize, Vec<u8>>,
    /// Initializers appended.
    pub(super) new_inits: &'a [pb::TensorProto],
    /// value_info appended (made FLOAT16 as the others with `to_fp16`).
    pub(super) value_info: &'a [pb::ValueInfoProto],
    /// FLOAT value_info becomes FLOAT16 (onnxruntime-fp16).
    pub(super) to_fp16: bool,
    /// The `com.microsoft` opset is imported, if it is not yet
    /// (MatMulNBits).
    pub(super) import_ms_domain: bool,
}

/// The graph's bytes with nodes replaced, weights dropped (with their
/// value_info) and the new initializers appended.
fn splice_graph(src: &Source<'_>, graph: Range<usize>, edits: &Edits<'_>) -> Result<Vec<Piece>> {
    let Edits {
        replaced,
        dropped,
        relocated,
        new_inits,
        value_info,
        to_fp16,
        import_ms_domain: _,
    } = edits;
    let bytes = src.model.bytes();
    let wire = |e| Error::wire("GraphProto", e);
    let mut pieces = Vec::new();
    let (mut node_i, mut init_i) = (0usize, 0usize);
    for f in Fields::with_base(&bytes[graph.clone()], graph.start) {
        let f = f.map_err(wire)?;
        let piece = match f.number {
            GRAPH_NODE => {
                node_i += 1;
                match replaced.get(&(node_i - 1)) {
                    Some(nodes) => {
                        let mut enc = Vec::new();
                        for n in nodes {
                            encoded_field(&mut enc, GRAPH_NODE, n);
                        }
                        Piece::New(enc)
                    }
                    None => Piece::Source(f.span),
                }
            }
            GRAPH_INITIALIZER => {
                init_i += 1;
                let name = src
                    .initializers
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
                if *to_fp16 && float_to_fp16(&mut vi) {
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
    for vi in *value_info {
        let mut vi = vi.clone();
        if *to_fp16 {
            float_to_fp16(&mut vi);
        }
        encoded_field(&mut tail, GRAPH_VALUE_INFO, &vi);
    }
    for t in *new_inits {
        encoded_field(&mut tail, GRAPH_INITIALIZER, t);
    }
    pieces.push(Piece::New(tail));
    Ok(pieces)
}

/// Writes the spliced model to `output`; returns its size.
pub(super) fn write_model(
    src: &Source<'_>,
    graph: Range<usize>,
    edits: &Edits<'_>,
    output: &OutFile,
) -> Result<u64> {
    let pieces = model_pieces(src, graph, edits)?;
    output
        .dir
        .write(&output.name, |w| write_pieces(src, &pieces, w))
        .map_err(|e| Error::write(output.path(), e))?;
    Ok(pieces.iter().map(|p| p.len() as u64).sum())
}

/// Appends the spliced model to `out`; returns its size.
pub(super) fn encode_model(
    src: &Source<'_>,
    graph: Range<usize>,
    edits: &Edits<'_>,
    out: &mut Vec<u8>,
) -> Result<u64> {
    let pieces = model_pieces(src, graph, edits)?;
    let len: usize = pieces.iter().map(Piece::len).sum();
    out.try_reserve_exact(len)
        .map_err(|e| Error::Rewrite(format!("materialize: {len} bytes of model: {e}")))?;
    // Only the check that the source is intact can fail.
    write_pieces(src, &pieces, out)
        .map_err(|e| Error::io(src.model.path().unwrap_or(src.model.dir()), e))?;
    Ok(len as u64)
}

/// The model's top-level fields in order, the graph spliced.
fn model_pieces(src: &Source<'_>, graph: Range<usize>, edits: &Edits<'_>) -> Result<Vec<Piece>> {
    let model = src.model;
    let mut pieces = splice_graph(src, graph, edits)?;
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
    if edits.import_ms_domain {
        top.extend(nbits::ms_domain_import(model)?.map(Piece::New));
    }
    Ok(top)
}

/// Writes `pieces` out, then makes sure the source's bytes did not change
/// meanwhile.
fn write_pieces(src: &Source<'_>, pieces: &[Piece], w: &mut impl Write) -> std::io::Result<()> {
    let bytes = src.model.bytes();
    for p in pieces {
        match p {
            Piece::Source(r) => w.write_all(&bytes[r.clone()])?,
            Piece::New(v) => w.write_all(v)?,
        }
    }
    crate::onnx::ensure_intact([&bytes[..]])
}
