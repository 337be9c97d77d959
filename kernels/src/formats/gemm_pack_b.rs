//! `gemm.pack_b.f32`: the B operand of an SGEMM micro-kernel, W[K, N]
//! FLOAT, cut into column panels of width NR. Panel p holds
//! `W[k, p*NR .. p*NR + NR]` for k = 0..K, contiguous (K rows of NR
//! floats); the last panel is zero-padded past N. A pure copy: bits are
//! kept exactly (NaN payloads too), and [`unpack`] restores the source.

use ctcache::dtype::DataType;
use ctcache::pb;
use rayon::prelude::*;

use crate::decoder::{ints, Builder, OUTPUT};
use crate::device::cpu_requirement;
use crate::error::PackError;
use crate::isa::Isa;
use crate::packer::{check_isa, check_lengths, PackedLayout, Packer, SourceTensor};
use crate::params::{ParamSpec, Params};
use crate::struct_builders::{const_i64, field, leaf, nested, root, size_bits, Count};
use crate::util::us;

/// The `gemm.pack_b.f32` packer.
pub struct GemmPackB;

/// This packer's id.
pub const ID: &str = "gemm.pack_b.f32";

const SPEC: &[ParamSpec] = &[ParamSpec {
    name: "panel",
    allowed: &["host", "8", "16", "32"],
    default: "host",
    doc: "panel width NR; host: 32 with AVX-512F, 16 with AVX2, else 8 (NEON on aarch64 too)",
}];

/// The panel width the host's SGEMM micro-kernel wants: 32 (AVX-512F), 16
/// (AVX2), else 8, which is also NEON's on aarch64 (two 4-lane registers
/// per row, the usual 8-wide NEON SGEMM micro-kernel).
pub fn host_panel() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return 32;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return 16;
        }
    }
    8
}

impl GemmPackB {
    fn panel(&self, params: &Params) -> Result<usize, PackError> {
        let r = params.resolve(ID, SPEC)?;
        Ok(match r.str("panel") {
            "host" => host_panel(),
            v => v.parse().expect("allowed panel values are integers"),
        })
    }

    fn shape(&self, data_type: DataType, dims: &[u64]) -> Result<(u64, u64), PackError> {
        if data_type != DataType::FLOAT {
            return Err(PackError::UnsupportedDataType {
                packer: ID,
                data_type,
                supported: "FLOAT",
            });
        }
        match *dims {
            [k, n] if k >= 1 && n >= 1 => {
                // Padded size must be addressable.
                n.checked_add(32)
                    .and_then(|n| n.checked_mul(k))
                    .and_then(|e| e.checked_mul(4))
                    .filter(|&b| usize::try_from(b).is_ok())
                    .ok_or(PackError::Overflow {
                        packer: ID,
                        dims: dims.to_vec(),
                    })?;
                Ok((k, n))
            }
            _ => Err(PackError::BadShape {
                packer: ID,
                dims: dims.to_vec(),
                reason: "the weight must be 2-D [K, N] with K, N >= 1".to_string(),
            }),
        }
    }
}

impl Packer for GemmPackB {
    fn orientation(&self) -> crate::Orientation {
        crate::Orientation::KnOnly
    }

