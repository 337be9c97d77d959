//! The runtimes the admin configured (`ort_library`): each is met only in
//! its own worker process (`ctcache-onnxruntime-worker`, beside
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

use ctcache::forms::RuntimeIdentity;

use crate::config::Config;

/// A configured runtime and what its worker found.
pub(crate) struct Configured {
    /// `onnxruntime`.
    pub name: &'static str,
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

    /// Has the worker optimize `model` at `level` into `out`, within
    /// `limit`: which onnxruntime made it, and the CPU time it used;
    /// dropping the future kills the worker.
    pub(crate) async fn optimize(
        &self,
        level: &str,
        model: Bytes,
        out: &std::fs::File,
        limit: Duration,
    ) -> (Result<RuntimeIdentity, CompileFailure>, Duration) {
        worker::optimize(worker::ONNXRUNTIME, &self.library, level, model, out, limit).await
    }
}

/// The configured runtimes.
#[derive(Default)]
pub(crate) struct Runtimes {
    pub onnxruntime: Option<Arc<Configured>>,
}

impl Runtimes {
    pub(crate) fn of(config: &Config) -> Runtimes {
        Runtimes {
            onnxruntime: config.ort_library.clone().map(|library| {
                Arc::new(Configured {
                    name: "onnxruntime",
                    library,
                    found: OnceCell::new(),
                })
            }),
        }
    }

    /// What status shows of every configured runtime.
    pub(crate) fn reports(&self) -> Vec<Report> {
        self.onnxruntime.iter().map(|c| c.report()).collect()
    }

    /// Has each configured library identified by its worker, in the
    /// background; the outcome is logged and kept for status.
    pub(crate) fn identify_in_background(&self) {
        if let Some(c) = self.onnxruntime.clone() {
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
    let identity = worker::identify(worker::ONNXRUNTIME, &c.library).await?;
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
