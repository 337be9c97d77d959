//! The clamp's bounds and its arithmetic on one value: shared by the
//! kernel and its AVX2 path.

use crate::fp16::f32_to_f16_bits;

/// The clamp bounds as FLOAT: the Python floats rounded to float32.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Bounds {
    pub(crate) min: f32,
    pub(crate) max: f32,
}

/// The reference's arithmetic on one value: clamp, then numpy's cast.
#[inline(always)]
pub(crate) fn scalar(x: f32, b: Bounds) -> u16 {
    let a = x.abs();
    let c = if a > 0.0 && a < b.min {
        b.min
    } else if a > b.max && a < f32::INFINITY {
        b.max
    } else {
        a
    };
    f32_to_f16_bits(f32::from_bits(c.to_bits() | (x.to_bits() & 0x8000_0000)))
}
