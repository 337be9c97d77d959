//! `ort.quantize_dynamic`: a FLOAT weight quantized to INT8 or UINT8 with
//! its scale and zero point, byte-identical with what
//! `onnxruntime.quantization.quantize_dynamic` writes for it: the
//! initializers `<W>_quantized`, `<W>_scale` and `<W>_zero_point` of a
//! MatMul weight (per tensor, or per channel along the last axis as its
//! MatMul rule asks), and, with the matching parameters, of a Gather table
//! (UINT8, asymmetric, per tensor, full range) or a Conv weight (per
//! tensor). The arithmetic is in `kernel.rs` and `quant.rs`.
//!
//! Payload: `scale` FLOAT[C], `zero_point` [C], `quantized` in the source
//! shape, where C is 1 per tensor and the last dimension per channel.

use ctcache::dtype::DataType;
use rayon::prelude::*;

use crate::decoder::{ints, Builder, OUTPUT};
use crate::error::PackError;
use crate::isa::Isa;
use crate::packer::{check_isa, check_lengths, PackedLayout, Packer, SourceTensor};
use crate::params::{ParamSpec, Params};
use crate::struct_builders::{field, leaf, nested, root, size_bits, Count};
use crate::util::us;
use quant::Quant;

#[cfg(target_arch = "x86_64")]
mod avx2;
mod kernel;
mod quant;

/// The `ort.quantize_dynamic` packer.
pub struct QuantizeDynamic;

/// This packer's id.
pub const ID: &str = "ort.quantize_dynamic";

const SPEC: &[ParamSpec] = &[
    ParamSpec {
        name: "weight_type",
        allowed: &["int8", "uint8"],
        default: "int8",
        doc: "element type of the quantized weight (QuantType.QInt8 / QUInt8)",
    },
    ParamSpec {
        name: "symmetric",
        allowed: &["true", "false"],
        default: "true",
        doc:
            "symmetric range around zero (the reference's default: true for int8, false for uint8)",
    },
    ParamSpec {
        name: "per_channel",
        allowed: &["false", "true"],
        default: "false",
        doc: "one scale and zero point per index of the last axis (MatMul's channel axis)",
    },
    ParamSpec {
        name: "reduce_range",
        allowed: &["false", "true"],
        default: "false",
        doc: "7-bit ranges: uint8 0..127, int8 -64..64",
    },
    ParamSpec {
        name: "transposed",
        allowed: &["false", "true"],
        default: "false",
        doc: "true: the source is W[N, K] (a Gemm B with transB=1) and the payload is the one of W^T (what the reference writes for `<W>_Transposed`), channels along N; type name suffix `.t`",
    },
];

/// Resolved parameters.
struct Settings {
    q: Quant,
    per_channel: bool,
    transposed: bool,
    name: String,
}

impl QuantizeDynamic {
    fn settings(&self, params: &Params) -> Result<Settings, PackError> {
        let r = params.resolve(ID, SPEC)?;
        let q = Quant {
            signed: r.str("weight_type") == "int8",
            symmetric: r.bool("symmetric"),
            reduce_range: r.bool("reduce_range"),
        };
        let per_channel = r.bool("per_channel");
        let mut name = format!(
            "{ID}.{}.{}.{}",
            r.str("weight_type"),
            if q.symmetric { "sym" } else { "asym" },
            if per_channel {
                "per_channel"
            } else {
                "per_tensor"
            }
        );
        if q.reduce_range {
            name.push_str(".reduce_range");
        }
        let transposed = r.bool("transposed");
        if transposed {
            name.push_str(".t");
        }
        Ok(Settings {
            q,
            per_channel,
            transposed,
            name,
        })
    }

    /// Channels: 1 per tensor, else the last dimension of the quantized
    /// weight (the first of the source when transposed).
    fn channels(&self, data_type: DataType, dims: &[u64], s: &Settings) -> Result<u64, PackError> {
        if data_type != DataType::FLOAT {
            return Err(PackError::UnsupportedDataType {
                packer: ID,
                data_type,
                supported: "FLOAT",
            });
        }
        let bad = |reason: &str| PackError::BadShape {
            packer: ID,
            dims: dims.to_vec(),
            reason: reason.to_string(),
        };
        let Some(&last) = dims.last() else {
            return Err(bad("a weight must have at least one dimension"));
        };
        let n = crate::util::numel(dims)
            .filter(|n| n.checked_mul(4).is_some_and(|b| usize::try_from(b).is_ok()))
            .ok_or(PackError::Overflow {
                packer: ID,
                dims: dims.to_vec(),
            })?;
        if n == 0 {
            return Err(bad("the weight is empty"));
        }
        if s.transposed {
            let [rows, _] = *dims else {
                return Err(bad(
                    "with transposed=true the weight must be 2-D [N, K] (a Gemm B with transB=1)",
                ));
            };
            return Ok(if s.per_channel { rows } else { 1 });
        }
        Ok(if s.per_channel { last } else { 1 })
    }
}

