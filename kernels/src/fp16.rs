//! Scalar IEEE half and bfloat16 conversions, bit-exact with the references
//! the packers must match:
//! - FLOAT -> FLOAT16: round to nearest even; a NaN keeps its sign and the
//!   top 10 payload bits *without* forcing the quiet bit (numpy's rule; a
//!   payload that truncates to zero becomes 1 so the value stays NaN).
//! - FLOAT -> BFLOAT16: round to nearest even; every NaN becomes the quiet
//!   NaN `0x7fc0` with the sign kept (ml_dtypes' rule).
//! - FLOAT16 -> FLOAT: exact.

/// FLOAT -> FLOAT16 bits (numpy `astype(np.float16)`).
#[inline]
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let f = x.to_bits();
    let sign = ((f >> 16) & 0x8000) as u16;
    let a = f & 0x7fff_ffff;
    if a >= 0x7f80_0000 {
        if a == 0x7f80_0000 {
            return sign | 0x7c00;
        }
        let m = ((a >> 13) & 0x3ff) as u16;
        return sign | 0x7c00 | if m == 0 { 1 } else { m };
    }
    if a >= 0x4780_0000 {
        // >= 65536: past the largest half even before rounding.
        return sign | 0x7c00;
    }
    if a >= 0x3880_0000 {
        // Normal half: rebias the exponent, then round the 13 dropped bits
        // to nearest even; a carry into the exponent (up to inf) is correct.
        let odd = (a >> 13) & 1;
        let r = a - (112 << 23) + 0xfff + odd;
        return sign | (r >> 13) as u16;
    }
    if a < 0x3300_0000 {
        // <= 2^-25 rounds to zero (2^-25 itself ties to the even zero).
        return sign;
    }
    // Subnormal half: the value in units of 2^-24, rounded to nearest even.
    let e = a >> 23;
    let m = (a & 0x7f_ffff) | 0x80_0000;
    let shift = 126 - e; // 14..=24
    let q = m >> shift;
    let rem = m & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let up = (rem > half || (rem == half && q & 1 == 1)) as u32;
    sign | (q + up) as u16
}

/// FLOAT16 bits -> FLOAT, exact (NaN payloads are kept).
#[inline]
pub fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let e = ((h >> 10) & 0x1f) as u32;
    let m = (h & 0x3ff) as u32;
    let bits = if e == 0x1f {
        sign | 0x7f80_0000 | (m << 13)
    } else if e != 0 {
        sign | ((e + 112) << 23) | (m << 13)
    } else if m == 0 {
        sign
    } else {
        // Subnormal: normalize the mantissa.
        let lz = m.leading_zeros() - 21; // shifts that bring bit 10 to the top
        let m = (m << lz) & 0x3ff;
        sign | ((113 - lz) << 23) | (m << 13)
    };
    f32::from_bits(bits)
}

/// FLOAT -> BFLOAT16 bits (ml_dtypes `astype(bfloat16)`).
#[inline]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) as u16 & 0x8000) | 0x7fc0;
    }
    // Adding 0x7fff plus the lowest kept bit rounds to nearest even; the
    // carry may run into the exponent (up to inf), which is correct.
    ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// The bits `x86` division/multiplication give for a NaN operand: the same
/// NaN with the quiet bit set (written out so every target agrees).
#[inline]
pub(crate) fn quiet_nan(x: f32) -> f32 {
    f32::from_bits(x.to_bits() | 0x0040_0000)
}

/// Rare path of the vector kernels: redoes the NaN lanes of `count`
/// elements with numpy's rule (the hardware conversion sets the quiet bit).
///
/// # Safety
/// `src` must hold `count` f32 and `out` room for `count` f16, unaligned.
#[cfg(target_arch = "x86_64")]
#[cold]
#[inline(never)]
pub(crate) unsafe fn fix_nans(src: *const u8, out: *mut u8, count: usize) {
    for j in 0..count {
        let x = f32::from_le_bytes(src.add(4 * j).cast::<[u8; 4]>().read_unaligned());
        if x.is_nan() {
            out.add(2 * j)
                .cast::<[u8; 2]>()
                .write_unaligned(f32_to_f16_bits(x).to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_specials() {
        let cases: &[(u32, u16)] = &[
            (0x7f80_0001, 0x7c01),
            (0x7fc0_0000, 0x7e00),
            (0xffc0_0000, 0xfe00),
            (0x7fa0_0000, 0x7d00),
            (0xff80_0001, 0xfc01),
            (0x7fff_ffff, 0x7fff),
            (0x7f80_0000, 0x7c00),
            (0xff80_0000, 0xfc00),
            (0x477f_efff, 0x7bff),
            (0x477f_f000, 0x7c00), // 65520 ties up to inf
            (0x3300_0000, 0x0000), // 2^-25 ties to even zero
            (0x3300_0001, 0x0001),
            (0x387f_c000, 0x03ff),
            (0x7f7f_ffff, 0x7c00),
            (0x8000_0000, 0x8000),
            (0x3f80_0000, 0x3c00),
            (0x3f80_1000, 0x3c00), // tie to even (down)
            (0x3f80_3000, 0x3c02), // tie to even (up)
        ];
        for &(f, h) in cases {
            assert_eq!(f32_to_f16_bits(f32::from_bits(f)), h, "{f:#x}");
        }
    }

    #[test]
    fn f16_matches_half_for_non_nan() {
        // A stride through every f32 bit pattern, plus the region near the
        // half subnormal/normal boundary in full.
        let check = |f: u32| {
            let x = f32::from_bits(f);
            if !x.is_nan() {
                assert_eq!(
                    f32_to_f16_bits(x),
                    half::f16::from_f32(x).to_bits(),
                    "{f:#x}"
                );
            }
        };
        for f in (0..=u32::MAX).step_by(4099) {
            check(f);
        }
        for f in 0x3280_0000..0x3900_0000u32 {
            if f % 7 == 0 {
                check(f);
                check(f | 0x8000_0000);
            }
        }
    }

    #[test]
    fn f16_to_f32_roundtrip() {
        for h in 0..=u16::MAX {
            let x = f16_bits_to_f32(h);
            if x.is_nan() {
                // Exact: the payload is kept (and comes back unchanged).
                assert_eq!((x.to_bits() >> 13) & 0x3ff, (h & 0x3ff) as u32);
                assert_eq!(x.to_bits() & 0x1fff, 0);
            } else {
                assert_eq!(x.to_bits(), half::f16::from_bits(h).to_f32().to_bits());
            }
            assert_eq!(f32_to_f16_bits(x), h, "{h:#x}");
        }
    }

    #[test]
    fn bf16_rules() {
        let cases: &[(u32, u16)] = &[
            (0x7f80_0001, 0x7fc0),
            (0xffc0_0000, 0xffc0),
            (0xff80_0001, 0xffc0),
            (0x7f80_0000, 0x7f80),
            (0x7f7f_ffff, 0x7f80),
            (0x3f80_8000, 0x3f80), // tie to even (down)
            (0x3f81_8000, 0x3f82), // tie to even (up)
            (0x0001_8000, 0x0002),
            (0x0000_0001, 0x0000),
            (0x8000_0000, 0x8000),
        ];
        for &(f, b) in cases {
            assert_eq!(f32_to_bf16_bits(f32::from_bits(f)), b, "{f:#x}");
        }
    }
}
