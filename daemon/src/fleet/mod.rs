//! The daemon's side of the fleet tier (`[remote]`): read-through on a
//! local miss and write-back after a local pack. The remote can only ever
//! save work: any timeout, error or doubtful byte is a miss with a named
//! reason, and the pack job goes on to pack locally.

mod costs;
mod counters;
mod fetch;
mod forms;
mod upload;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::locks::lock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ctcache::store::{Entry, EntryKey, Payload, Store, StoreError};
use ctcache_remote::breaker::{Breaker, NegativeCache};
use ctcache_remote::client::{Client, RemoteError};
use ctcache_remote::config::{RemoteConfig, Settings};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use crate::error::{Error, RunError};

pub(crate) use counters::Snapshot;
pub(crate) use forms::FormShape;

use costs::Costs;
use counters::Counters;

/// What the fleet tier shares between the pack jobs and the upload task.
struct Shared {
    settings: Settings,
    client: Client,
    counters: Counters,
    /// A failure is logged at warn once until the next success.
    warned: AtomicBool,
    /// The last failed request; cleared by an answer.
    last_error: Mutex<String>,
}

/// The local tensor an entry is fetched for: the store records its shape,
/// its name and the model it came from.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    pub shape: ctcache::hit::SourceShape,
    pub names: Vec<String>,
    pub model_paths: Vec<String>,
}

/// The fleet tier of a running daemon.
pub(crate) struct Fleet {
    shared: Arc<Shared>,
    rt: Handle,
    guard: Mutex<(Breaker, NegativeCache)>,
    costs: Mutex<Costs>,
    /// Keys whose remote entry failed an audit.
    quarantined: Mutex<HashSet<EntryKey>>,
    uploads: Option<mpsc::Sender<upload::Job>>,
    last_drop_log: Mutex<Option<Instant>>,
}

/// What `status` shows of the fleet tier.
#[derive(Debug)]
pub(crate) struct Report {
    pub remote: String,
    pub read: bool,
    pub write: bool,
    pub fetch: String,
    pub breaker: &'static str,
    pub last_error: String,
    pub queue_depth: u64,
    pub queue_capacity: u64,
    pub counters: Snapshot,
    /// (format, backend, pack bytes/s) and the remote's bytes/s, as measured.
    pub pack_rates: Vec<(String, String, f64)>,
    pub remote_rate: Option<f64>,
    /// Whether the remote answered a probe (`None`: not probed).
    pub reachable: Option<Result<(), RemoteError>>,
    /// The labels of the keys trusted for packs, and for runtime forms.
    pub trusted_keys: Vec<String>,
    pub trusted_form_keys: Vec<String>,
}

/// How this host would pack an entry: the cost rule weighs the measured
/// throughput of `format` on `backend` against the remote's, and an audit
/// packs it again.
pub(crate) struct Packing<'a> {
    pub format: &'a str,
    /// The backend the job would pack on (`cpu`, `wgpu`).
    pub backend: &'a str,
    /// Packs the entry here; its payload bytes.
    pub repack: &'a Repack<'a>,
}

/// Packs an entry on this host (for an audit): its payload bytes, or why
/// the pack failed.
pub(crate) type Repack<'a> = dyn Fn() -> Result<Bytes, Error> + 'a;

/// Who decides whether a local miss asks the remote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// `fetch` in the config (the cost rule under `auto`).
    CostRule,
    /// Always (an explicit `remote pull`).
    Always,
}

/// What `push` did with one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    Uploaded(u64),
    /// The remote has its manifest already.
    Present,
    /// Over `max_object_bytes`.
    TooLarge,
}

