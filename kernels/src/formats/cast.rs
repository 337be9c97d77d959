//! `cast.f16` and `cast.bf16`: FLOAT -> FLOAT16 (numpy `astype(float16)`)
//! and FLOAT -> BFLOAT16 (ml_dtypes `astype(bfloat16)`), any shape, same
//! shape out. Rounding and NaN rules are in `fp16`.

use ctcache::dtype::DataType;

use super::cast_kernel::{self, Target};
use crate::decoder::{int, Builder, OUTPUT};
use crate::isa::Isa;
use crate::layout::{field, leaf, nested, root, size_bits, Count};
use crate::packer::{check_isa, check_lengths, PackError, PackedLayout, Packer, SourceTensor};
use crate::params::{ParamSpec, Params};

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
        crate::util::numel(dims)
            .filter(|n| n.checked_mul(4).is_some_and(|b| usize::try_from(b).is_ok()))
            .map(|_| ())
            .ok_or(PackError::Overflow {
                packer: self.id,
                dims: dims.to_vec(),
            })
    }

    fn output(
        &self,
        data_type: DataType,
        dims: &[u64],
        params: &Params,
    ) -> Result<PackedLayout, PackError> {
        self.check_source(data_type, dims, params)?;
        let names: Vec<String> = (0..dims.len()).map(|i| format!("d{i}")).collect();
        let dims_param: Vec<&str> = names.iter().map(String::as_str).collect();
        let counts: Vec<Count> = (0..dims.len() as u32).map(Count::Dim).collect();
        let mut t = root(
            self.id.to_string(),
            self.id,
            self.format_version(),
            &dims_param,
            vec![field(
                "values",
                nested(leaf(self.elem()), &counts),
                "the source shape, row-major",
            )],
            self.describe(),
        );
        let mut f = Builder::new();
        f.op_to(
            "Cast",
            &["values"],
            OUTPUT,
            vec![int("to", DataType::FLOAT.code() as i64)],
        );
        t.decoder = Some(f.finish(self.id, &["values"]));
        let bits = size_bits(&t, dims).ok_or(PackError::Overflow {
            packer: self.id,
            dims: dims.to_vec(),
        })?;
        Ok(PackedLayout {
            struct_type: t,
            dims: dims.to_vec(),
            payload_len: bits / 8,
        })
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
        cast_kernel::convert(isa, self.target, src.data, out);
        Ok(())
    }
}
