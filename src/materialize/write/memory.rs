//! A materialized model built in memory: the same rewrite as the file's,
//! its new initializers' data left in the payload files.

use std::collections::HashMap;

use super::additions::PayloadTensor;
use super::report::Report;
use super::weight::{PackedWeight, WeightKey};
use super::{external, graph_to_splice, splice, Rewrite};
use crate::error::{Error, Result};
use crate::materialize::plan::Plan;
use crate::materialize::Recipe;
use crate::onnx::Model;

/// A materialized model built in memory: nothing written. Its new
/// initializers are external data in the payloads (`tensors` says where),
/// which the caller maps or feeds; it keeps no other external data.
#[derive(Debug, Clone, Default)]
pub struct InMemory {
    /// The model's bytes.
    pub model: Vec<u8>,
    /// Where each payload-backed initializer's bytes lie.
    pub tensors: Vec<PayloadTensor>,
    /// What the rewrite changed (no files, no data folder).
    pub report: Report,
}

/// Builds the materialized model in memory (see [`InMemory`]); refuses
/// what [`write`] refuses. The new initializers' locations are their
/// payloads' [`PackedWeight::file_name`]s, under `data_folder/` when that is
/// not empty (a model file its caller writes, its payloads copied into
/// that folder: [`write_answer`](crate::materialize::write_answer)); with
/// none, a runtime told the folder those names are relative to (the
/// daemon: the store's payload folder) maps the payload files itself. The initializers the model keeps with
/// external data are inlined (every kept one under
/// [`PLACED_MIN_BYTES`](super::PLACED_MIN_BYTES): the larger are placed),
/// so every location in the model is a payload's. A model whose bytes and
/// kept external data declare more than `max_bytes` is refused
/// ([`Error::Limit`]) before anything is copied.
pub fn build_in_memory(
    model: &Model,
    plan: &Plan,
    recipe: impl Into<Recipe>,
    weights: &HashMap<WeightKey, PackedWeight>,
    max_bytes: u64,
    data_folder: &str,
) -> Result<InMemory> {
    let recipe: Recipe = recipe.into();
    let graph = graph_to_splice(model, plan, &recipe)?;
    let rewrite = Rewrite::new(model, plan, &recipe, weights, data_folder.into())?;
    let mut report = rewrite.report();
    // Charged before a byte is copied: the kept data is declared by the
    // model, and a model may declare far more than it holds.
    let kept = external::kept_external_len(&rewrite.src, &rewrite.dropped)?;
    let left = external::dropped_len(&rewrite.src, &rewrite.dropped)?;
    let declared = (model.bytes().len() as u64)
        .saturating_sub(left)
        .saturating_add(kept);
    if declared > max_bytes {
        return Err(Error::Limit(format!(
            "the in-memory model would carry {declared} bytes ({kept} of them the model's kept \
             external data), more than an answer may carry ({max_bytes}); raise the daemon's \
             max_message_bytes, or materialize without it (--local)"
        )));
    }
    let inlined = external::inline_kept(&rewrite.src, &rewrite.dropped)?;
    let edits = rewrite.edits(&inlined);
    let mut bytes = Vec::new();
    report.model_bytes = splice::encode_model(&rewrite.src, graph, &edits, &mut bytes)?;
    Ok(InMemory {
        model: bytes,
        tensors: rewrite.add.tensors,
        report,
    })
}
