//! ggml Q8_0 / Q4_0 blocks, byte-identical with the gguf Python package
//! (`gguf.quants.quantize`, numpy on x86-64). Each block is 32 consecutive
//! elements of the last axis; the output block is the FLOAT16 scale `d`
//! followed by the codes. Facts the bytes depend on (verified against gguf
//! 0.19 / numpy 2.4):
//!
//! - Q8_0: `d = max|x| / 127`, `id = d == 0 ? 0 : 1/d`, code = round half
//!   away from zero of `x * id` as int8. A NaN anywhere makes `d` the
//!   canonical NaN (0x7e00) and every code 0 (numpy's NaN-propagating max;
//!   for exotic NaN payloads numpy's SIMD reduction may instead keep the
//!   payload of a NaN in the last lanes: not reproduced). Non-finite
//!   `x * id` (an inf in the block, or `1/d` overflowing) gives code 0.
//! - Q4_0: `max` = the element of largest magnitude, the *first* one on
//!   ties and the first NaN if any (numpy argmax); `d = max / -8` (a NaN
//!   keeps sign and payload, quiet bit set); `id` as above; code =
//!   `min(trunc(x * id + 8.5), 15)` with non-finite -> 0; byte j holds
//!   element j (low nibble) and element j + 16 (high nibble).
//! - `d` is converted to FLOAT16 by numpy's rule (`fp16::f32_to_f16_bits`).

use rayon::prelude::*;

use crate::fp16::{f16_bits_to_f32, f32_to_f16_bits, quiet_nan};
use crate::isa::Isa;

/// Elements per block.
pub(crate) const QK: usize = 32;
/// Blocks per parallel work item.
const BLOCKS_PER_JOB: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GgmlType {
    Q8_0,
    Q4_0,
}

impl GgmlType {
    /// Bytes per output block.
    pub(crate) fn block_bytes(self) -> usize {
        match self {
            GgmlType::Q8_0 => 2 + QK,
            GgmlType::Q4_0 => 2 + QK / 2,
        }
    }
}

/// Quantizes `src` (FLOAT or, with `f16`, FLOAT16 raw bytes; a whole number
/// of blocks) into `out`.
pub(crate) fn pack(isa: Isa, t: GgmlType, src: &[u8], f16: bool, out: &mut [u8]) {
    let es = if f16 { 2 } else { 4 };
    let ob = t.block_bytes();
    out.par_chunks_mut(ob * BLOCKS_PER_JOB)
        .zip(src.par_chunks(es * QK * BLOCKS_PER_JOB))
        .for_each(|(o, s)| pack_run(isa, t, s, f16, o));
}

fn pack_run(isa: Isa, t: GgmlType, src: &[u8], f16: bool, out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx2 => {
            // SAFETY: Isa::Avx2 is only used when the CPU has AVX2 and F16C.
            unsafe { super::ggml_avx2::pack_run(t, src, f16, out) };
            return;
        }
        Isa::Avx512 => {
            // SAFETY: Isa::Avx512 is only used when the CPU has AVX-512
            // F/BW/VL and F16C.
            unsafe { super::ggml_avx512::pack_run(t, src, f16, out) };
            return;
        }
        Isa::Scalar | Isa::Neon => {}
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        // SAFETY: Isa::Neon is only used when the CPU has NEON.
        unsafe { super::ggml_neon::pack_run(t, src, f16, out) };
        return;
    }
    let _ = isa;
    let es = if f16 { 2 } else { 4 };
    for (o, s) in out
        .chunks_exact_mut(t.block_bytes())
        .zip(src.chunks_exact(es * QK))
    {
        let x = load_block(s, f16);
        block(t, &x, o);
    }
}

/// One block's elements as f32.
pub(crate) fn load_block(s: &[u8], f16: bool) -> [f32; QK] {
    let mut x = [0f32; QK];
    if f16 {
        for (v, b) in x.iter_mut().zip(s.chunks_exact(2)) {
            *v = f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
        }
    } else {
        for (v, b) in x.iter_mut().zip(s.chunks_exact(4)) {
            *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
    x
}

/// Quantizes one block (the scalar reference).
pub(crate) fn block(t: GgmlType, x: &[f32; QK], out: &mut [u8]) {
    match t {
        GgmlType::Q8_0 => q8_0(x, out),
        GgmlType::Q4_0 => q4_0(x, out),
    }
}

fn q8_0(x: &[f32; QK], out: &mut [u8]) {
    let mut amax = 0f32;
    let mut nan = false;
    for v in x {
        let a = v.abs();
        nan |= a.is_nan();
        amax = if a > amax { a } else { amax };
    }
    let (d16, qs) = out.split_at_mut(2);
    if nan {
        d16.copy_from_slice(&0x7e00u16.to_le_bytes());
        qs.fill(0);
        return;
    }
    let d = amax / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    d16.copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
    for (q, v) in qs.iter_mut().zip(x) {
        let y = v * id;
        *q = if y.is_finite() {
            // Round half away from zero (|y| <= 127.x here) without libm.
            let t = y as i32;
            let step = i32::from((y - t as f32).abs() >= 0.5);
            (t + if y < 0.0 { -step } else { step }) as i8 as u8
        } else {
            0
        };
    }
}

fn q4_0(x: &[f32; QK], out: &mut [u8]) {
    let mut best = 0;
    let mut amax = -1f32;
    for (i, v) in x.iter().enumerate() {
        let a = v.abs();
        if a.is_nan() {
            best = i;
            break;
        }
        if a > amax {
            amax = a;
            best = i;
        }
    }
    let max = x[best];
    let d = if max.is_nan() {
        quiet_nan(max)
    } else {
        max / -8.0
    };
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    out[..2].copy_from_slice(&f32_to_f16_bits(d).to_le_bytes());
    let code = |v: f32| -> u8 {
        let y = v * id + 8.5;
        // `as` truncates; y >= 0 whenever it is finite.
        if y.is_finite() {
            (y as u8).min(15)
        } else {
            0
        }
    };
    for j in 0..QK / 2 {
        out[2 + j] = code(x[j]) | (code(x[j + QK / 2]) << 4);
    }
}
