//! The daemon's state and its operations, independent of gRPC: lookups,
//! model resolution, pack jobs (through the scheduler), embed and import.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctcache::digest::SourceDigest;
use ctcache::hit::{Accept, Host};
use ctcache::onnx::{Model, TensorRef};
use ctcache::pb;
use ctcache::store::{Entry, EntryKey, HostFilter, NewEntry, Producer, Store};
use ctcache_api::v1 as api;
use ctcache_kernels::{Packer, Params};
use tokio::sync::broadcast;

use crate::config::Config;
use crate::convert;
use crate::memo::Memo;
use crate::policy::{self, Wanted};
use crate::scheduler::{JobHandle, JobState, Lane, Priority, Scheduler};

/// Identity of a pack job: same source content, format and parameters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JobKey {
    pub source: [u8; 32],
    pub format: String,
    pub params: String,
}

/// A finished pack job.
#[derive(Debug, Clone)]
pub struct Packed {
    pub entry: Entry,
    /// True when the entry already existed and nothing was packed.
    pub cached: bool,
    pub duration: Duration,
}

/// Errors of daemon operations, mapped to gRPC codes in `service.rs`.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Internal(String),
}

impl From<ctcache::Error> for OpError {
    fn from(e: ctcache::Error) -> Self {
        match e {
            ctcache::Error::Io { ref source, .. }
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                OpError::NotFound(e.to_string())
            }
            ctcache::Error::Io { ref source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                OpError::PermissionDenied(e.to_string())
            }
            other => OpError::InvalidArgument(other.to_string()),
        }
    }
}

impl From<ctcache::store::StoreError> for OpError {
    fn from(e: ctcache::store::StoreError) -> Self {
        OpError::Internal(e.to_string())
    }
}

pub type OpResult<T> = Result<T, OpError>;