    fn id(&self) -> &'static str {
        ID
    }

    fn format_version(&self) -> u32 {
        1
    }

    fn describe(&self) -> &'static str {
        "SGEMM B panels: W[K,N] FLOAT as ceil(N/NR) panels of K x NR floats, last panel zero-padded"
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
        self.panel(params)?;
        self.shape(data_type, dims).map(|_| ())
    }

    fn output(
        &self,
        data_type: DataType,
        dims: &[u64],
        params: &Params,
    ) -> Result<PackedLayout, PackError> {
        let nr = self.panel(params)? as u64;
        let (k, n) = self.shape(data_type, dims)?;
        let overflow = || PackError::Overflow {
            packer: ID,
            dims: dims.to_vec(),
        };
        let name = format!("{ID}.nr{nr}");
        let mut f = Builder::new();
        let t = f.op("Transpose", &["panels"], vec![ints("perm", &[1, 0, 2])]);
        let flat_shape = f.i64s(&[0, -1]);
        let flat = f.op("Reshape", &[&t, &flat_shape], vec![]);
        let one = f.i64s(&[1]);
        let n1 = f.op("Reshape", &["N", &one], vec![]);
        let zero = f.i64s(&[0]);
        let ax1 = f.i64s(&[1]);
        f.op_to("Slice", &[&flat, &zero, &n1, &ax1], OUTPUT, vec![]);
        let decoder = f.finish(&name, &["panels", "N"]);
        let mut t = root(
            name,
            ID,
            self.format_version(),
            &["panels", "K"],
            vec![
                field(
                    "panels",
                    nested(
                        leaf(DataType::FLOAT),
                        &[Count::Dim(0), Count::Dim(1), Count::Fixed(nr)],
                    ),
                    "[panels, K, NR]: panel p, row k = W[k, p*NR .. p*NR+NR], zero past N",
                ),
                const_i64(
                    "N",
                    i64::try_from(n).map_err(|_| overflow())?,
                    "columns of the source (before panel padding)",
                ),
            ],
            self.describe(),
        );
        t.decoder = Some(decoder);
        let values = vec![n.div_ceil(nr), k];
        let bits = size_bits(&t, &values).ok_or_else(overflow)?;
        Ok(PackedLayout {
            struct_type: t,
            dims: values,
            payload_len: bits / 8,
        })
    }

    /// The micro-kernel that reads NR-wide panels needs the vector width.
    fn device(&self, params: &Params) -> Result<pb::DeviceProto, PackError> {
        Ok(panel_device(self.panel(params)?))
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
        let nr = self.panel(params)?;
        pack(src.data, us(src.dims[0]), us(src.dims[1]), nr, out);
        Ok(())
    }
}

/// The CPU requirement of NR-wide panels on this ISA family.
pub fn panel_device(nr: usize) -> pb::DeviceProto {
    match (std::env::consts::ARCH, nr) {
        ("x86_64", 32) => cpu_requirement("avx512", &["avx512f"]),
        ("x86_64", 16) => cpu_requirement("avx2", &["avx2", "fma"]),
        ("x86_64", _) => cpu_requirement("avx", &["avx"]),
        ("aarch64", _) => cpu_requirement("neon", &["neon"]),
        _ => cpu_requirement("baseline", &[]),
    }
}

/// Packs W[K, N] (FLOAT raw bytes) into `out` (ceil(N/NR) * K * NR floats).
pub fn pack(src: &[u8], k: usize, n: usize, nr: usize, out: &mut [u8]) {
    let row = 4 * n;
    let panel_bytes = 4 * k * nr;
    // A few panels per work item, filled row by row: each source row is
    // then read in runs of GROUP * NR floats instead of NR.
    const GROUP: usize = 8;
    out.par_chunks_mut(GROUP * panel_bytes)
        .enumerate()
        .for_each(|(g, panels)| {
            let mut dsts: Vec<&mut [u8]> = panels.chunks_mut(panel_bytes).collect();
            for kk in 0..k {
                for (j, panel) in dsts.iter_mut().enumerate() {
                    let c0 = (g * GROUP + j) * nr;
                    let w = nr.min(n - c0);
                    let dst = &mut panel[kk * 4 * nr..(kk + 1) * 4 * nr];
                    dst[..4 * w].copy_from_slice(&src[kk * row + 4 * c0..kk * row + 4 * (c0 + w)]);
                    dst[4 * w..].fill(0);
                }
            }
        });
}

/// Restores W[K, N] (FLOAT raw bytes) from panels: the exact inverse of
/// [`pack`].
pub fn unpack(panels: &[u8], k: usize, n: usize, nr: usize, out: &mut [u8]) {
    out.par_chunks_mut(4 * n).enumerate().for_each(|(kk, dst)| {
        for (p, d) in dst.chunks_mut(4 * nr).enumerate() {
            let at = (p * k + kk) * 4 * nr;
            d.copy_from_slice(&panels[at..at + d.len()]);
        }
    });
}
