//! The packers of format version 1, one module per format (plus its
//! kernels).

pub mod cast;
mod cast_kernel;
mod elementwise;
pub mod float16_clamp;
pub mod gemm_pack_b;
pub mod ggml;
mod ggml_kernel;
pub mod identity;
pub mod matmul_nbits;
mod nbits_kernel;
mod nbits_rows;
mod nbits_tile;
pub mod quantize_dynamic;
mod quantize_dynamic_kernel;

#[cfg(target_arch = "x86_64")]
mod cast_avx2;
#[cfg(target_arch = "x86_64")]
mod cast_avx512;
#[cfg(target_arch = "x86_64")]
mod float16_clamp_avx2;
#[cfg(target_arch = "x86_64")]
mod ggml_avx2;
#[cfg(target_arch = "x86_64")]
mod ggml_avx512;
#[cfg(target_arch = "x86_64")]
mod nbits_avx2;
#[cfg(target_arch = "x86_64")]
mod nbits_avx512;
#[cfg(target_arch = "x86_64")]
mod quantize_dynamic_avx2;

#[cfg(target_arch = "aarch64")]
mod cast_neon;
#[cfg(target_arch = "aarch64")]
mod fp16_neon;
#[cfg(target_arch = "aarch64")]
mod ggml_neon;
#[cfg(target_arch = "aarch64")]
mod nbits_neon;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_ort;
