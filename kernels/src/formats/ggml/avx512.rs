//! AVX-512 (F + BW + VL, with F16C) ggml Q8_0 / Q4_0 blocks: one block is
//! two 16-lane vectors. As in `ggml_avx2`, blocks with a NaN or an infinite
//! magnitude, and Q8_0 blocks whose `1/d` overflows, go to the scalar
//! reference (`block::block`); the rest use the same arithmetic in
//! vectors (separate multiply and add, no FMA), so every block gets the
//! reference's bytes. `d` is finite on the vector path, where F16C's
//! round-to-nearest-even conversion equals `fp16::f32_to_f16_bits`.

use std::arch::x86_64::*;

use super::block::{block, load_block, GgmlType, QK};

/// Quantizes whole blocks of `src` into `out`.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
pub(crate) unsafe fn pack_run(t: GgmlType, src: &[u8], f16: bool, out: &mut [u8]) {
    match (t, f16) {
        (GgmlType::Q8_0, false) => run::<false, false>(src, out),
        (GgmlType::Q8_0, true) => run::<false, true>(src, out),
        (GgmlType::Q4_0, false) => run::<true, false>(src, out),
        (GgmlType::Q4_0, true) => run::<true, true>(src, out),
    }
}

#[inline(always)]
unsafe fn run<const Q4: bool, const F16: bool>(src: &[u8], out: &mut [u8]) {
    let t = if Q4 { GgmlType::Q4_0 } else { GgmlType::Q8_0 };
    let es = if F16 { 2 } else { 4 };
    for (o, s) in out
        .chunks_exact_mut(t.block_bytes())
        .zip(src.chunks_exact(es * QK))
    {
        let v = load::<F16>(s);
        let done = if Q4 { q4_0(v, o) } else { q8_0(v, o) };
        if !done {
            block(t, &load_block(s, F16), o);
        }
    }
}

#[inline(always)]
unsafe fn load<const F16: bool>(s: &[u8]) -> [__m512; 2] {
    debug_assert!(s.len() >= QK * if F16 { 2 } else { 4 });
    let p = s.as_ptr();
    if F16 {
        [
            _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())),
            _mm512_cvtph_ps(_mm256_loadu_si256(p.add(32).cast())),
        ]
    } else {
        [_mm512_loadu_ps(p.cast()), _mm512_loadu_ps(p.add(64).cast())]
    }
}

/// |x| lanes, their maximum, and whether any element is NaN.
#[inline(always)]
unsafe fn abs_max(v: [__m512; 2]) -> ([__m512; 2], f32, bool) {
    let a = [_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])];
    // Unordered lane by lane: a NaN in that lane of either vector.
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v[0], v[1]) != 0;
    // Without NaNs the maximum of |x| does not depend on the order.
    let m = _mm512_max_ps(a[0], a[1]);
    let top = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(m)));
    let m = _mm256_max_ps(_mm512_castps512_ps256(m), top);
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
    (a, _mm_cvtss_f32(m), nan)
}

/// FLOAT16 bits of a finite `d` (round to nearest even).
#[inline(always)]
unsafe fn half_bits(d: f32) -> [u8; 2] {
    let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(d));
    (_mm_cvtsi128_si32(h) as u16).to_le_bytes()
}

#[inline(always)]
unsafe fn q8_0(v: [__m512; 2], out: &mut [u8]) -> bool {
    let (_, amax, nan) = abs_max(v);
    if nan || !amax.is_finite() {
        return false;
    }
    let d = amax / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    if !id.is_finite() {
        return false;
    }
    let idv = _mm512_set1_ps(id);
    // Float logic in 512 bits needs AVX512DQ: integer logic instead.
    let sign = _mm512_set1_epi32(i32::MIN);
    let half = _mm512_set1_ps(0.5);
    let one = _mm512_set1_epi32(1f32.to_bits() as i32);
    let mut q = [_mm512_setzero_si512(); 2];
    for (qi, x) in q.iter_mut().zip(v) {
        let y = _mm512_mul_ps(x, idv);
        let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
        // |y - t| >= 0.5 steps away from zero: round half away from zero.
        let frac = _mm512_abs_ps(_mm512_sub_ps(y, t));
        let step = _mm512_castsi512_ps(_mm512_or_si512(
            _mm512_and_si512(_mm512_castps_si512(y), sign),
            one,
        ));
        let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, half);
        *qi = _mm512_cvttps_epi32(_mm512_mask_add_ps(t, up, t, step));
    }
    // Signed saturation, as the AVX2 path's packs (|code| <= 127 here).
    let codes = _mm256_set_m128i(_mm512_cvtsepi32_epi8(q[1]), _mm512_cvtsepi32_epi8(q[0]));
    out[..2].copy_from_slice(&half_bits(d));
    _mm256_storeu_si256(out[2..2 + QK].as_mut_ptr().cast(), codes);
    true
}

#[inline(always)]
unsafe fn q4_0(v: [__m512; 2], out: &mut [u8]) -> bool {
    let (a, amax, nan) = abs_max(v);
    if nan || !amax.is_finite() {
        return false;
    }
    // First element whose magnitude is the maximum (numpy argmax).
    let m = _mm512_set1_ps(amax);
    let hits = u32::from(_mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a[0], m))
        | u32::from(_mm512_cmp_ps_mask::<_CMP_EQ_OQ>(a[1], m)) << 16;
    let best = hits.trailing_zeros() as usize;
    // That element itself (FLOAT16 sources convert exactly).
    let max = _mm512_permutex2var_ps(v[0], _mm512_set1_epi32(best as i32), v[1]);
    let d = _mm512_cvtss_f32(max) / -8.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let idv = _mm512_set1_ps(id);
    let bias = _mm512_set1_ps(8.5);
    let zero = _mm512_setzero_si512();
    let fifteen = _mm512_set1_epi32(15);
    let mut q = [zero; 2];
    for (qi, x) in q.iter_mut().zip(v) {
        // Truncation; a non-finite value converts to i32::MIN, clamped to 0.
        let t = _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(x, idv), bias));
        *qi = _mm512_min_epi32(_mm512_max_epi32(t, zero), fifteen);
    }
    // Byte j: element j (low nibble) and element j + 16 (high).
    let packed = _mm512_cvtepi32_epi8(_mm512_or_si512(q[0], _mm512_slli_epi32::<4>(q[1])));
    out[..2].copy_from_slice(&half_bits(d));
    _mm_storeu_si128(out[2..2 + QK / 2].as_mut_ptr().cast(), packed);
    true
}
