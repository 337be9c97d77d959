//! The packers of format version 1, one folder per format with its kernel
//! and instruction-set paths (a kernel dispatches to its ISA paths; they
//! share the format's scalar definitions, which import neither).

pub mod cast;
mod elementwise;
pub mod float16_clamp;
pub mod gemm_pack_b;
pub mod ggml;
pub mod identity;
pub mod matmul_nbits;
pub mod quantize_dynamic;

#[cfg(target_arch = "aarch64")]
mod fp16_neon;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_ort;
