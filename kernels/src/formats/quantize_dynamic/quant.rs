//! quantize_dynamic's arithmetic on one value and its types: the
//! quantization, a value range; shared by the kernel and its AVX2 path.

/// Quantization settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Quant {
    /// INT8 (else UINT8).
    pub(crate) signed: bool,
    pub(crate) symmetric: bool,
    pub(crate) reduce_range: bool,
}

impl Quant {
    /// `(qmin, qmax)` of the scale computation.
    pub(crate) fn qrange(self) -> (i32, i32) {
        match (self.signed, self.reduce_range, self.symmetric) {
            (false, true, _) => (0, 127),
            (true, true, _) => (-64, 64),
            (true, false, true) => (-127, 127),
            (true, false, false) => (-128, 127),
            (false, false, _) => (0, 255),
        }
    }

    /// The type's full range: what quantized values are clipped to.
    pub(crate) fn full(self) -> (f32, f32) {
        if self.signed {
            (-128.0, 127.0)
        } else {
            (0.0, 255.0)
        }
    }

    /// Stored scale and zero point of a channel whose finite values range
    /// over `[lo, hi]`.
    pub(crate) fn params(self, lo: f32, hi: f32) -> (f32, i32) {
        let (qmin, qmax) = self.qrange();
        let (mut rmin, mut rmax) = (lo.min(0.0), hi.max(0.0));
        if self.symmetric {
            let a = rmin.abs().max(rmax.abs());
            (rmin, rmax) = (-a, a);
        }
        let scale = (f64::from(rmax) - f64::from(rmin)) / f64::from(qmax - qmin);
        if scale < f64::from(f32::MIN_POSITIVE) {
            return (1.0, 0);
        }
        let zp = if self.symmetric {
            (f64::from(qmin + qmax) / 2.0).round_ties_even()
        } else {
            (f64::from(qmin) - f64::from(rmin) / scale).round_ties_even()
        };
        (scale as f32, zp as i32)
    }
}

/// One quantized value (the scalar rule every kernel follows).
#[inline(always)]
pub(crate) fn quantize_one(x: f32, scale: f32, zp: f32, lo: f32, hi: f32) -> u8 {
    let q = ((x / scale).round_ties_even() + zp).clamp(lo, hi);
    (q as i32) as u8
}

/// Minimum and maximum of finite values, or the index of the first value
/// that is not finite.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Range {
    pub(crate) lo: f32,
    pub(crate) hi: f32,
}
