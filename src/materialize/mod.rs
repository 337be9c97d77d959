//! Materialize: an onnxruntime-ready model assembled from cached payloads,
//! for one of the [`Recipe`]s (targets):
//! - `onnxruntime-int4`: every MatMul (and Gemm with a constant B) whose
//!   weight qualifies becomes `com.microsoft::MatMulNBits` over
//!   `ort.matmul_nbits` payloads;
//! - `onnxruntime-int8`: what `onnxruntime.quantization.quantize_dynamic`
//!   writes for MatMul (and Gemm with alpha = beta = 1, transA = 0, which it
//!   turns into MatMul), Conv and Gather, as the op types ask:
//!   DynamicQuantizeLinear of the input, MatMulInteger / ConvInteger on
//!   `ort.quantize_dynamic` payloads, Cast, and the two scale Muls; a
//!   Gather on the quantized table, whose output later quantized nodes read
//!   as it is and the others dequantized;
//! - `onnxruntime-fp16`: what `onnxruntime.transformers.float16.
//!   convert_float_to_float16(keep_io_types=True)` writes: every FLOAT
//!   initializer a node reads becomes FLOAT16 (`ort.float16` payloads, same
//!   name), FLOAT Constant tensors, Cast-to-FLOAT and FLOAT value_info become
//!   FLOAT16, and FLOAT graph inputs and outputs stay FLOAT behind Casts.
//!
//! The new weights are external data pointing into files next to the
//! output model: reflinks of the cache's payload files where the filesystem
//! can, else copies (hard links on request; see [`LinkMode`]). The rest of
//! the model is copied byte for byte.
//!
//! - [`Ask`] turns a request's target and settings into a [`Recipe`];
//! - [`plan`] decides which nodes are rewritten and why others are skipped;
//! - [`write`] splices the graph and places the payload files
//!   ([`build_in_memory`]: the model's bytes alone, its new weights left to
//!   the caller to feed from the payloads);
//! - [`place`] reflinks, copies or links one file atomically.

mod ask;
mod plan;
mod write;

pub use ask::{Ask, AskError, Setting};
pub use ctcache_files::answer::data_file_name;
pub use ctcache_files::place::{place, LinkMode, Method, Placed};
pub use plan::{
    group_skips, plan, plan_for, Op, Plan, SkipGroup, Skipped, Step, Target, IDENTITY,
    PLACED_MIN_BYTES,
};
pub use write::{
    build_in_memory, data_dir_name, write, InMemory, PackedWeight, PayloadTensor, Report, WeightKey,
};

use crate::error::{Error, Result};

/// The packer whose payloads are MatMulNBits inputs.
pub const PACKER: &str = "ort.matmul_nbits";

/// The packer whose payloads are MatMulInteger weights.
pub(crate) const PACKER_INT8: &str = "ort.quantize_dynamic";

/// The 4/8-bit MatMulNBits target.
pub const TARGET_ORT_INT4: &str = "onnxruntime-int4";

/// The `quantize_dynamic` target.
pub const TARGET_ORT_INT8: &str = "onnxruntime-int8";

/// The float16 converter target.
pub const TARGET_ORT_FP16: &str = "onnxruntime-fp16";

/// The packer whose payloads are the float16 converter's initializers.
pub(crate) const PACKER_FP16: &str = "ort.float16";

/// Every target, as named on the command line and in requests.
pub const TARGETS: [&str; 3] = [TARGET_ORT_INT4, TARGET_ORT_INT8, TARGET_ORT_FP16];

/// Settings of the `onnxruntime-fp16` target: the converter's defaults
/// (`min_positive_val` 5.96e-08, `max_finite_val` 65504, `keep_io_types`),
/// and the clamped cast itself for the FLOAT tensors held in nodes
/// (Constant values), which are not cache entries: FLOAT raw bytes in,
/// FLOAT16 raw bytes out (the `ort.float16` kernel, given by the caller).
#[derive(Debug, Clone)]
pub struct Fp16Settings {
    /// The clamped cast of `ort.float16` with the default parameters.
    pub convert: fn(&[u8]) -> Vec<u8>,
    /// The converter's `op_block_list`: op types kept in FLOAT behind
    /// Casts (`None`: its `DEFAULT_OP_BLOCK_LIST`).
    pub op_block_list: Option<Vec<String>>,
}

