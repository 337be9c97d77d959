//! AVX-512 (F + BW + VL, with F16C) parts of the n-bit MatMul quantizer:
//! column min/max and codes, sixteen columns per vector and up to four
//! vectors (64 columns) per pass over the rows, so each source row is read
//! as one contiguous run; the min/max pass prefetches the next block's
//! rows. A partial last vector is masked (loads and stores), so every
//! width is handled here without a scalar tail. The block parameters
//! (scale, zero point, reciprocal) are computed sixteen columns at a time
//! too. The code-tile transpose stays the AVX2 one (`nbits_avx2`): a
//! 512-bit version measured no faster.
//!
//! Same bytes as the scalar code, for the reasons given in `nbits_avx2`:
//! `vminps(v, m)` is `v < m ? v : m` and `vmaxps(v, m)` is `v > m ? v : m`;
//! rounding is trunc plus a `frac >= 0.5` step (roundf on the clamped
//! range); `vmaxps(NaN, 0) = 0` maps NaN codes to 0; the multiply and the
//! add stay separate instructions (no FMA).

use std::arch::x86_64::*;

use super::block::{ColParams, Nbits, Weight, MAX_BS, TILE};

/// Columns per vector.
const L: usize = 16;
/// Most vectors per pass.
const V: usize = 4;

/// The lanes of the vector at column `c` that lie before `cols`.
#[inline(always)]
fn lane_mask(cols: usize, c: usize) -> __mmask16 {
    let left = cols - c;
    if left >= L {
        0xffff
    } else {
        (1u16 << left) - 1
    }
}

/// Sixteen consecutive elements of row `k` from column `n` as f32; lanes
/// outside `m` are 0 and not read.
#[inline(always)]
unsafe fn load16<const F16: bool>(w: &Weight<'_>, k: usize, n: usize, m: __mmask16) -> __m512 {
    let i = k * w.n + n;
    if F16 {
        debug_assert!(i * 2 < w.data.len());
        _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
            m,
            w.data.as_ptr().add(i * 2).cast(),
        ))
    } else {
        debug_assert!(i * 4 < w.data.len());
        _mm512_maskz_loadu_ps(m, w.data.as_ptr().add(i * 4).cast())
    }
}

/// Min/max of columns `n0 .. n0 + cols` (any `cols <= TILE`) over rows
/// `k0 .. k0 + len`, into `mn[..cols]` / `mx[..cols]`.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL and F16C; the rows and columns
/// must lie inside the weight.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
pub(crate) unsafe fn minmax(
    w: &Weight<'_>,
    n0: usize,
    cols: usize,
    k0: usize,
    len: usize,
    mn: &mut [f32; TILE],
    mx: &mut [f32; TILE],
) {
    assert!(cols <= TILE && n0 + cols <= w.n && k0 + len <= w.k);
    let mut c0 = 0;
    while c0 < cols {
        let nv = (cols - c0).div_ceil(L).min(V);
        match (w.f16, nv) {
            (false, 1) => minmax_group::<false, 1>(w, n0, c0, cols, k0, len, mn, mx),
            (false, 2) => minmax_group::<false, 2>(w, n0, c0, cols, k0, len, mn, mx),
            (false, 3) => minmax_group::<false, 3>(w, n0, c0, cols, k0, len, mn, mx),
            (false, _) => minmax_group::<false, 4>(w, n0, c0, cols, k0, len, mn, mx),
            (true, 1) => minmax_group::<true, 1>(w, n0, c0, cols, k0, len, mn, mx),
            (true, 2) => minmax_group::<true, 2>(w, n0, c0, cols, k0, len, mn, mx),
            (true, 3) => minmax_group::<true, 3>(w, n0, c0, cols, k0, len, mn, mx),
            (true, _) => minmax_group::<true, 4>(w, n0, c0, cols, k0, len, mn, mx),
        }
        c0 += nv * L;
    }
}

/// `NV` vectors of columns from `c0`, the accumulators in registers.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn minmax_group<const F16: bool, const NV: usize>(
    w: &Weight<'_>,
    n0: usize,
    c0: usize,
    cols: usize,
    k0: usize,
    len: usize,
    mn: &mut [f32; TILE],
    mx: &mut [f32; TILE],
) {
    let mut m = [0u16; NV];
    let mut lo = [_mm512_setzero_ps(); NV];
    let mut hi = [_mm512_setzero_ps(); NV];
    for j in 0..NV {
        let c = c0 + L * j;
        m[j] = lane_mask(cols, c);
        lo[j] = _mm512_maskz_loadu_ps(m[j], mn.as_ptr().add(c));
        hi[j] = _mm512_maskz_loadu_ps(m[j], mx.as_ptr().add(c));
    }
    let es = if F16 { 2 } else { 4 };
    // The same columns of the next block's rows: this pass is the first
    // to read the source, a row is a short run and the next row is a
    // whole source row away, too far for the hardware prefetchers.
    let ahead = if k0 + 2 * len <= w.k { len } else { 0 };
    let row_bytes = w.n * es;
    for k in k0..k0 + len {
        if ahead > 0 {
            let at = w
                .data
                .as_ptr()
                .wrapping_add((k + ahead) * row_bytes + (n0 + c0) * es);
            for line in (0..NV * L * es).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line).cast());
            }
        }
        for j in 0..NV {
            let v = load16::<F16>(w, k, n0 + c0 + L * j, m[j]);
            lo[j] = _mm512_min_ps(v, lo[j]);
            hi[j] = _mm512_max_ps(v, hi[j]);
        }
    }
    for j in 0..NV {
        let c = c0 + L * j;
        _mm512_mask_storeu_ps(mn.as_mut_ptr().add(c), m[j], lo[j]);
        _mm512_mask_storeu_ps(mx.as_mut_ptr().add(c), m[j], hi[j]);
    }
}

