//! A ggml block and its scalar reference: the types, a block's load and
//! its quantization, shared by the kernel and its ISA paths.

use crate::fp16::{f16_bits_to_f32, f32_to_f16_bits, quiet_nan};

/// Elements per block.
pub(crate) const QK: usize = 32;

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
