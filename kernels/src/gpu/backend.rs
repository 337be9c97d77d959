//! The wgpu device: adapter choice and the compute pipelines (the entry
//! point that hands a request to a format's driver is `entry.rs`).

use std::borrow::Cow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use super::{AdapterSummary, GpuError};

/// Source bytes per chunk unless the adapter allows less: large enough
/// that per-chunk round trips are negligible, small enough to bound the
/// device memory of one pack.
pub(super) const DEFAULT_CHUNK: u64 = 64 << 20;
/// Smallest chunk: one block of 256 FLOAT rows of one column.
pub(super) const MIN_CHUNK: u64 = 1024;
/// Invocations per workgroup (the shaders' `@workgroup_size`).
pub(super) const WORKGROUP: u32 = 64;

/// The compute kernels, one entry point each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kernel {
    NbitsStats,
    NbitsCodes,
    GgmlStats,
    GgmlCodes,
    CastF16,
}

const KERNELS: [Kernel; 5] = [
    Kernel::NbitsStats,
    Kernel::NbitsCodes,
    Kernel::GgmlStats,
    Kernel::GgmlCodes,
    Kernel::CastF16,
];

impl Kernel {
    fn entry(self) -> &'static str {
        match self {
            Kernel::NbitsStats => "nbits_stats",
            Kernel::NbitsCodes => "nbits_codes",
            Kernel::GgmlStats => "ggml_stats",
            Kernel::GgmlCodes => "ggml_codes",
            Kernel::CastF16 => "cast_f16",
        }
    }

    fn source(self) -> &'static str {
        match self {
            Kernel::NbitsStats | Kernel::NbitsCodes => include_str!("shaders/nbits.wgsl"),
            Kernel::GgmlStats | Kernel::GgmlCodes => include_str!("shaders/ggml.wgsl"),
            Kernel::CastF16 => include_str!("shaders/cast.wgsl"),
        }
    }
}

/// A wgpu device with the packing pipelines. Cheap to share (`&self`
/// everywhere, thread-safe); creating one compiles the shaders, so most
/// callers use [`GpuBackend::shared`].
pub struct GpuBackend {
    pub(super) device: wgpu::Device,
    pub(super) queue: wgpu::Queue,
    pub(super) layout: wgpu::BindGroupLayout,
    pipelines: Vec<wgpu::ComputePipeline>,
    info: AdapterSummary,
    /// Largest buffer this device binds (storage binding and buffer limit).
    pub(super) max_binding: u64,
    pub(super) max_groups: u32,
}

impl std::fmt::Debug for GpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBackend")
            .field("info", &self.info)
            .field("max_binding", &self.max_binding)
            .finish_non_exhaustive()
    }
}

static SHARED: OnceLock<Result<GpuBackend, GpuError>> = OnceLock::new();

impl GpuBackend {
    /// Opens the best adapter: a real GPU before a software one, Vulkan
    /// before GL; only adapters that run compute shaders count.
    pub fn new() -> Result<GpuBackend, GpuError> {
        // wgpu and drivers may panic on odd systems; that means "no GPU".
        catch_unwind(AssertUnwindSafe(open)).unwrap_or_else(|p| {
            let why = p
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("panic");
            Err(GpuError::Unavailable(format!(
                "wgpu panicked while opening a device: {why}"
            )))
        })
    }

    /// The process-wide backend, opened on first use (adapter and shader
    /// creation take a while); the error is kept too.
    pub fn shared() -> Result<&'static GpuBackend, GpuError> {
        SHARED
            .get_or_init(GpuBackend::new)
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The adapter this backend runs on.
    pub fn adapter_info(&self) -> &AdapterSummary {
        &self.info
    }

    /// Whether this backend has a kernel for `packer_id`.
    pub fn supports(packer_id: &str) -> bool {
        super::supports(packer_id)
    }

    pub(super) fn pipeline(&self, k: Kernel) -> &wgpu::ComputePipeline {
        let i = KERNELS.iter().position(|&x| x == k).expect("every kernel");
        &self.pipelines[i]
    }
}

