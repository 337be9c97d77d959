//! `[[policy]]`: which initializers get which formats, and the default
//! rules.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A policy rule: which initializers get which format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    /// Packer id, e.g. `ort.matmul_nbits`.
    pub format: String,
    /// Packer parameters.
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    /// Source data types (ONNX names); empty = FLOAT.
    #[serde(default = "default_types")]
    pub data_types: Vec<String>,
    /// Required rank (0 = any).
    #[serde(default = "default_rank")]
    pub rank: usize,
    /// Smallest element count that qualifies (fewer: not worth packing).
    #[serde(default = "default_min_elements")]
    pub min_elements: u64,
    /// Uses that qualify: `MatMul.B`, `Gemm.B`, `Gather.data`, `Conv.W`;
    /// empty = any initializer.
    #[serde(default = "default_used_as")]
    pub used_as: Vec<String>,
}

fn default_types() -> Vec<String> {
    vec!["FLOAT".into()]
}
fn default_rank() -> usize {
    2
}
fn default_min_elements() -> u64 {
    ctcache::onnx::graph::DEFAULT_MIN_ELEMENTS
}
fn default_used_as() -> Vec<String> {
    ctcache::onnx::graph::DEFAULT_USED_AS
        .map(String::from)
        .to_vec()
}

/// The default policy: what the default materialize target reads. MatMul/
/// Gemm weights of at least 65,536 FLOAT elements get onnxruntime's 4-bit
/// format, and embedding tables that the int4 target keeps and places
/// beside the model (1 MiB and more) are stored whole (`identity`), so that
/// a watched model's first materialize finds everything it reads. Formats
/// no runtime reads (the host's SGEMM panels, `gemm.pack_b.f32`) are packed
/// only where a rule asks.
pub fn default_policy() -> Vec<PolicyRule> {
    let rule = |format: &str, params: &[(&str, &str)]| PolicyRule {
        format: format.into(),
        params: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        data_types: default_types(),
        rank: 2,
        min_elements: default_min_elements(),
        used_as: default_used_as(),
    };
    vec![
        rule(
            "ort.matmul_nbits",
            &[("bits", "4"), ("block_size", "32"), ("symmetric", "true")],
        ),
        PolicyRule {
            min_elements: ctcache::materialize::PLACED_MIN_BYTES / 4,
            used_as: vec!["Gather.data".into()],
            ..rule("identity", &[])
        },
    ]
}
