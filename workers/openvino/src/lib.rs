//! The OpenVINO compile worker: the process in which ctcached meets an
//! OpenVINO library, so that a crash, hang or leak in it never takes the
//! daemon down.
//!
//! It loads the C library the admin configured (`libopenvino_c.so`, as the
//! openvino wheel ships it under `openvino/libs/`), says which runtime it
//! is ([`identify`]), and writes the compiled model of an ONNX model it is
//! given as bytes ([`compile`]): what `Core.compile_model(model, device,
//! config)` makes, as `CompiledModel.export_model` writes it, which
//! `Core.import_model` reads back. It opens no path but the library, the
//! plugins beside it and its output descriptor.

use std::ffi::{c_char, CStr, CString};
use std::path::Path;

pub use ctcache_worker_protocol::{Identity, WorkerError};
use openvino_sys as ov;

/// The oldest OpenVINO the worker drives (the C API's element types
/// changed in 2025.1).
pub const OLDEST: (u32, u32) = (2025, 1);

/// Loads `library` and says which OpenVINO it is.
pub fn identify(library: &Path) -> Result<Identity, WorkerError> {
    load(library)
}

/// Writes to `output` the compiled model OpenVINO (`library`) makes of the
/// ONNX `model` for `device` with `config` (property names and values, as
/// `Core.compile_model` takes them); says which OpenVINO it was.
pub fn compile(
    library: &Path,
    device: &str,
    config: &[(String, String)],
    model: &[u8],
    output: &Path,
) -> Result<Identity, WorkerError> {
    let identity = load(library)?;
    let core = Core::new()?;
    let read = core.read_onnx(model)?;
    let compiled = core.compile(&read, device, config)?;
    compiled.export(output)?;
    match std::fs::metadata(output) {
        Ok(m) if m.len() > 0 => Ok(identity),
        Ok(_) => Err(WorkerError::NoOutput {
            form: "compiled model",
            said: "OpenVINO wrote nothing".into(),
        }),
        Err(e) => Err(WorkerError::NoOutput {
            form: "compiled model",
            said: e.to_string(),
        }),
    }
}

