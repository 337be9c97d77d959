//! `ort.float16` over a whole buffer: the AVX2 path for the leading whole
//! groups, the scalar rule for the rest.

use rayon::prelude::*;

use super::bounds::{scalar, Bounds};
use crate::isa::Isa;

/// Elements per parallel work item.
const CHUNK: usize = 1 << 16;

/// Converts the FLOAT raw bytes `src` into FLOAT16 raw bytes `out`.
pub(crate) fn convert(isa: Isa, b: Bounds, src: &[u8], out: &mut [u8]) {
    out.par_chunks_mut(2 * CHUNK)
        .zip(src.par_chunks(4 * CHUNK))
        .for_each(|(o, s)| {
            #[allow(unused_mut)]
            let mut done = 0;
            #[cfg(target_arch = "x86_64")]
            if matches!(isa, Isa::Avx2 | Isa::Avx512) {
                // SAFETY: Avx2 and Avx512 are only used when the CPU has
                // AVX2 and F16C.
                done = unsafe { super::avx2::convert_run(b, s, o) };
            }
            let _ = isa;
            for (o, s) in o[done * 2..]
                .chunks_exact_mut(2)
                .zip(s[done * 4..].chunks_exact(4))
            {
                let h = scalar(f32::from_le_bytes([s[0], s[1], s[2], s[3]]), b);
                o.copy_from_slice(&h.to_le_bytes());
            }
        });
}
