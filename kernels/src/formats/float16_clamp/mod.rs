//! `ort.float16`: FLOAT -> FLOAT16 as onnxruntime's float16 converter
//! (`onnxruntime.transformers.float16.convert_float_to_float16`) writes an
//! initializer stored as `raw_data`: every finite non-zero value is first
//! clamped by magnitude into [`min_positive_val`, `max_finite_val`] (sign
//! kept; zero, NaN and infinities left alone), then cast as numpy
//! `astype(float16)` (rules in `fp16`). The thresholds are compared and
//! substituted as FLOAT (numpy 2 reads the Python floats as weak scalars),
//! so a value is clamped when `0 < |x| < f32(min)` or `f32(max) < |x| < inf`.
//!
//! Not `cast.f16`: a plain cast turns 1e-9 into 0 and 1e5 into inf, this
//! one into 2^-24 and 65504, so it is a physical type of its own (D4/D9).

use ctcache::dtype::DataType;

use super::elementwise::{check_fits, Elementwise};
use crate::decoder::int;
use crate::error::PackError;
use crate::isa::Isa;
use crate::packer::{check_isa, check_lengths, PackedLayout, Packer, SourceTensor};
use crate::params::{ParamSpec, Params};

#[cfg(target_arch = "x86_64")]
mod avx2;
mod bounds;
mod kernel;

use bounds::Bounds;
use kernel::convert;

/// The `ort.float16` packer.
pub struct Float16Clamp;

/// This packer's id.
pub const ID: &str = "ort.float16";

const SPEC: &[ParamSpec] = &[
    ParamSpec {
        name: "min_positive_val",
        allowed: &["5.96e-08", "1e-07"],
        default: "5.96e-08",
        doc: "smallest magnitude a non-zero finite value keeps (onnxruntime's default 5.96e-08; 1e-07 is onnxconverter-common's)",
    },
    ParamSpec {
        name: "max_finite_val",
        allowed: &["65504", "10000"],
        default: "65504",
        doc: "largest magnitude a finite value keeps (onnxruntime's default 65504; 10000 is onnxconverter-common's)",
    },
];

impl Float16Clamp {
    fn bounds(&self, params: &Params) -> Result<(Bounds, String), PackError> {
        let r = params.resolve(ID, SPEC)?;
        let (lo, hi) = (r.str("min_positive_val"), r.str("max_finite_val"));
        // Python float (f64) first, then float32: numpy's conversion.
        let f = |s: &str| s.parse::<f64>().expect("allowed values are numbers") as f32;
        Ok((
            Bounds {
                min: f(lo),
                max: f(hi),
            },
            format!("{ID}.min{lo}.max{hi}"),
        ))
    }
}

/// FLOAT raw bytes -> FLOAT16 raw bytes with the default parameters (the
/// converter's 5.96e-08 and 65504), best kernel: what materialize applies
/// to FLOAT tensors held in nodes (Constant values). Trailing bytes short
/// of a FLOAT are ignored.
pub fn convert_default(src: &[u8]) -> Vec<u8> {
    let b = Bounds {
        min: 5.96e-08f64 as f32,
        max: 65504.0,
    };
    let n = src.len() / 4;
    let mut out = vec![0u8; 2 * n];
    convert(Isa::detect(), b, &src[..4 * n], &mut out);
    out
}

impl Packer for Float16Clamp {
    fn id(&self) -> &'static str {
        ID
    }

    fn format_version(&self) -> u32 {
        1
    }

    fn describe(&self) -> &'static str {
        "FLOAT -> FLOAT16 as onnxruntime's float16 converter: finite non-zero magnitudes clamped into [min_positive_val, max_finite_val] (sign, zero, NaN, inf kept), then round to nearest even"
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
        self.bounds(params)?;
        if data_type != DataType::FLOAT {
            return Err(PackError::UnsupportedDataType {
                packer: ID,
                data_type,
                supported: "FLOAT",
            });
        }
        check_fits(ID, dims, 4)
    }

    fn output(
        &self,
        data_type: DataType,
        dims: &[u64],
        params: &Params,
    ) -> Result<PackedLayout, PackError> {
        self.check_source(data_type, dims, params)?;
        let (_, name) = self.bounds(params)?;
        Elementwise {
            name: &name,
            packer: ID,
            version: self.format_version(),
            elem: DataType::FLOAT16,
            values_doc: "the source shape, row-major, clamped then rounded to nearest even",
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
        let (b, _) = self.bounds(params)?;
        convert(isa, b, src.data, out);
        Ok(())
    }
}
