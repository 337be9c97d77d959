//! The content digest of a whole model, as a runtime form's key covers it:
//! every byte of the model but each top-level initializer's data, which
//! its D3 digest stands for (so external data counts by its content, and
//! where a file lies or what it is called does not).

use crate::digest::{digest_all, Algorithm, SourceDigest};
use crate::error::{Error, Result};
use crate::onnx::elem_types::subgraphs;
use crate::onnx::fields::{GRAPH_INITIALIZER, MODEL_FUNCTIONS, MODEL_GRAPH};
use crate::onnx::{Model, TensorRef};
use crate::wire::Fields;

/// What the digest starts with: the scheme, so that another never meets it.
const DOMAIN: &[u8] = b"ctcache runtime-form model v2\0";

/// Each piece hashed starts with its kind, so that no sequence of pieces
/// reads as another (a graph's last fields as top-level fields, say).
const FIELD: u8 = b'F';
const INITIALIZER: u8 = b'I';
const GRAPH_START: u8 = b'G';
const GRAPH_END: u8 = b'E';

/// `GraphProto.sparse_initializer`.
const GRAPH_SPARSE_INITIALIZER: u32 = 15;

/// The model's content digest (blake3): its top-level fields in order, the
/// graph's fields in order between a start and an end mark, each top-level
/// initializer as its name and D3 digest. Every other tensor (subgraph
/// initializers, Constant and other attribute tensors, sparse
/// initializers) is hashed as its bytes, so one held as external data is
/// refused: its bytes would be a reference, not the data.
pub fn model_digest(model: &Model) -> Result<[u8; 32]> {
    let initializers = model.initializers()?;
    let digests = digest_all(model, &initializers, Algorithm::Blake3);
    model_digest_of(model, &initializers, digests)
}

/// [`model_digest`] with the top-level initializers' blake3 D3 digests
/// known (`initializers` as `Model::initializers` lists them, `digests` in
/// the same order): a caller that keeps digests (the daemon's memo) hashes
/// no initializer again.
pub fn model_digest_of(
    model: &Model,
    initializers: &[TensorRef],
    digests: impl IntoIterator<Item = Result<SourceDigest>>,
) -> Result<[u8; 32]> {
    refuse_external_data_outside_initializers(model)?;
    let bytes = model.bytes();
    let mut h = blake3::Hasher::new();
    h.update(DOMAIN);
    let mut next_initializer = initializers.iter().zip(digests);
    for top in model.top_fields() {
        if top.number != MODEL_GRAPH {
            field(&mut h, &bytes[top.span.clone()]);
            continue;
        }
        h.update(&[GRAPH_START]);
        for f in Fields::with_base(&bytes[top.value.clone()], top.value.start) {
            let f = f.map_err(|e| Error::wire("GraphProto", e))?;
            if f.number != GRAPH_INITIALIZER {
                field(&mut h, &bytes[f.span.clone()]);
                continue;
            }
            let (t, digest) = next_initializer.next().ok_or_else(|| {
                Error::Model("the graph's initializers changed while read".into())
            })?;
            let digest = digest?;
            if digest.algorithm != Algorithm::Blake3 {
                return Err(Error::Model(format!(
                    "initializer {:?}: a model digest takes blake3 digests",
                    t.name
                )));
            }
            h.update(&[INITIALIZER]);
            h.update(&(t.name.len() as u64).to_le_bytes());
            h.update(t.name.as_bytes());
            h.update(&digest.bytes);
        }
        h.update(&[GRAPH_END]);
    }
    Ok(*h.finalize().as_bytes())
}

/// One field's bytes, length-prefixed.
fn field(h: &mut blake3::Hasher, bytes: &[u8]) {
    h.update(&[FIELD]);
    h.update(&(bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// Refuses a model with a tensor held as external data anywhere but its
/// top-level initializers: in a node's attribute (the graph's, a
/// subgraph's or a model-local function's), a subgraph initializer or a
/// sparse initializer. Such data would count by its location, not its
/// content, and a runtime would read it from a file nobody handed over.
pub(super) fn refuse_external_data_outside_initializers(model: &Model) -> Result<()> {
    let refuse = |what: String| {
        Err(Error::Model(format!(
            "{what} is external data; a runtime form needs it in the model"
        )))
    };
    let external = |t: &crate::pb::TensorProto| !t.external_data.is_empty();
    fn tensors(n: &crate::pb::NodeProto) -> impl Iterator<Item = &crate::pb::TensorProto> {
        n.attribute.iter().flat_map(|a| {
            a.t.iter()
                .chain(&a.tensors)
                .chain(
                    a.sparse_tensor
                        .iter()
                        .flat_map(|s| s.values.iter().chain(&s.indices)),
                )
                .chain(
                    a.sparse_tensors
                        .iter()
                        .flat_map(|s| s.values.iter().chain(&s.indices)),
                )
        })
    }
    fn nodes_below(n: &crate::pb::NodeProto) -> Vec<&crate::pb::NodeProto> {
        let mut all = vec![n];
        for g in subgraphs(n) {
            for t in &g.node {
                all.extend(nodes_below(t));
            }
        }
        all
    }
    let mut top = model.nodes()?;
    for f in model
        .top_fields()
        .iter()
        .filter(|f| f.number == MODEL_FUNCTIONS)
    {
        let function: crate::pb::FunctionProto =
            crate::onnx::decode(model.bytes().slice(f.value.clone()), "FunctionProto")?;
        top.extend(function.node);
    }
    for n in top.iter().flat_map(nodes_below) {
        if tensors(n).any(external) {
            return refuse(format!("a tensor of node {:?} ({})", n.name, n.op_type));
        }
        for g in subgraphs(n) {
            if let Some(t) = g.initializer.iter().find(|t| external(t)) {
                return refuse(format!("subgraph initializer {:?}", t.name));
            }
        }
    }
    for r in model.graph_fields(GRAPH_SPARSE_INITIALIZER)? {
        let s: crate::pb::SparseTensorProto =
            crate::onnx::decode(model.bytes().slice(r), "SparseTensorProto")?;
        if s.values.iter().chain(&s.indices).any(external) {
            return refuse("a sparse initializer".into());
        }
    }
    Ok(())
}
