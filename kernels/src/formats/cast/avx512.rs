//! AVX-512 (F + BW + VL, with F16C) FLOAT -> FLOAT16 / BFLOAT16, 32
//! elements per step and a masked last step, so the whole run is converted
//! here. FLOAT16: `vcvtps2ph` rounds to nearest even like the scalar rule
//! for every non-NaN; NaN lanes are redone in scalar code (the hardware
//! sets the quiet bit, numpy does not). BFLOAT16 (no AVX512_BF16 needed,
//! and its `vcvtneps2bf16` would flush denormals): the integer rounding of
//! `fp16::f32_to_bf16_bits` in vectors, NaN lanes blended with
//! `sign | 0x7fc0`.

use std::arch::x86_64::*;

use super::target::Target;
use crate::fp16::fix_nans;

/// Converts every element (`min(src.len() / 4, out.len() / 2)`); returns
/// how many were converted.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,f16c")]
pub(crate) unsafe fn convert_run(t: Target, src: &[u8], out: &mut [u8]) -> usize {
    let n = (src.len() / 4).min(out.len() / 2);
    let whole = n / 32 * 32;
    let (sp, op) = (src.as_ptr(), out.as_mut_ptr());
    // Plain counted loops (see avx2.rs).
    let mut i = 0;
    match t {
        Target::F16 => {
            while i < whole {
                let a = _mm512_loadu_ps(sp.add(i * 4).cast());
                let b = _mm512_loadu_ps(sp.add(i * 4 + 64).cast());
                _mm256_storeu_si256(op.add(i * 2).cast(), f16(a));
                _mm256_storeu_si256(op.add(i * 2 + 32).cast(), f16(b));
                let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(a, a)
                    | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(b, b);
                if nan != 0 {
                    fix_nans(sp.add(i * 4), op.add(i * 2), 32);
                }
                i += 32;
            }
            while i < n {
                let m = mask(n - i);
                let a = _mm512_maskz_loadu_ps(m, sp.add(i * 4).cast());
                _mm256_mask_storeu_epi16(op.add(i * 2).cast(), m, f16(a));
                if _mm512_mask_cmp_ps_mask::<_CMP_UNORD_Q>(m, a, a) != 0 {
                    fix_nans(sp.add(i * 4), op.add(i * 2), (n - i).min(16));
                }
                i += 16;
            }
        }
        Target::Bf16 => {
            while i < whole {
                let a = _mm512_loadu_ps(sp.add(i * 4).cast());
                let b = _mm512_loadu_ps(sp.add(i * 4 + 64).cast());
                _mm256_storeu_si256(op.add(i * 2).cast(), bf16(a));
                _mm256_storeu_si256(op.add(i * 2 + 32).cast(), bf16(b));
                i += 32;
            }
            while i < n {
                let m = mask(n - i);
                let a = _mm512_maskz_loadu_ps(m, sp.add(i * 4).cast());
                _mm256_mask_storeu_epi16(op.add(i * 2).cast(), m, bf16(a));
                i += 16;
            }
        }
    }
    n
}

/// The first `left` (capped at 16) lanes.
#[inline(always)]
fn mask(left: usize) -> __mmask16 {
    if left >= 16 {
        0xffff
    } else {
        (1u16 << left) - 1
    }
}

#[inline(always)]
unsafe fn f16(x: __m512) -> __m256i {
    _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x)
}

/// Sixteen bfloat16 results (`fp16::f32_to_bf16_bits` lane by lane).
#[inline(always)]
unsafe fn bf16(x: __m512) -> __m256i {
    let u = _mm512_castps_si512(x);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(u), _mm512_set1_epi32(1));
    let r = _mm512_srli_epi32::<16>(_mm512_add_epi32(
        _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
        lsb,
    ));
    let abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fff_ffff));
    let nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f80_0000));
    let sign = _mm512_and_si512(_mm512_srli_epi32::<16>(u), _mm512_set1_epi32(0x8000));
    let qnan = _mm512_or_si512(sign, _mm512_set1_epi32(0x7fc0));
    _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, qnan))
}