/// Codes of columns `n0 .. n0 + cols` (any `cols <= TILE`) as output bytes:
/// 8 bits: `tile[r * TILE + c]` = code of row `k0 + r`; 4 bits: rows `2r`
/// (low nibble) and `2r + 1` (high), whole pairs only. Bytes of columns
/// past `cols` are not written.
///
/// # Safety
/// As for [`minmax`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
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
    assert!(cols <= TILE && n0 + cols <= w.n && k0 + len <= w.k);
    let rows = if bits == 8 { len } else { len / 2 };
    assert!(len <= MAX_BS && tile.len() >= rows * TILE);
    let mut c0 = 0;
    while c0 < cols {
        let nv = (cols - c0).div_ceil(L).min(V);
        macro_rules! group {
            ($f16:literal, $four:literal, $nv:literal) => {
                codes_group::<$f16, $four, $nv>(w, n0, c0, cols, k0, rows, p, kmax, tile)
            };
        }
        match (w.f16, bits == 4, nv) {
            (false, false, 1) => group!(false, false, 1),
            (false, false, 2) => group!(false, false, 2),
            (false, false, 3) => group!(false, false, 3),
            (false, false, _) => group!(false, false, 4),
            (false, true, 1) => group!(false, true, 1),
            (false, true, 2) => group!(false, true, 2),
            (false, true, 3) => group!(false, true, 3),
            (false, true, _) => group!(false, true, 4),
            (true, false, 1) => group!(true, false, 1),
            (true, false, 2) => group!(true, false, 2),
            (true, false, 3) => group!(true, false, 3),
            (true, false, _) => group!(true, false, 4),
            (true, true, 1) => group!(true, true, 1),
            (true, true, 2) => group!(true, true, 2),
            (true, true, 3) => group!(true, true, 3),
            (true, true, _) => group!(true, true, 4),
        }
        c0 += nv * L;
    }
}

/// `NV` vectors of columns from `c0`; `rows` output rows.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn codes_group<const F16: bool, const FOUR: bool, const NV: usize>(
    w: &Weight<'_>,
    n0: usize,
    c0: usize,
    cols: usize,
    k0: usize,
    rows: usize,
    p: &ColParams,
    kmax: f32,
    tile: &mut [u8],
) {
    let top = _mm512_set1_ps(kmax);
    let mut m = [0u16; NV];
    let mut r = [_mm512_setzero_ps(); NV];
    let mut z = [_mm512_setzero_ps(); NV];
    for j in 0..NV {
        let c = c0 + L * j;
        m[j] = lane_mask(cols, c);
        r[j] = _mm512_maskz_loadu_ps(m[j], p.recip.as_ptr().add(c));
        z[j] = _mm512_maskz_loadu_ps(m[j], p.zp.as_ptr().add(c));
    }
    let tp = tile.as_mut_ptr();
    for row in 0..rows {
        let k = if FOUR { k0 + 2 * row } else { k0 + row };
        for j in 0..NV {
            let c = c0 + L * j;
            let mut q = quantize(load16::<F16>(w, k, n0 + c, m[j]), r[j], z[j], top);
            if FOUR {
                let hi = quantize(load16::<F16>(w, k + 1, n0 + c, m[j]), r[j], z[j], top);
                q = _mm512_or_si512(q, _mm512_slli_epi32::<4>(hi));
            }
            // Codes are 0..=255: the truncating narrowing keeps them.
            _mm_mask_storeu_epi8(tp.add(row * TILE + c).cast(), m[j], _mm512_cvtepi32_epi8(q));
        }
    }
}

/// clamp(roundf(v * r + z), 0, top) as i32 lanes; NaN -> 0.
#[inline(always)]
unsafe fn quantize(v: __m512, r: __m512, z: __m512, top: __m512) -> __m512i {
    let x = _mm512_add_ps(_mm512_mul_ps(v, r), z);
    let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x);
    let frac = _mm512_sub_ps(x, t);
    let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, _mm512_set1_ps(0.5));
    let t = _mm512_mask_add_ps(t, up, t, _mm512_set1_ps(1.0));
    let q = _mm512_min_ps(_mm512_max_ps(t, _mm512_setzero_ps()), top);
    _mm512_cvttps_epi32(q)
}

