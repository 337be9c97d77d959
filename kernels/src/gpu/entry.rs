//! The GPU backend's entry point: validates a request and hands it to the
//! format's driver (`nbits`, `ggml`, `cast`), which runs on the device of
//! `backend.rs`.

use ctcache::dtype::DataType;

use super::backend::{GpuBackend, DEFAULT_CHUNK, MIN_CHUNK};
use super::{cast, ggml, nbits, GpuError};
use crate::error::PackError;
use crate::packer::check_lengths;
use crate::{Params, SourceTensor};

impl GpuBackend {
    /// Packs like the CPU packer `packer_id` (same bytes), in chunks that
    /// fit the device.
    pub fn pack(
        &self,
        packer_id: &str,
        src: &SourceTensor<'_>,
        params: &Params,
        out: &mut [u8],
    ) -> Result<(), GpuError> {
        self.pack_chunked(packer_id, src, params, out, DEFAULT_CHUNK)
    }

    /// [`GpuBackend::pack`] with at most `chunk_bytes` source bytes on the
    /// device at a time (clamped to the device's limits); for tests and
    /// tuning.
    pub fn pack_chunked(
        &self,
        packer_id: &str,
        src: &SourceTensor<'_>,
        params: &Params,
        out: &mut [u8],
        chunk_bytes: u64,
    ) -> Result<(), GpuError> {
        let packer =
            crate::find(packer_id).ok_or_else(|| PackError::UnknownPacker(packer_id.into()))?;
        let layout = packer.output(src.data_type, src.dims, params)?;
        check_lengths(src, out, layout.payload_len)?;
        let unsupported = |reason: &str| GpuError::Unsupported {
            packer: packer_id.to_string(),
            reason: reason.to_string(),
        };
        if !super::supports(packer_id) {
            return Err(unsupported("no GPU kernel for this packer"));
        }
        if src.data_type != DataType::FLOAT {
            return Err(unsupported("only FLOAT sources have a GPU kernel"));
        }
        let chunk = chunk_bytes.min(self.max_binding).max(MIN_CHUNK);
        match packer_id {
            "ort.matmul_nbits" => nbits::pack(self, packer, src, params, out, chunk),
            "ggml.q8_0" | "ggml.q4_0" => ggml::pack(self, packer, src, params, out, chunk),
            "cast.f16" => cast::pack(self, packer, src, out, chunk),
            _ => Err(unsupported("no GPU kernel for this packer")),
        }
    }
}
