//! Compiling one initializer of a model: copy its canonical raw form out of
//! the mapping, digest that copy (D3), pack it, and describe the result for
//! the store and for the model rewrite.

use std::time::{Duration, Instant};

use bytes::Bytes;
use ctcache::digest::{self, Algorithm, SourceDigest};
use ctcache::hit::SourceShape;
use ctcache::onnx::{rewrite, Model, TensorRef};
use ctcache::pb;

use crate::{OutputBuffer, PackError, PackedLayout, Packer, Params, SourceTensor};

/// Why an initializer could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The model could not be read, digested or rewritten.
    #[error("{0}")]
    Model(#[from] ctcache::Error),
    /// The packer refused or failed on one initializer.
    #[error("{name}: {source}")]
    Pack {
        /// The initializer's name.
        name: String,
        /// Why the packer refused it.
        source: PackError,
    },
    /// The initializer's bytes no longer hash to the digest the caller took
    /// (the file was written since): nothing is packed.
    #[error("{name}: the source changed since its digest was taken")]
    SourceChanged {
        /// The initializer's name.
        name: String,
    },
    /// The wgpu backend was asked for explicitly and could not pack this initializer.
    #[error("{name}: wgpu backend: {message}")]
    Gpu {
        /// The initializer's name.
        name: String,
        /// The GPU error, as text.
        message: String,
    },
}

/// One packed initializer.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The initializer's name in the source model.
    pub source_name: String,
    /// Canonical digest of the source tensor (D3), part of the store key.
    pub digest: SourceDigest,
    /// The source's data type and dims (the store records them, D9).
    pub source_shape: SourceShape,
    /// The output type, its dims and the payload length.
    pub layout: PackedLayout,
    /// What a device must offer to consume the payload (D5).
    pub device: pb::DeviceProto,
    /// The packed bytes, exactly `layout.payload_len` long.
    pub payload: Bytes,
    /// Id of the packer that produced it, e.g. `ort.matmul_nbits`.
    pub packer_id: &'static str,
    /// The packer's `ctcache.format_version`.
    pub packer_version: u32,
    /// Wall time of the pack alone (not the digest or the raw-form read).
    pub duration: Duration,
    /// The backend that packed it.
    pub backend: crate::Backend,
}

/// Checks that `packer` accepts `t` with `params`, without packing.
pub fn accepts(t: &TensorRef, packer: &dyn Packer, params: &Params) -> Result<(), PackError> {
    packer.check_source(t.data_type, &t.dims, params)
}

/// Which backend packs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// The CPU packers.
    Cpu,
    /// wgpu only; an error when it cannot pack this source.
    Wgpu,
    /// wgpu when a hardware adapter can pack this source, else the CPU (a
    /// software adapter is slower than the CPU packers, so it is not used).
    Auto,
}

/// Packs `t` of `model` on the CPU (see [`compile_on`] for `expected`).
pub fn compile(
    model: &Model,
    t: &TensorRef,
    expected: Option<SourceDigest>,
    packer: &dyn Packer,
    params: &Params,
) -> Result<Compiled, CompileError> {
    compile_on(model, t, expected, packer, params, BackendChoice::Cpu)
}

/// True when a hardware GPU adapter is available to the wgpu backend.
pub fn hardware_gpu() -> bool {
    crate::gpu::GpuBackend::shared()
        .map(|g| g.adapter_info().device_type != "cpu")
        .unwrap_or(false)
}

/// Packs `t` of `model` with the chosen backend. `expected` is a digest of
/// `t` the caller took earlier (its store key): the pack is refused with
/// [`CompileError::SourceChanged`] unless the bytes packed hash to it.
pub fn compile_on(
    model: &Model,
    t: &TensorRef,
    expected: Option<SourceDigest>,
    packer: &dyn Packer,
    params: &Params,
    choice: BackendChoice,
) -> Result<Compiled, CompileError> {
    compile_held(model, t, expected, packer, params, choice).map(|(c, _share)| c)
}

