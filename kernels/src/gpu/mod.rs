//! GPU packers through wgpu compute shaders (cargo feature `wgpu`, on by
//! default) and detection of the host's GPUs (wgpu adapters, CUDA devices
//! through NVML).
//!
//! The GPU path gives the same bytes as the CPU packers for every input.
//! Shaders do the bulk work (block statistics, codes, conversions) with
//! integer operations wherever bits depend on them; the few float products
//! whose rounding a GPU may not honour (fused multiply-add, flushed
//! denormals) are flagged when they fall near a rounding boundary and are
//! redone by the CPU packer, which stays the single definition of each
//! format's arithmetic. Blocks with NaN, infinities or denormals are packed
//! by the CPU packer outright. See `nbits.rs`, `ggml.rs` and `cast.rs`.
//!
//! Without the feature, or without a usable adapter, [`GpuBackend::new`]
//! returns [`GpuError::Unavailable`] and callers use the CPU.

pub mod devices;
mod nvml;

#[cfg(feature = "wgpu")]
mod backend;
#[cfg(feature = "wgpu")]
mod cast;
#[cfg(feature = "wgpu")]
mod chunk;
#[cfg(feature = "wgpu")]
mod entry;
#[cfg(feature = "wgpu")]
mod ggml;
#[cfg(feature = "wgpu")]
mod nbits;
#[cfg(feature = "wgpu")]
mod session;
#[cfg(not(feature = "wgpu"))]
mod stub;
#[cfg(all(feature = "wgpu", target_os = "linux"))]
mod wayland_log;

#[cfg(all(test, feature = "wgpu"))]
mod tests;

#[cfg(feature = "wgpu")]
pub use backend::GpuBackend;
#[cfg(not(feature = "wgpu"))]
pub use stub::GpuBackend;

use ctcache::dtype::DataType;

use crate::{PackError, Packer, Params, SourceTensor};

/// Why the GPU path could not pack.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// No usable adapter, or this build has no wgpu backend.
    #[error("no GPU backend: {0}")]
    Unavailable(String),
    /// The GPU path has no kernel for this packer, source type or setting.
    #[error("the GPU path does not support {packer} for this source: {reason}")]
    Unsupported {
        /// Id of the packer that was asked for.
        packer: String,
        /// What the GPU path lacks for it.
        reason: String,
    },
    /// The packer refused the source or the parameters (as on the CPU).
    #[error(transparent)]
    Pack(#[from] PackError),
    /// The device failed (validation, out of memory, lost device).
    #[error("GPU device error: {0}")]
    Device(String),
}

/// What identifies the adapter a [`GpuBackend`] runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterSummary {
    /// The adapter's name as the driver reports it.
    pub name: String,
    /// PCI vendor id (or a driver-specific id for software adapters).
    pub vendor: u32,
    /// PCI device id (or a driver-specific id for software adapters).
    pub device: u32,
    /// `vulkan`, `gl`, ...
    pub backend: String,
    /// `discrete_gpu`, `integrated_gpu`, `virtual_gpu`, `cpu`, `other`.
    pub device_type: String,
    /// Driver name, e.g. `NVIDIA` or `llvmpipe`.
    pub driver: String,
    /// Driver version details, free-form.
    pub driver_info: String,
}

/// Where a pack runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The CPU packers (best instruction set of this CPU).
    Cpu,
    /// The shared wgpu backend ([`GpuBackend::shared`]).
    Wgpu,
}

impl Backend {
    /// The name used in config, flags and logs: `cpu` or `wgpu`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Wgpu => "wgpu",
        }
    }

    /// Parses a [`Backend::name`]; `None` for any other string.
    pub fn from_name(name: &str) -> Option<Backend> {
        match name {
            "cpu" => Some(Backend::Cpu),
            "wgpu" => Some(Backend::Wgpu),
            _ => None,
        }
    }
}

/// Whether the GPU path has a kernel for `packer_id` (for some sources):
/// the packer says so ([`Packer::has_gpu_kernel`](crate::Packer::has_gpu_kernel)).
pub fn supports(packer_id: &str) -> bool {
    cfg!(feature = "wgpu") && crate::find(packer_id).is_some_and(|p| p.has_gpu_kernel())
}

/// Whether the GPU path packs this source: a supported packer and a FLOAT
/// source (FLOAT16 sources go to the CPU).
pub fn supports_source(packer_id: &str, data_type: DataType) -> bool {
    supports(packer_id) && data_type == DataType::FLOAT
}

/// Packs on `backend`: the CPU packer, or the shared GPU backend (which
/// fails with [`GpuError::Unavailable`] / [`GpuError::Unsupported`] rather
/// than falling back, so that callers know where the bytes came from).
pub fn pack_on(
    backend: Backend,
    packer: &dyn Packer,
    src: &SourceTensor<'_>,
    params: &Params,
    out: &mut [u8],
) -> Result<(), GpuError> {
    match backend {
        Backend::Cpu => Ok(packer.pack(src, params, out)?),
        Backend::Wgpu => GpuBackend::shared()?.pack(packer.id(), src, params, out),
    }
}

/// Packs on the GPU when it can, else on the CPU; returns where it ran.
/// Device failures also fall back to the CPU (the bytes are the same).
pub fn pack_auto(
    packer: &dyn Packer,
    src: &SourceTensor<'_>,
    params: &Params,
    out: &mut [u8],
) -> Result<Backend, PackError> {
    if supports_source(packer.id(), src.data_type) {
        if let Ok(gpu) = GpuBackend::shared() {
            match gpu.pack(packer.id(), src, params, out) {
                Ok(()) => return Ok(Backend::Wgpu),
                Err(GpuError::Pack(e)) => return Err(e),
                Err(_) => {}
            }
        }
    }
    packer.pack(src, params, out)?;
    Ok(Backend::Cpu)
}

/// Work the GPU path handed to the CPU packer since the process started
/// (all threads): elements near a rounding boundary, blocks with NaN,
/// infinities or denormals, chunks with too many of the former. For
/// diagnostics, benchmarks and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuAssist {
    /// Elements packed on the CPU because they lie near a rounding boundary.
    pub elements: u64,
    /// Blocks packed on the CPU because they hold NaN, infinities or denormals.
    pub blocks: u64,
    /// Chunks handed whole to the CPU because too many of their elements needed it.
    pub chunks: u64,
}

static ASSIST: [std::sync::atomic::AtomicU64; 3] = [
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
    std::sync::atomic::AtomicU64::new(0),
];

/// The counts so far.
pub fn cpu_assist() -> CpuAssist {
    let get = |i: usize| ASSIST[i].load(std::sync::atomic::Ordering::Relaxed);
    CpuAssist {
        elements: get(0),
        blocks: get(1),
        chunks: get(2),
    }
}

#[cfg(feature = "wgpu")]
fn note_assist(elements: usize, blocks: usize, chunks: usize) {
    for (i, n) in [elements, blocks, chunks].into_iter().enumerate() {
        ASSIST[i].fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }
}
