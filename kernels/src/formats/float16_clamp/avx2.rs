//! AVX2 + F16C `ort.float16`: the clamp in vectors (magnitude compares and
//! blends, the sign put back), then `vcvtps2ph` (round to nearest even, as
//! the scalar rule for every non-NaN); NaN lanes, which the clamp leaves
//! alone, are redone in scalar code (the hardware sets the quiet bit, numpy
//! does not). Also the AVX-512 path.

use std::arch::x86_64::*;

use super::bounds::Bounds;
use crate::fp16::fix_nans;

/// Converts the leading whole groups of 8 elements; returns how many
/// elements were converted (the caller finishes the rest).
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn convert_run(b: Bounds, src: &[u8], out: &mut [u8]) -> usize {
    let n = (src.len() / 4).min(out.len() / 2) / 8 * 8;
    let (sp, op) = (src.as_ptr(), out.as_mut_ptr());
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let zero = _mm256_setzero_ps();
    let inf = _mm256_set1_ps(f32::INFINITY);
    let lo = _mm256_set1_ps(b.min);
    let hi = _mm256_set1_ps(b.max);
    let mut i = 0;
    while i < n {
        let x = _mm256_loadu_ps(sp.add(i * 4).cast());
        let a = _mm256_and_ps(x, abs_mask);
        let sign = _mm256_andnot_ps(abs_mask, x);
        // Ordered compares: false for NaN, which stays as it is.
        let small = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_GT_OQ>(a, zero),
            _mm256_cmp_ps::<_CMP_LT_OQ>(a, lo),
        );
        let big = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_GT_OQ>(a, hi),
            _mm256_cmp_ps::<_CMP_LT_OQ>(a, inf),
        );
        let c = _mm256_blendv_ps(a, lo, small);
        let c = _mm256_or_ps(_mm256_blendv_ps(c, hi, big), sign);
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(c);
        _mm_storeu_si128(op.add(i * 2).cast(), h);
        if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x)) != 0 {
            fix_nans(sp.add(i * 4), op.add(i * 2), 8);
        }
        i += 8;
    }
    n
}
