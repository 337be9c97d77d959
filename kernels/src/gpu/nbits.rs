//! `ort.matmul_nbits` on the GPU. Per chunk of whole k-blocks (and, for
//! very wide weights, of columns):
//!
//! 1. `nbits_stats`: min/max of every block by integer comparisons, and
//!    whether it holds a NaN, an infinity or a denormal ("special").
//! 2. The CPU turns min/max into the stored scale, the zero point and the
//!    reciprocal by running the CPU packer on a W[2, blocks] matrix of
//!    (min, max) columns: a column with those two values has the same
//!    block parameters as the block itself.
//! 3. `nbits_codes`: the code words; elements whose `v * recip + zp` lies
//!    near a rounding boundary are listed and redone by the CPU packer on
//!    W[3, n] columns (min, max, v), whose third code is that element's.
//! 4. Special blocks (and blocks whose reciprocal is not normal) are
//!    packed by the CPU packer from their own values.
//!
//! Last, for 4 bits and odd K, the padding nibble of each column's last
//! byte is set as the CPU does (see `formats::matmul_nbits::kernel`).

use super::backend::{GpuBackend, Kernel};
use super::chunk::{block_stats, cpu_pack, set_nibble, to_bytes, u32_at, SKIP};
use super::session::{Cfg, Session};
use super::GpuError;
use crate::{Packer, Params, SourceTensor};

/// The output layout of one weight.
struct Geometry {
    k: usize,
    n: usize,
    bits: usize,
    bs: usize,
    sym: bool,
    kb: usize,
    blob: usize,
    zpb: usize,
}

impl Geometry {
    fn codes_len(&self) -> usize {
        self.n * self.kb * self.blob
    }
    fn scales_at(&self, n: usize, b: usize) -> usize {
        self.codes_len() + (n * self.kb + b) * 4
    }
    fn zps_at(&self) -> usize {
        self.codes_len() + self.n * self.kb * 4
    }
    fn code_at(&self, n: usize, b: usize) -> usize {
        (n * self.kb + b) * self.blob
    }
    /// Writes the zero point of block `b` of column `n`.
    fn set_zp(&self, out: &mut [u8], n: usize, b: usize, zp: u8) {
        let zps = self.zps_at();
        if self.bits == 8 {
            out[zps + n * self.zpb + b] = zp;
        } else {
            set_nibble(&mut out[zps + n * self.zpb + b / 2], b % 2 == 1, zp);
        }
    }
}

/// One chunk: blocks `b0 .. b0 + nb`, columns `n0 .. n0 + cols`.
struct Chunk {
    b0: usize,
    nb: usize,
    n0: usize,
    cols: usize,
    rows: usize,
}

pub(super) fn pack(
    gpu: &GpuBackend,
    packer: &dyn Packer,
    src: &SourceTensor<'_>,
    params: &Params,
    out: &mut [u8],
    chunk_bytes: u64,
) -> Result<(), GpuError> {
    let r = params.resolve(packer.id(), packer.param_spec())?;
    if r.bool("transposed") {
        // W[N, K] sources: the shaders read W[K, N]; the CPU packs them.
        return Err(GpuError::Unsupported {
            packer: packer.id().to_string(),
            reason: "transposed=true has no GPU kernel".to_string(),
        });
    }
    let (bits, bs) = (r.u32("bits") as usize, r.u32("block_size") as usize);
    let (k, n) = (src.dims[0] as usize, src.dims[1] as usize);
    let kb = k.div_ceil(bs);
    let sym = r.bool("symmetric");
    let g = Geometry {
        k,
        n,
        bits,
        bs,
        sym,
        kb,
        blob: bs * bits / 8,
        zpb: if sym { 0 } else { (kb * bits).div_ceil(8) },
    };
    // Chunks of whole block rows when one fits, else of columns of one.
    let chunk = chunk_bytes as usize;
    let (blocks_per, cols_per) = if bs * n * 4 <= chunk {
        ((chunk / (bs * n * 4)).min(kb), n)
    } else {
        (1, (chunk / (bs * 4)).min(n))
    };
    let cells = blocks_per * cols_per;
    let elems = cells * bs;
    let fix_cap = (elems / 64).clamp(1024, 1 << 20) as u32;
    let s = Session::new(
        gpu,
        (elems * 4) as u64,
        (cells * 8) as u64,
        (cells * (12usize).max(g.blob)) as u64,
        fix_cap,
    )?;
    if !sym && bits == 4 {
        // Spare nibble of an odd block count is 8; the rest is overwritten.
        out[g.zps_at()..].fill(0x88);
    }
    for b0 in (0..kb).step_by(blocks_per) {
        for n0 in (0..n).step_by(cols_per) {
            let nb = blocks_per.min(kb - b0);
            let c = Chunk {
                b0,
                nb,
                n0,
                cols: cols_per.min(n - n0),
                rows: (k - b0 * bs).min(nb * bs),
            };
            let chunk = ChunkPack {
                g: &g,
                packer,
                params,
                src,
                c,
            };
            chunk.pack(&s, out)?;
        }
    }
    s.finish()?;
    if bits == 4 && k % 2 == 1 {
        odd_k_nibbles(&g, out);
    }
    Ok(())
}

