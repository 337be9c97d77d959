//! The weights a materialize writes: their keys, their cached payloads,
//! the model they come from, and the inputs that replace them.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::materialize::plan::Plan;
use crate::onnx::{Model, TensorRef};
use crate::pb;

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

/// The payload packed for a weight.
pub(super) fn packed<'a>(
    weights: &'a HashMap<WeightKey, PackedWeight>,
    name: &str,
    transposed: bool,
) -> Result<&'a PackedWeight> {
    weights
        .get(&(name.to_string(), transposed))
        .ok_or_else(|| Error::Rewrite(format!("materialize: no packed payload for {name:?}")))
}

/// The model being materialized and what was decided for it: what every
/// step reads.
pub(super) struct Source<'a> {
    pub(super) model: &'a Model,
    pub(super) plan: &'a Plan,
    pub(super) initializers: Vec<TensorRef>,
    pub(super) top_nodes: Vec<pb::NodeProto>,
}

/// The new inputs of the nodes replacing a target (MatMulNBits or
/// MatMulInteger), as initializer names.
pub(super) struct NewInputs {
    pub(super) b: String,
    pub(super) scales: String,
    pub(super) zero_points: Option<String>,
}
