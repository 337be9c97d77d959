//! The daemon's use cases, one per file: core types in and out, a
//! [`Caller`](crate::caller::Caller) for who asks, and one [`Error`] whose
//! kind means something to the caller. Nothing here knows gRPC: the RPC
//! edge (`rpc/`) decodes a request, calls one use case and encodes its
//! answer. Rules live in the core; use cases apply them for a caller.

pub(crate) mod embed;
pub(crate) mod gc;
pub(crate) mod import;
pub(crate) mod lookup;
pub(crate) mod materialize;
pub(crate) mod model;
mod output;
pub(crate) mod pack;
pub(crate) mod payload;
pub(crate) mod progress;
pub(crate) mod put;
pub(crate) mod remote;
pub(crate) mod resolve;
pub(crate) mod scan;
pub(crate) mod status;
pub(crate) mod watch;

pub(crate) use crate::error::{Error, Result};

/// Why nothing usable was found: a stable reason code and a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Miss {
    pub reason: &'static str,
    pub detail: String,
}

impl Miss {
    pub fn new(reason: &'static str, detail: impl Into<String>) -> Miss {
        Miss {
            reason,
            detail: detail.into(),
        }
    }
}

/// Runs blocking work (file I/O, hashing, packing) off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::internal(format!("worker failed: {e}")))?
}
