//! What ctcached and its runtime workers agree on, whichever runtime: a
//! worker prints the identity of the runtime it loaded as one JSON line,
//! reads the model on its standard input, writes the form to descriptor 3
//! (the one file the daemon gives it), and says how it failed by its exit
//! status.

use std::io::Read;
use std::process::ExitCode;

use serde::Serialize;

mod crash;
pub use crash::name_crashes_near_the_bound;

/// The output descriptor, as a runtime opens a path.
pub const OUTPUT: &str = "/proc/self/fd/3";

/// The runtime a library is, as it reports itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Identity {
    /// `onnxruntime` or `openvino`.
    pub runtime: &'static str,
    /// Its version, e.g. `1.32.0` or `2026.4.1`.
    pub version: String,
    /// Its build string, as its Python module reports it too.
    pub build: String,
}

/// What can go wrong in a worker, by who is to act on it.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The library is not a runtime this worker can drive (`a_runtime`:
    /// "an onnxruntime", "an OpenVINO C").
    #[error("{path} is not {a_runtime} library ctcache can use: {reason}")]
    NotTheRuntime {
        a_runtime: &'static str,
        path: String,
        reason: String,
    },
    /// The runtime refuses the model or its options (its words).
    #[error("{runtime} refuses the model: {said}")]
    Refused { runtime: &'static str, said: String },
    /// The form did not reach the output.
    #[error("the {form} was not written: {said}")]
    NoOutput { form: &'static str, said: String },
}

impl WorkerError {
    /// How the daemon is told: a refusal in the words of a failed
    /// allocation is the worker's memory bound (RLIMIT_DATA) reached, not
    /// the model's fault.
    pub fn failure(&self) -> Failure {
        match self {
            WorkerError::NotTheRuntime { .. } => Failure::NotTheRuntime,
            WorkerError::Refused { said, .. } if out_of_memory(said) => Failure::OutOfMemory,
            WorkerError::Refused { .. } => Failure::Refused,
            WorkerError::NoOutput { .. } => Failure::NoOutput,
        }
    }
}

/// Whether a runtime's words are those of a failed allocation (C++'s
/// `std::bad_alloc`, as onnxruntime and OpenVINO pass it on).
fn out_of_memory(said: &str) -> bool {
    ["bad_alloc", "bad allocation"]
        .iter()
        .any(|w| said.contains(w))
}

/// How a worker failed, as its exit status says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// 1: the form was not written (or the model not read).
    NoOutput = 1,
    /// 2: the library is not a usable runtime.
    NotTheRuntime = 2,
    /// 3: the runtime refuses the model or its options.
    Refused = 3,
    /// 4: an allocation failed: the worker reached its memory bound.
    OutOfMemory = 4,
}

/// A compile option that is not `NAME=VALUE`.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not NAME=VALUE")]
pub struct NotAnOption(pub String);

/// A compile option as the daemon passes it on the command line,
/// `NAME=VALUE`.
pub fn option(s: &str) -> Result<(String, String), NotAnOption> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| NotAnOption(s.to_string()))
}

/// The model on standard input, once descriptor 3 is shown to be a file;
/// `what` names the form in the message.
pub fn model_in(what: &str) -> Result<Vec<u8>, ExitCode> {
    if !std::fs::metadata(OUTPUT).is_ok_and(|m| m.is_file()) {
        eprintln!("the {what} was not written: descriptor 3 is not a file");
        return Err(ExitCode::from(Failure::NoOutput as u8));
    }
    let mut model = Vec::new();
    if let Err(e) = std::io::stdin().lock().read_to_end(&mut model) {
        eprintln!("reading the model: {e}");
        let failure = if e.kind() == std::io::ErrorKind::OutOfMemory {
            Failure::OutOfMemory
        } else {
            Failure::NoOutput
        };
        return Err(ExitCode::from(failure as u8));
    }
    Ok(model)
}

/// The worker's end: the identity printed, or the error said with its
/// exit status.
pub fn finish(done: Result<Identity, WorkerError>) -> ExitCode {
    match done {
        Ok(id) => {
            println!("{}", serde_json::to_string(&id).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(e.failure() as u8)
        }
    }
}
