//! The onnxruntime compile worker: the process in which ctcached meets an
//! onnxruntime library, so that a crash, hang or leak in it never takes the
//! daemon down.
//!
//! It loads the library the admin configured (`libonnxruntime.so`, as the
//! onnxruntime wheel ships it under `onnxruntime/capi/`), says which
//! runtime it is ([`identify`]), and writes the optimized model of a model
//! it is given as bytes ([`optimize`]): what onnxruntime saves with
//! `optimized_model_filepath` at the level asked. It opens no path but the
//! library and its output descriptor.

use std::ffi::CStr;
use std::path::Path;

pub use ctcache_worker_protocol::{Identity, WorkerError};
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;

/// The oldest onnxruntime the worker drives (its API level).
pub const OLDEST_MINOR: u32 = 24;

/// The optimization levels onnxruntime saves a model at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Level {
    Basic,
    Extended,
    Layout,
    All,
}

impl From<Level> for GraphOptimizationLevel {
    fn from(l: Level) -> Self {
        match l {
            Level::Basic => GraphOptimizationLevel::Level1,
            Level::Extended => GraphOptimizationLevel::Level2,
            Level::Layout => GraphOptimizationLevel::Level3,
            Level::All => GraphOptimizationLevel::All,
        }
    }
}

/// Loads `library` and says which onnxruntime it is.
pub fn identify(library: &Path) -> Result<Identity, WorkerError> {
    let (version, _held) = version_of(library)?;
    load(library)?;
    Ok(Identity {
        runtime: "onnxruntime",
        version,
        build: ort::info().to_string(),
    })
}

/// Writes to `output` the model onnxruntime (`library`) optimizes `model`
/// into at `level`, on the CPU execution provider; says which onnxruntime
/// it was.
pub fn optimize(
    library: &Path,
    level: Level,
    model: &[u8],
    output: &Path,
) -> Result<Identity, WorkerError> {
    let (version, _held) = version_of(library)?;
    let env = load(library)?;
    let refused = |e: &dyn std::fmt::Display| WorkerError::Refused {
        runtime: "onnxruntime",
        said: e.to_string(),
    };
    let builder = Session::builder(&env).map_err(|e| refused(&e))?;
    let builder = builder.with_intra_threads(1).map_err(|e| refused(&e))?;
    let builder = builder
        .with_optimization_level(level.into())
        .map_err(|e| refused(&e))?;
    let mut builder = builder
        .with_optimized_model_path(output)
        .map_err(|e| refused(&e))?;
    builder.commit_from_memory(model).map_err(|e| refused(&e))?;
    // onnxruntime logs a failed save and goes on: an empty output is a
    // failure here, not a form.
    match std::fs::metadata(output) {
        // Which onnxruntime made it: the library at that path may not be
        // the one the daemon identified at start.
        Ok(m) if m.len() > 0 => Ok(Identity {
            runtime: "onnxruntime",
            version,
            build: ort::info().to_string(),
        }),
        Ok(_) => Err(WorkerError::NoOutput {
            form: "optimized model",
            said: "onnxruntime wrote nothing".into(),
        }),
        Err(e) => Err(WorkerError::NoOutput {
            form: "optimized model",
            said: e.to_string(),
        }),
    }
}

/// The library's version string, refused when it is older than the
/// worker's API level or not onnxruntime at all; with the library loaded,
/// so that `ort`'s own load of the same path finds it loaded once.
fn version_of(library: &Path) -> Result<(String, libloading::Library), WorkerError> {
    let not = |reason: String| WorkerError::NotTheRuntime {
        a_runtime: "an onnxruntime",
        path: library.display().to_string(),
        reason,
    };
    // SAFETY: loading runs the library's initializers; the admin named it,
    // and it runs in this worker process only.
    let lib = unsafe { libloading::Library::new(library) }.map_err(|e| not(e.to_string()))?;
    // SAFETY: OrtGetApiBase has this signature in every onnxruntime.
    let get_base = unsafe {
        lib.get::<unsafe extern "C" fn() -> *const ort::sys::OrtApiBase>(b"OrtGetApiBase")
    }
    .map_err(|_| not("it has no OrtGetApiBase".into()))?;
    // SAFETY: OrtGetApiBase returns a pointer to a static table.
    let base = unsafe { get_base() };
    if base.is_null() {
        return Err(not("OrtGetApiBase returned nothing".into()));
    }
    // SAFETY: the table's GetVersionString takes nothing.
    let text = unsafe { ((*base).GetVersionString)() };
    if text.is_null() {
        return Err(not("it has no version string".into()));
    }
    // SAFETY: a non-null version string is a static NUL-terminated string.
    let version = unsafe { CStr::from_ptr(text) }
        .to_str()
        .map_err(|_| not("its version string is not UTF-8".into()))?
        .to_string();
    let minor = version
        .split('.')
        .nth(1)
        .and_then(|m| m.parse::<u32>().ok())
        .ok_or_else(|| not(format!("its version {version:?} is not a version")))?;
    if !version.starts_with("1.") || minor < OLDEST_MINOR {
        return Err(not(format!(
            "it is onnxruntime {version}; ctcache needs 1.{OLDEST_MINOR} or later"
        )));
    }
    Ok((version, lib))
}

/// The onnxruntime environment over `library`.
fn load(library: &Path) -> Result<ort::environment::Environment, WorkerError> {
    let not = |reason: String| WorkerError::NotTheRuntime {
        a_runtime: "an onnxruntime",
        path: library.display().to_string(),
        reason,
    };
    ort::init_from(library)
        .map_err(|e| not(e.to_string()))?
        .with_name("ctcache")
        .build()
        .map_err(|e| not(e.to_string()))
}
