//! Blockwise n-bit quantization of a MatMul weight W[K, N], byte-identical
//! with onnxruntime's `quantize_matmul_4bits` / `quantize_matmul_8bits`
//! (MLAS `MlasQuantizeBlockwise`, columnwise) on x86-64. Facts the bytes
//! depend on, all verified against onnxruntime 1.32:
//!
//! - A block is `bs` consecutive k of one column n; K is padded up to a
//!   whole block but the padding takes no part in min/max and its codes
//!   are 0.
//! - min/max start at +/-FLT_MAX and use `v < min` / `v > max` (NaNs are
//!   skipped, +0/-0 keep the first seen).
//! - Symmetric: `m = |max| > |min| ? max : min`, `scale = -m / 2^(bits-1)`
//!   (no rectification to include 0), zero point `2^(bits-1)`.
//! - Asymmetric: `min = min(min, 0)`, `max = max(max, 0)`,
//!   `scale = (max - min) / (2^bits - 1)`, `zp_f = scale != 0 ? 0 - min /
//!   scale : min`, zp = 0 / 2^bits-1 when below / above the range, else
//!   `roundf(zp_f)`.
//! - The scale is stored in the source type (FLOAT16 rounds to nearest
//!   even) and the *stored* value is read back for quantization, while the
//!   zero point used the unrounded f32 scale.
//! - code = clamp(roundf(v * (scale != 0 ? 1/scale : 0) + zp), 0, 2^bits-1)
//!   in f32 with a separate multiply and add (no FMA), roundf = half away
//!   from zero, NaN -> 0.
//! - 4 bits: even k in the low nibble. Zero points pack two blocks per byte
//!   (even block low); with an odd block count the spare nibble is 8.
//! - 4 bits, odd K: MLAS handles k in pairs inside a 2*bs-row work item and
//!   the unpaired last element reuses the high code of the previous pair of
//!   the same work item (0 if there is none). That nibble is padding (never
//!   decoded) but is reproduced for byte identity.

use rayon::prelude::*;

use super::block::{code, load_row, put_block_params, ColParams, Nbits, Weight, MAX_BS, TILE};
use super::tile::{fill_codes, minmax, transpose_out};
use crate::isa::Isa;

/// Packs the whole weight into `out` = codes | scales | zero points.
pub(crate) fn pack(isa: Isa, w: Weight<'_>, q: Nbits, out: &mut [u8]) {
    let kb = q.k_blocks(w.k);
    let es = w.elem_bytes();
    let (codes, rest) = out.split_at_mut(w.n * kb * q.blob());
    let (scales, zps) = rest.split_at_mut(w.n * kb * es);
    let zpb = q.zp_bytes(w.k);
    // Narrower tiles when N is small, so that there is work for every thread.
    let tile = match w.n {
        n if n >= 8 * TILE => TILE,
        n if n >= 256 => 32,
        _ => 8,
    };
    let mut jobs = Vec::with_capacity(w.n.div_ceil(tile));
    let (mut c, mut s, mut z) = (codes, scales, zps);
    let mut n0 = 0;
    while n0 < w.n {
        let width = tile.min(w.n - n0);
        let (c1, c2) = c.split_at_mut(width * kb * q.blob());
        let (s1, s2) = s.split_at_mut(width * kb * es);
        let (z1, z2) = z.split_at_mut(width * zpb);
        jobs.push((n0, width, c1, s1, z1));
        (c, s, z) = (c2, s2, z2);
        n0 += width;
    }
    jobs.into_par_iter().for_each(|(n0, width, c, s, z)| {
        pack_tile(isa, &w, &q, n0, width, c, s, z);
    });
}

