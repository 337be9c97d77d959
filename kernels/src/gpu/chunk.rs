//! What the block-quantizing GPU packers (`nbits.rs`, `ggml.rs`) share on
//! each chunk: the words they exchange with the shaders (block statistics
//! in, block parameters out, [`SKIP`]), the nibble stores of 4-bit codes,
//! and the CPU packer run on a small FLOAT source for what the GPU cannot
//! do exactly.

use ctcache::dtype::DataType;

use super::backend::Kernel;
use super::session::{Cfg, Session};
use super::GpuError;
use crate::{Packer, Params, SourceTensor};

/// Block parameter word: the CPU packs the block.
pub(super) const SKIP: u32 = u32::MAX;

/// The little-endian word `i` of `b`.
pub(super) fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4 bytes"))
}

/// Words as the little-endian bytes a buffer holds.
pub(super) fn to_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Runs the statistics kernel over `cells` blocks and reads back its
/// `per_cell` words of each.
pub(super) fn block_stats(
    s: &Session<'_>,
    kernel: Kernel,
    cfg: Cfg,
    cells: usize,
    per_cell: usize,
) -> Result<Vec<u32>, GpuError> {
    let words = per_cell * cells;
    s.run(kernel, cfg, cells as u32, 4 * words as u64, |b, _| {
        (0..words).map(|i| u32_at(b, i)).collect()
    })
}

/// Stores the 4-bit `code` in the low nibble of `byte` (`high` false) or
/// its high nibble, keeping the other.
pub(super) fn set_nibble(byte: &mut u8, high: bool, code: u8) {
    *byte = if high {
        (*byte & 0x0f) | (code << 4)
    } else {
        (*byte & 0xf0) | code
    };
}

/// Packs a FLOAT source of `dims` (`data`: its little-endian bytes) with
/// the CPU packer.
pub(super) fn cpu_pack(
    packer: &dyn Packer,
    params: &Params,
    dims: &[u64],
    data: &[u8],
) -> Result<Vec<u8>, GpuError> {
    let src = SourceTensor {
        data_type: DataType::FLOAT,
        dims,
        data,
    };
    Ok(crate::pack_to_vec(packer, &src, params)?.1)
}