/// Everything the service shares.
pub struct Daemon {
    pub config: Config,
    pub store: Arc<Store>,
    pub host: Host,
    pub host_filter: HostFilter,
    pub scheduler: Scheduler<JobKey, Packed>,
    pub events: broadcast::Sender<api::Event>,
    pub watches: Mutex<BTreeSet<PathBuf>>,
    pub memo: Memo,
    pub started: Instant,
    pub socket: Option<PathBuf>,
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn params_key(p: &Params) -> String {
    p.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The resolved inputs of one pack.
struct PackSpec {
    model_path: PathBuf,
    tensor: String,
    digest: SourceDigest,
    packer: &'static dyn Packer,
    params: Params,
    elements_bytes: u64,
}

impl Daemon {
    pub fn new(config: Config, store: Arc<Store>, socket: Option<PathBuf>) -> Daemon {
        let host = Host::new(
            ctcache_kernels::compile::host_devices(),
            None,
            Accept::Known(ctcache_kernels::registry::known_types()),
        );
        let host_filter = host.clone();
        // A GPU lane only for a hardware adapter: a software one (lavapipe)
        // is slower than the CPU kernels.
        let gpu_workers = usize::from(config.gpu && ctcache_kernels::compile::hardware_gpu());
        let scheduler = Scheduler::new(config.worker_count(), gpu_workers, config.memory_budget);
        let memo = Memo::new(store.clone());
        let watches = Mutex::new(config.watch.iter().cloned().collect());
        Daemon {
            config,
            store,
            host,
            host_filter,
            scheduler,
            events: broadcast::channel(1024).0,
            watches,
            memo,
            started: Instant::now(),
            socket,
        }
    }

    pub fn emit(
        &self,
        kind: &str,
        key: String,
        model_path: String,
        detail: String,
        progress: Option<api::PrepackProgress>,
    ) {
        let _ = self.events.send(api::Event {
            unix_ms: now_ms(),
            kind: kind.into(),
            key,
            model_path,
            detail,
            progress,
        });
    }

    pub fn api_entry(&self, e: &Entry) -> api::Entry {
        let path = self
            .store
            .blob_path(&e.payload.blake3)
            .display()
            .to_string();
        convert::entry(e, path, false)
    }

    /// A host filter for a request: its devices / runtime / types, or the daemon's.
    pub fn filter_for(
        &self,
        devices: &[pb::DeviceProto],
        runtime: Option<&api::RuntimeIdentity>,
        accepted: &[api::AcceptedType],
    ) -> HostFilter {
        let devices = if devices.is_empty() {
            self.host.devices().to_vec()
        } else {
            devices.to_vec()
        };
        let runtime =
            runtime
                .filter(|r| !r.name.is_empty())
                .map(|r| ctcache::device::RuntimeIdentity {
                    name: r.name.clone(),
                    version: r.version.clone(),
                });
        let host = HostFilter::new(devices, runtime, self.host.accept().clone());
        if accepted.is_empty() {
            host
        } else {
            host.accepting_names(
                accepted
                    .iter()
                    .map(|a| (a.name.clone(), a.versions.clone())),
            )
        }
    }

    /// Lookup of one source digest: hits best first, or the miss reason.
    pub fn lookup(&self, req: &api::LookupRequest) -> OpResult<api::LookupResponse> {
        let algorithm = if req.digest_algorithm.is_empty() {
            "blake3"
        } else {
            &req.digest_algorithm
        };
        let algorithm = match algorithm.parse() {
            Ok(a) => a,
            Err(_) => {
                return Ok(api::LookupResponse {
                    entries: vec![],
                    miss: Some(convert::miss(
                        "unknown_digest_algorithm",
                        format!("{algorithm:?} is not blake3 or sha256"),
                    )),
                })
            }
        };
        let bytes: [u8; 32] = req.source_digest.as_ref().try_into().map_err(|_| {
            OpError::InvalidArgument(format!(
                "source_digest has {} bytes, expected 32",
                req.source_digest.len()
            ))
        })?;
        let source = SourceDigest { algorithm, bytes };
        // The common case (the daemon's own host) reuses the prepared filter
        // instead of re-deriving device keys and accepted types per lookup.
        let custom;
        let filter = if req.devices.is_empty() && req.runtime.is_none() && req.accepted.is_empty() {
            &self.host_filter
        } else {
            custom = self.filter_for(&req.devices, req.runtime.as_ref(), &req.accepted);
            &custom
        };
        let only_daemon = req.daemon_produced_only || self.config.daemon_produced_only;
        let hits: Vec<_> = self
            .store
            .lookup(&source, filter)?
            .into_iter()
            .filter(|h| !only_daemon || h.entry.producer.client_uid.is_none())
            .collect();
        if !hits.is_empty() {
            metrics::counter!("ctcache_lookup_hits_total").increment(1);
            let entries = hits.iter().map(|h| {
                if req.brief {
                    let path = self.store.blob_path(&h.entry.payload.blake3);
                    convert::entry_brief(&h.entry, path.display().to_string(), false)
                } else {
                    self.api_entry(&h.entry)
                }
            });
            return Ok(api::LookupResponse {
                entries: entries.collect(),
                miss: None,
            });
        }
        let miss = self.explain_miss(&source, filter)?;
        metrics::counter!("ctcache_lookup_misses_total", "reason" => miss.reason.clone())
            .increment(1);
        Ok(api::LookupResponse {
            entries: vec![],
            miss: Some(miss),
        })
    }

    /// Why no entry of `source` fits: the core's judgement of the entry
    /// that got furthest.
    fn explain_miss(&self, source: &SourceDigest, filter: &HostFilter) -> OpResult<api::Miss> {
        let reason = match self.store.lookup_explained(source, None, filter)? {
            Ok(_) => ctcache::hit::MissReason::NoEntry,
            Err(m) => m,
        };
        Ok(convert::miss(reason.code(), reason.detail()))
    }

    /// Opens a model the peer named, after the access check.
    pub fn open_model(&self, path: &str, peer: &crate::peer::Peer) -> OpResult<(PathBuf, Model)> {
        if path.is_empty() {
            return Err(OpError::InvalidArgument("model_path is empty".into()));
        }
        let p = PathBuf::from(path);
        if !p.is_absolute() {
            return Err(OpError::InvalidArgument(format!(
                "model_path {path:?} must be absolute"
            )));
        }
        let canonical = p
            .canonicalize()
            .map_err(|e| OpError::NotFound(format!("{path}: {e}")))?;
        let watched = self
            .watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|w| {
                w.canonicalize()
                    .map(|w| canonical.starts_with(w))
                    .unwrap_or(false)
            });
        if !watched && !peer.may_read(&canonical) {
            return Err(OpError::PermissionDenied(format!(
                "{path}: outside the watched folders and not readable by uid {}",
                peer.uid
                    .map(|u| u.to_string())
                    .unwrap_or_else(|| "?".into())
            )));
        }
        let model = Model::open(&canonical)?;
        Ok((canonical, model))
    }

    /// The wanted (initializer, format) pairs: explicit formats for every
    /// initializer they accept, or the policy.
    pub fn wanted(
        &self,
        model: &Model,
        formats: &[api::FormatSpec],
        only: &[String],
    ) -> OpResult<policy::Selection> {
        let mut sel = if formats.is_empty() {
            policy::select(model, &self.config.policy)?
        } else {
            let mut sel = policy::Selection::default();
            for t in model.initializers()? {
                for f in formats {
                    let packer = ctcache_kernels::find(&f.id).ok_or_else(|| {
                        OpError::InvalidArgument(format!("unknown format {:?}", f.id))
                    })?;
                    let params = Params::parse(f.params.iter().map(|(k, v)| format!("{k}={v}")))
                        .map_err(|e| OpError::InvalidArgument(e.to_string()))?;
                    match packer.check_source(t.data_type, &t.dims, &params) {
                        Ok(()) => sel.wanted.push(Wanted {
                            initializer: t.name.clone(),
                            format: f.id.clone(),
                            params,
                        }),
                        // A bad parameter is the caller's mistake, not a refusal.
                        Err(
                            e @ (ctcache_kernels::PackError::UnknownParam { .. }
                            | ctcache_kernels::PackError::BadParamValue { .. }
                            | ctcache_kernels::PackError::MalformedParam(_)
                            | ctcache_kernels::PackError::DuplicateParam(_)),
                        ) => return Err(OpError::InvalidArgument(format!("{}: {e}", f.id))),
                        Err(e) => sel.refused.push((t.name.clone(), e.to_string())),
                    }
                }
            }
            sel
        };
        if !only.is_empty() {
            for name in only {
                if !sel.wanted.iter().any(|w| &w.initializer == name) {
                    let why = sel
                        .refused
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, r)| r.clone());
                    return Err(OpError::InvalidArgument(match why {
                        Some(r) => format!("{name}: {r}"),
                        None => format!("{name}: not an initializer the selected formats accept"),
                    }));
                }
            }
            sel.wanted.retain(|w| only.contains(&w.initializer));
        }
        Ok(sel)
    }

    /// Digests of a model's initializers through the memo.
    pub fn digests(
        &self,
        path: &Path,
        model: &Model,
    ) -> OpResult<(Vec<TensorRef>, HashMap<String, SourceDigest>)> {
        let tensors = model.initializers()?;
        let (d, _) = self.memo.digests(path, model, &tensors)?;
        Ok((tensors, d))
    }

    /// The stored entry for (source, packer output), if any.
    fn existing(
        &self,
        digest: &SourceDigest,
        t: &TensorRef,
        packer: &dyn Packer,
        params: &Params,
    ) -> Option<Entry> {
        let layout = packer.output(t.data_type, &t.dims, params).ok()?;
        let device = packer.device(params).ok()?;
        let key = EntryKey::derive(*digest, &device, &layout.struct_type).ok()?;
        self.store.stat(&key).ok().flatten()
    }

    /// Submits (or joins) the pack job of one wanted pair.
    pub fn submit_pack(
        self: &Arc<Self>,
        path: &Path,
        t: &TensorRef,
        digest: SourceDigest,
        w: &Wanted,
        priority: Priority,
    ) -> OpResult<JobHandle<Packed>> {
        let packer = ctcache_kernels::find(&w.format)
            .ok_or_else(|| OpError::InvalidArgument(format!("unknown format {:?}", w.format)))?;
        let spec = PackSpec {
            model_path: path.to_path_buf(),
            tensor: t.name.clone(),
            digest,
            packer,
            params: w.params.clone(),
            elements_bytes: t.raw_size().unwrap_or(0),
        };
        let key = JobKey {
            source: digest.bytes,
            format: w.format.clone(),
            params: params_key(&w.params),
        };
        let me = self.clone();
        let bytes = spec.elements_bytes.saturating_mul(2);
        let lane = if self.scheduler.has_gpu_lane()
            && ctcache_kernels::gpu::supports_source(&w.format, t.data_type)
            && w.params.get("transposed") != Some("true")
        {
            Lane::Gpu
        } else {
            Lane::Cpu
        };
        Ok(self
            .scheduler
            .submit(key, lane, priority, bytes, move |cancel| {
                me.run_pack(spec, lane, cancel)
            }))
    }

    /// A pack job: reuse a stored entry, else pack and put.
    fn run_pack(
        &self,
        spec: PackSpec,
        lane: Lane,
        cancel: &crate::scheduler::CancelToken,
    ) -> Result<Packed, String> {
        let started = Instant::now();
        let model = Model::open(&spec.model_path).map_err(|e| e.to_string())?;
        let t = model
            .initializers()
            .map_err(|e| e.to_string())?
            .into_iter()
            .find(|t| t.name == spec.tensor)
            .ok_or_else(|| {
                format!(
                    "{}: no initializer {:?}",
                    spec.model_path.display(),
                    spec.tensor
                )
            })?;
        if let Some(entry) = self.existing(&spec.digest, &t, spec.packer, &spec.params) {
            return Ok(Packed {
                entry,
                cached: true,
                duration: started.elapsed(),
            });
        }
        if cancel.cancelled() {
            return Err("every waiter went away".into());
        }
        let c = ctcache_kernels::compile::compile_on(
            &model,
            &t,
            Some(spec.digest),
            spec.packer,
            &spec.params,
            // The GPU lane packs on the adapter, falling back to the CPU
            // kernels when the GPU fails.
            match lane {
                Lane::Gpu => ctcache_kernels::compile::BackendChoice::Auto,
                Lane::Cpu => ctcache_kernels::compile::BackendChoice::Cpu,
            },
        )
        .map_err(|e| e.to_string())?;
        // The model may have changed since its digest was taken.
        if c.digest != spec.digest {
            return Err("the model changed while packing; it will be picked up again".into());
        }
        if cancel.cancelled() {
            return Err("every waiter went away".into());
        }
        let new = NewEntry {
            source: spec.digest,
            source_shape: c.source_shape.clone(),
            device: c.device.clone(),
            physical_type: c.layout.struct_type.clone(),
            dims: c.layout.dims.clone(),
            producer: Producer {
                packer_id: c.packer_id.to_string(),
                packer_version: c.packer_version.to_string(),
                client_uid: None,
            },
            source_names: vec![spec.tensor.clone()],
            model_paths: vec![spec.model_path.display().to_string()],
            pack_duration: c.duration,
        };
        let stored = self
            .store
            .put(&new, &c.payload[..])
            .map_err(|e| e.to_string())?;
        metrics::counter!("ctcache_pack_jobs_total", "format" => spec.packer.id(), "backend" => c.backend.name()).increment(1);
        metrics::histogram!("ctcache_pack_seconds", "format" => spec.packer.id(), "backend" => c.backend.name()).record(c.duration.as_secs_f64());
        self.emit(
            "entry_added",
            convert::key_to_string(&stored.entry.key),
            spec.model_path.display().to_string(),
            format!("{} {}", spec.tensor, stored.entry.type_name),
            None,
        );
        Ok(Packed {
            entry: stored.entry,
            cached: !stored.created,
            duration: started.elapsed(),
        })
    }

    /// Starts (or joins) pack jobs for every wanted pair of a model.
    pub fn prepack_model(
        self: &Arc<Self>,
        path: &Path,
        model: &Model,
        wanted: &[Wanted],
        priority: Priority,
    ) -> OpResult<Vec<(Wanted, JobHandle<Packed>)>> {
        let (tensors, digests) = self.digests(path, model)?;
        let mut jobs = Vec::new();
        for w in wanted {
            let Some(t) = tensors.iter().find(|t| t.name == w.initializer) else {
                continue;
            };
            let d = digests[&t.name];
            jobs.push((w.clone(), self.submit_pack(path, t, d, w, priority)?));
        }
        Ok(jobs)
    }
}

/// Waits for a job to finish.
pub async fn wait(h: JobHandle<Packed>) -> JobState<Packed> {
    h.finished().await
}
