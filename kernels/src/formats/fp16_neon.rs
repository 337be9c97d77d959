//! NEON FLOAT16 <-> FLOAT conversions in integer code, bit-exact with the
//! scalar rules of `crate::fp16` (round to nearest even, numpy's NaN rule).
//! No FP16 extension is needed (Rust's `float16x4_t` is not stable either)
//! and no lane ever does arithmetic on a denormal, so the result does not
//! depend on FPCR.FZ.

use std::arch::aarch64::*;

/// Four FLOAT16 bit patterns to f32, exact (`fp16::f16_bits_to_f32`).
#[inline(always)]
pub(crate) unsafe fn f16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    let h = vmovl_u16(h);
    let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
    let em = vandq_u32(h, vdupq_n_u32(0x7fff));
    let shifted = vshlq_n_u32::<13>(em);
    let normal = vaddq_u32(shifted, vdupq_n_u32(112 << 23));
    let special = vorrq_u32(shifted, vdupq_n_u32(0x7f80_0000));
    // Subnormal or zero: m * 2^-24, exact (m < 2^10, the product normal).
    let sub = vreinterpretq_u32_f32(vmulq_f32(
        vcvtq_f32_u32(em),
        vdupq_n_f32(1.0 / 16_777_216.0),
    ));
    let is_sub = vcltq_u32(em, vdupq_n_u32(0x400));
    let is_special = vcgeq_u32(em, vdupq_n_u32(0x7c00));
    let r = vbslq_u32(is_sub, sub, vbslq_u32(is_special, special, normal));
    vreinterpretq_f32_u32(vorrq_u32(r, sign))
}

/// Four f32 to FLOAT16 bits (`fp16::f32_to_f16_bits`, NaN rule included).
#[inline(always)]
pub(crate) unsafe fn f32x4_to_f16(x: float32x4_t) -> uint16x4_t {
    let u = vreinterpretq_u32_f32(x);
    let sign = vandq_u32(vshrq_n_u32::<16>(u), vdupq_n_u32(0x8000));
    let a = vandq_u32(u, vdupq_n_u32(0x7fff_ffff));
    // NaN: the top 10 payload bits, 1 if they are all zero; no quiet bit.
    let m = vandq_u32(vshrq_n_u32::<13>(a), vdupq_n_u32(0x3ff));
    let m = vbslq_u32(vceqzq_u32(m), vdupq_n_u32(1), m);
    let nan_v = vorrq_u32(m, vdupq_n_u32(0x7c00));
    // Normal half: rebias, round the 13 dropped bits to nearest even.
    let odd = vandq_u32(vshrq_n_u32::<13>(a), vdupq_n_u32(1));
    let normal = vshrq_n_u32::<13>(vaddq_u32(
        vsubq_u32(a, vdupq_n_u32(112 << 23)),
        vaddq_u32(vdupq_n_u32(0xfff), odd),
    ));
    // Subnormal half: mantissa >> shift (14..=24), nearest even:
    // (m + half - 1 + (q & 1)) >> shift. Out-of-range shifts only occur in
    // lanes another case selects.
    let e = vreinterpretq_s32_u32(vshrq_n_u32::<23>(a));
    let shift = vsubq_s32(vdupq_n_s32(126), e);
    let mant = vorrq_u32(vandq_u32(a, vdupq_n_u32(0x7f_ffff)), vdupq_n_u32(0x80_0000));
    let neg = vnegq_s32(shift);
    let q_odd = vandq_u32(vshlq_u32(mant, neg), vdupq_n_u32(1));
    let half_m1 = vsubq_u32(
        vshlq_u32(vdupq_n_u32(1), vsubq_s32(shift, vdupq_n_s32(1))),
        vdupq_n_u32(1),
    );
    let sub = vshlq_u32(vaddq_u32(vaddq_u32(mant, half_m1), q_odd), neg);
    let tiny = vcltq_u32(a, vdupq_n_u32(0x3300_0000));
    let is_norm = vcgeq_u32(a, vdupq_n_u32(0x3880_0000));
    let big = vcgeq_u32(a, vdupq_n_u32(0x4780_0000));
    let nan = vcgtq_u32(a, vdupq_n_u32(0x7f80_0000));
    let r = vbicq_u32(sub, tiny);
    let r = vbslq_u32(is_norm, normal, r);
    let r = vbslq_u32(big, vdupq_n_u32(0x7c00), r);
    let r = vbslq_u32(nan, nan_v, r);
    vmovn_u32(vorrq_u32(r, sign))
}

/// Four f32 from little-endian bytes at `p` (no alignment needed).
#[inline(always)]
pub(crate) unsafe fn load_f32x4(p: *const u8) -> float32x4_t {
    vreinterpretq_f32_u8(vld1q_u8(p))
}

/// Four FLOAT16 from little-endian bytes at `p`, as f32.
#[inline(always)]
pub(crate) unsafe fn load_f16x4(p: *const u8) -> float32x4_t {
    f16x4_to_f32(vreinterpret_u16_u8(vld1_u8(p)))
}
