//! `ggml.q8_0` / `ggml.q4_0` on the GPU. Per chunk of blocks:
//!
//! 1. `ggml_stats`: the first element of largest magnitude of each block
//!    (integer comparisons) and whether the block holds a NaN, an infinity
//!    or a denormal ("special").
//! 2. The CPU computes `d` (Q8_0: `amax / 127`, Q4_0: `max / -8`), its
//!    FLOAT16 bits and `1/d` exactly as the CPU kernel does.
//! 3. `ggml_codes`: the output byte stream; codes whose `v / d` lies near a
//!    rounding boundary are listed and redone by the CPU packer on blocks
//!    (reference element, v, zeros...), which share the block's `d`.
//! 4. Special blocks (and blocks whose `1/d` is not normal) are packed by
//!    the CPU packer from their own values.

use super::backend::{GpuBackend, Kernel};
use super::chunk::{block_stats, cpu_pack, set_nibble, to_bytes, SKIP};
use super::session::{Cfg, Session};
use super::GpuError;
use crate::fp16::f32_to_f16_bits;
use crate::{Packer, Params, SourceTensor};

const QK: usize = 32;

pub(super) fn pack(
    gpu: &GpuBackend,
    packer: &dyn Packer,
    src: &SourceTensor<'_>,
    params: &Params,
    out: &mut [u8],
    chunk_bytes: u64,
) -> Result<(), GpuError> {
    let q8 = packer.id() == "ggml.q8_0";
    let bb = if q8 { 2 + QK } else { 2 + QK / 2 };
    let blocks = src.data.len() / (4 * QK);
    // An even block count keeps every chunk's output word-aligned.
    let per = ((chunk_bytes as usize / (4 * QK)) & !1).max(2);
    let fix_cap = (per * QK / 64).clamp(1024, 1 << 20) as u32;
    let s = Session::new(
        gpu,
        (per * 4 * QK) as u64,
        (per * 8) as u64,
        (per * bb.max(8)) as u64,
        fix_cap,
    )?;
    for b0 in (0..blocks).step_by(per) {
        let nb = per.min(blocks - b0);
        let chunk = Chunk {
            packer,
            params,
            q8,
            data: &src.data[b0 * 4 * QK..(b0 + nb) * 4 * QK],
            nb,
            bb,
        };
        chunk.pack(&s, &mut out[b0 * bb..(b0 + nb) * bb])?;
    }
    s.finish()
}

/// One chunk of `nb` blocks and what each step of packing it needs.
struct Chunk<'a> {
    packer: &'a dyn Packer,
    params: &'a Params,
    /// `ggml.q8_0` (else `ggml.q4_0`).
    q8: bool,
    /// The chunk's source values (FLOAT bytes).
    data: &'a [u8],
    nb: usize,
    /// Output bytes per block.
    bb: usize,
}

/// Each block's reference element (Q8_0 its magnitude, Q4_0 itself) and
/// whether the CPU packs the block.
struct Blocks {
    reference: Vec<u32>,
    special: Vec<bool>,
}

