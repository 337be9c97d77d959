//! `cast.f16` on the GPU: pairs of elements per invocation, the conversion
//! in integer arithmetic (so it is exact on any GPU); an odd last element
//! is converted by the CPU packer.

use ctcache::dtype::DataType;

use super::backend::{GpuBackend, Kernel};
use super::session::{Cfg, Session};
use super::GpuError;
use crate::{Packer, Params, SourceTensor};

pub(super) fn pack(
    gpu: &GpuBackend,
    packer: &dyn Packer,
    src: &SourceTensor<'_>,
    out: &mut [u8],
    chunk_bytes: u64,
) -> Result<(), GpuError> {
    let n = src.data.len() / 4;
    let pairs = n / 2;
    if pairs > 0 {
        let per = (chunk_bytes as usize / 8).min(pairs);
        let s = Session::new(gpu, (per * 8) as u64, 4, (per * 4) as u64, 1)?;
        for p0 in (0..pairs).step_by(per) {
            let np = per.min(pairs - p0);
            s.write_src(&src.data[p0 * 8..(p0 + np) * 8]);
            let dst = &mut out[p0 * 4..(p0 + np) * 4];
            s.run(
                Kernel::CastF16,
                Cfg::default(),
                np as u32,
                dst.len() as u64,
                |b, _| dst.copy_from_slice(b),
            )?;
        }
        s.finish()?;
    }
    if n % 2 == 1 {
        let last = SourceTensor {
            data_type: DataType::FLOAT,
            dims: &[1],
            data: &src.data[4 * (n - 1)..],
        };
        packer.pack(&last, &Params::new(), &mut out[2 * (n - 1)..])?;
    }
    Ok(())
}
