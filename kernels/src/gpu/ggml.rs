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

use ctcache::dtype::DataType;

use super::backend::{GpuBackend, Kernel};
use super::session::{Cfg, Session};
use super::GpuError;
use crate::fp16::f32_to_f16_bits;
use crate::{Packer, Params, SourceTensor};

const QK: usize = 32;
const SKIP: u32 = u32::MAX;

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
        let data = &src.data[b0 * 4 * QK..(b0 + nb) * 4 * QK];
        let dst = &mut out[b0 * bb..(b0 + nb) * bb];
        chunk_pack(&s, packer, params, q8, data, nb, dst)?;
    }
    s.finish()
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4 bytes"))
}

fn cpu_pack(packer: &dyn Packer, params: &Params, data: &[u8]) -> Result<Vec<u8>, GpuError> {
    let src = SourceTensor {
        data_type: DataType::FLOAT,
        dims: &[(data.len() / 4) as u64],
        data,
    };
    Ok(crate::pack_to_vec(packer, &src, params)?.1)
}

/// Blocks `data` (nb blocks) into `dst` (nb output blocks).
fn chunk_pack(
    s: &Session<'_>,
    packer: &dyn Packer,
    params: &Params,
    q8: bool,
    data: &[u8],
    nb: usize,
    dst: &mut [u8],
) -> Result<(), GpuError> {
    let bb = dst.len() / nb;
    s.write_src(data);
    let cfg = Cfg {
        cols: nb as u32,
        blocks: nb as u32,
        bs: bb as u32,
        bits: if q8 { 8 } else { 4 },
        ..Cfg::default()
    };
    let stats: Vec<u32> = s.run(Kernel::GgmlStats, cfg, nb as u32, 8 * nb as u64, |b, _| {
        (0..2 * nb).map(|i| u32_at(b, i)).collect()
    })?;
    let mut special: Vec<bool> = stats.chunks_exact(2).map(|t| t[1] != 0).collect();
    // The block's reference element: Q8_0 its magnitude, Q4_0 itself.
    let reference: Vec<u32> = stats
        .chunks_exact(2)
        .map(|t| if q8 { t[0] & 0x7fff_ffff } else { t[0] })
        .collect();
    let mut aux = vec![0u32; 2 * nb];
    for i in 0..nb {
        let r = f32::from_bits(reference[i]);
        let d = if q8 { r / 127.0 } else { r / -8.0 };
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        special[i] |= !(id == 0.0 || id.is_normal());
        aux[2 * i] = id.to_bits();
        aux[2 * i + 1] = if special[i] {
            SKIP
        } else {
            u32::from(f32_to_f16_bits(d))
        };
    }
    s.write_aux(
        &aux.iter()
            .flat_map(|w| w.to_le_bytes())
            .collect::<Vec<u8>>(),
    );
    let words = (nb * bb).div_ceil(4) as u32;
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
        dst.copy_from_slice(&cpu_pack(packer, params, data)?);
        return Ok(());
    }
    // Flagged elements: block (reference, v, 0, ...) has the same d.
    let todo: Vec<usize> = fixes
        .list
        .iter()
        .map(|&e| e as usize)
        .filter(|&e| !special[e / QK])
        .collect();
    if !todo.is_empty() {
        super::note_assist(todo.len(), 0, 0);
        let mut w = vec![0u8; todo.len() * 4 * QK];
        for (x, &e) in todo.iter().enumerate() {
            let blk = &mut w[x * 4 * QK..];
            blk[..4].copy_from_slice(&reference[e / QK].to_le_bytes());
            blk[4..8].copy_from_slice(&data[4 * e..4 * e + 4]);
        }
        let p = cpu_pack(packer, params, &w)?;
        for (x, &e) in todo.iter().enumerate() {
            let (b, j) = (e / QK, e % QK);
            let code = &p[x * bb + 2..];
            if q8 {
                dst[b * bb + 2 + j] = code[1];
            } else {
                // Element 1 of the redo block: low nibble of byte 1.
                let c = code[1] & 0x0f;
                let byte = &mut dst[b * bb + 2 + j % (QK / 2)];
                *byte = if j < QK / 2 {
                    (*byte & 0xf0) | c
                } else {
                    (*byte & 0x0f) | (c << 4)
                };
            }
        }
    }
    let specials: Vec<usize> = (0..nb).filter(|&i| special[i]).collect();
    if !specials.is_empty() {
        super::note_assist(0, specials.len(), 0);
        let mut w = Vec::with_capacity(specials.len() * 4 * QK);
        for &i in &specials {
            w.extend_from_slice(&data[i * 4 * QK..(i + 1) * 4 * QK]);
        }
        let p = cpu_pack(packer, params, &w)?;
        for (x, &i) in specials.iter().enumerate() {
            dst[i * bb..(i + 1) * bb].copy_from_slice(&p[x * bb..(x + 1) * bb]);
        }
    }
    Ok(())
}
