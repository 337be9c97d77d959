//! `ort.matmul_nbits`: the B, scales and zero_points inputs of
//! onnxruntime's `com.microsoft.MatMulNBits` for a MatMul weight W[K, N],
//! byte-identical with `onnxruntime.quantization.matmul_nbits_quantizer`
//! (QOperator format). The arithmetic is in `block.rs` and `kernel.rs`.
//!
//! With `transposed=true` the source is W[N, K], the B input of a Gemm with
//! transB=1, and the MatMul weight is B = W^T: the payload is the one of
//! `transposed=false` on W^T (packed from the rows of W by `rows.rs`,
//! without a transposed copy), and only the type name (`.t`) and the
//! decoder (which yields W[N, K]) differ.

use ctcache::dtype::DataType;

use crate::decoder::{int, ints, Builder, OUTPUT};
use crate::error::PackError;
use crate::packer::{check_isa, check_lengths, PackedLayout, Packer, SourceTensor};
use crate::params::{ParamSpec, Params};
use crate::struct_builders::{const_i64, field, leaf, nested, root, size_bits, Count};
use crate::util::us;
use block::{Nbits, Weight};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod block;
mod kernel;
#[cfg(target_arch = "aarch64")]
mod neon;
mod rows;
mod tile;

/// The `ort.matmul_nbits` packer.
pub struct MatMulNbits;

/// This packer's id.
pub const ID: &str = "ort.matmul_nbits";

const SPEC: &[ParamSpec] = &[
    ParamSpec {
        name: "bits",
        allowed: &["4", "8"],
        default: "4",
        doc: "bits per code",
    },
    ParamSpec {
        name: "block_size",
        allowed: &["16", "32", "64", "128", "256"],
        default: "32",
        doc: "consecutive k sharing one scale (and zero point)",
    },
    ParamSpec {
        name: "symmetric",
        allowed: &["true", "false"],
        default: "true",
        doc: "true: no zero_points field (implicit 2^(bits-1)); false: per-block zero points",
    },
    ParamSpec {
        name: "transposed",
        allowed: &["false", "true"],
        default: "false",
        doc: "true: the source is W[N, K] (Gemm B with transB=1) and B = W^T; same payload as false on W^T; type name suffix `.t` (after `.f16`)",
    },
];

impl MatMulNbits {
    /// The quantization settings and whether the source is transposed.
    fn settings(&self, params: &Params) -> Result<(Nbits, bool), PackError> {
        let r = params.resolve(ID, SPEC)?;
        let q = Nbits {
            bits: r.u32("bits"),
            block_size: r.u32("block_size") as usize,
            symmetric: r.bool("symmetric"),
        };
        Ok((q, r.bool("transposed")))
    }

    /// (K, N) of the MatMul weight B: the source is B[K, N], or W[N, K]
    /// when transposed.
    fn shape(
        &self,
        data_type: DataType,
        dims: &[u64],
        transposed: bool,
    ) -> Result<(u64, u64), PackError> {
        if data_type != DataType::FLOAT && data_type != DataType::FLOAT16 {
            return Err(PackError::UnsupportedDataType {
                packer: ID,
                data_type,
                supported: "FLOAT, FLOAT16",
            });
        }
        let bad = |reason: &str| PackError::BadShape {
            packer: ID,
            dims: dims.to_vec(),
            reason: reason.to_string(),
        };
        match *dims {
            [a, b] if a >= 1 && b >= 1 => {
                // The whole source must be addressable (it is in memory).
                a.checked_mul(b)
                    .and_then(|e| e.checked_mul(4))
                    .filter(|&bytes| usize::try_from(bytes).is_ok())
                    .ok_or(PackError::Overflow {
                        packer: ID,
                        dims: dims.to_vec(),
                    })?;
                Ok(if transposed { (b, a) } else { (a, b) })
            }
            [_, _] => Err(bad("K and N must be at least 1")),
            _ if transposed => Err(bad(
                "with transposed=true the weight must be 2-D [N, K] (a Gemm B with transB=1)",
            )),
            _ => Err(bad("the MatMul weight must be 2-D [K, N]")),
        }
    }
}

