//! The vectorizable steps of packing a tile of columns for
//! `kernel.rs`: column min/max, the code bytes, and the transposition
//! of the codes to their output rows. Each runs the ISA's vector kernel on
//! the columns it takes and scalar code on the rest.

use super::block::{code, load_row, ColParams, Nbits, Weight, TILE};
use crate::isa::Isa;

/// Writes column c of `tile` (rows `0 .. rows`, then zeros up to `blob`) to
/// `out[c * stride ..][.. blob]`.
pub(super) fn transpose_out(
    isa: Isa,
    tile: &[u8],
    rows: usize,
    width: usize,
    blob: usize,
    out: &mut [u8],
    stride: usize,
) {
    #[allow(unused_mut)] // only x86-64 has a vector path (NEON: scalar)
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) {
        done = rows & !7;
        // SAFETY: Isa::Avx2 and Isa::Avx512 are only used when the CPU has
        // AVX2; the function checks its bounds. Avx512 runs the AVX2
        // transpose: a 512-bit one (16 x 16 blocks) measured no faster,
        // the scattered column stores dominate.
        unsafe { super::avx2::transpose(tile, done, width, out, stride) };
    }
    let _ = isa;
    for c in 0..width {
        let dst = &mut out[c * stride..c * stride + blob];
        let skip = if done > 0 && c < width & !7 { done } else { 0 };
        for (i, d) in dst.iter_mut().enumerate().take(rows).skip(skip) {
            *d = tile[i * TILE + c];
        }
        dst[rows..].fill(0);
    }
}

/// Column min/max over rows `k0 .. k0 + len`.
#[allow(clippy::too_many_arguments)]
pub(super) fn minmax(
    isa: Isa,
    w: &Weight<'_>,
    n0: usize,
    width: usize,
    k0: usize,
    len: usize,
    mn: &mut [f32; TILE],
    mx: &mut [f32; TILE],
) {
    #[allow(unused_mut)] // only x86-64 and aarch64 have vector paths
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx2 => {
            done = width & !7;
            // SAFETY: Isa::Avx2 is only used when the CPU has AVX2 and F16C
            // (checked by the packer); the column range is inside the row.
            unsafe { super::avx2::minmax(w, n0, done, k0, len, mn, mx) };
        }
        Isa::Avx512 => {
            done = width;
            // SAFETY: Isa::Avx512 is only used when the CPU has AVX-512
            // F/BW/VL and F16C; the column range is inside the row.
            unsafe { super::avx512::minmax(w, n0, done, k0, len, mn, mx) };
        }
        Isa::Scalar | Isa::Neon => {}
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        done = width & !3;
        // SAFETY: Isa::Neon is only used when the CPU has NEON (checked by
        // the packer); the column range is inside the row.
        unsafe { super::neon::minmax(w, n0, done, k0, len, mn, mx) };
    }
    let _ = isa;
    if done == width {
        return;
    }
    let mut row = [0f32; TILE];
    for k in k0..k0 + len {
        load_row(w, k, n0 + done, &mut row[..width - done]);
        let (mn, mx) = (&mut mn[done..width], &mut mx[done..width]);
        // Selects (not branches), so that they vectorize as minps/maxps.
        for ((&v, lo), hi) in row.iter().zip(mn.iter_mut()).zip(mx.iter_mut()) {
            *lo = if v < *lo { v } else { *lo };
            *hi = if v > *hi { v } else { *hi };
        }
    }
}

/// Output bytes of rows `k0 .. k0 + len` into `tile[i * TILE + c]`: 8 bits:
/// row i; 4 bits: rows 2i (low nibble) and 2i + 1 (high), whole pairs only.
#[allow(clippy::too_many_arguments)]
pub(super) fn fill_codes(
    isa: Isa,
    w: &Weight<'_>,
    q: &Nbits,
    n0: usize,
    width: usize,
    k0: usize,
    len: usize,
    p: &ColParams,
    tile: &mut [u8],
) {
    let kmax = q.kmax();
    #[allow(unused_mut)] // only x86-64 and aarch64 have vector paths
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx2 => {
            done = width & !7;
            // SAFETY: as in `minmax`.
            unsafe { super::avx2::codes(w, q.bits, n0, done, k0, len, p, kmax, tile) };
        }
        Isa::Avx512 => {
            done = width;
            // SAFETY: as in `minmax`.
            unsafe { super::avx512::codes(w, q.bits, n0, done, k0, len, p, kmax, tile) };
        }
        Isa::Scalar | Isa::Neon => {}
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        done = width & !3;
        // SAFETY: as in `minmax`.
        unsafe { super::neon::codes(w, q.bits, n0, done, k0, len, p, kmax, tile) };
    }
    let _ = isa;
    if done == width {
        return;
    }
    let (recip, zp) = (&p.recip[done..width], &p.zp[done..width]);
    let mut lo = [0f32; TILE];
    let mut hi = [0f32; TILE];
    let (step, rows) = if q.bits == 8 { (1, len) } else { (2, len / 2) };
    for r in 0..rows {
        let row = &mut tile[r * TILE + done..r * TILE + width];
        load_row(w, k0 + step * r, n0 + done, &mut lo[..width - done]);
        if step == 1 {
            for (((o, &v), &rc), &z) in row.iter_mut().zip(lo.iter()).zip(recip).zip(zp) {
                *o = code(v, rc, z, kmax);
            }
        } else {
            load_row(w, k0 + step * r + 1, n0 + done, &mut hi[..width - done]);
            for ((((o, &a), &b), &rc), &z) in row
                .iter_mut()
                .zip(lo.iter())
                .zip(hi.iter())
                .zip(recip)
                .zip(zp)
            {
                *o = code(a, rc, z, kmax) | (code(b, rc, z, kmax) << 4);
            }
        }
    }
}
