//! NEON FLOAT -> FLOAT16 / BFLOAT16, 8 elements per step, both with the
//! scalar rules' integer rounding in vectors (`fp16_neon`), NaNs included.

use std::arch::aarch64::*;

use super::target::Target;
use crate::formats::fp16_neon::{f32x4_to_f16, load_f32x4};

/// Converts the leading whole groups of 8 elements; returns how many
/// elements were converted (the caller finishes the rest).
///
/// # Safety
/// The CPU must have NEON.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn convert_run(t: Target, src: &[u8], out: &mut [u8]) -> usize {
    let n = (src.len() / 4).min(out.len() / 2) / 8 * 8;
    let (sp, op) = (src.as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    while i < n {
        let a = load_f32x4(sp.add(i * 4));
        let b = load_f32x4(sp.add(i * 4 + 16));
        let r = match t {
            Target::F16 => vcombine_u16(f32x4_to_f16(a), f32x4_to_f16(b)),
            Target::Bf16 => vcombine_u16(bf16(a), bf16(b)),
        };
        vst1q_u8(op.add(i * 2), vreinterpretq_u8_u16(r));
        i += 8;
    }
    n
}

/// Four bfloat16 results (`fp16::f32_to_bf16_bits`).
#[inline(always)]
unsafe fn bf16(x: float32x4_t) -> uint16x4_t {
    let u = vreinterpretq_u32_f32(x);
    let lsb = vandq_u32(vshrq_n_u32::<16>(u), vdupq_n_u32(1));
    let r = vshrn_n_u32::<16>(vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), lsb));
    let abs = vandq_u32(u, vdupq_n_u32(0x7fff_ffff));
    let nan = vmovn_u32(vcgtq_u32(abs, vdupq_n_u32(0x7f80_0000)));
    let sign = vshrn_n_u32::<16>(vandq_u32(u, vdupq_n_u32(0x8000_0000)));
    let qnan = vorr_u16(sign, vdup_n_u16(0x7fc0));
    vbsl_u16(nan, qnan, r)
}
