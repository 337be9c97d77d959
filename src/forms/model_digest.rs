//! The content digest of a whole model, as a runtime form's key covers it:
//! every byte of the model but each top-level initializer's data, which
//! its D3 digest stands for (so external data counts by its content, and
//! where a file lies or what it is called does not).

use crate::digest::{digest_all, Algorithm};
use crate::error::{Error, Result};
use crate::onnx::elem_types::subgraphs;
use crate::onnx::fields::{GRAPH_INITIALIZER, MODEL_GRAPH};
use crate::onnx::Model;
use crate::wire::{Fields, WireError};

/// What the digest starts with: the scheme, so that another never meets it.
const DOMAIN: &[u8] = b"ctcache runtime-form model v1\0";

/// The model's content digest (blake3): its top-level fields in order, the
/// graph's fields in order, each top-level initializer as its name and D3
/// digest. Subgraph initializers are hashed as their bytes, so one held as
/// external data is refused (its bytes would be a reference, not the data).
pub fn model_digest(model: &Model) -> Result<[u8; 32]> {
    refuse_external_subgraph_data(model)?;
    let initializers = model.initializers()?;
    let digests = digest_all(model, &initializers, Algorithm::Blake3);
    let bytes = model.bytes();
    let mut h = blake3::Hasher::new();
    h.update(DOMAIN);
    let mut next_initializer = initializers.iter().zip(digests);
    for top in model.top_fields() {
        if top.number != MODEL_GRAPH {
            field(&mut h, &bytes[top.span.clone()]);
            continue;
        }
        h.update(&u64::from(MODEL_GRAPH).to_le_bytes());
        let wire = |e: WireError| Error::Wire {
            context: "GraphProto".into(),
            offset: e.offset,
            problem: e.problem,
        };
        for f in Fields::with_base(&bytes[top.value.clone()], top.value.start) {
            let f = f.map_err(wire)?;
            if f.number != GRAPH_INITIALIZER {
                field(&mut h, &bytes[f.span.clone()]);
                continue;
            }
            let (t, digest) = next_initializer.next().ok_or_else(|| {
                Error::Model("the graph's initializers changed while read".into())
            })?;
            let digest = digest?;
            h.update(b"initializer\0");
            field(&mut h, t.name.as_bytes());
            h.update(&digest.bytes);
        }
    }
    Ok(*h.finalize().as_bytes())
}

/// One length-prefixed piece, so that pieces cannot run into each other.
fn field(h: &mut blake3::Hasher, bytes: &[u8]) {
    h.update(&(bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

fn refuse_external_subgraph_data(model: &Model) -> Result<()> {
    fn walk(g: &crate::pb::GraphProto) -> Result<()> {
        for t in &g.initializer {
            if !t.external_data.is_empty() {
                return Err(Error::Model(format!(
                    "subgraph initializer {:?} is external data; a runtime form needs the \
                     subgraphs' weights in the model",
                    t.name
                )));
            }
        }
        g.node.iter().flat_map(subgraphs).try_for_each(walk)
    }
    model.nodes()?.iter().flat_map(subgraphs).try_for_each(walk)
}
