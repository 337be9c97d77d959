//! `ggml.q8_0` and `ggml.q4_0`: llama.cpp block quantization along the last
//! axis, byte-identical with the gguf Python package. The arithmetic is in
//! `kernel.rs` and `block.rs`.

use ctcache::dtype::DataType;

use crate::decoder::{int, Builder, OUTPUT};
use crate::error::PackError;
use crate::isa::Isa;
use crate::packer::{check_isa, check_lengths, PackedLayout, Packer, SourceTensor};
use crate::params::{ParamSpec, Params};
use crate::struct_builders::{array, field, leaf, nested, root, size_bits, structure, Count};
use block::{GgmlType, QK};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod block;
mod kernel;
#[cfg(target_arch = "aarch64")]
mod neon;

/// The ggml block quantization packer; [`Q8_0`] and [`Q4_0`] are its two instances.
pub struct Ggml {
    t: GgmlType,
    id: &'static str,
}

/// `ggml.q8_0`: blocks of 32 int8 values with one half-precision scale.
pub const Q8_0: Ggml = Ggml {
    t: GgmlType::Q8_0,
    id: "ggml.q8_0",
};

/// `ggml.q4_0`: blocks of 32 4-bit values with one half-precision scale.
pub const Q4_0: Ggml = Ggml {
    t: GgmlType::Q4_0,
    id: "ggml.q4_0",
};

impl Ggml {
    fn check(&self, data_type: DataType, dims: &[u64], params: &Params) -> Result<u64, PackError> {
        params.resolve(self.id, &[])?;
        if data_type != DataType::FLOAT && data_type != DataType::FLOAT16 {
            return Err(PackError::UnsupportedDataType {
                packer: self.id,
                data_type,
                supported: "FLOAT, FLOAT16",
            });
        }
        let bad = |reason: &str| PackError::BadShape {
            packer: self.id,
            dims: dims.to_vec(),
            reason: reason.to_string(),
        };
        let last = *dims
            .last()
            .ok_or_else(|| bad("a scalar has no last axis to block"))?;
        if last % QK as u64 != 0 {
            return Err(bad("the last dimension must be a multiple of 32"));
        }
        let n = crate::util::numel(dims)
            .filter(|n| n.checked_mul(4).is_some_and(|b| usize::try_from(b).is_ok()))
            .ok_or(PackError::Overflow {
                packer: self.id,
                dims: dims.to_vec(),
            })?;
        if n == 0 {
            return Err(bad("the tensor is empty"));
        }
        Ok(n)
    }
}

impl Ggml {
    /// `x = d * q` (Q4_0: `d * (q - 8)`) per block, blocks flattened into
    /// the last axis.
    fn decoder(&self) -> ctcache::pb::FunctionProto {
        let mut f = Builder::new();
        let last = f.i64s(&[-1]);
        let d = f.cast_f32("blocks.d");
        let d = f.op("Unsqueeze", &[&d, &last], vec![]);
        let q = match self.t {
            GgmlType::Q8_0 => f.cast_f32("blocks.qs"),
            GgmlType::Q4_0 => {
                let (lo, hi) = f.nibbles("blocks.qs");
                let q = f.op("Concat", &[&lo, &hi], vec![int("axis", -1)]);
                let q = f.cast_f32(&q);
                let eight = f.f32(8.0);
                f.op("Sub", &[&q, &eight], vec![])
            }
        };
        let x = f.op("Mul", &[&q, &d], vec![]);
        let lead = f.op("Shape", &["blocks.d"], vec![int("end", -1)]);
        let shape = f.op("Concat", &[&lead, &last], vec![int("axis", 0)]);
        f.op_to("Reshape", &[&x, &shape], OUTPUT, vec![]);
        f.finish(self.id, &["blocks.d", "blocks.qs"])
    }
}

impl Packer for Ggml {
    fn has_gpu_kernel(&self) -> bool {
        true
    }

    fn id(&self) -> &'static str {
        self.id
    }

    fn format_version(&self) -> u32 {
        1
    }

    fn describe(&self) -> &'static str {
        match self.t {
            GgmlType::Q8_0 => "ggml Q8_0: blocks of 32 along the last axis, f16 scale + 32 int8 codes, byte-identical with gguf-py",
            GgmlType::Q4_0 => "ggml Q4_0: blocks of 32 along the last axis, f16 scale + 16 bytes of 4-bit codes (j | j+16 << 4), byte-identical with gguf-py",
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
        self.check(data_type, dims, params).map(|_| ())
    }

    fn output(
        &self,
        data_type: DataType,
        dims: &[u64],
        params: &Params,
    ) -> Result<PackedLayout, PackError> {
        self.check(data_type, dims, params)?;
        let r = dims.len();
        let names: Vec<String> = (0..r - 1)
            .map(|i| format!("d{i}"))
            .chain(std::iter::once("blocks".to_string()))
            .collect();
        let dims_param: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut values = dims.to_vec();
        values[r - 1] /= QK as u64;
        let counts: Vec<Count> = (0..r as u32).map(Count::Dim).collect();
        let qs = match self.t {
            GgmlType::Q8_0 => field(
                "qs",
                array(leaf(DataType::INT8), Count::Fixed(QK as u64)),
                "codes; x = d * q",
            ),
            GgmlType::Q4_0 => field(
                "qs",
                array(leaf(DataType::UINT8), Count::Fixed(QK as u64 / 2)),
                "byte j: element j in the low nibble, element j+16 in the high nibble; x = d * (q - 8)",
            ),
        };
        let block = structure(vec![field("d", leaf(DataType::FLOAT16), "block scale"), qs]);
        let mut t = root(
            self.id.to_string(),
            self.id,
            self.format_version(),
            &dims_param,
            vec![field(
                "blocks",
                nested(block, &counts),
                "source leading dims, then blocks of 32 along the last axis",
            )],
            self.describe(),
        );
        t.decoder = Some(self.decoder());
        let bits = size_bits(&t, &values).ok_or(PackError::Overflow {
            packer: self.id,
            dims: dims.to_vec(),
        })?;
        Ok(PackedLayout {
            struct_type: t,
            dims: values,
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
        kernel::pack(
            isa,
            self.t,
            src.data,
            src.data_type == DataType::FLOAT16,
            out,
        );
        Ok(())
    }
}
