//! Materialize: an onnxruntime-ready 4/8-bit model assembled from cached
//! `ort.matmul_nbits` payloads. Every MatMul (and Gemm with a constant B)
//! whose weight qualifies becomes `com.microsoft::MatMulNBits`; its B,
//! scales and zero points are external data pointing into files next to the
//! output model: reflinks of the cache's payload files where the filesystem
//! can, else copies (hard links on request; see [`LinkMode`]). The rest of
//! the model is copied byte for byte.
//!
//! - [`plan`] decides which nodes are rewritten and why others are skipped;
//! - [`write`] splices the graph and places the payload files;
//! - [`place`] reflinks, copies or links one file atomically.

mod place;
mod plan;
mod write;

pub use place::{place, LinkMode, Method, Placed};
pub use plan::{group_skips, plan, Op, Plan, SkipGroup, Skipped, Step, Target};
pub use write::{data_dir_name, write, PackedWeight, Report, WeightKey};

use crate::error::{Error, Result};

/// The packer whose payloads are MatMulNBits inputs.
pub const PACKER: &str = "ort.matmul_nbits";

/// The one target this module produces.
pub const TARGET_ORT_INT4: &str = "onnxruntime-int4";

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
