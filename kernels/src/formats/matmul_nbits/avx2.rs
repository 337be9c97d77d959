//! AVX2 + F16C parts of the n-bit MatMul quantizer: column min/max and
//! codes, eight columns per vector. Same bytes as the scalar code:
//! `minps(v, m)` is `v < m ? v : m` and `maxps(v, m)` is `v > m ? v : m`,
//! exactly the comparisons MLAS makes; rounding is trunc plus a
//! `frac >= 0.5` step, equal to roundf on the clamped range; NaN codes
//! become 0 through `maxps(NaN, 0) = 0`.

use std::arch::x86_64::*;

use super::block::{ColParams, Weight, MAX_BS, TILE};

/// Eight consecutive elements of row `k` from column `n`, as f32.
#[inline(always)]
unsafe fn load8(w: &Weight<'_>, k: usize, n: usize) -> __m256 {
    let i = k * w.n + n;
    if w.f16 {
        debug_assert!((i + 8) * 2 <= w.data.len());
        _mm256_cvtph_ps(_mm_loadu_si128(w.data.as_ptr().add(i * 2).cast()))
    } else {
        debug_assert!((i + 8) * 4 <= w.data.len());
        _mm256_loadu_ps(w.data.as_ptr().add(i * 4).cast())
    }
}

/// Min/max of columns `n0 .. n0 + cols` (`cols` a multiple of 8) over rows
/// `k0 .. k0 + len`.
///
/// # Safety
/// The CPU must have AVX2 and F16C; the rows and columns must lie inside
/// the weight.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn minmax(
    w: &Weight<'_>,
    n0: usize,
    cols: usize,
    k0: usize,
    len: usize,
    mn: &mut [f32; TILE],
    mx: &mut [f32; TILE],
) {
    assert!(cols <= TILE && cols.is_multiple_of(8) && n0 + cols <= w.n && k0 + len <= w.k);
    for c8 in 0..cols / 8 {
        let c = 8 * c8;
        let mut lo = _mm256_loadu_ps(mn.as_ptr().add(c));
        let mut hi = _mm256_loadu_ps(mx.as_ptr().add(c));
        for k in k0..k0 + len {
            let v = load8(w, k, n0 + c);
            lo = _mm256_min_ps(v, lo);
            hi = _mm256_max_ps(v, hi);
        }
        _mm256_storeu_ps(mn.as_mut_ptr().add(c), lo);
        _mm256_storeu_ps(mx.as_mut_ptr().add(c), hi);
    }
}

/// Codes of columns `n0 .. n0 + cols` (`cols` a multiple of 8) as output
/// bytes: 8 bits: `tile[r * TILE + c]` = code of row `k0 + r`; 4 bits:
/// rows `2r` (low nibble) and `2r + 1` (high), whole pairs only.
///
/// # Safety
/// As for [`minmax`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,f16c")]
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
    assert!(cols <= TILE && cols.is_multiple_of(8) && n0 + cols <= w.n && k0 + len <= w.k);
    let (step, rows) = if bits == 8 { (1, len) } else { (2, len / 2) };
    assert!(len <= MAX_BS && tile.len() >= rows * TILE);
    let top = _mm256_set1_ps(kmax);
    for c8 in 0..cols / 8 {
        let c = 8 * c8;
        let r = _mm256_loadu_ps(p.recip.as_ptr().add(c));
        let z = _mm256_loadu_ps(p.zp.as_ptr().add(c));
        for row in 0..rows {
            let k = k0 + step * row;
            let mut q = quantize(load8(w, k, n0 + c), r, z, top);
            if step == 2 {
                let hi = quantize(load8(w, k + 1, n0 + c), r, z, top);
                q = _mm256_or_si256(q, _mm256_slli_epi32::<4>(hi));
            }
            let w16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
            let b8 = _mm_packus_epi16(w16, w16);
            _mm_storel_epi64(tile.as_mut_ptr().add(row * TILE + c).cast(), b8);
        }
    }
}

/// clamp(roundf(v * r + z), 0, top) as i32 lanes; NaN -> 0.
#[inline(always)]
unsafe fn quantize(v: __m256, r: __m256, z: __m256, top: __m256) -> __m256i {
    let x = _mm256_add_ps(_mm256_mul_ps(v, r), z);
    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x);
    let frac = _mm256_sub_ps(x, t);
    let up = _mm256_and_ps(
        _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5)),
        _mm256_set1_ps(1.0),
    );
    let q = _mm256_min_ps(
        _mm256_max_ps(_mm256_add_ps(t, up), _mm256_setzero_ps()),
        top,
    );
    _mm256_cvttps_epi32(q)
}

/// Transposes `tile` rows `0 .. rows` (a multiple of 8) of columns
/// `0 .. width & !7` into `out[c * stride + i]`, 8x8 bytes at a time.
///
/// # Safety
/// The CPU must have AVX2 (SSE2 suffices for the shuffles).
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn transpose(
    tile: &[u8],
    rows: usize,
    width: usize,
    out: &mut [u8],
    stride: usize,
) {
    let cols = width & !7;
    assert!(rows.is_multiple_of(8) && rows <= MAX_BS && tile.len() >= MAX_BS * TILE);
    if cols == 0 || rows == 0 {
        return;
    }
    assert!(out.len() >= (cols - 1) * stride + rows);
    let tp = tile.as_ptr();
    let op = out.as_mut_ptr();
    // Columns outer: each output column's run is written in one go, so
    // its cache lines fill completely before the next column.
    for c8 in 0..cols / 8 {
        let c = 8 * c8;
        for i8 in 0..rows / 8 {
            let i = 8 * i8;
            let ld = |r: usize| _mm_loadl_epi64(tp.add((i + r) * TILE + c).cast());
            let a0 = _mm_unpacklo_epi8(ld(0), ld(1));
            let a1 = _mm_unpacklo_epi8(ld(2), ld(3));
            let a2 = _mm_unpacklo_epi8(ld(4), ld(5));
            let a3 = _mm_unpacklo_epi8(ld(6), ld(7));
            let b0 = _mm_unpacklo_epi16(a0, a1);
            let b1 = _mm_unpackhi_epi16(a0, a1);
            let b2 = _mm_unpacklo_epi16(a2, a3);
            let b3 = _mm_unpackhi_epi16(a2, a3);
            // Each result holds two output columns of 8 rows.
            let pairs = [
                _mm_unpacklo_epi32(b0, b2),
                _mm_unpackhi_epi32(b0, b2),
                _mm_unpacklo_epi32(b1, b3),
                _mm_unpackhi_epi32(b1, b3),
            ];
            for (j, v) in pairs.into_iter().enumerate() {
                let c0 = c + 2 * j;
                _mm_storel_epi64(op.add(c0 * stride + i).cast(), v);
                _mm_storel_epi64(
                    op.add((c0 + 1) * stride + i).cast(),
                    _mm_unpackhi_epi64(v, v),
                );
            }
        }
    }
}
