//! The runtimes the admin configured (`ort_library`, `openvino_library`):
//! each is met only in its own worker process
//! (`ctcache-onnxruntime-worker`, `ctcache-openvino-worker`, beside
//! `ctcached`), never loaded by the daemon. At start the worker says which
//! runtime the library is; `ctcachectl status` shows it, or why it cannot
//! be used, and everything else is served either way.

mod error;
mod worker;

pub(crate) use error::{CompileFailure, RuntimeProblem};

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::OnceCell;

use ctcache::forms::{FormKey, RuntimeIdentity};

use crate::config::Config;

/// A configured runtime and what its worker found.
pub(crate) struct Configured {
    /// `onnxruntime` or `openvino`.
    pub name: &'static str,
    /// Its worker's file name.
    worker: &'static str,
    /// The library as configured.
    pub library: PathBuf,
    /// Set once the worker has answered.
    found: OnceCell<Result<Identified, RuntimeProblem>>,
}

/// A library the worker identified.
#[derive(Debug, Clone)]
pub(crate) struct Identified {
    pub identity: RuntimeIdentity,
    /// The library file's blake3 (provenance: which file made a form).
    pub library_blake3: String,
}

/// What status shows of one runtime.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub name: &'static str,
    pub library: PathBuf,
    /// `None` while the worker has not answered.
    pub found: Option<Result<Identified, RuntimeProblem>>,
}

impl Configured {
    pub(crate) fn report(&self) -> Report {
        Report {
            name: self.name,
            library: self.library.clone(),
            found: self.found.get().cloned(),
        }
    }

    /// The library as its worker identified it, waiting for the worker
    /// when it has not answered yet.
    pub(crate) async fn identified(&self) -> Result<Identified, RuntimeProblem> {
        self.found
            .get_or_init(|| identify_and_log(self))
            .await
            .clone()
    }

    /// Has the worker make the form of `key` of `model` into `out`, within
    /// `limit`: which runtime made it, and the CPU time it used; dropping
    /// the future kills the worker.
    pub(crate) async fn compile(
        &self,
        key: &FormKey,
        model: Bytes,
        out: &std::fs::File,
        limit: Duration,
    ) -> (Result<RuntimeIdentity, CompileFailure>, Duration) {
        let args = worker::compile_args(self.worker, key);
        worker::compile(self.worker, &self.library, args, model, out, limit).await
    }
}

/// The configured runtimes.
#[derive(Default)]
pub(crate) struct Runtimes {
    pub onnxruntime: Option<Arc<Configured>>,
    pub openvino: Option<Arc<Configured>>,
}

impl Runtimes {
    pub(crate) fn of(config: &Config) -> Runtimes {
        let configured = |name, worker, library: &Option<PathBuf>| {
            library.clone().map(|library| {
                Arc::new(Configured {
                    name,
                    worker,
                    library,
                    found: OnceCell::new(),
                })
            })
        };
        Runtimes {
            onnxruntime: configured("onnxruntime", worker::ONNXRUNTIME, &config.ort_library),
            openvino: configured("openvino", worker::OPENVINO, &config.openvino_library),
        }
    }

    /// The runtime of that name, when configured.
    pub(crate) fn named(&self, name: &str) -> Option<&Arc<Configured>> {
        match name {
            "onnxruntime" => self.onnxruntime.as_ref(),
            "openvino" => self.openvino.as_ref(),
            _ => None,
        }
    }

    fn all(&self) -> impl Iterator<Item = &Arc<Configured>> {
        self.onnxruntime.iter().chain(self.openvino.iter())
    }

    /// What status shows of every configured runtime.
    pub(crate) fn reports(&self) -> Vec<Report> {
        self.all().map(|c| c.report()).collect()
    }

    /// Has each configured library identified by its worker, in the
    /// background; the outcome is logged and kept for status.
    pub(crate) fn identify_in_background(&self) {
        for c in self.all() {
            let c = c.clone();
            tokio::spawn(async move {
                let _ = c.identified().await;
            });
        }
    }
}

/// [`identify`], logged.
async fn identify_and_log(c: &Configured) -> Result<Identified, RuntimeProblem> {
    let found = identify(c).await;
    match &found {
        Ok(id) => tracing::info!(
            runtime = c.name,
            version = %id.identity.version,
            build = %id.identity.build,
            library = %c.library.display(),
            "runtime ready"
        ),
        Err(why) => tracing::warn!(
            runtime = c.name,
            library = %c.library.display(),
            "{why}; runtime forms of {} are off, everything else is served",
            c.name
        ),
    }
    found
}

async fn identify(c: &Configured) -> Result<Identified, RuntimeProblem> {
    let identity = worker::identify(c.worker, &c.library).await?;
    let library = c.library.clone();
    let read = |problem: String| RuntimeProblem::Read {
        library: c.library.clone(),
        problem,
    };
    // Read, not mapped: a library cut short meanwhile is an error, not a
    // SIGBUS in the daemon.
    let library_blake3 = tokio::task::spawn_blocking(move || {
        let mut h = blake3::Hasher::new();
        std::fs::File::open(&library).and_then(|f| {
            h.update_reader(f)
                .map(|h| h.finalize().to_hex().to_string())
        })
    })
    .await
    .map_err(|e| read(e.to_string()))?
    .map_err(|e| read(e.to_string()))?;
    Ok(Identified {
        identity,
        library_blake3,
    })
}
