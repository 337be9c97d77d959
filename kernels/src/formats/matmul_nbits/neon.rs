//! NEON parts of the n-bit MatMul quantizer: column min/max and codes,
//! four columns per vector, four vectors (16 columns) per pass where the
//! tile is wide enough. Same bytes as the scalar code:
//!
//! - min/max are `v < m ? v : m` / `v > m ? v : m` as compare + bit
//!   select (`vcltq` / `vcgtq` + `vbslq`), not `vminq` / `vmaxq`, which
//!   propagate NaN and order -0 below +0.
//! - `x = v * recip + zp` is a `vmulq` and a `vaddq` (never `vfmaq`).
//! - The clamp is `vmaxnmq(x, 0)` then `vminnmq(x, kmax)`: x comes out of
//!   arithmetic, so a NaN is quiet and `maxnm` maps it to 0, as the
//!   scalar `max` does.
//! - `vcvtaq_u32` rounds to nearest, ties away from zero: on the clamped
//!   range [0, kmax] that is the scalar trunc plus `frac >= 0.5` step
//!   (x - trunc(x) is exact there).
//! - FLOAT16 sources are widened in integer code (`fp16_neon`).

use std::arch::aarch64::*;

use super::block::{ColParams, Weight, MAX_BS, TILE};
use crate::formats::fp16_neon::{load_f16x4, load_f32x4};

/// Four consecutive elements of row `k` from column `n`, as f32.
#[inline(always)]
unsafe fn load4(w: &Weight<'_>, k: usize, n: usize) -> float32x4_t {
    let i = k * w.n + n;
    if w.f16 {
        debug_assert!((i + 4) * 2 <= w.data.len());
        load_f16x4(w.data.as_ptr().add(i * 2))
    } else {
        debug_assert!((i + 4) * 4 <= w.data.len());
        load_f32x4(w.data.as_ptr().add(i * 4))
    }
}

/// Min/max of columns `n0 .. n0 + cols` (`cols` a multiple of 4) over rows
/// `k0 .. k0 + len`.
///
/// # Safety
/// The CPU must have NEON; the rows and columns must lie inside the weight
/// (checked).
#[target_feature(enable = "neon")]
pub(crate) unsafe fn minmax(
    w: &Weight<'_>,
    n0: usize,
    cols: usize,
    k0: usize,
    len: usize,
    mn: &mut [f32; TILE],
    mx: &mut [f32; TILE],
) {
    assert!(cols <= TILE && cols.is_multiple_of(4) && n0 + cols <= w.n && k0 + len <= w.k);
    let mut c = 0;
    // Sixteen columns per pass: four independent vectors.
    while c + 16 <= cols {
        let mut lo = [vdupq_n_f32(0.0); 4];
        let mut hi = [vdupq_n_f32(0.0); 4];
        for j in 0..4 {
            lo[j] = vld1q_f32(mn.as_ptr().add(c + 4 * j));
            hi[j] = vld1q_f32(mx.as_ptr().add(c + 4 * j));
        }
        for k in k0..k0 + len {
            for j in 0..4 {
                let v = load4(w, k, n0 + c + 4 * j);
                lo[j] = vbslq_f32(vcltq_f32(v, lo[j]), v, lo[j]);
                hi[j] = vbslq_f32(vcgtq_f32(v, hi[j]), v, hi[j]);
            }
        }
        for j in 0..4 {
            vst1q_f32(mn.as_mut_ptr().add(c + 4 * j), lo[j]);
            vst1q_f32(mx.as_mut_ptr().add(c + 4 * j), hi[j]);
        }
        c += 16;
    }
    while c < cols {
        let mut lo = vld1q_f32(mn.as_ptr().add(c));
        let mut hi = vld1q_f32(mx.as_ptr().add(c));
        for k in k0..k0 + len {
            let v = load4(w, k, n0 + c);
            lo = vbslq_f32(vcltq_f32(v, lo), v, lo);
            hi = vbslq_f32(vcgtq_f32(v, hi), v, hi);
        }
        vst1q_f32(mn.as_mut_ptr().add(c), lo);
        vst1q_f32(mx.as_mut_ptr().add(c), hi);
        c += 4;
    }
}

/// Codes of columns `n0 .. n0 + cols` (`cols` a multiple of 4) as output
/// bytes: 8 bits: `tile[r * TILE + c]` = code of row `k0 + r`; 4 bits:
/// rows `2r` (low nibble) and `2r + 1` (high), whole pairs only.
///
/// # Safety
/// As for [`minmax`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "neon")]
pub(crate) unsafe fn codes(
    w: &Weight<'_>,
    bits: u32,
    n0: usize,
    cols: usize,
    k0: usize,
    len: usize,
    p: &ColParams,
    kmax: f32,
    tile: &mut [u8],
) {
    assert!(cols <= TILE && cols.is_multiple_of(4) && n0 + cols <= w.n && k0 + len <= w.k);
    let (step, rows) = if bits == 8 { (1, len) } else { (2, len / 2) };
    assert!(len <= MAX_BS && tile.len() >= rows * TILE);
    let top = vdupq_n_f32(kmax);
    for c4 in 0..cols / 4 {
        let c = 4 * c4;
        let r = vld1q_f32(p.recip.as_ptr().add(c));
        let z = vld1q_f32(p.zp.as_ptr().add(c));
        for row in 0..rows {
            let k = k0 + step * row;
            let mut q = quantize(load4(w, k, n0 + c), r, z, top);
            if step == 2 {
                let hi = quantize(load4(w, k + 1, n0 + c), r, z, top);
                q = vorrq_u32(q, vshlq_n_u32::<4>(hi));
            }
            let h = vmovn_u32(q);
            let b = vmovn_u16(vcombine_u16(h, h));
            let word = vget_lane_u32::<0>(vreinterpret_u32_u8(b));
            let dst = &mut tile[row * TILE + c..row * TILE + c + 4];
            dst.copy_from_slice(&word.to_le_bytes());
        }
    }
}

/// clamp(roundf(v * r + z), 0, top) as u32 lanes; NaN -> 0.
#[inline(always)]
unsafe fn quantize(v: float32x4_t, r: float32x4_t, z: float32x4_t, top: float32x4_t) -> uint32x4_t {
    let x = vaddq_f32(vmulq_f32(v, r), z);
    let x = vminnmq_f32(vmaxnmq_f32(x, vdupq_n_f32(0.0)), top);
    vcvtaq_u32_f32(x)
}