impl Chunk<'_> {
    /// Packs the chunk into `dst` (its `nb` output blocks).
    fn pack(&self, s: &Session<'_>, dst: &mut [u8]) -> Result<(), GpuError> {
        s.write_src(self.data);
        let cfg = Cfg {
            cols: self.nb as u32,
            blocks: self.nb as u32,
            bs: self.bb as u32,
            bits: if self.q8 { 8 } else { 4 },
            ..Cfg::default()
        };
        let stats = block_stats(s, Kernel::GgmlStats, cfg, self.nb, 2)?;
        let mut blocks = Blocks {
            special: stats.chunks_exact(2).map(|t| t[1] != 0).collect(),
            reference: stats
                .chunks_exact(2)
                .map(|t| if self.q8 { t[0] & 0x7fff_ffff } else { t[0] })
                .collect(),
        };
        s.write_aux(&to_bytes(&self.block_params(&mut blocks)));
        let words = (self.nb * self.bb).div_ceil(4) as u32;
        let fixes = s.run(
            Kernel::GgmlCodes,
            cfg,
            words,
            dst.len() as u64,
            |b, fixes| {
                dst.copy_from_slice(b);
                fixes
            },
        )?;
        if fixes.overflow {
            super::note_assist(0, 0, 1);
            dst.copy_from_slice(&self.cpu_pack(self.data)?);
            return Ok(());
        }
        self.fix_codes(&fixes.list, &blocks, dst)?;
        self.special_blocks(&blocks.special, dst)
    }

    /// The CPU packer on FLOAT values `data` (whole blocks).
    fn cpu_pack(&self, data: &[u8]) -> Result<Vec<u8>, GpuError> {
        cpu_pack(self.packer, self.params, &[(data.len() / 4) as u64], data)
    }

    /// The codes kernel's words per block: `1/d` and the FLOAT16 bits of
    /// `d` computed as the CPU kernel does, or [`SKIP`] for a special
    /// block (one whose `1/d` is not normal becomes special here).
    fn block_params(&self, blocks: &mut Blocks) -> Vec<u32> {
        let mut aux = vec![0u32; 2 * self.nb];
        for i in 0..self.nb {
            let r = f32::from_bits(blocks.reference[i]);
            let d = if self.q8 { r / 127.0 } else { r / -8.0 };
            let id = if d == 0.0 { 0.0 } else { 1.0 / d };
            blocks.special[i] |= !(id == 0.0 || id.is_normal());
            aux[2 * i] = id.to_bits();
            aux[2 * i + 1] = if blocks.special[i] {
                SKIP
            } else {
                u32::from(f32_to_f16_bits(d))
            };
        }
        aux
    }

    /// Redoes the flagged elements (`list`) of ordinary blocks with the CPU
    /// packer: block (reference, v, 0, ...) has the same `d`, so its
    /// element 1 is v's code.
    fn fix_codes(&self, list: &[u32], blocks: &Blocks, dst: &mut [u8]) -> Result<(), GpuError> {
        let todo: Vec<usize> = list
            .iter()
            .map(|&e| e as usize)
            .filter(|&e| !blocks.special[e / QK])
            .collect();
        if todo.is_empty() {
            return Ok(());
        }
        super::note_assist(todo.len(), 0, 0);
        let mut w = vec![0u8; todo.len() * 4 * QK];
        for (x, &e) in todo.iter().enumerate() {
            let blk = &mut w[x * 4 * QK..];
            blk[..4].copy_from_slice(&blocks.reference[e / QK].to_le_bytes());
            blk[4..8].copy_from_slice(&self.data[4 * e..4 * e + 4]);
        }
        let p = self.cpu_pack(&w)?;
        let bb = self.bb;
        for (x, &e) in todo.iter().enumerate() {
            let (b, j) = (e / QK, e % QK);
            let code = &p[x * bb + 2..];
            if self.q8 {
                dst[b * bb + 2 + j] = code[1];
            } else {
                // Element 1 of the redo block: low nibble of byte 1.
                let byte = &mut dst[b * bb + 2 + j % (QK / 2)];
                set_nibble(byte, j >= QK / 2, code[1] & 0x0f);
            }
        }
        Ok(())
    }

    /// Packs the special blocks with the CPU packer from their own values.
    fn special_blocks(&self, special: &[bool], dst: &mut [u8]) -> Result<(), GpuError> {
        let specials: Vec<usize> = (0..self.nb).filter(|&i| special[i]).collect();
        if specials.is_empty() {
            return Ok(());
        }
        super::note_assist(0, specials.len(), 0);
        let mut w = Vec::with_capacity(specials.len() * 4 * QK);
        for &i in &specials {
            w.extend_from_slice(&self.data[i * 4 * QK..(i + 1) * 4 * QK]);
        }
        let p = self.cpu_pack(&w)?;
        let bb = self.bb;
        for (x, &i) in specials.iter().enumerate() {
            dst[i * bb..(i + 1) * bb].copy_from_slice(&p[x * bb..(x + 1) * bb]);
        }
        Ok(())
    }
}