/// Adapter preference: lower is better.
fn rank(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let t = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let b = match info.backend {
        wgpu::Backend::Vulkan => 0,
        wgpu::Backend::Metal => 1,
        wgpu::Backend::Dx12 => 2,
        wgpu::Backend::Gl => 3,
        _ => 4,
    };
    (t, b)
}

/// Every backend of this build (Vulkan, GL), unless `WGPU_BACKEND` names
/// some (e.g. `gl`).
pub(super) fn backends() -> wgpu::Backends {
    wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all())
}

/// A new instance over [`backends`].
pub(super) fn instance() -> wgpu::Instance {
    #[cfg(target_os = "linux")]
    super::wayland_log::route_to_debug_log();
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends();
    // No validation layers: they cost time and are not installed in
    // production; wgpu's own validation stays on.
    desc.flags = wgpu::InstanceFlags::empty();
    wgpu::Instance::new(desc)
}

pub(super) fn summary(info: &wgpu::AdapterInfo) -> AdapterSummary {
    AdapterSummary {
        name: info.name.clone(),
        vendor: info.vendor,
        device: info.device,
        backend: info.backend.to_str().to_string(),
        device_type: device_type(info.device_type).to_string(),
        driver: info.driver.clone(),
        driver_info: info.driver_info.clone(),
    }
}

pub(super) fn device_type(t: wgpu::DeviceType) -> &'static str {
    match t {
        wgpu::DeviceType::Other => "other",
        wgpu::DeviceType::IntegratedGpu => "integrated_gpu",
        wgpu::DeviceType::DiscreteGpu => "discrete_gpu",
        wgpu::DeviceType::VirtualGpu => "virtual_gpu",
        wgpu::DeviceType::Cpu => "cpu",
    }
}

fn open() -> Result<GpuBackend, GpuError> {
    let instance = instance();
    let adapter = pollster::block_on(instance.enumerate_adapters(backends()))
        .into_iter()
        .filter(|a| {
            a.get_downlevel_capabilities()
                .flags
                .contains(wgpu::DownlevelFlags::COMPUTE_SHADERS)
        })
        .min_by_key(|a| rank(&a.get_info()))
        .ok_or_else(|| GpuError::Unavailable("no wgpu adapter with compute shaders".into()))?;
    let info = adapter.get_info();
    let limits = adapter.limits();
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("ctcache"),
        required_limits: limits.clone(),
        memory_hints: wgpu::MemoryHints::MemoryUsage,
        ..Default::default()
    }))
    .map_err(|e| GpuError::Unavailable(format!("{}: {e}", info.name)))?;
    // Errors are caught by the error scopes of each pack; anything else
    // must not panic the process (the default handler does).
    device.on_uncaptured_error(std::sync::Arc::new(|e| {
        let _ = e;
    }));
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let layout = bind_group_layout(&device);
    let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some("ctcache"),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    let common = include_str!("shaders/common.wgsl");
    let pipelines = KERNELS
        .iter()
        .map(|k| {
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(k.entry()),
                source: wgpu::ShaderSource::Wgsl(Cow::Owned(format!("{common}\n{}", k.source()))),
            });
            device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(k.entry()),
                layout: Some(&pl),
                module: &module,
                entry_point: Some(k.entry()),
                compilation_options: Default::default(),
                cache: None,
            })
        })
        .collect();
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(GpuError::Unavailable(format!(
            "{}: shaders do not compile: {e}",
            info.name
        )));
    }
    Ok(GpuBackend {
        device,
        queue,
        layout,
        pipelines,
        info: summary(&info),
        max_binding: limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size)
            & !255,
        max_groups: limits.max_compute_workgroups_per_dimension,
    })
}

/// src, aux (read), dst, fix (read-write), cfg (uniform).
fn bind_group_layout(device: &wgpu::Device) -> wgpu::BindGroupLayout {
    let storage = |binding, read_only| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    };
    device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some("ctcache"),
        entries: &[
            storage(0, true),
            storage(1, true),
            storage(2, false),
            storage(3, false),
            wgpu::BindGroupLayoutEntry {
                binding: 4,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Uniform,
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            },
        ],
    })
}