/// Packs columns `n0 .. n0 + width` (all blocks) into their output rows.
#[allow(clippy::too_many_arguments)]
fn pack_tile(
    isa: Isa,
    w: &Weight<'_>,
    q: &Nbits,
    n0: usize,
    width: usize,
    codes: &mut [u8],
    scales: &mut [u8],
    zps: &mut [u8],
) {
    let kb = q.k_blocks(w.k);
    // Output bytes of a group of blocks, [byte i][column c]; transposed at the end.
    let mut tile = vec![0u8; MAX_BS * TILE];
    // High code of the last pair of the previous block (odd K rule).
    let mut last_hi = [0u8; TILE];
    let mut p = ColParams {
        recip: [0.0; TILE],
        zp: [0.0; TILE],
    };
    let blob = q.blob();
    // Blocks transposed together, so that each column receives at least a
    // cache line at a time.
    let group = (64 / blob).max(1);
    for g0 in (0..kb).step_by(group) {
        let g1 = kb.min(g0 + group);
        for b in g0..g1 {
            let seg = &mut tile[(b - g0) * blob * TILE..(b - g0 + 1) * blob * TILE];
            block(
                isa,
                w,
                q,
                n0,
                width,
                b,
                &mut p,
                seg,
                &mut last_hi,
                scales,
                zps,
            );
        }
        let rows = (g1 - g0) * blob;
        transpose_out(
            isa,
            &tile,
            rows,
            width,
            rows,
            &mut codes[g0 * blob..],
            kb * blob,
        );
    }
}

/// Quantizes block `b` of the tile's columns: scales and zero points go to
/// their outputs, the code bytes to `seg[i * TILE + c]` (zero past K).
#[allow(clippy::too_many_arguments)]
fn block(
    isa: Isa,
    w: &Weight<'_>,
    q: &Nbits,
    n0: usize,
    width: usize,
    b: usize,
    p: &mut ColParams,
    seg: &mut [u8],
    last_hi: &mut [u8; TILE],
    scales: &mut [u8],
    zps: &mut [u8],
) {
    let bs = q.block_size;
    let kb = q.k_blocks(w.k);
    let es = w.elem_bytes();
    let zpb = q.zp_bytes(w.k);
    let k0 = b * bs;
    let len = bs.min(w.k - k0);
    let mut mn = [f32::MAX; TILE];
    let mut mx = [-f32::MAX; TILE];
    minmax(isa, w, n0, width, k0, len, &mut mn, &mut mx);
    #[allow(unused_mut)] // only x86-64 has a vector path
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        done = width;
        // SAFETY: Isa::Avx512 is only used when the CPU has AVX-512
        // F/BW/VL and F16C; the outputs are the tile's.
        unsafe { super::avx512::block_params(q, w.f16, b, kb, width, &mn, &mx, scales, zps, p) };
    }
    for c in done..width {
        let at = (c * kb + b) * es;
        (p.recip[c], p.zp[c]) = put_block_params(
            q,
            mn[c],
            mx[c],
            w.f16,
            b,
            &mut scales[at..at + es],
            &mut zps[c * zpb..(c + 1) * zpb],
        );
    }
    fill_codes(isa, w, q, n0, width, k0, len, p, seg);
    let mut rows = if q.bits == 8 { len } else { len / 2 };
    if q.bits == 4 && len % 2 == 1 {
        // Odd K: the unpaired last element (see module doc).
        let kmax = q.kmax();
        let mut last = [0f32; TILE];
        load_row(w, k0 + len - 1, n0, &mut last[..width]);
        for c in 0..width {
            let hi = if len >= 2 {
                seg[(rows - 1) * TILE + c] >> 4
            } else if b % 2 == 1 {
                last_hi[c]
            } else {
                0
            };
            seg[rows * TILE + c] = code(last[c], p.recip[c], p.zp[c], kmax) | (hi << 4);
        }
        rows += 1;
    } else if q.bits == 4 {
        for c in 0..width {
            last_hi[c] = seg[(rows - 1) * TILE + c] >> 4;
        }
    }
    for r in rows..q.blob() {
        seg[r * TILE..r * TILE + width].fill(0);
    }
}
