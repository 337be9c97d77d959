//! The extension point: a [`Packer`] turns one source tensor (canonical raw
//! form) into one compiled payload and describes that payload's physical
//! type (D4).

use ctcache::dtype::DataType;
use ctcache::pb;

use crate::error::PackError;
use crate::isa::Isa;
use crate::params::{ParamSpec, Params};

/// A source tensor in canonical raw form: row-major, fixed-width
/// little-endian elements (the ONNX `raw_data` form, D3).
#[derive(Debug, Clone, Copy)]
pub struct SourceTensor<'a> {
    /// Element type of the source.
    pub data_type: DataType,
    /// The source's shape, outermost first.
    pub dims: &'a [u64],
    /// The raw bytes: product of `dims` times the element size.
    pub data: &'a [u8],
}

/// What a packer produces for a given source shape and parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedLayout {
    /// The concrete root type (a structure of named fields), with `name`,
    /// `metadata_props` and `dims_param` set.
    pub struct_type: pb::StructTypeProto,
    /// `StructProto.dims`: one value per `dims_param`, in order.
    pub dims: Vec<u64>,
    /// Exact payload length in bytes.
    pub payload_len: u64,
}

/// How a packer reads a 2-D weight a MatMul or Gemm uses: what the policy
/// needs to know to pack a weight the graph reads transposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Orientation {
    /// The layout does not depend on which axis is K (elementwise casts,
    /// blocks along the stored last axis): the weight is packed as stored.
    AsStored,
    /// The source is the logical MatMul B, W[K, N]; a weight stored as
    /// W[N, K] cannot be packed.
    KnOnly,
    /// The source is W[K, N], or W[N, K] with `transposed=true`.
    KnOrTransposed,
}

/// A source-to-payload transformation with a versioned, named output type.
///
/// Implementations are stateless; every method may be called from any
/// thread. `pack` writes exactly `output(..).payload_len` bytes into a
/// caller-provided buffer (for example a mapped payload file), so there is
/// no second full copy of the payload.
pub trait Packer: Send + Sync {
    /// Stable identifier, e.g. `ort.matmul_nbits`; also the
    /// `ctcache.packer` metadata of every output type.
    fn id(&self) -> &'static str;
    /// `ctcache.format_version` of the output types this build writes.
    fn format_version(&self) -> u32;
    /// One line for humans.
    fn describe(&self) -> &'static str;
    /// Accepted parameters, their allowed values and defaults.
    fn param_spec(&self) -> &'static [ParamSpec];
    /// Refuses (with the reason) a source this packer cannot handle.
    fn check_source(
        &self,
        data_type: DataType,
        dims: &[u64],
        params: &Params,
    ) -> Result<(), PackError>;
    /// The output type, its `dims` and the payload length.
    fn output(
        &self,
        data_type: DataType,
        dims: &[u64],
        params: &Params,
    ) -> Result<PackedLayout, PackError>;
    /// How it reads a MatMul weight (see [`Orientation`]).
    fn orientation(&self) -> Orientation {
        Orientation::AsStored
    }
    /// Whether the wgpu backend has a kernel for it (for FLOAT sources).
    fn has_gpu_kernel(&self) -> bool {
        false
    }
    /// What a device must offer to consume the payload (D5).
    fn device(&self, params: &Params) -> Result<pb::DeviceProto, PackError> {
        let _ = params;
        Ok(crate::device::portable_cpu())
    }
    /// Packs with an explicit kernel instruction set (every set gives the
    /// same bytes; tests use this to cover each path).
    fn pack_with(
        &self,
        src: &SourceTensor<'_>,
        params: &Params,
        out: &mut [u8],
        isa: Isa,
    ) -> Result<(), PackError>;
    /// Packs with the best kernel for this CPU.
    fn pack(
        &self,
        src: &SourceTensor<'_>,
        params: &Params,
        out: &mut [u8],
    ) -> Result<(), PackError> {
        self.pack_with(src, params, out, Isa::detect())
    }
}

/// Checks the lengths of `src.data` and `out` against the expected sizes.
pub(crate) fn check_lengths(
    src: &SourceTensor<'_>,
    out: &[u8],
    payload_len: u64,
) -> Result<(), PackError> {
    let n = crate::util::numel(src.dims).ok_or(PackError::SizeMismatch {
        what: "source data",
        expected: u64::MAX,
        actual: src.data.len() as u64,
    })?;
    let expected = src.data_type.raw_size(n).ok_or(PackError::SizeMismatch {
        what: "source data",
        expected: u64::MAX,
        actual: src.data.len() as u64,
    })?;
    if expected != src.data.len() as u64 {
        return Err(PackError::SizeMismatch {
            what: "source data",
            expected,
            actual: src.data.len() as u64,
        });
    }
    if payload_len != out.len() as u64 {
        return Err(PackError::SizeMismatch {
            what: "output buffer",
            expected: payload_len,
            actual: out.len() as u64,
        });
    }
    Ok(())
}

/// Fails unless `isa` runs on this CPU.
pub(crate) fn check_isa(isa: Isa) -> Result<(), PackError> {
    if isa.available() {
        Ok(())
    } else {
        Err(PackError::IsaUnavailable(isa))
    }
}
