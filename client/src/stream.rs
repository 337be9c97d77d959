//! Server-streamed answers (Prepack progress, Events, payload chunks) with
//! errors already mapped to [`Error`].

use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{Error, Result};

/// A stream of messages from one RPC.
pub struct MessageStream<T> {
    inner: tonic::Streaming<T>,
    rpc: &'static str,
    socket: Arc<PathBuf>,
}

impl<T> MessageStream<T> {
    pub(crate) fn new(inner: tonic::Streaming<T>, rpc: &'static str, socket: Arc<PathBuf>) -> Self {
        MessageStream { inner, rpc, socket }
    }

    /// The next message; `None` once the daemon ended the stream.
    pub async fn next(&mut self) -> Result<Option<T>> {
        self.inner
            .message()
            .await
            .map_err(|s| Error::from_status(&self.socket, self.rpc, s))
    }
}
