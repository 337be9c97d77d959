//! `ort.matmul_nbits` with `transposed=true`: the source is W[N, K] (the B
//! input of a Gemm with transB=1) and the MatMul weight is B = W^T [K, N].
//! Column n of B is the contiguous row n of W, so every block is a
//! contiguous run of at most `bs` elements of one source row.
//!
//! The bytes are those of `kernel::pack` on W^T, and so are the rules
//! (see that module's doc); the block parameters, zero-point packing and
//! codes are `block.rs`'s own functions. What differs is the order of
//! work, which the bytes must not see:
//!
//! - min/max are taken in independent lanes, then the lanes are combined.
//!   The *value* of a NaN-skipping `v < min` / `v > max` scan does not
//!   depend on the order; only the sign of a zero extreme does, and the
//!   sequential scan keeps the first zero of the block, so a zero extreme
//!   is replaced by the block's first zero.
//! - 4 bits, odd K: the unpaired last element of the last block takes as
//!   its high nibble the high code of the block's own last pair; when the
//!   block has no pair (one element), that of the previous block's last
//!   pair if both blocks are in one 2*bs work item (odd block index), else
//!   0. The previous block is whole (only the last block is short and block
//!   sizes are even), so its last pair is its last byte.

use rayon::prelude::*;

use super::block::{code, load_row, put_block_params, Nbits, Weight, MAX_BS};
use crate::isa::Isa;

/// Independent min/max accumulators per block.
const LANES: usize = 16;
/// Source elements per job, about (at least one row).
const JOB_ELEMS: usize = 1 << 15;

/// Packs B = W^T into `out` = codes | scales | zero points. `w.k` and `w.n`
/// are B's dimensions (K, N); `w.data` holds W[N, K] row-major.
pub(crate) fn pack(isa: Isa, w: Weight<'_>, q: Nbits, out: &mut [u8]) {
    let kb = q.k_blocks(w.k);
    let es = w.elem_bytes();
    let blob = q.blob();
    let zpb = q.zp_bytes(w.k);
    let (codes, rest) = out.split_at_mut(w.n * kb * blob);
    let (scales, zps) = rest.split_at_mut(w.n * kb * es);
    // Enough rows per job to amortize it, few enough to feed every thread.
    let spread = w.n.div_ceil(4 * rayon::current_num_threads()).max(1);
    let rows = (JOB_ELEMS / w.k.max(1)).clamp(1, spread);
    let mut jobs = Vec::with_capacity(w.n.div_ceil(rows));
    let (mut c, mut s, mut z) = (codes, scales, zps);
    let mut n0 = 0;
    while n0 < w.n {
        let count = rows.min(w.n - n0);
        let (c1, c2) = c.split_at_mut(count * kb * blob);
        let (s1, s2) = s.split_at_mut(count * kb * es);
        let (z1, z2) = z.split_at_mut(count * zpb);
        jobs.push((n0, count, c1, s1, z1));
        (c, s, z) = (c2, s2, z2);
        n0 += count;
    }
    jobs.into_par_iter().for_each(|(n0, count, c, s, z)| {
        pack_rows(isa, &w, &q, n0, count, c, s, z);
    });
}

/// Packs source rows `n0 .. n0 + count` (columns of B) into their outputs.
#[allow(clippy::too_many_arguments)]
fn pack_rows(
    isa: Isa,
    w: &Weight<'_>,
    q: &Nbits,
    n0: usize,
    count: usize,
    codes: &mut [u8],
    scales: &mut [u8],
    zps: &mut [u8],
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: Isa::Avx2 is only used when the CPU has AVX2 and F16C
        // (checked by the packer). The same Rust code, compiled for wider
        // vectors: no FMA contraction, so the same bytes.
        unsafe { pack_rows_avx2(w, q, n0, count, codes, scales, zps) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: Isa::Avx512 is only used when the CPU has AVX-512 F/BW/VL
        // and F16C. As above, with 512-bit vectors.
        unsafe { pack_rows_avx512(w, q, n0, count, codes, scales, zps) };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        // SAFETY: Isa::Neon is only used when the CPU has NEON. NEON is
        // aarch64's baseline, so this is the scalar code's own
        // vectorization (compare + select min/max, no FMA contraction);
        // kept as a separate entry for symmetry and to force the path.
        unsafe { pack_rows_neon(w, q, n0, count, codes, scales, zps) };
        return;
    }
    let _ = isa;
    rows(w, q, n0, count, codes, scales, zps);
}