impl Fp16Settings {
    /// Whether nodes of `op_type` stay FLOAT.
    pub fn keeps(&self, op_type: &str) -> bool {
        match &self.op_block_list {
            Some(list) => list.iter().any(|o| o == op_type),
            None => plan::FP16_OP_BLOCK_LIST.contains(&op_type),
        }
    }
}

/// The cast is the packer's, whoever passes it: the block list is the one
/// setting.
impl PartialEq for Fp16Settings {
    fn eq(&self, other: &Self) -> bool {
        self.op_block_list == other.op_block_list
    }
}

impl Eq for Fp16Settings {}

/// A comma-separated list of op types as a request gives it ("" is none).
pub fn op_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|o| !o.is_empty())
        .map(String::from)
        .collect()
}

/// Op types the int8 target quantizes (`op_types_to_quantize`).
pub(crate) const INT8_OP_TYPES: [&str; 3] = ["MatMul", "Gather", "Conv"];

/// `int8` or `uint8`: the weight type's name, as flags and packer
/// parameters spell it.
fn weight_type_name(signed: bool) -> &'static str {
    if signed {
        "int8"
    } else {
        "uint8"
    }
}

/// How the int8 target quantizes one weight: `quantize_dynamic`'s rule for
/// the op that reads it first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int8Weight {
    /// INT8 (else UINT8).
    pub signed: bool,
    /// A range symmetric around zero.
    pub symmetric: bool,
    /// One scale and zero point per index of the last axis.
    pub per_channel: bool,
    /// 7-bit ranges.
    pub reduce_range: bool,
}

/// Settings of the `onnxruntime-int8` target: `quantize_dynamic`'s
/// `weight_type`, `per_channel`, `reduce_range` and `op_types_to_quantize`
/// (weights are symmetric for int8 and asymmetric for uint8, its default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Int8Settings {
    /// QInt8 (else QUInt8).
    pub signed: bool,
    /// One scale and zero point per output column.
    pub per_channel: bool,
    /// 7-bit ranges.
    pub reduce_range: bool,
    /// The op types to quantize.
    pub op_types: Vec<String>,
}

impl Default for Int8Settings {
    /// `quantize_dynamic`'s defaults, MatMul only.
    fn default() -> Self {
        Int8Settings {
            signed: true,
            per_channel: false,
            reduce_range: false,
            op_types: vec!["MatMul".into()],
        }
    }
}

impl Int8Settings {
    /// `int8` or `uint8`.
    pub fn weight_type(&self) -> &'static str {
        weight_type_name(self.signed)
    }

    /// How a weight read first by `op` is quantized: a MatMul's as asked
    /// (weights symmetric for int8, asymmetric for uint8); a Conv's always
    /// per tensor (ConvInteger asks no per-channel weight); a Gather's table
    /// as an activation: UINT8, asymmetric, per tensor, full range.
    pub fn weight_for(&self, op: &Op) -> Int8Weight {
        let asked = Int8Weight {
            signed: self.signed,
            symmetric: self.signed,
            per_channel: self.per_channel,
            reduce_range: self.reduce_range,
        };
        match op {
            Op::MatMul | Op::Gemm { .. } => asked,
            Op::Conv { .. } => Int8Weight {
                per_channel: false,
                ..asked
            },
            Op::Gather => Int8Weight {
                signed: false,
                symmetric: false,
                per_channel: false,
                reduce_range: false,
            },
        }
    }

    /// Parses `int8` / `uint8`.
    pub fn parse_weight_type(v: &str) -> Result<bool> {
        match v {
            "int8" => Ok(true),
            "uint8" => Ok(false),
            _ => Err(Error::Rewrite(format!(
                "materialize: weight type {v:?} is not supported by {TARGET_ORT_INT8} (int8 or uint8)"
            ))),
        }
    }

    /// Refuses op types the target does not quantize, and an empty list.
    pub fn validate(&self) -> Result<()> {
        if self.op_types.is_empty() {
            return Err(Error::Rewrite(format!(
                "materialize: no op type to quantize (supported by {TARGET_ORT_INT8}: {})",
                INT8_OP_TYPES.join(", ")
            )));
        }
        for o in &self.op_types {
            if !INT8_OP_TYPES.contains(&o.as_str()) {
                return Err(Error::Rewrite(format!(
                    "materialize: op type {o:?} is not supported by {TARGET_ORT_INT8} (supported: {})",
                    INT8_OP_TYPES.join(", ")
                )));
            }
        }
        Ok(())
    }
}

