//! AVX2 kernels of `ort.quantize_dynamic` (also the AVX-512 path): FLOAT
//! ranges with a finiteness check, and `clip(round(x / s) + z)` with IEEE
//! division and ties-to-even rounding (`vroundps`), 8 values per step.

use std::arch::x86_64::*;

use super::quant::{quantize_one, Quant, Range};

/// True in lanes that are NaN or infinite.
#[inline(always)]
unsafe fn non_finite(x: __m256) -> __m256 {
    let a = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)));
    _mm256_cmp_ps::<_CMP_NLT_UQ>(a, _mm256_set1_ps(f32::INFINITY))
}

/// Range of the leading whole groups of 8 values: (values done, range, or
/// `None` when one is not finite).
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn range_run(data: &[u8]) -> (usize, Option<Range>) {
    let n = data.len() / 4 / 8 * 8;
    let p = data.as_ptr();
    let mut lo = _mm256_set1_ps(f32::INFINITY);
    let mut hi = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut bad = _mm256_setzero_ps();
    let mut i = 0;
    while i < n {
        let x = _mm256_loadu_ps(p.add(4 * i).cast());
        lo = _mm256_min_ps(lo, x);
        hi = _mm256_max_ps(hi, x);
        bad = _mm256_or_ps(bad, non_finite(x));
        i += 8;
    }
    if _mm256_movemask_ps(bad) != 0 {
        return (n, None);
    }
    let (mut l, mut h) = ([0f32; 8], [0f32; 8]);
    _mm256_storeu_ps(l.as_mut_ptr(), lo);
    _mm256_storeu_ps(h.as_mut_ptr(), hi);
    let r = Range {
        lo: l.iter().fold(f32::INFINITY, |a, &b| a.min(b)),
        hi: h.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)),
    };
    (n, Some(r))
}

/// Folds the leading whole groups of 8 columns of one row into the column
/// ranges: (columns done, all finite).
///
/// # Safety
/// The CPU must have AVX2; `row` holds `lo.len()` FLOATs, `hi` as `lo`.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn columns_row(row: &[u8], lo: &mut [f32], hi: &mut [f32]) -> (usize, bool) {
    let n = lo.len().min(hi.len()).min(row.len() / 4) / 8 * 8;
    let p = row.as_ptr();
    let mut bad = _mm256_setzero_ps();
    let mut c = 0;
    while c < n {
        let x = _mm256_loadu_ps(p.add(4 * c).cast());
        let l = _mm256_loadu_ps(lo.as_ptr().add(c));
        let h = _mm256_loadu_ps(hi.as_ptr().add(c));
        _mm256_storeu_ps(lo.as_mut_ptr().add(c), _mm256_min_ps(l, x));
        _mm256_storeu_ps(hi.as_mut_ptr().add(c), _mm256_max_ps(h, x));
        bad = _mm256_or_ps(bad, non_finite(x));
        c += 8;
    }
    (n, _mm256_movemask_ps(bad) == 0)
}

/// Quantizes a leading run of values; returns how many (the caller does
/// the rest).
///
/// # Safety
/// The CPU must have AVX2; `src` holds `out.len()` FLOATs; with `step` 1,
/// `s` and `z` hold `out.len()` values, with `step` 0 at least 8.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn quantize_run(
    q: Quant,
    src: &[u8],
    s: &[f32],
    z: &[f32],
    step: usize,
    out: &mut [u8],
) -> usize {
    let mut n = out.len().min(src.len() / 4);
    if step == 1 {
        n = n.min(s.len().min(z.len()));
    } else if s.len() < 8 || z.len() < 8 {
        return 0;
    }
    let (lo, hi) = q.full();
    let codes = Codes {
        src: src.as_ptr(),
        s: s.as_ptr(),
        z: z.as_ptr(),
        step,
        lo: _mm256_set1_ps(lo),
        hi: _mm256_set1_ps(hi),
    };
    // One at a time up to a 32-byte aligned output, then 32 at a time with
    // streaming stores (the output is not read again here: no
    // read-for-ownership of its lines), then 8 at a time.
    let head = ((32 - out.as_ptr() as usize % 32) % 32).min(n);
    for i in 0..head {
        let x = f32::from_le_bytes([src[4 * i], src[4 * i + 1], src[4 * i + 2], src[4 * i + 3]]);
        out[i] = quantize_one(x, s[i * step], z[i * step], lo, hi);
    }
    let op = out.as_mut_ptr();
    let mut i = head;
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    while i + 32 <= n {
        let a = _mm256_packs_epi32(codes.at(i), codes.at(i + 8));
        let b = _mm256_packs_epi32(codes.at(i + 16), codes.at(i + 24));
        let bytes = if q.signed {
            _mm256_packs_epi16(a, b)
        } else {
            _mm256_packus_epi16(a, b)
        };
        _mm256_stream_si256(op.add(i).cast(), _mm256_permutevar8x32_epi32(bytes, order));
        i += 32;
    }
    _mm_sfence();
    while i + 8 <= n {
        store8(q, codes.at(i), op.add(i));
        i += 8;
    }
    i
}

/// What the codes of a run are made from.
struct Codes {
    src: *const u8,
    s: *const f32,
    z: *const f32,
    step: usize,
    lo: __m256,
    hi: __m256,
}

impl Codes {
    /// Values `i..i + 8`'s codes as i32: clip(round(x / s) + z).
    ///
    /// # Safety
    /// The CPU has AVX2; the values and their scales and zero points are
    /// in bounds (see `quantize_run`).
    #[target_feature(enable = "avx2")]
    unsafe fn at(&self, i: usize) -> __m256i {
        let x = _mm256_loadu_ps(self.src.add(4 * i).cast());
        let sc = _mm256_loadu_ps(self.s.add(i * self.step));
        let zp = _mm256_loadu_ps(self.z.add(i * self.step));
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_div_ps(x, sc),
        );
        let v = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(r, zp), self.lo), self.hi);
        _mm256_cvtps_epi32(v)
    }
}

/// Stores the 8 codes of `v` (already in the type's range) as bytes at `to`.
#[target_feature(enable = "avx2")]
unsafe fn store8(q: Quant, v: __m256i, to: *mut u8) {
    let w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let b = if q.signed {
        _mm_packs_epi16(w, w)
    } else {
        _mm_packus_epi16(w, w)
    };
    _mm_storel_epi64(to.cast(), b);
}
