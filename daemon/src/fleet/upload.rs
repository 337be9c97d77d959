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
pub(super) struct Upload {
    entry: Entry,
    params: BTreeMap<String, String>,
    /// The mapping as a request body, shared by each send without a copy.
    payload: Bytes,
}

impl Upload {
    pub(super) fn new(entry: Entry, params: BTreeMap<String, String>, payload: Payload) -> Upload {
        Upload {
            entry,
            params,
            payload: Bytes::from_owner(Mapped(payload)),
        }
    }
}

/// Entries uploaded together, in order: a runtime form's weights, then
/// the form, whose manifest is the commit point of them all. The first
/// failure ends the job, so no form goes up without its weights.
pub(super) struct Job(pub Vec<Upload>);

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
        let Some(key) = job.0.last().map(|u| u.entry.key) else {
            continue;
        };
        match upload_all(&shared, &job).await {
            Ok(Some(bytes)) => {
                shared.answered();
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

/// Uploads a job's entries in order, each counted; the bytes sent, or
/// `None` when one is too large to share (then the rest stay here: a form
/// never goes up without its weights). A job whose request was not
/// answered in time is sent once more from the entry it stopped at: a
/// server that stalls once (a node's loss, a failover) mostly answers the
/// next, and overwrites are harmless (object_store has retried the other
/// transient failures).
pub(super) async fn upload_all(s: &Shared, job: &Job) -> Result<Option<u64>, RemoteError> {
    let mut done = Done::default();
    match send_rest(s, job, &mut done).await {
        Err(e @ RemoteError::Timeout(_)) => {
            if let Some(last) = job.0.last() {
                let key = last.entry.key;
                tracing::info!(%key, "remote upload: {e}; sending it again");
            }
            send_rest(s, job, &mut done).await
        }
        sent => sent,
    }
}

/// How far the sends of one job got: its entries up (or found up), and
/// the bytes sent.
#[derive(Default)]
struct Done {
    entries: usize,
    bytes: u64,
}

/// Sends the job's entries `done` does not count yet. An entry before the
/// last that this host signed on the remote already (a weight shared with
/// another form) is not sent again.
async fn send_rest(s: &Shared, job: &Job, done: &mut Done) -> Result<Option<u64>, RemoteError> {
    let last = job.0.last().map(|u| u.entry.key);
    for one in &job.0[done.entries..] {
        let key = one.entry.key;
        if Some(key) != last && signed_here(s, &key).await? {
            done.entries += 1;
            continue;
        }
        let Some(bytes) = upload(s, one).await? else {
            if let Some(form) = last.filter(|l| *l != key) {
                tracing::info!(
                    %form,
                    weight = %key,
                    max_object_bytes = s.settings.config.max_object_bytes,
                    "a runtime form stays on this host: one of its weights is too large to share"
                );
            }
            return Ok(None);
        };
        s.counters.uploaded(bytes);
        done.entries += 1;
        done.bytes += bytes;
    }
    Ok(Some(done.bytes))
}

/// Whether the remote holds `key` under a manifest this host signed (then
/// its payload went up before it).
async fn signed_here(s: &Shared, key: &ctcache::store::EntryKey) -> Result<bool, RemoteError> {
    let Some(own) = &s.settings.signing_key else {
        return Ok(false);
    };
    let Some(bytes) = s.client.manifest(key).await? else {
        return Ok(false);
    };
    let trust = manifest::Trust::new(vec![own.public()]);
    let max = s.settings.config.max_object_bytes;
    Ok(manifest::open(&bytes, &trust, key, max).is_ok())
}

/// Uploads one entry; `None` when it is too large to share.
async fn upload(s: &Shared, one: &Upload) -> Result<Option<u64>, RemoteError> {
    let Some(key_file) = &s.settings.signing_key else {
        return Ok(None);
    };
    let len = one.entry.payload.len;
    if len > s.settings.config.max_object_bytes {
        return Ok(None);
    }
    let record = manifest::describe(&one.entry, &one.params, env!("CARGO_PKG_VERSION"))
        .map_err(|e| RemoteError::Config(e.to_string()))?;
    let sealed = manifest::seal(&record, Some(key_file));
    let key = one.entry.key;
    s.client.put_payload(&key, one.payload.clone()).await?;
    s.client.put_manifest(&key, sealed).await?;
    Ok(Some(len))
}
