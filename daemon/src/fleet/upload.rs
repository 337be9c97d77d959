//! Write-back: one task drains the bounded upload queue, payload first,
//! manifest last (the commit point; readers ignore a payload without one).
//! Overwrites are harmless (content addressing), so nothing relies on
//! put-if-absent, which some servers ignore.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use ctcache::store::{Entry, Payload};
use ctcache_remote::client::RemoteError;
use ctcache_remote::manifest;
use tokio::sync::mpsc;

use super::Shared;

/// One entry to upload, its payload mapped when it was queued (the mapping
/// stays valid if the entry is removed meanwhile).
pub(super) struct Job {
    pub entry: Entry,
    pub params: BTreeMap<String, String>,
    pub payload: Payload,
}

/// A mapped payload as the bytes of a request body, without a copy.
struct Mapped(Payload);

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

pub(super) async fn run(shared: Arc<Shared>, mut rx: mpsc::Receiver<Job>) {
    while let Some(job) = rx.recv().await {
        metrics::gauge!("ctcache_remote_upload_queue").set(rx.len() as f64);
        let key = job.entry.key;
        match upload(&shared, job).await {
            Ok(Some(bytes)) => {
                shared.answered();
                shared.counters.uploaded(bytes);
                tracing::debug!(%key, bytes, "uploaded");
            }
            Ok(None) => {}
            Err(e) => {
                shared.counters.error("upload");
                shared.failed(&format!("remote upload of {key} failed: {e}"));
            }
        }
    }
}

/// Uploads one entry; `None` when it is too large to share.
pub(super) async fn upload(s: &Shared, job: Job) -> Result<Option<u64>, RemoteError> {
    let Some(key_file) = &s.settings.signing_key else {
        return Ok(None);
    };
    let len = job.entry.payload.len;
    if len > s.settings.config.max_object_bytes {
        return Ok(None);
    }
    let record = manifest::describe(&job.entry, &job.params, env!("CARGO_PKG_VERSION"))
        .map_err(|e| RemoteError::Config(e.to_string()))?;
    let sealed = manifest::seal(&record, Some(key_file));
    let key = job.entry.key;
    s.client
        .put_payload(&key, Bytes::from_owner(Mapped(job.payload)))
        .await?;
    s.client.put_manifest(&key, sealed).await?;
    Ok(Some(len))
}
