//! The arithmetic of onnxruntime's `quantize_dynamic` weight quantizer
//! (`quant_utils.compute_scale_zp` + `quantize_nparray`), per tensor or per
//! channel along the last axis, for FLOAT sources.
//!
//! For each channel (the whole tensor when per tensor):
//! 1. `rmin = min(min(x), 0)`, `rmax = max(max(x), 0)` in FLOAT; symmetric:
//!    both become `∓max(|rmin|, |rmax|)`.
//! 2. `(qmin, qmax)`: reduce_range (u8 0..127, i8 -64..64), else symmetric
//!    INT8 -127..127, else the type's range (u8 0..255, i8 -128..127).
//! 3. `scale = (f64(rmax) - f64(rmin)) / f64(qmax - qmin)` in DOUBLE. Below
//!    FLOAT's smallest normal (all-zero or tiny weights): scale 1.0, zero
//!    point 0. Else the zero point is `round((qmin + qmax) / 2)` (symmetric)
//!    or `round(qmin - f64(rmin) / scale)` (DOUBLE, ties to even), and the
//!    stored scale is the DOUBLE rounded to FLOAT.
//! 4. `q = clip(round(x / scale) + zero_point, type range)`: FLOAT division
//!    by the stored scale, ties to even, clipped to the full range of the
//!    type (not the reduced one).
//!
//! NaN fails the reference's own `scale >= 0` assertion and an infinity
//! makes it cast NaN to an integer (platform dependent), so a source with
//! either is refused.

use rayon::prelude::*;

use super::quant::{quantize_one, Quant, Range};
use crate::isa::Isa;

/// Elements per parallel work item.
const CHUNK: usize = 1 << 16;

/// Reads FLOAT `i` of raw little-endian bytes.
#[inline(always)]
fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// The index of the first value of `data` that is NaN or infinite.
pub(crate) fn first_non_finite(data: &[u8]) -> Option<usize> {
    (0..data.len() / 4).find(|&i| !f32_at(data, i).is_finite())
}

/// Range of the whole tensor; `None` when some value is not finite.
pub(crate) fn range_all(isa: Isa, data: &[u8]) -> Option<Range> {
    data.par_chunks(4 * CHUNK)
        .map(|c| range_run(isa, c))
        .reduce(
            || {
                Some(Range {
                    lo: f32::INFINITY,
                    hi: f32::NEG_INFINITY,
                })
            },
            |a, b| {
                let (a, b) = (a?, b?);
                Some(Range {
                    lo: a.lo.min(b.lo),
                    hi: a.hi.max(b.hi),
                })
            },
        )
}

fn range_run(isa: Isa, data: &[u8]) -> Option<Range> {
    let mut r = Range {
        lo: f32::INFINITY,
        hi: f32::NEG_INFINITY,
    };
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) {
        // SAFETY: Avx2 and Avx512 are only used when the CPU has AVX2.
        let (n, v) = unsafe { super::avx2::range_run(data) };
        r = v?;
        done = n;
    }
    let _ = isa;
    for i in done..data.len() / 4 {
        let x = f32_at(data, i);
        if !x.is_finite() {
            return None;
        }
        r.lo = r.lo.min(x);
        r.hi = r.hi.max(x);
    }
    Some(r)
}

/// Ranges of the `cols` columns of the row-major `[rows, cols]` data;
/// `None` when some value is not finite.
pub(crate) fn range_columns(isa: Isa, data: &[u8], cols: usize) -> Option<Vec<Range>> {
    let row_bytes = 4 * cols;
    let rows_per = CHUNK.div_ceil(cols).max(1);
    let init = || Some((vec![f32::INFINITY; cols], vec![f32::NEG_INFINITY; cols]));
    let (lo, hi) = data
        .par_chunks(row_bytes * rows_per)
        .map(|c| {
            let (mut lo, mut hi) = init()?;
            for row in c.chunks_exact(row_bytes) {
                columns_row(isa, row, &mut lo, &mut hi)?;
            }
            Some((lo, hi))
        })
        .reduce(init, |a, b| {
            let ((mut alo, mut ahi), (blo, bhi)) = (a?, b?);
            for (x, y) in alo.iter_mut().zip(blo) {
                *x = x.min(y);
            }
            for (x, y) in ahi.iter_mut().zip(bhi) {
                *x = x.max(y);
            }
            Some((alo, ahi))
        })?;
    Some(
        lo.into_iter()
            .zip(hi)
            .map(|(lo, hi)| Range { lo, hi })
            .collect(),
    )
}

/// Folds one row into the column ranges; `None` on a non-finite value.
fn columns_row(isa: Isa, row: &[u8], lo: &mut [f32], hi: &mut [f32]) -> Option<()> {
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) {
        // SAFETY: Avx2 and Avx512 are only used when the CPU has AVX2.
        let (n, ok) = unsafe { super::avx2::columns_row(row, lo, hi) };
        if !ok {
            return None;
        }
        done = n;
    }
    let _ = isa;
    for c in done..lo.len() {
        let x = f32_at(row, c);
        if !x.is_finite() {
            return None;
        }
        lo[c] = lo[c].min(x);
        hi[c] = hi[c].max(x);
    }
    Some(())
}

/// Quantizes `src` into `out`: per tensor when `scales` has one value,
/// else per column of rows of `scales.len()` values.
pub(crate) fn quantize(
    isa: Isa,
    q: Quant,
    src: &[u8],
    scales: &[f32],
    zps: &[f32],
    out: &mut [u8],
) {
    let cols = scales.len();
    if cols == 1 {
        let (s, z) = ([scales[0]; 8], [zps[0]; 8]);
        out.par_chunks_mut(CHUNK)
            .zip(src.par_chunks(4 * CHUNK))
            .for_each(|(o, x)| run(isa, q, x, &s, &z, 0, o));
    } else {
        let rows_per = CHUNK.div_ceil(cols).max(1);
        out.par_chunks_mut(cols * rows_per)
            .zip(src.par_chunks(4 * cols * rows_per))
            .for_each(|(o, x)| {
                for (o, x) in o.chunks_exact_mut(cols).zip(x.chunks_exact(4 * cols)) {
                    run(isa, q, x, scales, zps, 1, o);
                }
            });
    }
}

/// Quantizes one run; value `i` uses `s[i * step]`, `z[i * step]` (step 0:
/// the first value for all, and `s`, `z` hold it 8 times).
fn run(isa: Isa, q: Quant, src: &[u8], s: &[f32], z: &[f32], step: usize, out: &mut [u8]) {
    let (lo, hi) = q.full();
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) {
        // SAFETY: Avx2 and Avx512 are only used when the CPU has AVX2;
        // `s` and `z` hold 8 values (step 0) or one per element (step 1).
        done = unsafe { super::avx2::quantize_run(q, src, s, z, step, out) };
    }
    let _ = isa;
    for i in done..out.len() {
        out[i] = quantize_one(f32_at(src, i), s[i * step], z[i * step], lo, hi);
    }
}

/// `out[c][r] = src[r][c]` for the row-major byte matrix `src[rows, cols]`,
/// in cache-sized tiles.
pub(crate) fn transpose_bytes(src: &[u8], rows: usize, cols: usize, out: &mut [u8]) {
    const T: usize = 64;
    for r0 in (0..rows).step_by(T) {
        for c0 in (0..cols).step_by(T) {
            for r in r0..(r0 + T).min(rows) {
                for c in c0..(c0 + T).min(cols) {
                    out[c * rows + r] = src[r * cols + c];
                }
            }
        }
    }
}