/// The parameters of block `b` of columns `0 .. width` from their min/max,
/// as `block::put_block_params` computes them column by column:
/// scales written at `scales[(c * kb + b) * es ..]`, zero points (when
/// asymmetric) into `zps[c * zpb ..]`, and `p` filled for the codes.
///
/// The same operations in the same order, in lanes: the division and
/// subtraction are IEEE; `vmaxps(NaN, 0) = 0` then the clamp and
/// trunc-plus-step rounding give `zf < 0 ? 0 : zf > kmax ? kmax : roundf(zf)`
/// with NaN -> 0; the scale is never NaN (min/max skip NaNs and start
/// finite), so F16C's round-to-nearest-even conversion equals
/// `fp16::f32_to_f16_bits`, and its reading back is exact.
///
/// # Safety
/// As for [`minmax`]; `scales` and `zps` must hold the tile's columns.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
pub(crate) unsafe fn block_params(
    q: &Nbits,
    f16: bool,
    b: usize,
    kb: usize,
    width: usize,
    mn: &[f32; TILE],
    mx: &[f32; TILE],
    scales: &mut [u8],
    zps: &mut [u8],
    p: &mut ColParams,
) {
    assert!(width <= TILE && b < kb);
    let es = if f16 { 2 } else { 4 };
    let zpb = if q.symmetric {
        0
    } else {
        (kb * q.bits as usize).div_ceil(8)
    };
    assert!(scales.len() >= width * kb * es && zps.len() >= width * zpb);
    let kmax = _mm512_set1_ps(q.kmax());
    let mid = _mm512_set1_ps((1u32 << (q.bits - 1)) as f32);
    let zero = _mm512_setzero_ps();
    let mut bits = [0u32; L];
    let mut zp8 = [0u32; L];
    for c0 in (0..width).step_by(L) {
        let m = lane_mask(width, c0);
        let lo = _mm512_maskz_loadu_ps(m, mn.as_ptr().add(c0));
        let hi = _mm512_maskz_loadu_ps(m, mx.as_ptr().add(c0));
        let (s, zp) = if q.symmetric {
            // m = |mx| > |mn| ? mx : mn; s = -m / mid.
            let big = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(hi), _mm512_abs_ps(lo));
            let ext = _mm512_mask_blend_ps(big, lo, hi);
            let neg = _mm512_castsi512_ps(_mm512_xor_si512(
                _mm512_castps_si512(ext),
                _mm512_set1_epi32(i32::MIN),
            ));
            (_mm512_div_ps(neg, mid), mid)
        } else {
            // mn = 0 < mn ? 0 : mn; mx = mx < 0 ? 0 : mx.
            let lo = _mm512_mask_mov_ps(lo, _mm512_cmp_ps_mask::<_CMP_LT_OQ>(zero, lo), zero);
            let hi = _mm512_mask_mov_ps(hi, _mm512_cmp_ps_mask::<_CMP_LT_OQ>(hi, zero), zero);
            let s = _mm512_div_ps(_mm512_sub_ps(hi, lo), kmax);
            // zf = s != 0 ? 0 - mn / s : mn.
            let nz = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(s, zero);
            let zf = _mm512_mask_sub_ps(lo, nz, zero, _mm512_maskz_div_ps(nz, lo, s));
            let x = _mm512_min_ps(_mm512_max_ps(zf, zero), kmax);
            let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x);
            let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_sub_ps(x, t), _mm512_set1_ps(0.5));
            (s, _mm512_mask_add_ps(t, up, t, _mm512_set1_ps(1.0)))
        };
        let (sb, sf) = if f16 {
            let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(s);
            (_mm512_cvtepu16_epi32(h), _mm512_cvtph_ps(h))
        } else {
            (_mm512_castps_si512(s), s)
        };
        // recip = sf != 0 ? 1 / sf : 0.
        let nz = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(sf, zero);
        let recip = _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0), sf);
        _mm512_mask_storeu_ps(p.recip.as_mut_ptr().add(c0), m, recip);
        _mm512_mask_storeu_ps(p.zp.as_mut_ptr().add(c0), m, zp);
        _mm512_storeu_si512(bits.as_mut_ptr().cast(), sb);
        _mm512_storeu_si512(zp8.as_mut_ptr().cast(), _mm512_cvttps_epi32(zp));
        for l in 0..L.min(width - c0) {
            let c = c0 + l;
            let at = (c * kb + b) * es;
            if f16 {
                scales[at..at + 2].copy_from_slice(&(bits[l] as u16).to_le_bytes());
            } else {
                scales[at..at + 4].copy_from_slice(&bits[l].to_le_bytes());
            }
            if !q.symmetric {
                // As put_block_params: 4 bits, even block low, spare 8.
                let z = zp8[l] as u8;
                let col = &mut zps[c * zpb..(c + 1) * zpb];
                if q.bits == 8 {
                    col[b] = z;
                } else if b.is_multiple_of(2) {
                    col[b / 2] = z | 0x80;
                } else {
                    col[b / 2] = (col[b / 2] & 0x0f) | (z << 4);
                }
            }
        }
    }
}
