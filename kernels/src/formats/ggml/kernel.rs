//! ggml Q8_0 / Q4_0 blocks, byte-identical with the gguf Python package
//! (`gguf.quants.quantize`, numpy on x86-64). Each block is 32 consecutive
//! elements of the last axis; the output block is the FLOAT16 scale `d`
//! followed by the codes. Facts the bytes depend on (verified against gguf
//! 0.19 / numpy 2.4):
//!
//! - Q8_0: `d = max|x| / 127`, `id = d == 0 ? 0 : 1/d`, code = round half
//!   away from zero of `x * id` as int8. A NaN anywhere makes `d` the
//!   canonical NaN (0x7e00) and every code 0 (numpy's NaN-propagating max;
//!   for exotic NaN payloads numpy's SIMD reduction may instead keep the
//!   payload of a NaN in the last lanes: not reproduced). Non-finite
//!   `x * id` (an inf in the block, or `1/d` overflowing) gives code 0.
//! - Q4_0: `max` = the element of largest magnitude, the *first* one on
//!   ties and the first NaN if any (numpy argmax); `d = max / -8` (a NaN
//!   keeps sign and payload, quiet bit set); `id` as above; code =
//!   `min(trunc(x * id + 8.5), 15)` with non-finite -> 0; byte j holds
//!   element j (low nibble) and element j + 16 (high nibble).
//! - `d` is converted to FLOAT16 by numpy's rule (`fp16::f32_to_f16_bits`).

use rayon::prelude::*;

use super::block::{block, load_block, GgmlType, QK};
use crate::isa::Isa;

/// Blocks per parallel work item.
const BLOCKS_PER_JOB: usize = 512;

/// Quantizes `src` (FLOAT or, with `f16`, FLOAT16 raw bytes; a whole number
/// of blocks) into `out`.
pub(crate) fn pack(isa: Isa, t: GgmlType, src: &[u8], f16: bool, out: &mut [u8]) {
    let es = if f16 { 2 } else { 4 };
    let ob = t.block_bytes();
    out.par_chunks_mut(ob * BLOCKS_PER_JOB)
        .zip(src.par_chunks(es * QK * BLOCKS_PER_JOB))
        .for_each(|(o, s)| pack_run(isa, t, s, f16, o));
}

fn pack_run(isa: Isa, t: GgmlType, src: &[u8], f16: bool, out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx2 => {
            // SAFETY: Isa::Avx2 is only used when the CPU has AVX2 and F16C.
            unsafe { super::avx2::pack_run(t, src, f16, out) };
            return;
        }
        Isa::Avx512 => {
            // SAFETY: Isa::Avx512 is only used when the CPU has AVX-512
            // F/BW/VL and F16C.
            unsafe { super::avx512::pack_run(t, src, f16, out) };
            return;
        }
        Isa::Scalar | Isa::Neon => {}
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        // SAFETY: Isa::Neon is only used when the CPU has NEON.
        unsafe { super::neon::pack_run(t, src, f16, out) };
        return;
    }
    let _ = isa;
    let es = if f16 { 2 } else { 4 };
    for (o, s) in out
        .chunks_exact_mut(t.block_bytes())
        .zip(src.chunks_exact(es * QK))
    {
        let x = load_block(s, f16);
        block(t, &x, o);
    }
}