/// `rows` compiled for one instruction set: the same Rust code with wider
/// vectors (Rust never contracts to FMA, so the bytes are the same).
macro_rules! rows_for {
    ($name:ident, $arch:literal, $features:literal) => {
        #[cfg(target_arch = $arch)]
        #[target_feature(enable = $features)]
        unsafe fn $name(
            w: &Weight<'_>,
            q: &Nbits,
            n0: usize,
            count: usize,
            codes: &mut [u8],
            scales: &mut [u8],
            zps: &mut [u8],
        ) {
            rows(w, q, n0, count, codes, scales, zps);
        }
    };
}

rows_for!(pack_rows_neon, "aarch64", "neon");
rows_for!(pack_rows_avx2, "x86_64", "avx2,f16c");
rows_for!(
    pack_rows_avx512,
    "x86_64",
    "avx512f,avx512bw,avx512vl,avx2,f16c"
);

#[inline(always)]
fn rows(
    w: &Weight<'_>,
    q: &Nbits,
    n0: usize,
    count: usize,
    codes: &mut [u8],
    scales: &mut [u8],
    zps: &mut [u8],
) {
    let bs = q.block_size;
    let kb = q.k_blocks(w.k);
    let es = w.elem_bytes();
    let blob = q.blob();
    let zpb = q.zp_bytes(w.k);
    let kmax = q.kmax();
    // The source as stored: W[N, K].
    let src = Weight {
        data: w.data,
        f16: w.f16,
        k: w.n,
        n: w.k,
    };
    let mut buf = [0f32; MAX_BS];
    for r in 0..count {
        let n = n0 + r;
        let crow = &mut codes[r * kb * blob..(r + 1) * kb * blob];
        let srow = &mut scales[r * kb * es..(r + 1) * kb * es];
        let zrow = &mut zps[r * zpb..(r + 1) * zpb];
        for b in 0..kb {
            let k0 = b * bs;
            let len = bs.min(w.k - k0);
            let v = &mut buf[..len];
            load_row(&src, n, k0, v);
            let (mn, mx) = minmax(v);
            let (recip, zp) =
                put_block_params(q, mn, mx, w.f16, b, &mut srow[b * es..(b + 1) * es], zrow);
            let (prev, blk) = crow.split_at_mut(b * blob);
            let blk = &mut blk[..blob];
            let used = if q.bits == 8 {
                for (o, &x) in blk.iter_mut().zip(v.iter()) {
                    *o = code(x, recip, zp, kmax);
                }
                len
            } else {
                let pairs = len / 2;
                for (o, p) in blk.iter_mut().zip(v.chunks_exact(2)) {
                    *o = code(p[0], recip, zp, kmax) | (code(p[1], recip, zp, kmax) << 4);
                }
                if len % 2 == 1 {
                    // Odd K (module doc).
                    let hi = if pairs > 0 {
                        blk[pairs - 1] >> 4
                    } else if b % 2 == 1 {
                        prev[b * blob - 1] >> 4
                    } else {
                        0
                    };
                    blk[pairs] = code(v[len - 1], recip, zp, kmax) | (hi << 4);
                    pairs + 1
                } else {
                    pairs
                }
            };
            blk[used..].fill(0);
        }
    }
}

/// min/max as the sequential scan from (FLT_MAX, -FLT_MAX) with `v < min`
/// / `v > max` computes them (NaNs skipped, the first of +0/-0 kept).
#[inline(always)]
fn minmax(v: &[f32]) -> (f32, f32) {
    let mut lo = [f32::MAX; LANES];
    let mut hi = [-f32::MAX; LANES];
    let mut chunks = v.chunks_exact(LANES);
    for c in &mut chunks {
        // Selects (not branches), so that they vectorize as minps/maxps.
        for ((&x, l), h) in c.iter().zip(lo.iter_mut()).zip(hi.iter_mut()) {
            *l = if x < *l { x } else { *l };
            *h = if x > *h { x } else { *h };
        }
    }
    let tail = chunks.remainder();
    let mut mn = f32::MAX;
    let mut mx = -f32::MAX;
    for &x in lo.iter().chain(tail) {
        mn = if x < mn { x } else { mn };
    }
    for &x in hi.iter().chain(tail) {
        mx = if x > mx { x } else { mx };
    }
    // A zero extreme: the sequential scan keeps the block's first zero.
    if mn == 0.0 || mx == 0.0 {
        let first = v.iter().copied().find(|&x| x == 0.0).unwrap_or(0.0);
        if mn == 0.0 {
            mn = first;
        }
        if mx == 0.0 {
            mx = first;
        }
    }
    (mn, mx)
}
