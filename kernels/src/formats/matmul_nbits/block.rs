//! MatMulNBits' quantization blocks: the settings, a weight's view, a
//! block's scale and zero point and its codes, a row's decode. Shared by
//! the kernel, its tile and row paths, and its ISA paths.

use crate::fp16::{f16_bits_to_f32, f32_to_f16_bits};

/// Most columns handled together; also the row stride of the code tile.
/// Wide tiles read long runs of each source row (the source is row-major,
/// blocks run down the columns).
pub(crate) const TILE: usize = 128;
/// Largest supported block size.
pub(crate) const MAX_BS: usize = 256;

/// Quantization settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Nbits {
    pub bits: u32,
    pub block_size: usize,
    pub symmetric: bool,
}

/// A weight W[K, N] in raw little-endian form.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Weight<'a> {
    pub data: &'a [u8],
    pub f16: bool,
    pub k: usize,
    pub n: usize,
}

impl Weight<'_> {
    #[inline(always)]
    pub(crate) fn elem_bytes(&self) -> usize {
        if self.f16 {
            2
        } else {
            4
        }
    }
}

impl Nbits {
    pub(crate) fn k_blocks(&self, k: usize) -> usize {
        k.div_ceil(self.block_size)
    }
    pub(crate) fn blob(&self) -> usize {
        self.block_size * self.bits as usize / 8
    }
    /// Zero-point bytes per column (0 when symmetric).
    pub(crate) fn zp_bytes(&self, k: usize) -> usize {
        if self.symmetric {
            0
        } else {
            (self.k_blocks(k) * self.bits as usize).div_ceil(8)
        }
    }
    pub(crate) fn kmax(&self) -> f32 {
        ((1u32 << self.bits) - 1) as f32
    }
    fn mid(&self) -> f32 {
        (1u32 << (self.bits - 1)) as f32
    }
}

/// Per-column quantization parameters of one block.
pub(crate) struct ColParams {
    pub recip: [f32; TILE],
    pub zp: [f32; TILE],
}

/// Scale (as stored), its f32 reading and the zero point of a block.
pub(crate) fn block_params(q: &Nbits, mn: f32, mx: f32, f16: bool) -> (u32, f32, u8) {
    let (s, zp) = if q.symmetric {
        let m = if mx.abs() > mn.abs() { mx } else { mn };
        (-m / q.mid(), q.mid() as u8)
    } else {
        let mn = if 0.0 < mn { 0.0 } else { mn };
        let mx = if mx < 0.0 { 0.0 } else { mx };
        let s = (mx - mn) / q.kmax();
        let zf = if s != 0.0 { 0.0 - mn / s } else { mn };
        let zp = if zf < 0.0 {
            0
        } else if zf > q.kmax() {
            q.kmax() as u8
        } else {
            zf.round() as u8 // NaN -> 0, as MLAS on x86-64
        };
        (s, zp)
    };
    if f16 {
        let h = f32_to_f16_bits(s);
        (u32::from(h), f16_bits_to_f32(h), zp)
    } else {
        (s.to_bits(), s, zp)
    }
}

/// Writes the parameters of block `b` of one column: its scale (as stored,
/// `scale.len()` = element bytes) and, when asymmetric, its zero point into
/// the column's zero-point bytes `zps` (4 bits: even block in the low nibble,
/// spare high nibble 8). Returns the reciprocal of the stored scale (0 for a
/// zero scale) and the zero point, as the codes use them.
#[inline(always)]
pub(crate) fn put_block_params(
    q: &Nbits,
    mn: f32,
    mx: f32,
    f16: bool,
    b: usize,
    scale: &mut [u8],
    zps: &mut [u8],
) -> (f32, f32) {
    let (bits, sf, zp) = block_params(q, mn, mx, f16);
    // Fixed-size copies (a variable-length one is a memcpy call per scale).
    match scale {
        [a, b] => [*a, *b] = (bits as u16).to_le_bytes(),
        s => s.copy_from_slice(&bits.to_le_bytes()),
    }
    if !q.symmetric {
        if q.bits == 8 {
            zps[b] = zp;
        } else if b.is_multiple_of(2) {
            zps[b / 2] = zp | 0x80; // spare high nibble = 8
        } else {
            let z = &mut zps[b / 2];
            *z = (*z & 0x0f) | (zp << 4);
        }
    }
    (if sf != 0.0 { 1.0 / sf } else { 0.0 }, f32::from(zp))
}

/// The code of one element: clamp(roundf(v * recip + zp), 0, kmax), NaN
/// -> 0. Written without `round` (a libm call on baseline x86-64) so that
/// it vectorizes: clamp first (`max` maps NaN to 0), then truncate and step
/// up on a fraction >= 0.5, which is roundf on the clamped range.
#[inline(always)]
pub(crate) fn code(v: f32, recip: f32, zp: f32, kmax: f32) -> u8 {
    let x = (v * recip + zp).max(0.0).min(kmax);
    let t = x as u32;
    (t + u32::from(x - t as f32 >= 0.5)) as u8
}

/// Decodes `out.len()` elements of row `k` starting at column `n`.
#[inline(always)]
pub(crate) fn load_row(w: &Weight<'_>, k: usize, n: usize, out: &mut [f32]) {
    let es = w.elem_bytes();
    let start = (k * w.n + n) * es;
    let bytes = &w.data[start..start + out.len() * es];
    if w.f16 {
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            *o = f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
        }
    } else {
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
}