impl Packer for QuantizeDynamic {
    fn id(&self) -> &'static str {
        ID
    }

    fn format_version(&self) -> u32 {
        1
    }

    fn describe(&self) -> &'static str {
        "int8/uint8 quantization of a FLOAT weight with scale and zero point (per tensor or per last-axis channel), byte-identical with onnxruntime's quantize_dynamic"
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
        let s = self.settings(params)?;
        self.channels(data_type, dims, &s).map(|_| ())
    }

    fn output(
        &self,
        data_type: DataType,
        dims: &[u64],
        params: &Params,
    ) -> Result<PackedLayout, PackError> {
        let s = self.settings(params)?;
        self.channels(data_type, dims, &s)?;
        // The quantized weight's shape: the source's, or W^T's.
        let qdims: Vec<u64> = if s.transposed {
            vec![dims[1], dims[0]]
        } else {
            dims.to_vec()
        };
        let qt = if s.q.signed {
            DataType::INT8
        } else {
            DataType::UINT8
        };
        let names: Vec<String> = (0..qdims.len()).map(|i| format!("d{i}")).collect();
        let dims_param: Vec<&str> = names.iter().map(String::as_str).collect();
        let counts: Vec<Count> = (0..qdims.len() as u32).map(Count::Dim).collect();
        let c = if s.per_channel {
            Count::Dim(qdims.len() as u32 - 1)
        } else {
            Count::Fixed(1)
        };
        let fields = vec![
            field(
                "scale",
                nested(leaf(DataType::FLOAT), &[c]),
                "scale of each channel (one per tensor): the DOUBLE scale rounded to FLOAT",
            ),
            field(
                "zero_point",
                nested(leaf(qt), &[c]),
                "zero point of each channel (one per tensor)",
            ),
            field(
                "quantized",
                nested(leaf(qt), &counts),
                "clip(round_half_even(x / scale) + zero_point) in the source shape (W^T's when transposed), row-major",
            ),
        ];
        let mut t = root(
            s.name.clone(),
            ID,
            self.format_version(),
            &dims_param,
            fields,
            "quantize_dynamic weight: decode as W = (quantized - zero_point) * scale, channels along the last axis",
        );
        let mut f = Builder::new();
        let q = f.cast_f32("quantized");
        let z = f.cast_f32("zero_point");
        let d = f.op("Sub", &[&q, &z], vec![]);
        if s.transposed {
            let w = f.op("Mul", &[&d, "scale"], vec![]);
            f.op_to("Transpose", &[&w], OUTPUT, vec![ints("perm", &[1, 0])]);
        } else {
            f.op_to("Mul", &[&d, "scale"], OUTPUT, vec![]);
        }
        t.decoder = Some(f.finish(&s.name, &["scale", "zero_point", "quantized"]));
        let bits = size_bits(&t, &qdims).ok_or(PackError::Overflow {
            packer: ID,
            dims: dims.to_vec(),
        })?;
        Ok(PackedLayout {
            struct_type: t,
            dims: qdims,
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
        let s = self.settings(params)?;
        let c = us(self.channels(src.data_type, src.dims, &s)?);
        let ranges = if s.per_channel && s.transposed {
            let row = 4 * us(src.dims[1]);
            src.data
                .chunks_exact(row)
                .map(|r| kernel::range_all(isa, r))
                .collect::<Option<Vec<_>>>()
        } else if s.per_channel {
            kernel::range_columns(isa, src.data, c)
        } else {
            kernel::range_all(isa, src.data).map(|r| vec![r])
        };
        let ranges = ranges.ok_or_else(|| {
            let i = kernel::first_non_finite(src.data).unwrap_or(0);
            let b = &src.data[4 * i..4 * i + 4];
            PackError::BadValue {
                packer: ID,
                detail: format!(
                    "element {i} is {} (the reference cannot quantize NaN or infinite weights)",
                    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
                ),
            }
        })?;
        let (head, quantized) = out.split_at_mut(5 * c);
        let (scale_out, zp_out) = head.split_at_mut(4 * c);
        let mut scales = Vec::with_capacity(c);
        let mut zps = Vec::with_capacity(c);
        for (i, r) in ranges.iter().enumerate() {
            let (scale, zp) = s.q.params(r.lo, r.hi);
            scale_out[4 * i..4 * i + 4].copy_from_slice(&scale.to_le_bytes());
            zp_out[i] = zp as u8;
            scales.push(scale);
            zps.push(zp as f32);
        }
        if s.transposed {
            // W[N, K] quantized row by row (a row is a channel of W^T),
            // then written transposed.
            let (n, k) = (us(src.dims[0]), us(src.dims[1]));
            let mut rows = vec![0u8; n * k];
            rows.par_chunks_mut(k)
                .zip(src.data.par_chunks(4 * k))
                .enumerate()
                .for_each(|(r, (o, x))| {
                    let i = if s.per_channel { r } else { 0 };
                    kernel::quantize(isa, s.q, x, &scales[i..=i], &zps[i..=i], o);
                });
            kernel::transpose_bytes(&rows, n, k, quantized);
        } else {
            kernel::quantize(isa, s.q, src.data, &scales, &zps, quantized);
        }
        Ok(())
    }
}
