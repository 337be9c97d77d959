//! CUDA devices through NVML, loaded at run time (`libnvidia-ml.so.1`, part
//! of the NVIDIA driver). No library, no driver or any NVML failure means
//! "no CUDA devices": detection never fails or panics.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use ctcache::pb;

/// The NVML library name on Linux (the driver installs it).
pub(super) const LIBRARY: &str = "libnvidia-ml.so.1";

const SUCCESS: c_int = 0;
/// NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE and
/// NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE are 96, 96 and 80: one size fits.
const BUF: usize = 128;

type Device = *mut c_void;
type Init = unsafe extern "C" fn() -> c_int;
type Count = unsafe extern "C" fn(*mut c_uint) -> c_int;
type Handle = unsafe extern "C" fn(c_uint, *mut Device) -> c_int;
type DevString = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> c_int;
type Capability = unsafe extern "C" fn(Device, *mut c_int, *mut c_int) -> c_int;
type SysString = unsafe extern "C" fn(*mut c_char, c_uint) -> c_int;

/// The CUDA devices NVML reports through the library at `path`.
pub(super) fn cuda_devices(path: &str) -> Vec<pb::DeviceProto> {
    // SAFETY: loading NVML runs its (driver-provided) initializers; the
    // symbols are called with the signatures of nvml.h and buffers of the
    // sizes passed.
    unsafe { query(path) }.unwrap_or_default()
}

/// A function pointer of type `T` (which must match the symbol's C type).
fn get<T: Copy>(lib: &libloading::Library, name: &str) -> Option<T> {
    // SAFETY: the caller names T as the symbol's nvml.h signature.
    unsafe { lib.get::<T>(name) }.ok().map(|s| *s)
}

unsafe fn query(path: &str) -> Option<Vec<pb::DeviceProto>> {
    let lib = unsafe { libloading::Library::new(path) }.ok()?;
    let init: Init = get(&lib, "nvmlInit_v2")?;
    let shutdown: Init = get(&lib, "nvmlShutdown")?;
    let count: Count = get(&lib, "nvmlDeviceGetCount_v2")?;
    let handle: Handle = get(&lib, "nvmlDeviceGetHandleByIndex_v2")?;
    let name: DevString = get(&lib, "nvmlDeviceGetName")?;
    let uuid: DevString = get(&lib, "nvmlDeviceGetUUID")?;
    let cap: Capability = get(&lib, "nvmlDeviceGetCudaComputeCapability")?;
    let driver: SysString = get(&lib, "nvmlSystemGetDriverVersion")?;
    if unsafe { init() } != SUCCESS {
        return None;
    }
    let text = |f: &dyn Fn(*mut c_char, c_uint) -> c_int| -> String {
        let mut buf = [0 as c_char; BUF];
        if f(buf.as_mut_ptr(), BUF as c_uint) != SUCCESS {
            return String::new();
        }
        buf[BUF - 1] = 0;
        // SAFETY: NUL-terminated above at the latest.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    };
    let driver_version = text(&|p, n| unsafe { driver(p, n) });
    let mut n: c_uint = 0;
    let mut out = Vec::new();
    if unsafe { count(&mut n) } == SUCCESS {
        for i in 0..n {
            let mut d: Device = std::ptr::null_mut();
            if unsafe { handle(i, &mut d) } != SUCCESS {
                continue;
            }
            let (mut major, mut minor) = (0, 0);
            if unsafe { cap(d, &mut major, &mut minor) } != SUCCESS {
                continue;
            }
            let props = [
                ("cuda.driver_version", driver_version.clone()),
                ("cuda.name", text(&|p, n| unsafe { name(d, p, n) })),
                ("cuda.uuid", text(&|p, n| unsafe { uuid(d, p, n) })),
            ];
            out.push(pb::DeviceProto {
                r#type: "cuda".into(),
                index: i32::try_from(i).ok(),
                architecture: format!("sm_{major}{minor}"),
                runtime: String::new(),
                runtime_version: String::new(),
                metadata_props: props
                    .into_iter()
                    .map(|(k, v)| pb::StringStringEntryProto {
                        key: k.into(),
                        value: v,
                    })
                    .collect(),
            });
        }
    }
    unsafe { shutdown() };
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in NVML with two devices, built with the system C compiler.
    const FAKE: &str = r#"
#include <string.h>
typedef void *dev;
static int inited;
int nvmlInit_v2(void) { inited = 1; return 0; }
int nvmlShutdown(void) { inited = 0; return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 2; return inited ? 0 : 1; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, dev *d) { *d = (dev)(long)(i + 1); return 0; }
int nvmlDeviceGetName(dev d, char *s, unsigned n) {
  strncpy(s, (long)d == 1 ? "NVIDIA H200" : "NVIDIA L4", n); return 0; }
int nvmlDeviceGetUUID(dev d, char *s, unsigned n) {
  strncpy(s, (long)d == 1 ? "GPU-aaaa" : "GPU-bbbb", n); return 0; }
int nvmlDeviceGetCudaComputeCapability(dev d, int *ma, int *mi) {
  *ma = (long)d == 1 ? 9 : 8; *mi = (long)d == 1 ? 0 : 9; return 0; }
int nvmlSystemGetDriverVersion(char *s, unsigned n) { strncpy(s, "570.86.15", n); return 0; }
"#;

    #[test]
    fn fake_nvml() {
        let dir = std::env::temp_dir().join(format!("ctcache-nvml-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = dir.join("fake.c");
        let so = dir.join("libfake-nvml.so");
        std::fs::write(&c, FAKE).unwrap();
        let built = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&so)
            .arg(&c)
            .status();
        if !built.is_ok_and(|s| s.success()) {
            println!("skipped: no C compiler to build a stand-in NVML");
            return;
        }
        // A cross-compiled run (e.g. the aarch64 suite under qemu) builds
        // the stand-in with the host's `cc`, for another machine: it cannot
        // be loaded here, so skip. The ELF header's e_machine (bytes 18..20)
        // tells; x86-64 and native aarch64 runs still take the test.
        let machine = std::fs::read(&so)
            .ok()
            .and_then(|b| b.get(18..20).map(|m| u16::from_le_bytes([m[0], m[1]])));
        let want = match std::env::consts::ARCH {
            "x86_64" => Some(62),
            "aarch64" => Some(183),
            _ => None,
        };
        if want.is_some() && machine != want {
            std::fs::remove_dir_all(&dir).ok();
            println!("skipped: the stand-in NVML was built for another machine ({machine:?})");
            return;
        }
        let devs = cuda_devices(so.to_str().unwrap());
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(devs.len(), 2);
        assert_eq!(devs[0].r#type, "cuda");
        assert_eq!(devs[0].index, Some(0));
        assert_eq!(devs[0].architecture, "sm_90");
        assert_eq!(devs[1].architecture, "sm_89");
        let meta: Vec<(&str, &str)> = devs[1]
            .metadata_props
            .iter()
            .map(|p| (p.key.as_str(), p.value.as_str()))
            .collect();
        assert_eq!(
            meta,
            [
                ("cuda.driver_version", "570.86.15"),
                ("cuda.name", "NVIDIA L4"),
                ("cuda.uuid", "GPU-bbbb"),
            ]
        );
    }
}
