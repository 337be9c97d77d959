//! The GPU backend of a build without the `wgpu` feature: never available.

use super::{AdapterSummary, GpuError};
use crate::{Params, SourceTensor};

/// Placeholder with the API of the wgpu backend; cannot be constructed.
#[derive(Debug)]
pub struct GpuBackend {
    _never: std::convert::Infallible,
}

fn unavailable() -> GpuError {
    GpuError::Unavailable("this build has no wgpu backend (cargo feature `wgpu` is off)".into())
}

impl GpuBackend {
    /// Always fails: no backend in this build.
    pub fn new() -> Result<GpuBackend, GpuError> {
        Err(unavailable())
    }

    /// Always fails: no backend in this build.
    pub fn shared() -> Result<&'static GpuBackend, GpuError> {
        Err(unavailable())
    }

    /// Unreachable: no value of this type exists.
    pub fn adapter_info(&self) -> &AdapterSummary {
        match self._never {}
    }

    /// No packer runs on the GPU in this build.
    pub fn supports(packer_id: &str) -> bool {
        let _ = packer_id;
        false
    }

    /// Unreachable: no value of this type exists.
    pub fn pack(
        &self,
        packer_id: &str,
        src: &SourceTensor<'_>,
        params: &Params,
        out: &mut [u8],
    ) -> Result<(), GpuError> {
        let _ = (packer_id, src, params, out);
        match self._never {}
    }
}
