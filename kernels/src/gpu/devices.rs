//! The host's GPUs as D5 `DeviceProto`s: one per wgpu adapter (type
//! `wgpu`, architecture `<vendor>-<device>` in lowercase hex) and one per
//! CUDA device found through NVML (type `cuda`, architecture
//! `sm_<major><minor>`). Detection runs once per process, never fails and
//! never panics: anything that goes wrong means "no such device".

use std::sync::OnceLock;

use ctcache::pb;

/// wgpu adapters, then CUDA devices (detected once).
pub fn gpu_devices() -> &'static [pb::DeviceProto] {
    static DEVICES: OnceLock<Vec<pb::DeviceProto>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let mut v = wgpu_devices();
        v.extend(cuda_devices());
        v
    })
}

/// One device per wgpu adapter, `index` = the adapter's ordinal.
pub fn wgpu_devices() -> Vec<pb::DeviceProto> {
    #[cfg(feature = "wgpu")]
    {
        std::panic::catch_unwind(wgpu_adapters).unwrap_or_default()
    }
    #[cfg(not(feature = "wgpu"))]
    Vec::new()
}

/// One device per CUDA GPU that NVML reports (none without the driver).
pub fn cuda_devices() -> Vec<pb::DeviceProto> {
    std::panic::catch_unwind(|| super::nvml::cuda_devices(super::nvml::LIBRARY)).unwrap_or_default()
}

/// Metadata entries sorted by key.
pub(super) fn props(mut kv: Vec<(&str, String)>) -> Vec<pb::StringStringEntryProto> {
    kv.sort_by(|a, b| a.0.cmp(b.0));
    kv.into_iter()
        .map(|(k, v)| pb::StringStringEntryProto {
            key: k.to_string(),
            value: v,
        })
        .collect()
}

#[cfg(feature = "wgpu")]
fn wgpu_adapters() -> Vec<pb::DeviceProto> {
    let instance = super::backend::instance();
    let adapters = pollster::block_on(instance.enumerate_adapters(super::backend::backends()));
    adapters
        .iter()
        .enumerate()
        .map(|(i, a)| wgpu_device(i, &super::backend::summary(&a.get_info())))
        .collect()
}

/// The `DeviceProto` of adapter number `index`.
pub fn wgpu_device(index: usize, a: &super::AdapterSummary) -> pb::DeviceProto {
    pb::DeviceProto {
        r#type: "wgpu".into(),
        index: i32::try_from(index).ok(),
        architecture: format!("{:04x}-{:04x}", a.vendor, a.device),
        runtime: String::new(),
        runtime_version: String::new(),
        metadata_props: props(vec![
            (ctcache::device::WGPU_BACKEND_KEY, a.backend.clone()),
            ("wgpu.driver", a.driver.clone()),
            ("wgpu.driver_info", a.driver_info.clone()),
            ("wgpu.device_type", a.device_type.clone()),
            (ctcache::device::WGPU_NAME_KEY, a.name.clone()),
        ]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wgpu_device_shape() {
        let a = super::super::AdapterSummary {
            name: "llvmpipe".into(),
            vendor: 0x10005,
            device: 0,
            backend: "vulkan".into(),
            device_type: "cpu".into(),
            driver: "llvmpipe".into(),
            driver_info: "Mesa".into(),
        };
        let d = wgpu_device(2, &a);
        assert_eq!(d.r#type, "wgpu");
        assert_eq!(d.index, Some(2));
        assert_eq!(d.architecture, "10005-0000");
        let keys: Vec<&str> = d.metadata_props.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "wgpu.backend",
                "wgpu.device_type",
                "wgpu.driver",
                "wgpu.driver_info",
                "wgpu.name"
            ]
        );
    }

    #[test]
    fn detection_is_cached_and_typed() {
        let t = std::time::Instant::now();
        let a = gpu_devices();
        println!("detected in {:?}: {a:#?}", t.elapsed());
        let b = gpu_devices();
        assert!(std::ptr::eq(a, b));
        for d in a {
            assert!(d.r#type == "wgpu" || d.r#type == "cuda", "{d:?}");
        }
    }

    #[test]
    fn missing_nvml_means_no_cuda() {
        assert!(super::super::nvml::cuda_devices("/nonexistent/libnvidia-ml.so.1").is_empty());
    }
}
