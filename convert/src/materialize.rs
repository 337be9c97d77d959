//! The materializer's settings, plans and reports as API messages.

use ctcache::materialize::{Plan, Recipe, Report, Settings};
use ctcache_api::v1;
use ctcache_files::answer::Written;

pub use ctcache_api::placed::{link_mode, link_mode_of, place_method, place_method_name};

/// The answer for `plan` written to `output` with `recipe`, as `report`
/// says; `packed` and `cached` (entries packed now / found in the store)
/// are the caller's to set.
pub fn materialize_response(
    output: &std::path::Path,
    plan: &Plan,
    report: &Report,
    recipe: &Recipe,
) -> v1::MaterializeResponse {
    let nbits = match recipe {
        Recipe::Nbits(s) => *s,
        Recipe::Int8(_) | Recipe::Fp16(_) => Settings {
            bits: 0,
            block_size: 0,
            symmetric: false,
            accuracy_level: 0,
        },
    };
    let int8 = match recipe {
        Recipe::Int8(s) => Some(s),
        Recipe::Nbits(_) | Recipe::Fp16(_) => None,
    };
    let settings = &nbits;
    let answer = v1::MaterializeResponse {
        target: recipe.target().into(),
        weight_type: int8
            .map(|s| s.weight_type().to_string())
            .unwrap_or_default(),
        per_channel: int8.is_some_and(|s| s.per_channel),
        reduce_range: int8.is_some_and(|s| s.reduce_range),
        op_types: int8.map(|s| s.op_types.clone()).unwrap_or_default(),
        nodes_rewritten: report.nodes_rewritten as u32,
        initializers_removed: report.initializers_removed as u32,
        skipped: plan
            .skipped
            .iter()
            .map(|s| v1::MaterializeSkip {
                node: s.node.clone(),
                op_type: s.op_type.clone(),
                reason: s.reason.clone(),
                detail: s.detail.clone(),
            })
            .collect(),
        payload_bytes: report.payload_bytes,
        model_bytes: report.model_bytes,
        bits: settings.bits,
        block_size: settings.block_size,
        symmetric: settings.symmetric,
        accuracy_level: settings.accuracy_level,
        ..Default::default()
    };
    if output.as_os_str().is_empty() {
        return answer;
    }
    let written = Written {
        data_dir: report.data_dir.clone(),
        files: report.files.clone(),
        bytes_copied: report.bytes_copied,
        model_bytes: report.model_bytes,
    };
    ctcache_api::placed::with_files_written(answer, output, report.link, &written)
}