/// Loads `library` once it is shown to be an OpenVINO C library recent
/// enough; its identity.
fn load(library: &Path) -> Result<Identity, WorkerError> {
    let not = |reason: String| WorkerError::NotTheRuntime {
        a_runtime: "an OpenVINO C",
        path: library.display().to_string(),
        reason,
    };
    // Asked first with a handle of our own: `openvino-sys` calls into
    // whatever it loads without looking for the symbols.
    let build = {
        // SAFETY: loading runs the library's initializers; the admin named
        // it, and it runs in this worker process only.
        let lib = unsafe { libloading::Library::new(library) }.map_err(|e| not(e.to_string()))?;
        // SAFETY: the C API's version call has this signature.
        let get = unsafe {
            lib.get::<unsafe extern "C" fn(*mut ov::ov_version_t) -> ov::ov_status_e>(
                b"ov_get_openvino_version",
            )
        }
        .map_err(|_| not("it has no ov_get_openvino_version".into()))?;
        // SAFETY: the symbol is OpenVINO's (named by its C API's prefix).
        let free =
            unsafe { lib.get::<unsafe extern "C" fn(*mut ov::ov_version_t)>(b"ov_version_free") }
                .map_err(|_| not("it has no ov_version_free".into()))?;
        let mut v = ov::ov_version_t {
            buildNumber: std::ptr::null(),
            description: std::ptr::null(),
        };
        // SAFETY: `v` is a valid out parameter.
        if unsafe { get(&mut v) } != ov::ov_status_e::OK || v.buildNumber.is_null() {
            return Err(not("it reports no version".into()));
        }
        // SAFETY: a non-null build number is a NUL-terminated string the
        // library owns until ov_version_free.
        let text = unsafe { CStr::from_ptr(v.buildNumber) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: `v` came from ov_get_openvino_version.
        unsafe { free(&mut v) };
        text
    };
    let version = build.split('-').next().unwrap_or_default().to_string();
    let mut parts = version.split('.').map(str::parse::<u32>);
    let (Some(Ok(year)), Some(Ok(minor))) = (parts.next(), parts.next()) else {
        return Err(not(format!("its version {build:?} is not a version")));
    };
    if (year, minor) < OLDEST {
        return Err(not(format!(
            "it is OpenVINO {version}; ctcache needs {}.{} or later",
            OLDEST.0, OLDEST.1
        )));
    }
    ov::library::load_from(library).map_err(not)?;
    // The release is the build number up to its first `-`; the whole
    // build number is what `openvino.get_version()` reports.
    Ok(Identity {
        runtime: "openvino",
        version,
        build,
    })
}

/// OpenVINO's words for its last failure.
fn last_error(what: &str, status: ov::ov_status_e) -> String {
    // SAFETY: the message is a thread-local string OpenVINO owns (or null).
    let msg = unsafe { ov::ov_get_last_err_msg() };
    let said = if msg.is_null() {
        String::new()
    } else {
        // SAFETY: non-null: NUL-terminated.
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .trim()
            .to_string()
    };
    if said.is_empty() {
        format!("{what}: {status:?}")
    } else {
        format!("{what}: {said}")
    }
}

/// Turns a status into OpenVINO's refusal.
fn check(what: &str, status: ov::ov_status_e) -> Result<(), WorkerError> {
    if status == ov::ov_status_e::OK {
        Ok(())
    } else {
        Err(WorkerError::Refused {
            runtime: "OpenVINO",
            said: last_error(what, status),
        })
    }
}

fn c_string(what: &str, s: &str) -> Result<CString, WorkerError> {
    CString::new(s).map_err(|_| WorkerError::Refused {
        runtime: "OpenVINO",
        said: format!("{what} {s:?} holds a NUL"),
    })
}

/// An `ov_core_t`, freed when dropped.
struct Core(*mut ov::ov_core_t);

/// An `ov_model_t`, freed when dropped.
struct Model(*mut ov::ov_model_t);

/// An `ov_compiled_model_t`, freed when dropped.
struct Compiled(*mut ov::ov_compiled_model_t);

impl Core {
    fn new() -> Result<Core, WorkerError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out parameter.
        check("creating the core", unsafe { ov::ov_core_create(&mut p) })?;
        Ok(Core(p))
    }

    /// The model of ONNX bytes (its weights inside: OpenVINO would look
    /// for external data by path, and the worker is given none).
    fn read_onnx(&self, model: &[u8]) -> Result<Model, WorkerError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `model` outlives the call; ONNX takes no weights tensor.
        let status = unsafe {
            ov::ov_core_read_model_from_memory_buffer(
                self.0,
                model.as_ptr().cast::<c_char>(),
                model.len(),
                std::ptr::null(),
                &mut p,
            )
        };
        check("reading the model", status)?;
        Ok(Model(p))
    }

    fn compile(
        &self,
        model: &Model,
        device: &str,
        config: &[(String, String)],
    ) -> Result<Compiled, WorkerError> {
        let device = c_string("device", device)?;
        let pairs = config
            .iter()
            .map(|(k, v)| Ok((c_string("property", k)?, c_string("value", v)?)))
            .collect::<Result<Vec<_>, WorkerError>>()?;
        let props: Vec<ov::ov_property_t> = pairs
            .iter()
            .map(|(k, v)| ov::ov_property_t {
                key: k.as_ptr(),
                value: v.as_ptr().cast(),
            })
            .collect();
        let mut p = std::ptr::null_mut();
        // SAFETY: every pointer outlives the call (`pairs` holds the
        // strings `props` points into).
        let status = unsafe {
            ov::ov_core_compile_model_props(
                self.0,
                model.0,
                device.as_ptr(),
                props.len(),
                if props.is_empty() {
                    std::ptr::null()
                } else {
                    props.as_ptr()
                },
                &mut p,
            )
        };
        check("compiling the model", status)?;
        Ok(Compiled(p))
    }
}

impl Compiled {
    fn export(&self, output: &Path) -> Result<(), WorkerError> {
        let path = c_string("output", &output.display().to_string())?;
        // SAFETY: `path` outlives the call.
        let status = unsafe { ov::ov_compiled_model_export_model(self.0, path.as_ptr()) };
        if status == ov::ov_status_e::OK {
            Ok(())
        } else {
            Err(WorkerError::NoOutput {
                form: "compiled model",
                said: last_error("export_model", status),
            })
        }
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // SAFETY: made by ov_core_create, freed once.
        unsafe { ov::ov_core_free(self.0) }
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: made by ov_core_read_model_*, freed once.
        unsafe { ov::ov_model_free(self.0) }
    }
}

impl Drop for Compiled {
    fn drop(&mut self) {
        // SAFETY: made by ov_core_compile_model_*, freed once.
        unsafe { ov::ov_compiled_model_free(self.0) }
    }
}
