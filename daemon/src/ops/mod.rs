//! The daemon's use cases, one per file: core types in and out, a
//! [`Caller`](crate::caller::Caller) for who asks, and one [`Error`] whose
//! kind means something to the caller. Nothing here knows gRPC: the RPC
//! edge (`rpc/`) decodes a request, calls one use case and encodes its
//! answer. Rules live in the core; use cases apply them for a caller.

pub(crate) mod compile;
pub(crate) mod embed;
pub(crate) mod follow;
pub(crate) mod gc;
pub(crate) mod import;
pub(crate) mod lookup;
pub(crate) mod materialize;
pub(crate) mod model;
pub(crate) mod pack;
pub(crate) mod payload_access;
pub(crate) mod progress;
pub(crate) mod put;
pub(crate) mod remote;
pub(crate) mod resolve;
pub(crate) mod scan;
pub(crate) mod serve;
pub(crate) mod status;
pub(crate) mod watch;

pub(crate) use crate::error::{Error, Result};
use ctcache::hit::MissReason;

/// Why nothing usable was found: one of the core's reasons (its code is
/// the stable part) and the sentence for this case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Miss {
    pub reason: MissReason,
    pub detail: String,
}

impl Miss {
    /// A reason with a sentence of this use case's own (e.g. which format
    /// is not packed yet).
    pub fn new(reason: MissReason, detail: impl Into<String>) -> Miss {
        Miss {
            reason,
            detail: detail.into(),
        }
    }

    /// The stable reason code.
    pub fn code(&self) -> &'static str {
        self.reason.code()
    }
}

impl From<MissReason> for Miss {
    fn from(reason: MissReason) -> Miss {
        let detail = reason.detail();
        Miss { reason, detail }
    }
}

/// Runs blocking work (file I/O, hashing, packing) off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    // The request's payer (see `cpu_budget`) is charged the thread's CPU.
    let payer = crate::cpu_budget::Payer::current();
    tokio::task::spawn_blocking(move || match payer {
        Some(p) => p.run(f),
        None => f(),
    })
    .await
    .map_err(|e| Error::internal(format!("worker failed: {e}")))?
}