/// Why `remote push` did not upload an entry.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PushError {
    #[error("no signing_key_file: this host does not upload")]
    NoSigningKey,
    #[error("write = false in [remote]")]
    WriteOff,
    #[error("{0}")]
    Remote(#[from] RemoteError),
    #[error("{0}")]
    Store(#[from] StoreError),
    /// A runtime form whose model does not read.
    #[error("the form's model: {0}")]
    FormModel(#[from] ctcache::Error),
    /// A runtime form one of whose weights is no longer stored.
    #[error("a weight of the form ({0}) is no longer stored")]
    WeightGone(EntryKey),
}

impl Fleet {
    /// Starts the fleet tier on the runtime `rt` (the upload task runs
    /// there). Fails on a bad config: the operator asked for a remote.
    pub fn start(config: RemoteConfig, rt: Handle) -> Result<Fleet, RunError> {
        let settings = Settings::new(config).map_err(|e| RunError::Remote(e.to_string()))?;
        let client = Client::new(&settings).map_err(|e| RunError::Remote(e.to_string()))?;
        counters::describe();
        let writes = settings.config.write && settings.signing_key.is_some();
        if settings.config.write && !writes {
            tracing::warn!("remote: write = true but no signing_key_file: uploads are off");
        }
        let capacity = settings.config.upload_queue.max(1);
        let shared = Arc::new(Shared {
            settings,
            client,
            counters: Counters::default(),
            warned: AtomicBool::new(false),
            last_error: Mutex::new(String::new()),
        });
        let uploads = writes.then(|| {
            let (tx, rx) = mpsc::channel(capacity);
            rt.spawn(upload::run(shared.clone(), rx));
            tx
        });
        let fleet = Fleet {
            shared,
            rt,
            guard: Mutex::new(Default::default()),
            costs: Mutex::new(Costs::default()),
            quarantined: Mutex::default(),
            uploads,
            last_drop_log: Mutex::new(None),
        };
        let (describe, forms) = (&fleet.shared.client.describe, fleet.takes_forms());
        tracing::info!(remote = %describe, uploads = writes, forms, "fleet tier on");
        if !forms {
            tracing::info!(
                "remote: no key is trusted for runtime forms (trusted_form_keys, or a signing key): \
                 forms are compiled here, never fetched"
            );
        }
        // Say early whether the remote answers; misses fall back either way.
        let probe = fleet.shared.clone();
        fleet.rt.spawn(async move {
            match probe.client.reachable().await {
                Ok(()) => tracing::info!("remote reachable"),
                Err(e) => probe.failed(&format!("remote not reachable: {e}")),
            }
        });
        Ok(fleet)
    }

    /// After a local pack: measures it and queues the upload (dropped and
    /// counted when the queue is full).
    pub fn packed(
        &self,
        store: &Store,
        entry: &Entry,
        (format, backend): (&str, &str),
        params: Vec<(String, String)>,
    ) {
        let took = entry.pack_duration;
        lock(&self.costs).packed(format, backend, entry.payload.len, took);
        self.queue(store, vec![(entry, params.into_iter().collect())]);
    }

    /// Queues the upload of `entries`, in order, as one job (dropped and
    /// counted when the queue is full); nothing when one cannot be read.
    fn queue(&self, store: &Store, entries: Vec<(&Entry, BTreeMap<String, String>)>) {
        let Some(tx) = &self.uploads else { return };
        let Some(key) = entries.last().map(|(e, _)| e.key) else {
            return;
        };
        let job = match upload_job(store, entries) {
            Ok(job) => job,
            Err(e) => {
                tracing::warn!(%key, "upload skipped: {e}");
                return;
            }
        };
        match tx.try_send(job) {
            Ok(()) => {
                metrics::gauge!("ctcache_remote_upload_queue").set(self.queue_depth() as f64);
            }
            Err(_) => {
                self.shared.counters.dropped();
                let mut last = lock(&self.last_drop_log);
                if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                    *last = Some(Instant::now());
                    tracing::warn!(
                        capacity = self.shared.settings.config.upload_queue,
                        "remote upload queue full: dropping uploads (counted)"
                    );
                }
            }
        }
    }

    /// Uploads `entry` now, from a blocking thread (`remote push`), unless
    /// the remote has its manifest already; a runtime form with every
    /// weight it names, weights first.
    pub fn push(&self, store: &Store, entry: &Entry) -> Result<Pushed, PushError> {
        let s = &self.shared;
        if s.settings.signing_key.is_none() {
            return Err(PushError::NoSigningKey);
        }
        if !s.settings.config.write {
            return Err(PushError::WriteOff);
        }
        if self.rt.block_on(s.client.manifest(&entry.key))?.is_some() {
            return Ok(Pushed::Present);
        }
        let entries = forms::with_weights(store, entry)?;
        let job = upload_job(store, entries.iter().map(|e| (e, BTreeMap::new())))?;
        match self.rt.block_on(upload::upload_all(s, &job)) {
            Ok(Some(bytes)) => {
                s.answered();
                Ok(Pushed::Uploaded(bytes))
            }
            Ok(None) => Ok(Pushed::TooLarge),
            Err(e) => {
                s.counters.error("upload");
                Err(e.into())
            }
        }
    }

    fn queue_depth(&self) -> u64 {
        self.uploads
            .as_ref()
            .map_or(0, |tx| (tx.max_capacity() - tx.capacity()) as u64)
    }

    /// What `status` shows; `probe`: ask the remote now whether it answers
    /// (within the timeout; from a blocking thread).
    pub fn report(&self, probe: bool) -> Report {
        let c = &self.shared.settings.config;
        let reachable = probe.then(|| self.rt.block_on(self.shared.client.reachable()));
        let breaker = lock(&self.guard).0.state(Instant::now());
        let (pack_rates, remote_rate) = lock(&self.costs).rates();
        Report {
            remote: self.shared.client.describe.clone(),
            read: c.read,
            write: self.uploads.is_some(),
            fetch: format!("{:?}", c.fetch).to_lowercase(),
            breaker: breaker.name(),
            last_error: lock(&self.shared.last_error).clone(),
            queue_depth: self.queue_depth(),
            queue_capacity: self
                .uploads
                .as_ref()
                .map_or(0, |tx| tx.max_capacity() as u64),
            counters: self.shared.counters.snapshot(),
            pack_rates,
            remote_rate,
            reachable,
            trusted_keys: self.shared.settings.trust.names(),
            trusted_form_keys: self.shared.settings.form_trust.names(),
        }
    }
}

impl Shared {
    /// A request failed: logged at warn the first time after an answer.
    fn failed(&self, msg: &str) {
        *lock(&self.last_error) = msg.to_string();
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!("{msg} (packing locally; further failures are logged at debug)");
        } else {
            tracing::debug!("{msg}");
        }
    }

    /// The remote answered.
    fn answered(&self) {
        self.warned.store(false, Ordering::Relaxed);
        lock(&self.last_error).clear();
    }
}

/// The upload job of `entries` (with their packer parameters), in order,
/// each payload checked and mapped; why one cannot be read.
fn upload_job<'e>(
    store: &Store,
    entries: impl IntoIterator<Item = (&'e Entry, BTreeMap<String, String>)>,
) -> Result<upload::Job, StoreError> {
    let mut job = upload::Job(Vec::new());
    for (entry, params) in entries {
        let payload = checked_payload(store, entry)?;
        job.0
            .push(upload::Upload::new(entry.clone(), params, payload));
    }
    Ok(job)
}

/// `entry`'s payload with every group checked (D12: only the bytes hashed
/// leave the host); a rotted one is quarantined and its entries dropped.
fn checked_payload(store: &Store, entry: &Entry) -> Result<Payload, ctcache::store::StoreError> {
    // An upload is the daemon's own read, not a use.
    let p = store.check_payload(&entry.key)?;
    match p.checked_all() {
        Ok(_) => Ok(p),
        Err(r) => Err(store.payload_rotted(&entry.key, &p, r)),
    }
}
