//! AVX2 + F16C ggml Q8_0 / Q4_0 blocks. Blocks with a NaN or an infinite
//! magnitude, and Q8_0 blocks whose `1/d` overflows, go to the scalar
//! reference (`block::block`); the rest use the same arithmetic in
//! vectors, so every block gets the reference's bytes.

use std::arch::x86_64::*;

use super::block::{block, load_block, GgmlType, QK};
use crate::fp16::f32_to_f16_bits;

/// Quantizes whole blocks of `src` into `out`.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn pack_run(t: GgmlType, src: &[u8], f16: bool, out: &mut [u8]) {
    let es = if f16 { 2 } else { 4 };
    for (o, s) in out
        .chunks_exact_mut(t.block_bytes())
        .zip(src.chunks_exact(es * QK))
    {
        let v = load(s, f16);
        let done = match t {
            GgmlType::Q8_0 => q8_0(&v, o),
            GgmlType::Q4_0 => q4_0(&v, s, f16, o),
        };
        if !done {
            block(t, &load_block(s, f16), o);
        }
    }
}

#[inline(always)]
unsafe fn load(s: &[u8], f16: bool) -> [__m256; 4] {
    let p = s.as_ptr();
    let mut v = [_mm256_setzero_ps(); 4];
    for (i, r) in v.iter_mut().enumerate() {
        *r = if f16 {
            _mm256_cvtph_ps(_mm_loadu_si128(p.add(i * 16).cast()))
        } else {
            _mm256_loadu_ps(p.add(i * 32).cast())
        };
    }
    v
}

/// Largest |x| of the block and whether any element is NaN.
#[inline(always)]
unsafe fn abs_max(v: &[__m256; 4]) -> (f32, bool, [__m256; 4]) {
    let mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let a = [
        _mm256_and_ps(v[0], mask),
        _mm256_and_ps(v[1], mask),
        _mm256_and_ps(v[2], mask),
        _mm256_and_ps(v[3], mask),
    ];
    let nan = _mm256_or_ps(
        _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v[0], v[0]),
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v[1], v[1]),
        ),
        _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v[2], v[2]),
            _mm256_cmp_ps::<_CMP_UNORD_Q>(v[3], v[3]),
        ),
    );
    let m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
    (_mm_cvtss_f32(m), _mm256_movemask_ps(nan) != 0, a)
}

/// 32 int32 lanes (in four vectors) to 32 bytes in element order, with
/// signed (`packs`) or unsigned (`packus`) saturation.
#[inline(always)]
unsafe fn narrow(i: [__m256i; 4], signed: bool) -> __m256i {
    let a = _mm256_packs_epi32(i[0], i[1]);
    let b = _mm256_packs_epi32(i[2], i[3]);
    let p = if signed {
        _mm256_packs_epi16(a, b)
    } else {
        _mm256_packus_epi16(a, b)
    };
    // Undo the per-128-bit-lane interleave of the packs.
    _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

#[inline(always)]
unsafe fn q8_0(v: &[__m256; 4], out: &mut [u8]) -> bool {
    let (amax, nan, _) = abs_max(v);
    if nan || !amax.is_finite() {
        return false;
    }
    let d = amax / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    if !id.is_finite() {
        return false;
    }
    let idv = _mm256_set1_ps(id);
    let sign = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
    let half = _mm256_set1_ps(0.5);
    let one = _mm256_set1_ps(1.0);
    let mut q = [_mm256_setzero_si256(); 4];
    for (qi, &x) in q.iter_mut().zip(v) {
        let y = _mm256_mul_ps(x, idv);
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
        // |y - t| >= 0.5 steps away from zero: round half away from zero.
        let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(y, t));
        let step = _mm256_or_ps(_mm256_and_ps(y, sign), one);
        let up = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(frac, half), step);
        *qi = _mm256_cvttps_epi32(_mm256_add_ps(t, up));
    }
    out[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
    let qs = &mut out[2..2 + QK];
    _mm256_storeu_si256(qs.as_mut_ptr().cast(), narrow(q, true));
    true
}

#[inline(always)]
unsafe fn q4_0(v: &[__m256; 4], s: &[u8], f16: bool, out: &mut [u8]) -> bool {
    let (amax, nan, a) = abs_max(v);
    if nan || !amax.is_finite() {
        return false;
    }
    // First element whose magnitude is the maximum (numpy argmax).
    let m = _mm256_set1_ps(amax);
    let mut hits = 0u32;
    for (i, ai) in a.iter().enumerate() {
        hits |= (_mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(*ai, m)) as u32) << (8 * i);
    }
    let best = hits.trailing_zeros() as usize;
    let max = if f16 {
        crate::fp16::f16_bits_to_f32(u16::from_le_bytes([s[2 * best], s[2 * best + 1]]))
    } else {
        f32::from_le_bytes([
            s[4 * best],
            s[4 * best + 1],
            s[4 * best + 2],
            s[4 * best + 3],
        ])
    };
    let d = max / -8.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let idv = _mm256_set1_ps(id);
    let bias = _mm256_set1_ps(8.5);
    let zero = _mm256_setzero_si256();
    let fifteen = _mm256_set1_epi32(15);
    let mut q = [zero; 4];
    for (qi, &x) in q.iter_mut().zip(v) {
        // Truncation; a non-finite value converts to i32::MIN, clamped to 0.
        let t = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(x, idv), bias));
        *qi = _mm256_min_epi32(_mm256_max_epi32(t, zero), fifteen);
    }
    let b = narrow(q, false);
    let lo = _mm256_castsi256_si128(b);
    let hi = _mm256_extracti128_si256::<1>(b);
    let packed = _mm_or_si128(lo, _mm_slli_epi16::<4>(hi));
    out[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
    _mm_storeu_si128(out[2..2 + QK / 2].as_mut_ptr().cast(), packed);
    true
}
