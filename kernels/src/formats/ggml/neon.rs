//! NEON ggml Q8_0 / Q4_0 blocks. As in the AVX2 version, blocks with a NaN
//! or an infinite magnitude, and Q8_0 blocks whose `1/d` overflows, go to
//! the scalar reference (`block::block`); the rest use the same
//! arithmetic in vectors: separate multiply and add (no `vfmaq`), Q8_0's
//! round half away from zero is `vcvtaq_s32` (ties away; |y| <= 127.x, so
//! equal to the scalar trunc plus step), Q4_0's truncation is `vcvtq_s32`
//! with non-finite lanes masked to 0.

use std::arch::aarch64::*;

use super::block::{block, load_block, GgmlType, QK};
use crate::formats::fp16_neon::{load_f16x4, load_f32x4};
use crate::fp16::f32_to_f16_bits;

/// Quantizes whole blocks of `src` into `out`.
///
/// # Safety
/// The CPU must have NEON.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn pack_run(t: GgmlType, src: &[u8], f16: bool, out: &mut [u8]) {
    let es = if f16 { 2 } else { 4 };
    for (o, s) in out
        .chunks_exact_mut(t.block_bytes())
        .zip(src.chunks_exact(es * QK))
    {
        let v = load(s, f16);
        let done = match t {
            GgmlType::Q8_0 => q8_0(&v, o),
            GgmlType::Q4_0 => q4_0(&v, o),
        };
        if !done {
            block(t, &load_block(s, f16), o);
        }
    }
}

#[inline(always)]
unsafe fn load(s: &[u8], f16: bool) -> [float32x4_t; 8] {
    assert!(s.len() >= QK * if f16 { 2 } else { 4 });
    let p = s.as_ptr();
    let mut v = [vdupq_n_f32(0.0); 8];
    for (i, r) in v.iter_mut().enumerate() {
        *r = if f16 {
            load_f16x4(p.add(i * 8))
        } else {
            load_f32x4(p.add(i * 16))
        };
    }
    v
}

/// Largest |x| of the block and whether any element is NaN.
#[inline(always)]
unsafe fn abs_max(v: &[float32x4_t; 8]) -> (f32, bool) {
    let mut m = vdupq_n_f32(0.0);
    let mut ord = vdupq_n_u32(u32::MAX);
    for &x in v {
        m = vmaxq_f32(m, vabsq_f32(x));
        ord = vandq_u32(ord, vceqq_f32(x, x));
    }
    (vmaxvq_f32(m), vminvq_u32(ord) == 0)
}

#[inline(always)]
unsafe fn q8_0(v: &[float32x4_t; 8], out: &mut [u8]) -> bool {
    let (amax, nan) = abs_max(v);
    if nan || !amax.is_finite() {
        return false;
    }
    let d = amax / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    if !id.is_finite() {
        return false;
    }
    let idv = vdupq_n_f32(id);
    let mut b = [vdup_n_s8(0); 4];
    for (j, bj) in b.iter_mut().enumerate() {
        let q0 = vcvtaq_s32_f32(vmulq_f32(v[2 * j], idv));
        let q1 = vcvtaq_s32_f32(vmulq_f32(v[2 * j + 1], idv));
        let h = vcombine_s16(vqmovn_s32(q0), vqmovn_s32(q1));
        *bj = vqmovn_s16(h);
    }
    out[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
    let qs = &mut out[2..2 + QK];
    vst1q_s8(qs.as_mut_ptr().cast(), vcombine_s8(b[0], b[1]));
    vst1q_s8(qs.as_mut_ptr().add(16).cast(), vcombine_s8(b[2], b[3]));
    true
}

#[inline(always)]
unsafe fn q4_0(v: &[float32x4_t; 8], out: &mut [u8]) -> bool {
    let (amax, nan) = abs_max(v);
    if nan || !amax.is_finite() {
        return false;
    }
    // First element whose magnitude is the maximum (numpy argmax).
    let mut x = [0f32; QK];
    for (i, &vi) in v.iter().enumerate() {
        vst1q_f32(x.as_mut_ptr().add(4 * i), vi);
    }
    let best = x.iter().position(|e| e.abs() == amax).unwrap_or(0);
    let d = x[best] / -8.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let idv = vdupq_n_f32(id);
    let bias = vdupq_n_f32(8.5);
    let inf = vdupq_n_f32(f32::INFINITY);
    let mut q = [vdup_n_u16(0); 8];
    for (qi, &xi) in q.iter_mut().zip(v) {
        let y = vaddq_f32(vmulq_f32(xi, idv), bias);
        let finite = vcltq_f32(vabsq_f32(y), inf);
        // Truncation (saturating), clamped to 0..=15; non-finite -> 0.
        let t = vcvtq_s32_f32(y);
        let t = vminq_s32(vmaxq_s32(t, vdupq_n_s32(0)), vdupq_n_s32(15));
        *qi = vmovn_u32(vandq_u32(vreinterpretq_u32_s32(t), finite));
    }
    let lo = vcombine_u8(
        vmovn_u16(vcombine_u16(q[0], q[1])),
        vmovn_u16(vcombine_u16(q[2], q[3])),
    );
    let hi = vcombine_u8(
        vmovn_u16(vcombine_u16(q[4], q[5])),
        vmovn_u16(vcombine_u16(q[6], q[7])),
    );
    let packed = vorrq_u8(lo, vshlq_n_u8::<4>(hi));
    out[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
    vst1q_u8(out[2..2 + QK / 2].as_mut_ptr(), packed);
    true
}
