//! FLOAT -> FLOAT16 / BFLOAT16 over a whole buffer (rules in `fp16`). The
//! AVX2 and AVX-512 paths convert with F16C / AVX-512F `vcvtps2ph` (round
//! to nearest even, same as the scalar rule for every non-NaN) and redo NaN
//! lanes in scalar code, since the hardware sets the quiet bit and numpy
//! does not; BFLOAT16 uses the scalar rule's integer rounding in vectors.
//! The aarch64 NEON path does both conversions with the scalar rules'
//! integer rounding in vectors (`fp16_neon`), NaNs included.

use rayon::prelude::*;

use super::target::Target;
use crate::fp16::{f32_to_bf16_bits, f32_to_f16_bits};
use crate::isa::Isa;

/// Elements per parallel work item.
const CHUNK: usize = 1 << 16;

/// Converts the FLOAT raw bytes `src` into 16-bit raw bytes `out`.
pub(crate) fn convert(isa: Isa, t: Target, src: &[u8], out: &mut [u8]) {
    out.par_chunks_mut(2 * CHUNK)
        .zip(src.par_chunks(4 * CHUNK))
        .for_each(|(o, s)| convert_run(isa, t, s, o));
}

fn convert_run(isa: Isa, t: Target, src: &[u8], out: &mut [u8]) {
    #[allow(unused_mut)] // only x86-64 and aarch64 have vector paths
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: Isa::Avx2 is only used when the CPU has AVX2 and F16C.
        Isa::Avx2 => done = unsafe { super::avx2::convert_run(t, src, out) },
        // SAFETY: Isa::Avx512 is only used when the CPU has AVX-512
        // F/BW/VL and F16C.
        Isa::Avx512 => done = unsafe { super::avx512::convert_run(t, src, out) },
        Isa::Scalar | Isa::Neon => {}
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        // SAFETY: Isa::Neon is only used when the CPU has NEON.
        done = unsafe { super::neon::convert_run(t, src, out) };
    }
    let _ = isa;
    let (src, out) = (&src[done * 4..], &mut out[done * 2..]);
    match t {
        Target::F16 => scalar(src, out, f32_to_f16_bits),
        Target::Bf16 => scalar(src, out, f32_to_bf16_bits),
    }
}

#[inline(always)]
fn scalar(src: &[u8], out: &mut [u8], f: impl Fn(f32) -> u16) {
    for (o, s) in out.chunks_exact_mut(2).zip(src.chunks_exact(4)) {
        let h = f(f32::from_le_bytes([s[0], s[1], s[2], s[3]]));
        o.copy_from_slice(&h.to_le_bytes());
    }
}