/// Packing one chunk: the weight's layout, the packer and the source.
struct ChunkPack<'a> {
    g: &'a Geometry,
    packer: &'a dyn Packer,
    params: &'a Params,
    src: &'a SourceTensor<'a>,
    c: Chunk,
}

impl ChunkPack<'_> {
    /// Source element (chunk row `r`, chunk column `j`) as bits.
    fn elem(&self, r: usize, j: usize) -> u32 {
        let (g, c) = (self.g, &self.c);
        u32_at(self.src.data, (c.b0 * g.bs + r) * g.n + c.n0 + j)
    }

    /// Packs a FLOAT matrix W[rows, cols] (u32 bits) with the CPU packer.
    fn cpu_pack(&self, rows: usize, cols: usize, bits: &[u32]) -> Result<Vec<u8>, GpuError> {
        let dims = [rows as u64, cols as u64];
        cpu_pack(self.packer, self.params, &dims, &to_bytes(bits))
    }

    /// Packs the chunk into its blocks of `out`.
    fn pack(&self, s: &Session<'_>, out: &mut [u8]) -> Result<(), GpuError> {
        let (g, c) = (self.g, &self.c);
        let k0 = c.b0 * g.bs;
        if c.cols == g.n {
            s.write_src(&self.src.data[k0 * g.n * 4..(k0 + c.rows) * g.n * 4]);
        } else {
            let mut words = Vec::with_capacity(c.rows * c.cols);
            for r in 0..c.rows {
                words.extend((0..c.cols).map(|j| self.elem(r, j)));
            }
            s.write_src(&to_bytes(&words));
        }
        let cfg = Cfg {
            cols: c.cols as u32,
            rows: c.rows as u32,
            bs: g.bs as u32,
            blocks: c.nb as u32,
            bits: g.bits as u32,
        };
        // Cell i = (block i / cols, column i % cols), as in the shaders.
        let m = c.nb * c.cols;
        let stats = block_stats(s, Kernel::NbitsStats, cfg, m, 3)?;
        let mut special: Vec<bool> = stats.chunks_exact(3).map(|t| t[2] != 0).collect();
        let mut minmax = vec![0u32; 2 * m];
        for i in (0..m).filter(|&i| !special[i]) {
            minmax[i] = stats[3 * i];
            minmax[m + i] = stats[3 * i + 1];
        }
        let aux = self.block_params(&minmax, &mut special, out)?;
        s.write_aux(&to_bytes(&aux));
        let blob_run = c.nb * g.blob;
        let words = (c.cols * c.nb * g.blob / 4) as u32;
        let fixes = s.run(
            Kernel::NbitsCodes,
            cfg,
            words,
            (c.cols * blob_run) as u64,
            |b, fixes| {
                for j in 0..c.cols {
                    let at = g.code_at(c.n0 + j, c.b0);
                    out[at..at + blob_run].copy_from_slice(&b[j * blob_run..(j + 1) * blob_run]);
                }
                fixes
            },
        )?;
        if fixes.overflow {
            super::note_assist(0, 0, 1);
            special.fill(true);
        } else {
            self.fix_codes(out, &fixes.list, &special, &minmax)?;
        }
        self.special_blocks(out, &special)
    }

    /// The block parameters from each cell's (min, max) (`minmax`: W[2, m]
    /// of min then max rows): the CPU packer on W[2, m] gives each column
    /// its block's scale and zero point, which go to `out`. Returns the
    /// codes kernel's words per cell (reciprocal and zero point, or
    /// [`SKIP`]); a cell whose reciprocal is not normal becomes special.
    fn block_params(
        &self,
        minmax: &[u32],
        special: &mut [bool],
        out: &mut [u8],
    ) -> Result<Vec<u32>, GpuError> {
        let (g, c) = (self.g, &self.c);
        let m = special.len();
        let p2 = self.cpu_pack(2, m, minmax)?;
        // W[2, m] has one block per column: blob code bytes, scale, zp byte.
        let (scales2, zps2) = (m * g.blob, m * g.blob + m * 4);
        let mut aux = vec![0u32; 2 * m];
        let mid = 1u32 << (g.bits - 1);
        for i in 0..m {
            let scale = u32_at(&p2[scales2..], i);
            let sf = f32::from_bits(scale);
            let recip = if sf != 0.0 { 1.0 / sf } else { 0.0 };
            // A GPU may flush a denormal or mishandle an infinite reciprocal.
            special[i] |= !(recip == 0.0 || recip.is_normal());
            if special[i] {
                aux[2 * i + 1] = SKIP;
                continue;
            }
            let zp = match (g.sym, g.bits) {
                (true, _) => mid,
                (false, 4) => u32::from(p2[zps2 + i] & 0x0f),
                (false, _) => u32::from(p2[zps2 + i]),
            };
            aux[2 * i] = recip.to_bits();
            aux[2 * i + 1] = zp;
            let (b, n) = (c.b0 + i / c.cols, c.n0 + i % c.cols);
            let at = g.scales_at(n, b);
            out[at..at + 4].copy_from_slice(&scale.to_le_bytes());
            if !g.sym {
                g.set_zp(out, n, b, zp as u8);
            }
        }
        Ok(aux)
    }

    /// Redoes the flagged elements with the CPU packer: column (min, max, v)
    /// of a W[3, f] has its block's parameters, so its third code is v's.
    fn fix_codes(
        &self,
        out: &mut [u8],
        list: &[u32],
        special: &[bool],
        minmax: &[u32],
    ) -> Result<(), GpuError> {
        let (g, c) = (self.g, &self.c);
        let m = c.nb * c.cols;
        // (chunk row, chunk column) of each element to redo.
        let todo: Vec<(usize, usize)> = list
            .iter()
            .map(|&e| (e as usize / c.cols, e as usize % c.cols))
            .filter(|&(r, j)| !special[(r / g.bs) * c.cols + j])
            .collect();
        if todo.is_empty() {
            return Ok(());
        }
        let f = todo.len();
        super::note_assist(f, 0, 0);
        let mut w = vec![0u32; 3 * f];
        for (x, &(r, j)) in todo.iter().enumerate() {
            let i = (r / g.bs) * c.cols + j;
            w[x] = minmax[i];
            w[f + x] = minmax[m + i];
            w[2 * f + x] = self.elem(r, j);
        }
        let p = self.cpu_pack(3, f, &w)?;
        for (x, &(r, j)) in todo.iter().enumerate() {
            let (bl, kk) = (r / g.bs, r % g.bs);
            let at = g.code_at(c.n0 + j, c.b0 + bl);
            if g.bits == 8 {
                out[at + kk] = p[x * g.blob + 2];
            } else {
                // Element 2 of the column: low nibble of its byte 1.
                let code = p[x * g.blob + 1] & 0x0f;
                set_nibble(&mut out[at + kk / 2], kk % 2 == 1, code);
            }
        }
        Ok(())
    }

    /// Packs the special blocks with the CPU packer from their own values, one
    /// W[len, blocks] per block length (the last block row may be short).
    fn special_blocks(&self, out: &mut [u8], special: &[bool]) -> Result<(), GpuError> {
        let (g, c) = (self.g, &self.c);
        let cells: Vec<usize> = (0..special.len()).filter(|&i| special[i]).collect();
        super::note_assist(0, cells.len(), 0);
        for full in [true, false] {
            let group: Vec<usize> = cells
                .iter()
                .copied()
                .filter(|&i| ((i / c.cols + 1) * g.bs <= c.rows) == full)
                .collect();
            if group.is_empty() {
                continue;
            }
            let len = if full { g.bs } else { c.rows % g.bs };
            let f = group.len();
            let mut w = vec![0u32; len * f];
            for (x, &i) in group.iter().enumerate() {
                let (bl, j) = (i / c.cols, i % c.cols);
                for r in 0..len {
                    w[r * f + x] = self.elem(bl * g.bs + r, j);
                }
            }
            let p = self.cpu_pack(len, f, &w)?;
            let (scales, zps) = (f * g.blob, f * g.blob + f * 4);
            let zpb = if g.sym { 0 } else { g.bits.div_ceil(8) };
            for (x, &i) in group.iter().enumerate() {
                let (b, n) = (c.b0 + i / c.cols, c.n0 + i % c.cols);
                let at = g.code_at(n, b);
                out[at..at + g.blob].copy_from_slice(&p[x * g.blob..(x + 1) * g.blob]);
                let s = g.scales_at(n, b);
                out[s..s + 4].copy_from_slice(&p[scales + 4 * x..scales + 4 * x + 4]);
                if !g.sym {
                    let z = p[zps + x * zpb];
                    g.set_zp(out, n, b, if g.bits == 4 { z & 0x0f } else { z });
                }
            }
        }
        Ok(())
    }
}

/// 4 bits, odd K: the unpaired last element's byte takes as high nibble the
/// high code of the previous pair of the same 2*bs-row work item, which
/// the chunks could not see (the CPU kernel's rule).
fn odd_k_nibbles(g: &Geometry, out: &mut [u8]) {
    let b = g.kb - 1;
    let len = g.k - b * g.bs;
    for n in 0..g.n {
        let at = g.code_at(n, b);
        let hi = if len >= 2 {
            out[at + len / 2 - 1] >> 4
        } else if b % 2 == 1 {
            out[g.code_at(n, b - 1) + g.blob - 1] >> 4
        } else {
            0
        };
        let byte = &mut out[at + len / 2];
        *byte = (*byte & 0x0f) | (hi << 4);
    }
}
