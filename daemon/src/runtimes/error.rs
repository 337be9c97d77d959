//! Why a configured runtime cannot be used.

use std::path::PathBuf;
use std::time::Duration;

/// What stands between the daemon and a configured runtime library.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum RuntimeProblem {
    #[error("the worker {name} is not installed beside ctcached ({dir})")]
    NoWorker { name: &'static str, dir: String },
    #[error("the daemon's own path: {0}")]
    OwnPath(String),
    #[error("starting {name}: {problem}")]
    Start { name: &'static str, problem: String },
    #[error("{name} did not identify {} within {limit:?}", library.display())]
    Timeout {
        name: &'static str,
        library: PathBuf,
        limit: Duration,
    },
    /// The worker's own words (it names the library and what it is not).
    #[error("{0}")]
    Refused(String),
    #[error("{name} answered no identity: {problem}")]
    NoIdentity { name: &'static str, problem: String },
    #[error("reading {}: {problem}", library.display())]
    Read { library: PathBuf, problem: String },
}

/// Why a worker made no form.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum CompileFailure {
    /// The runtime refused the model: its own words.
    #[error("{0}")]
    Refused(String),
    #[error("{name} ran past its limit of {limit:?}")]
    Timeout { name: &'static str, limit: Duration },
    /// An allocation failed in the worker: its memory bound was reached.
    #[error("{name} ran out of its memory bound (RLIMIT_DATA {limit_gib} GiB): {said}")]
    OutOfMemory {
        name: &'static str,
        limit_gib: u64,
        said: String,
    },
    #[error("{name} made no form ({status}){}{said}", if said.is_empty() { "" } else { ": " })]
    Failed {
        name: &'static str,
        status: String,
        said: String,
    },
    #[error(transparent)]
    Start(RuntimeProblem),
}
