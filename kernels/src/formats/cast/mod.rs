//! `cast.f16` and `cast.bf16`: FLOAT -> FLOAT16 (numpy `astype(float16)`)
//! and FLOAT -> BFLOAT16 (ml_dtypes `astype(bfloat16)`), any shape, same
//! shape out. Rounding and NaN rules are in `fp16`.

use ctcache::dtype::DataType;

use super::elementwise::{check_fits, Elementwise};
use crate::decoder::int;
use crate::error::PackError;
use crate::isa::Isa;
use crate::packer::{check_isa, check_lengths, PackedLayout, Packer, SourceTensor};
use crate::params::{ParamSpec, Params};
use target::Target;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod kernel;
#[cfg(target_arch = "aarch64")]
pub(super) mod neon;
pub(super) mod target;

/// The float-to-half cast packer; [`F16`] and [`BF16`] are its two instances.
pub struct Cast {
    target: Target,
    id: &'static str,
}

/// `cast.f16`: FLOAT to IEEE half precision.
pub const F16: Cast = Cast {
    target: Target::F16,
    id: "cast.f16",
};

/// `cast.bf16`: FLOAT to bfloat16.
pub const BF16: Cast = Cast {
    target: Target::Bf16,
    id: "cast.bf16",
};

impl Cast {
    fn elem(&self) -> DataType {
        match self.target {
            Target::F16 => DataType::FLOAT16,
            Target::Bf16 => DataType::BFLOAT16,
        }
    }
}

impl Packer for Cast {
    fn has_gpu_kernel(&self) -> bool {
        matches!(self.target, Target::F16)
    }

    fn id(&self) -> &'static str {
        self.id
    }

    fn format_version(&self) -> u32 {
        1
    }

    fn describe(&self) -> &'static str {
        match self.target {
            Target::F16 => {
                "FLOAT -> FLOAT16, round to nearest even, NaN payload truncated (numpy astype)"
            }
            Target::Bf16 => {
                "FLOAT -> BFLOAT16, round to nearest even, NaN -> quiet NaN (ml_dtypes astype)"
            }
        }
    }

    fn param_spec(&self) -> &'static [ParamSpec] {
        &[]
    }

    fn check_source(
        &self,
        data_type: DataType,
        dims: &[u64],
        params: &Params,
    ) -> Result<(), PackError> {
        params.resolve(self.id, &[])?;
        if data_type != DataType::FLOAT {
            return Err(PackError::UnsupportedDataType {
                packer: self.id,
                data_type,
                supported: "FLOAT",
            });
        }
        check_fits(self.id, dims, 4)
    }

    fn output(
        &self,
        data_type: DataType,
        dims: &[u64],
        params: &Params,
    ) -> Result<PackedLayout, PackError> {
        self.check_source(data_type, dims, params)?;
        Elementwise {
            name: self.id,
            packer: self.id,
            version: self.format_version(),
            elem: self.elem(),
            values_doc: "the source shape, row-major",
            doc: self.describe(),
            op: "Cast",
            attrs: vec![int("to", DataType::FLOAT.code() as i64)],
        }
        .layout(dims)
    }

    fn pack_with(
        &self,
        src: &SourceTensor<'_>,
        params: &Params,
        out: &mut [u8],
        isa: Isa,
    ) -> Result<(), PackError> {
        check_isa(isa)?;
        let layout = self.output(src.data_type, src.dims, params)?;
        check_lengths(src, out, layout.payload_len)?;
        kernel::convert(isa, self.target, src.data, out);
        Ok(())
    }
}