/// [`compile_on`], the pack's share of the budget (crate::copies), shrunk
/// to the payload, handed to the caller with it: a caller that stores the
/// payload before
/// it packs again (the daemon's workers) keeps the payload counted until it
/// is stored by dropping the share then. A caller that keeps payloads of
/// several packs must not hold their shares: the next pack would wait for
/// them.
pub fn compile_held(
    model: &Model,
    t: &TensorRef,
    expected: Option<SourceDigest>,
    packer: &dyn Packer,
    params: &Params,
    choice: BackendChoice,
) -> Result<(Compiled, crate::copies::Share), CompileError> {
    let pack_err = |source| CompileError::Pack {
        name: t.name.clone(),
        source,
    };
    packer
        .check_source(t.data_type, &t.dims, params)
        .map_err(pack_err)?;
    let layout = packer
        .output(t.data_type, &t.dims, params)
        .map_err(pack_err)?;
    let device = packer.device(params).map_err(pack_err)?;
    // The bytes hashed are the bytes packed: one private copy. The model's
    // mapping shows writes made after `expected` was taken, and a pack read
    // from it could store other bytes under that digest. Packs side by side
    // hold at most the budget of such copies and their payloads
    // (crate::copies).
    let raw_len = digest::raw_len(t)?;
    let mut share = crate::copies::take((raw_len as u64).saturating_add(layout.payload_len));
    let mut raw = OutputBuffer::reusable(raw_len);
    digest::raw_copy_into(model, t, &mut raw)?;
    let alg = expected.map_or(Algorithm::Blake3, |d| d.algorithm);
    let digest = digest::digest_raw(t.data_type, &t.dims, &raw, alg);
    if expected.is_some_and(|e| e != digest) {
        return Err(CompileError::SourceChanged {
            name: t.name.clone(),
        });
    }
    let started = Instant::now();
    let src = SourceTensor {
        data_type: t.data_type,
        dims: &t.dims,
        data: &raw,
    };
    // Large payloads get huge pages, reused across packs (crate::buffer).
    // The CPU packers write every byte; the GPU path gets zeroed memory.
    let len = usize::try_from(layout.payload_len).map_err(|_| {
        pack_err(PackError::Overflow {
            packer: packer.id(),
            dims: t.dims.clone(),
        })
    })?;
    let mut payload = match choice {
        BackendChoice::Cpu => OutputBuffer::reusable(len),
        BackendChoice::Wgpu | BackendChoice::Auto => OutputBuffer::zeroed(len),
    };
    let backend = match choice {
        BackendChoice::Cpu => {
            packer.pack(&src, params, &mut payload).map_err(pack_err)?;
            crate::Backend::Cpu
        }
        BackendChoice::Wgpu => {
            crate::pack_on(crate::Backend::Wgpu, packer, &src, params, &mut payload).map_err(
                |e| CompileError::Gpu {
                    name: t.name.clone(),
                    message: e.to_string(),
                },
            )?;
            crate::Backend::Wgpu
        }
        BackendChoice::Auto if hardware_gpu() => {
            crate::gpu::pack_auto(packer, &src, params, &mut payload).map_err(pack_err)?
        }
        BackendChoice::Auto => {
            packer.pack(&src, params, &mut payload).map_err(pack_err)?;
            crate::Backend::Cpu
        }
    };
    // The source copy goes now; a caller holding the share holds the payload.
    drop(raw);
    share.shrink_to(layout.payload_len);
    let compiled = Compiled {
        source_name: t.name.clone(),
        digest,
        source_shape: SourceShape {
            data_type: t.data_type,
            dims: t.dims.clone(),
        },
        layout,
        device,
        payload: payload.into_bytes(),
        packer_id: packer.id(),
        packer_version: packer.format_version(),
        duration: started.elapsed(),
        backend,
    };
    Ok((compiled, share))
}

impl Compiled {
    /// The entry to embed into a model with the byte-preserving rewrite.
    pub fn to_embedded(&self) -> rewrite::NewEntry {
        rewrite::NewEntry {
            source_name: self.source_name.clone(),
            device: self.device.clone(),
            struct_type: self.layout.struct_type.clone(),
            dims: self.layout.dims.clone(),
            payload: self.payload.clone(),
            source_digest: self.digest.bytes.to_vec(),
            digest_algorithm: self.digest.algorithm.name().to_string(),
            metadata_props: Vec::new(),
        }
    }
}

/// The devices of this host (D5): the CPU first, then one device per wgpu
/// adapter, then the CUDA GPUs NVML reports. GPU detection runs once per
/// process and never fails (no driver means no such devices).
pub fn host_devices() -> Vec<pb::DeviceProto> {
    let mut v = vec![ctcache::device::host_cpu()];
    v.extend_from_slice(crate::gpu::devices::gpu_devices());
    v
}