/// What a materialize makes: a target and its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recipe {
    /// `onnxruntime-int4` (MatMulNBits, 4 or 8 bits).
    Nbits(Settings),
    /// `onnxruntime-int8` (`quantize_dynamic`).
    Int8(Int8Settings),
    /// `onnxruntime-fp16` (`convert_float_to_float16`, keep_io_types).
    Fp16(Fp16Settings),
}

impl From<Settings> for Recipe {
    fn from(s: Settings) -> Recipe {
        Recipe::Nbits(s)
    }
}

impl From<&Settings> for Recipe {
    fn from(s: &Settings) -> Recipe {
        Recipe::Nbits(*s)
    }
}

impl Recipe {
    /// The target's name.
    pub fn target(&self) -> &'static str {
        match self {
            Recipe::Nbits(_) => TARGET_ORT_INT4,
            Recipe::Int8(_) => TARGET_ORT_INT8,
            Recipe::Fp16(_) => TARGET_ORT_FP16,
        }
    }

    /// The packer of the payloads.
    pub fn packer(&self) -> &'static str {
        match self {
            Recipe::Nbits(_) => PACKER,
            Recipe::Int8(_) => PACKER_INT8,
            Recipe::Fp16(_) => PACKER_FP16,
        }
    }

    /// Refuses settings the target cannot take.
    pub fn validate(&self) -> Result<()> {
        match self {
            Recipe::Nbits(s) => s.validate(),
            Recipe::Int8(s) => s.validate(),
            Recipe::Fp16(_) => Ok(()),
        }
    }

    /// The packer parameters for a weight read first by `op`, as stored
    /// (`transposed = false`) or as W[N, K] of a Gemm with transB = 1.
    pub fn packer_params(&self, op: &Op, transposed: bool) -> Vec<String> {
        match self {
            Recipe::Nbits(s) => s.packer_params(transposed),
            Recipe::Int8(s) => {
                let w = s.weight_for(op);
                vec![
                    format!("weight_type={}", weight_type_name(w.signed)),
                    format!("symmetric={}", w.symmetric),
                    format!("per_channel={}", w.per_channel),
                    format!("reduce_range={}", w.reduce_range),
                    format!("transposed={transposed}"),
                ]
            }
            Recipe::Fp16(_) => vec![
                "min_positive_val=5.96e-08".into(),
                "max_finite_val=65504".into(),
            ],
        }
    }
}

/// Quantization settings of a materialized model (the MatMulNBits
/// attributes and the packer parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Bits per quantized weight: 4 or 8 (MatMulNBits `bits`).
    pub bits: u32,
    /// Weights per quantization block along K (MatMulNBits `block_size`).
    pub block_size: u32,
    /// Symmetric quantization: no zero points are written.
    pub symmetric: bool,
    /// MatMulNBits `accuracy_level`; 0 leaves the attribute out (as
    /// onnxruntime's quantizer does).
    pub accuracy_level: i64,
}

impl Default for Settings {
    /// The daemon's default policy for `ort.matmul_nbits`.
    fn default() -> Self {
        Settings {
            bits: 4,
            block_size: 32,
            symmetric: true,
            accuracy_level: 0,
        }
    }
}

impl Settings {
    /// Refuses settings MatMulNBits or the packer cannot take.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::Rewrite(format!("materialize: {what}")));
        if self.bits != 4 && self.bits != 8 {
            return bad(format!("bits {} is not supported (4 or 8)", self.bits));
        }
        if !matches!(self.block_size, 16 | 32 | 64 | 128 | 256) {
            return bad(format!(
                "block size {} is not supported (16, 32, 64, 128 or 256)",
                self.block_size
            ));
        }
        if !(0..=4).contains(&self.accuracy_level) {
            return bad(format!(
                "accuracy level {} is not supported (0 to 4)",
                self.accuracy_level
            ));
        }
        Ok(())
    }

    /// The `ort.matmul_nbits` parameters, as `key=value` (the form packer
    /// parameters are parsed from), for a weight read as W[K, N]
    /// (`transposed = false`) or W[N, K] (Gemm with transB = 1).
    pub fn packer_params(&self, transposed: bool) -> Vec<String> {
        vec![
            format!("bits={}", self.bits),
            format!("block_size={}", self.block_size),
            format!("symmetric={}", self.symmetric),
            format!("transposed={transposed}"),
        ]
    }
}

#[cfg(test)]
mod tests;