impl Packer for MatMulNbits {
    fn orientation(&self) -> crate::Orientation {
        crate::Orientation::KnOrTransposed
    }

    fn has_gpu_kernel(&self) -> bool {
        true
    }

    fn id(&self) -> &'static str {
        ID
    }

    fn format_version(&self) -> u32 {
        1
    }

    fn describe(&self) -> &'static str {
        "blockwise 4/8-bit quantization of a MatMul weight W[K,N] (or a Gemm transB=1 weight W[N,K] with transposed=true) into MatMulNBits inputs (B, scales, zero_points), byte-identical with onnxruntime"
    }

    fn param_spec(&self) -> &'static [ParamSpec] {
        SPEC
    }

    fn check_source(
        &self,
        data_type: DataType,
        dims: &[u64],
        params: &Params,
    ) -> Result<(), PackError> {
        let (_, transposed) = self.settings(params)?;
        self.shape(data_type, dims, transposed).map(|_| ())
    }

    fn output(
        &self,
        data_type: DataType,
        dims: &[u64],
        params: &Params,
    ) -> Result<PackedLayout, PackError> {
        let (q, transposed) = self.settings(params)?;
        let (k, n) = self.shape(data_type, dims, transposed)?;
        let bs = q.block_size as u64;
        let kb = k.div_ceil(bs);
        let blob = q.blob() as u64;
        let scale_t = data_type;
        let mut name = format!(
            "{ID}.b{}.bs{}.{}",
            q.bits,
            bs,
            if q.symmetric { "sym" } else { "asym" }
        );
        if data_type == DataType::FLOAT16 {
            name.push_str(".f16");
        }
        if transposed {
            name.push_str(".t");
        }
        let mut dims_param = vec!["N", "k_blocks"];
        let mut values = vec![n, kb];
        let mut fields = vec![
            field(
                "B",
                nested(leaf(DataType::UINT8), &[Count::Dim(0), Count::Dim(1), Count::Fixed(blob)]),
                "codes [N, k_blocks, block_size*bits/8]: block of column n, k ascending; 4 bits: even k in the low nibble; codes past K are 0",
            ),
            field(
                "scales",
                nested(leaf(scale_t), &[Count::Dim(0), Count::Dim(1)]),
                "scale of each block [N, k_blocks], in the source element type",
            ),
        ];
        if !q.symmetric {
            let zp_count = if q.bits == 8 {
                Count::Dim(1)
            } else {
                dims_param.push("zp_bytes");
                values.push(kb.div_ceil(2));
                Count::Dim(2)
            };
            fields.push(field(
                "zero_points",
                nested(leaf(DataType::UINT8), &[Count::Dim(0), zp_count]),
                "zero point of each block [N, ceil(k_blocks*bits/8)]; 4 bits: even block in the low nibble, spare nibble 8",
            ));
        }
        let k_i64 = i64::try_from(k).map_err(|_| PackError::Overflow {
            packer: ID,
            dims: dims.to_vec(),
        })?;
        fields.push(const_i64(
            "K",
            k_i64,
            if transposed {
                "columns of the source W[N, K] = rows of B (before block padding)"
            } else {
                "rows of the source weight (before block padding)"
            },
        ));
        let decoder = decoder(&name, &q, transposed);
        let mut t = root(
            name,
            ID,
            self.format_version(),
            &dims_param,
            fields,
            if transposed {
                "MatMulNBits weight of a Gemm transB=1 source W[N, K]: decode as W[n, k] = (code - zero_point) * scale"
            } else {
                "MatMulNBits weight: decode as W[k, n] = (code - zero_point) * scale"
            },
        );
        t.decoder = Some(decoder);
        let bits = size_bits(&t, &values).ok_or(PackError::Overflow {
            packer: ID,
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
        isa: crate::isa::Isa,
    ) -> Result<(), PackError> {
        check_isa(isa)?;
        let layout = self.output(src.data_type, src.dims, params)?;
        check_lengths(src, out, layout.payload_len)?;
        let (q, transposed) = self.settings(params)?;
        let f16 = src.data_type == DataType::FLOAT16;
        if transposed {
            // B's dimensions; the data is W[N, K].
            let w = Weight {
                data: src.data,
                f16,
                k: us(src.dims[1]),
                n: us(src.dims[0]),
            };
            rows::pack(isa, w, q, out);
        } else {
            let w = Weight {
                data: src.data,
                f16,
                k: us(src.dims[0]),
                n: us(src.dims[1]),
            };
            kernel::pack(isa, w, q, out);
        }
        Ok(())
    }
}

/// `W[K, N] = transpose((code - zero_point) * scale)[:, :K]` in ONNX ops;
/// `transposed`: the source `W[N, K] = ((code - zero_point) * scale)[:, :K]`
/// (no final Transpose).
fn decoder(name: &str, q: &Nbits, transposed: bool) -> ctcache::pb::FunctionProto {
    let mut f = Builder::new();
    let ax2 = f.i64s(&[2]);
    let codes = if q.bits == 4 {
        interleave(&mut f, "B", &[0, 0, -1])
    } else {
        "B".to_string()
    };
    let codes = f.cast_f32(&codes);
    let mut inputs = vec!["B", "scales"];
    let zp = if q.symmetric {
        f.f32((1u32 << (q.bits - 1)) as f32)
    } else {
        inputs.push("zero_points");
        let z = if q.bits == 4 {
            // Two blocks per byte, then drop the spare nibble: [N, k_blocks].
            let z = interleave(&mut f, "zero_points", &[0, -1]);
            let kb = f.op("Shape", &["scales"], vec![int("start", 1), int("end", 2)]);
            let zero = f.i64s(&[0]);
            let ax1 = f.i64s(&[1]);
            f.op("Slice", &[&z, &zero, &kb, &ax1], vec![])
        } else {
            "zero_points".to_string()
        };
        let z = f.cast_f32(&z);
        f.op("Unsqueeze", &[&z, &ax2], vec![])
    };
    inputs.push("K");
    let s = f.cast_f32("scales");
    let s = f.op("Unsqueeze", &[&s, &ax2], vec![]);
    let d = f.op("Sub", &[&codes, &zp], vec![]);
    let d = f.op("Mul", &[&d, &s], vec![]);
    let flat_shape = f.i64s(&[0, -1]);
    let flat = f.op("Reshape", &[&d, &flat_shape], vec![]);
    let one = f.i64s(&[1]);
    let k = f.op("Reshape", &["K", &one], vec![]);
    let zero = f.i64s(&[0]);
    let ax1 = f.i64s(&[1]);
    if transposed {
        f.op_to("Slice", &[&flat, &zero, &k, &ax1], OUTPUT, vec![]);
    } else {
        let rows = f.op("Slice", &[&flat, &zero, &k, &ax1], vec![]);
        f.op_to("Transpose", &[&rows], OUTPUT, vec![ints("perm", &[1, 0])]);
    }
    f.finish(name, &inputs)
}

/// Unpacks a UINT8 tensor of nibble pairs (low first) along its last axis,
/// then reshapes to `shape`.
fn interleave(f: &mut Builder, x: &str, shape: &[i64]) -> String {
    let (lo, hi) = f.nibbles(x);
    let last = f.i64s(&[-1]);
    let lo = f.op("Unsqueeze", &[&lo, &last], vec![]);
    let hi = f.op("Unsqueeze", &[&hi, &last], vec![]);
    let pair = f.op("Concat", &[&lo, &hi], vec![int("axis", -1)]);
    let shape = f.i64s(shape);
    f.op("Reshape", &[&pair, &shape], vec![])
}
