//! AVX2 + F16C FLOAT -> FLOAT16 / BFLOAT16, 16 elements per step.

use std::arch::x86_64::*;

use super::target::Target;
use crate::fp16::fix_nans;

/// Converts the leading whole groups of 16 elements; returns how many
/// elements were converted (the caller finishes the rest).
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn convert_run(t: Target, src: &[u8], out: &mut [u8]) -> usize {
    let n = (src.len() / 4).min(out.len() / 2) / 16 * 16;
    let (sp, op) = (src.as_ptr(), out.as_mut_ptr());
    // Plain counted loops: a `step_by` iterator here costs as much as the
    // conversion itself.
    let mut i = 0;
    match t {
        Target::F16 => {
            while i < n {
                let a = _mm256_loadu_ps(sp.add(i * 4).cast());
                let b = _mm256_loadu_ps(sp.add(i * 4 + 32).cast());
                let ha = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(a);
                let hb = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(b);
                _mm_storeu_si128(op.add(i * 2).cast(), ha);
                _mm_storeu_si128(op.add(i * 2 + 16).cast(), hb);
                let nan = _mm256_or_ps(
                    _mm256_cmp_ps::<_CMP_UNORD_Q>(a, a),
                    _mm256_cmp_ps::<_CMP_UNORD_Q>(b, b),
                );
                if _mm256_movemask_ps(nan) != 0 {
                    fix_nans(sp.add(i * 4), op.add(i * 2), 16);
                }
                i += 16;
            }
        }
        Target::Bf16 => {
            while i < n {
                let a = _mm256_loadu_ps(sp.add(i * 4).cast());
                let b = _mm256_loadu_ps(sp.add(i * 4 + 32).cast());
                let r = _mm256_packus_epi32(bf16(a), bf16(b));
                let r = _mm256_permute4x64_epi64::<0b11_01_10_00>(r);
                _mm256_storeu_si256(op.add(i * 2).cast(), r);
                i += 16;
            }
        }
    }
    n
}

/// Eight bfloat16 results in the low halves of 32-bit lanes.
#[inline(always)]
unsafe fn bf16(x: __m256) -> __m256i {
    let u = _mm256_castps_si256(x);
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(u), _mm256_set1_epi32(1));
    let r = _mm256_srli_epi32::<16>(_mm256_add_epi32(
        _mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
        lsb,
    ));
    let abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fff_ffff));
    let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f80_0000));
    let sign = _mm256_and_si256(_mm256_srli_epi32::<16>(u), _mm256_set1_epi32(0x8000));
    let qnan = _mm256_or_si256(sign, _mm256_set1_epi32(0x7fc0));
    _mm256_blendv_epi8(r, qnan, nan)
}
