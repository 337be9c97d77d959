//! The gRPC service: validates requests, checks the peer, and maps daemon
//! operations and their errors onto gRPC. Every mutating RPC logs the peer.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ctcache::onnx::rewrite::{self, Mode, RewriteOptions};
use ctcache::store::{GcPolicy, NewEntry, Producer};
use ctcache_api::v1 as api;
use ctcache_api::v1::compiled_tensor_cache_server::CompiledTensorCache;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::convert;
use crate::daemon::{wait, Daemon, OpError, Packed};
use crate::peer::Peer;
use crate::policy::Wanted;
use crate::scheduler::JobHandle;
use crate::scheduler::{JobState, Priority};
use ctcache::store::Entry;

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The service over a shared daemon.
#[derive(Clone)]
pub struct Service {
    pub daemon: Arc<Daemon>,
    /// Turns true at shutdown: open Events streams end then, so that the
    /// server's graceful shutdown does not wait for followers.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
}

impl From<OpError> for Status {
    fn from(e: OpError) -> Status {
        match e {
            OpError::InvalidArgument(m) => Status::invalid_argument(m),
            OpError::NotFound(m) => Status::not_found(m),
            OpError::PermissionDenied(m) => Status::permission_denied(m),
            OpError::FailedPrecondition(m) => Status::failed_precondition(m),
            OpError::Internal(m) => Status::internal(m),
        }
    }
}

pub(crate) fn store_err(e: ctcache::store::StoreError) -> Status {
    Status::from(OpError::from(e))
}

/// Runs blocking work (file IO, hashing, packing) off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("worker failed: {e}")))?
}

const CHUNK: usize = 1 << 20;

impl Service {
    /// Admin and mutating RPCs (Put, Import, Gc, Verify, watches) are for the
    /// daemon's user, root and `trusted_uids`; the socket group may only read.
    fn require_trusted(&self, peer: &Peer, what: &str) -> Result<(), Status> {
        let trusted = peer.is_self_or_root()
            || peer
                .uid
                .is_some_and(|u| self.daemon.config.trusted_uids.contains(&u));
        tracing::info!(peer = %peer.describe(), trusted, "{what}");
        if trusted {
            Ok(())
        } else {
            Err(Status::permission_denied(format!(
                "{} may not {what}: only the daemon's user, root and trusted_uids may",
                peer.describe()
            )))
        }
    }
}
const MAX_TTL_MS: u64 = 24 * 3600 * 1000;

fn progress(
    job: u64,
    w: &crate::policy::Wanted,
    state: &JobState<crate::daemon::Packed>,
    d: &Daemon,
    done: u32,
    total: u32,
) -> api::PrepackProgress {
    let mut p = api::PrepackProgress {
        job_id: job.to_string(),
        initializer: w.initializer.clone(),
        format: w.format.clone(),
        done,
        total,
        backend: "cpu".into(),
        ..Default::default()
    };
    match state {
        JobState::Queued => p.state = "queued".into(),
        JobState::Running => p.state = "running".into(),
        JobState::Done(packed) => {
            p.state = if packed.cached { "cached" } else { "done" }.into();
            p.entry = Some(d.api_entry(&packed.entry));
            p.pack_duration_us = packed.entry.pack_duration.as_micros() as u64;
        }
        JobState::Failed(e) => {
            p.state = "failed".into();
            p.error = e.clone();
        }
        JobState::Cancelled => {
            p.state = "failed".into();
            p.error = "cancelled".into();
        }
    }
    p
}

#[tonic::async_trait]
impl CompiledTensorCache for Service {
    async fn get_host_devices(
        &self,
        _: Request<api::GetHostDevicesRequest>,
    ) -> Result<Response<api::GetHostDevicesResponse>, Status> {
        Ok(Response::new(api::GetHostDevicesResponse {
            devices: self.daemon.host.devices().to_vec(),
        }))
    }

    async fn list_formats(
        &self,
        _: Request<api::ListFormatsRequest>,
    ) -> Result<Response<api::ListFormatsResponse>, Status> {
        let formats = ctcache_kernels::catalogue()
            .iter()
            .map(|p| api::FormatInfo {
                id: p.id().into(),
                version: p.format_version(),
                description: p.describe().into(),
                params: p
                    .param_spec()
                    .iter()
                    .map(|s| api::FormatParam {
                        name: s.name.into(),
                        default_value: s.default.into(),
                        allowed: s.allowed.iter().map(|a| a.to_string()).collect(),
                        description: s.doc.into(),
                    })
                    .collect(),
                backends: vec!["cpu".into()],
            })
            .collect();
        Ok(Response::new(api::ListFormatsResponse { formats }))
    }

    async fn lookup(
        &self,
        req: Request<api::LookupRequest>,
    ) -> Result<Response<api::LookupResponse>, Status> {
        let d = self.daemon.clone();
        let r = req.into_inner();
        blocking(move || d.lookup(&r).map_err(Status::from))
            .await
            .map(Response::new)
    }

    async fn batch_lookup(
        &self,
        req: Request<api::BatchLookupRequest>,
    ) -> Result<Response<api::BatchLookupResponse>, Status> {
        let d = self.daemon.clone();
        let r = req.into_inner();
        if r.requests.len() > 100_000 {
            return Err(Status::invalid_argument("at most 100000 lookups per batch"));
        }
        blocking(move || {
            let responses = r
                .requests
                .iter()
                .map(|q| d.lookup(q))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(api::BatchLookupResponse { responses })
        })
        .await
        .map(Response::new)
    }

    async fn resolve_model(
        &self,
        req: Request<api::ResolveModelRequest>,
    ) -> Result<Response<api::ResolveModelResponse>, Status> {
        let peer = Peer::of(&req);
        let r = req.into_inner();
        let d = self.daemon.clone();
        let on_miss = api::OnMiss::try_from(r.on_miss).unwrap_or(api::OnMiss::None);
        let (resp, jobs) = blocking(move || {
            let (path, model) = d.open_model(&r.model_path, &peer)?;
            let sel = d.wanted(&model, &r.formats, &[])?;
            let (tensors, digests) = d.digests(&path, &model)?;
            let filter = d.filter_for(&r.devices, r.runtime.as_ref(), &[]);
            let mut resp = api::ResolveModelResponse {
                model_path: path.display().to_string(),
                not_sources: sel
                    .not_sources
                    .iter()
                    .map(|n| api::NotASource {
                        name: n.name.clone(),
                        reason: n.reason.clone(),
                    })
                    .collect(),
                ..Default::default()
            };
            let mut missing = Vec::new();
            for t in &tensors {
                let digest = digests[&t.name];
                // Counted below per wanted format: tensors nothing wants
                // are not lookups a runtime would make.
                let hits = d
                    .store
                    .lookup_uncounted(&digest, &filter)
                    .map_err(store_err)?;
                let wanted: Vec<_> = sel
                    .wanted
                    .iter()
                    .filter(|w| w.initializer == t.name)
                    .collect();
                let mut res = api::TensorResolution {
                    name: t.name.clone(),
                    data_type: t.data_type.code(),
                    dims: t.dims.clone(),
                    source_digest: bytes::Bytes::copy_from_slice(&digest.bytes),
                    digest_algorithm: "blake3".into(),
                    entries: hits.iter().map(|h| d.api_entry(&h.entry)).collect(),
                    wanted_formats: wanted.iter().map(|w| w.format.clone()).collect(),
                    misses: vec![],
                    refused: sel
                        .refused
                        .iter()
                        .filter(|(n, _)| n == &t.name)
                        .map(|(_, why)| why.clone())
                        .collect(),
                };
                for w in wanted {
                    let hit = hits.iter().any(|h| {
                        h.entry.producer.packer_id == w.format
                            && h.entry.producer.client_uid.is_none()
                            || h.entry.type_name.starts_with(&format!("{}.", w.format))
                            || h.entry.type_name == w.format
                    });
                    d.store.count_lookups(u64::from(hit), u64::from(!hit));
                    if !hit {
                        res.misses.push(convert::miss(
                            "no_entry",
                            format!("{} not packed yet", w.format),
                        ));
                        missing.push(w.clone());
                    }
                }
                resp.tensors.push(res);
            }
            let jobs = match on_miss {
                api::OnMiss::None => Vec::new(),
                api::OnMiss::Background => {
                    d.prepack_model(&path, &model, &missing, Priority::Background)?
                }
                api::OnMiss::Wait => d.prepack_model(&path, &model, &missing, Priority::Client)?,
            };
            resp.jobs_started = jobs.len() as u64;
            Ok((resp, (on_miss == api::OnMiss::Wait).then_some(jobs)))
        })
        .await?;
        let Some(jobs) = jobs else {
            return Ok(Response::new(resp));
        };
        // on_miss = wait: resolve again once the jobs are done.
        let mut resp = resp;
        for (w, h) in jobs {
            if let JobState::Done(p) = wait(h).await {
                if let Some(t) = resp.tensors.iter_mut().find(|t| t.name == w.initializer) {
                    t.entries.push(self.daemon.api_entry(&p.entry));
                    t.misses.retain(|m| !m.detail.starts_with(&w.format));
                }
            }
        }
        Ok(Response::new(resp))
    }

    type PrepackStream = Stream_<api::PrepackProgress>;

    async fn prepack(
        &self,
        req: Request<api::PrepackRequest>,
    ) -> Result<Response<Self::PrepackStream>, Status> {
        let peer = Peer::of(&req);
        let r = req.into_inner();
        tracing::info!(peer = %peer.describe(), model = %r.model_path, "prepack");
        if !r.backend.is_empty() && r.backend != "cpu" {
            return Err(Status::invalid_argument(format!(
                "backend {:?} is not available",
                r.backend
            )));
        }
        let d = self.daemon.clone();
        let jobs = blocking(move || {
            let (path, model) = d.open_model(&r.model_path, &peer)?;
            let sel = d.wanted(&model, &r.formats, &r.initializers)?;
            Ok(d.prepack_model(&path, &model, &sel.wanted, Priority::Client)?)
        })
        .await?;
        let (tx, rx) = mpsc::channel(64);
        let d = self.daemon.clone();
        tokio::spawn(async move {
            let total = jobs.len() as u32;
            let mut done = 0u32;
            for (w, h) in &jobs {
                let first = progress(h.id, w, &h.state.borrow().clone(), &d, done, total);
                if tx.send(Ok(first)).await.is_err() {
                    return; // client gone: dropping the handles cancels the jobs
                }
            }
            for (w, h) in jobs {
                let id = h.id;
                let state = wait(h).await;
                done += 1;
                let p = progress(id, &w, &state, &d, done, total);
                d.emit(
                    "job_progress",
                    String::new(),
                    String::new(),
                    p.state.clone(),
                    Some(p.clone()),
                );
                if tx.send(Ok(p)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn put(
        &self,
        req: Request<Streaming<api::PutRequest>>,
    ) -> Result<Response<api::PutResponse>, Status> {
        let peer = Peer::of(&req);
        self.require_trusted(&peer, "put entries")?;
        let mut stream = req.into_inner();
        let header = match stream.next().await {
            Some(Ok(api::PutRequest {
                part: Some(api::put_request::Part::Header(h)),
            })) => h,
            Some(Err(e)) => return Err(e),
            _ => {
                return Err(Status::invalid_argument(
                    "the first Put message must be the header",
                ))
            }
        };
        let algorithm = header.digest_algorithm.parse().map_err(|_| {
            Status::invalid_argument(format!(
                "unknown digest algorithm {:?}",
                header.digest_algorithm
            ))
        })?;
        let bytes: [u8; 32] = header
            .source_digest
            .as_ref()
            .try_into()
            .map_err(|_| Status::invalid_argument("source_digest must be 32 bytes"))?;
        let ty = header
            .struct_type
            .ok_or_else(|| Status::invalid_argument("struct_type is required"))?;
        let device = header
            .device
            .ok_or_else(|| Status::invalid_argument("device is required"))?;
        let layout = ctcache::structs::check_value(
            &ty,
            &header.dims,
            &[],
            &ctcache::structs::Limits::default(),
        )
        .map_err(|e| Status::invalid_argument(format!("struct_type: {e}")))?;
        if layout.byte_len != header.payload_len {
            return Err(Status::invalid_argument(format!(
                "payload_len {} does not match the type's size {}",
                header.payload_len, layout.byte_len
            )));
        }
        let max = self.daemon.config.memory_budget;
        if header.payload_len > max {
            return Err(Status::resource_exhausted(format!(
                "payload larger than the memory budget ({max} bytes)"
            )));
        }
        let mut data = Vec::with_capacity(header.payload_len as usize);
        while let Some(msg) = stream.next().await {
            match msg?.part {
                Some(api::put_request::Part::Data(chunk)) => {
                    if data.len() as u64 + chunk.len() as u64 > header.payload_len {
                        return Err(Status::invalid_argument("more data than payload_len"));
                    }
                    data.extend_from_slice(&chunk);
                }
                _ => {
                    return Err(Status::invalid_argument(
                        "only data chunks may follow the header",
                    ))
                }
            }
        }
        if data.len() as u64 != header.payload_len {
            return Err(Status::invalid_argument(format!(
                "got {} bytes, payload_len is {}",
                data.len(),
                header.payload_len
            )));
        }
        let source_shape = ctcache::hit::SourceShape {
            data_type: ctcache::dtype::DataType::from_i32(header.source_data_type).map_err(
                |_| {
                    Status::invalid_argument(format!(
                    "source_data_type {} is not an ONNX data type (the source's shape is required)",
                    header.source_data_type
                ))
                },
            )?,
            dims: header.source_dims.clone(),
        };
        let new = NewEntry {
            source: ctcache::digest::SourceDigest { algorithm, bytes },
            source_shape,
            device,
            physical_type: ty,
            dims: header.dims,
            producer: Producer {
                client_uid: peer.uid,
                ..Default::default()
            },
            source_names: vec![header.source_name]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect(),
            model_paths: vec![header.model_path]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect(),
            pack_duration: Duration::ZERO,
        };
        let d = self.daemon.clone();
        let stored = blocking(move || {
            d.store
                .put(&new, &data[..])
                .map_err(|e| Status::invalid_argument(e.to_string()))
        })
        .await?;
        Ok(Response::new(api::PutResponse {
            entry: Some(self.daemon.api_entry(&stored.entry)),
            already_present: !stored.created,
        }))
    }

    type ReadPayloadStream = Stream_<api::PayloadChunk>;

    async fn read_payload(
        &self,
        req: Request<api::ReadPayloadRequest>,
    ) -> Result<Response<Self::ReadPayloadStream>, Status> {
        let r = req.into_inner();
        let key = convert::key_from_string(&r.key)?;
        let d = self.daemon.clone();
        let payload = blocking(move || {
            d.store
                .open_payload(&key)
                .map_err(|e| Status::not_found(e.to_string()))
        })
        .await?;
        let len = payload.len() as u64;
        if r.offset > len {
            return Err(Status::out_of_range(format!(
                "offset {} is past the payload's {} bytes",
                r.offset, len
            )));
        }
        let end = if r.length == 0 {
            len
        } else {
            r.offset.saturating_add(r.length).min(len)
        };
        let (tx, rx) = mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            let mut pos = r.offset;
            while pos < end {
                let n = ((end - pos) as usize).min(CHUNK);
                let data = bytes::Bytes::copy_from_slice(&payload[pos as usize..pos as usize + n]);
                if tx
                    .blocking_send(Ok(api::PayloadChunk { offset: pos, data }))
                    .is_err()
                {
                    return;
                }
                pos += n as u64;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn acquire_lease(
        &self,
        req: Request<api::AcquireLeaseRequest>,
    ) -> Result<Response<api::LeaseResponse>, Status> {
        let r = req.into_inner();
        let key = convert::key_from_string(&r.key)?;
        let ttl = Duration::from_millis(r.ttl_ms.clamp(1, MAX_TTL_MS));
        let d = self.daemon.clone();
        blocking(move || {
            let entry = d
                .store
                .stat(&key)
                .map_err(store_err)?
                .ok_or_else(|| Status::not_found("no such entry"))?;
            let id = d.store.acquire_lease(&key, ttl).map_err(store_err)?;
            Ok(api::LeaseResponse {
                lease_id: id.0,
                expires_unix_ms: crate::daemon::now_ms() + ttl.as_millis() as i64,
                entry: Some(d.api_entry(&entry)),
            })
        })
        .await
        .map(Response::new)
    }

    async fn renew_lease(
        &self,
        req: Request<api::RenewLeaseRequest>,
    ) -> Result<Response<api::LeaseResponse>, Status> {
        let r = req.into_inner();
        let ttl = Duration::from_millis(r.ttl_ms.clamp(1, MAX_TTL_MS));
        let d = self.daemon.clone();
        blocking(move || {
            let lease = d
                .store
                .renew(ctcache::store::LeaseId(r.lease_id), ttl)
                .map_err(|e| Status::not_found(e.to_string()))?;
            Ok(api::LeaseResponse {
                lease_id: lease.id.0,
                expires_unix_ms: lease.expires_ms as i64,
                entry: None,
            })
        })
        .await
        .map(Response::new)
    }

    async fn release_lease(
        &self,
        req: Request<api::ReleaseLeaseRequest>,
    ) -> Result<Response<api::ReleaseLeaseResponse>, Status> {
        let id = req.into_inner().lease_id;
        let d = self.daemon.clone();
        blocking(move || {
            d.store
                .release(ctcache::store::LeaseId(id))
                .map_err(store_err)?;
            Ok(api::ReleaseLeaseResponse {})
        })
        .await
        .map(Response::new)
    }

    async fn embed(
        &self,
        req: Request<api::EmbedRequest>,
    ) -> Result<Response<api::EmbedResponse>, Status> {
        let peer = Peer::of(&req);
        let r = req.into_inner();
        tracing::info!(peer = %peer.describe(), model = %r.model_path, output = %r.output_path, "embed");
        let out = output_path(&peer, &r.output_path)?;
        let d = self.daemon.clone();
        let (path, model, sel) = {
            let d = d.clone();
            let r2 = r.clone();
            blocking(move || {
                let (path, model) = d.open_model(&r2.model_path, &peer)?;
                let sel = d.wanted(&model, &r2.formats, &[])?;
                Ok((path, model, sel))
            })
            .await?
        };
        let jobs = {
            let d = d.clone();
            let (path, wanted) = (path.clone(), sel.wanted.clone());
            let model = Model2(Arc::new(model));
            let m = model.clone();
            let jobs =
                blocking(move || Ok(d.prepack_model(&path, &m.0, &wanted, Priority::Client)?))
                    .await?;
            (jobs, model)
        };
        let (jobs, model) = jobs;
        let (entries, packed) = finish_jobs(jobs).await?;
        blocking(move || {
            let mut news = Vec::new();
            for (w, e) in &entries {
                let payload = d.store.open_payload(&e.key).map_err(store_err)?;
                let ty = e.physical_type().map_err(store_err)?;
                news.push(rewrite::NewEntry {
                    source_name: w.initializer.clone(),
                    device: e.device.clone(),
                    struct_type: ty,
                    dims: e.dims.clone(),
                    payload: bytes::Bytes::copy_from_slice(&payload),
                    source_digest: e.key.source.bytes.to_vec(),
                    digest_algorithm: e.key.source.algorithm.name().into(),
                    metadata_props: vec![],
                });
            }
            let opts = RewriteOptions {
                all_to_sidecar: r.sidecar,
                ..Default::default()
            };
            let mode = if r.replace { Mode::Replace } else { Mode::Add };
            let report = rewrite::embed(&model.0, &news, &out, mode, &opts)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            give_to_peer(&peer, std::iter::once(&out).chain(report.sidecar.iter()));
            let _ = path;
            Ok(api::EmbedResponse {
                output_path: out.display().to_string(),
                entries: report.entries as u32,
                packed,
                sidecar_path: report
                    .sidecar
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                inline_bytes: report.inline_bytes,
                sidecar_bytes: report.sidecar_bytes,
            })
        })
        .await
        .map(Response::new)
    }

    async fn materialize(
        &self,
        req: Request<api::MaterializeRequest>,
    ) -> Result<Response<api::MaterializeResponse>, Status> {
        let peer = Peer::of(&req);
        let r = req.into_inner();
        tracing::info!(peer = %peer.describe(), model = %r.model_path, output = %r.output_path, "materialize");
        crate::materialize::materialize(self.daemon.clone(), peer, r)
            .await
            .map(Response::new)
    }

    async fn import(
        &self,
        req: Request<api::ImportRequest>,
    ) -> Result<Response<api::ImportResponse>, Status> {
        let peer = Peer::of(&req);
        self.require_trusted(&peer, "import models")?;
        let r = req.into_inner();
        let d = self.daemon.clone();
        blocking(move || crate::import::import(&d, &r.model_path, &peer).map_err(Status::from))
            .await
            .map(Response::new)
    }

    async fn stats(
        &self,
        _: Request<api::StatsRequest>,
    ) -> Result<Response<api::StatsResponse>, Status> {
        let d = self.daemon.clone();
        blocking(move || {
            let s = d.store.stats().map_err(store_err)?;
            let leases = d.store.leases().map_err(store_err)?.len() as u64;
            Ok(convert::stats(&s, leases))
        })
        .await
        .map(Response::new)
    }

    async fn list(
        &self,
        req: Request<api::ListRequest>,
    ) -> Result<Response<api::ListResponse>, Status> {
        let r = req.into_inner();
        let d = self.daemon.clone();
        blocking(move || {
            let source = if r.source_digest.is_empty() {
                None
            } else {
                let bytes: [u8; 32] = r
                    .source_digest
                    .as_ref()
                    .try_into()
                    .map_err(|_| Status::invalid_argument("source_digest must be 32 bytes"))?;
                Some(ctcache::digest::SourceDigest {
                    algorithm: ctcache::digest::Algorithm::Blake3,
                    bytes,
                })
            };
            let filter = ctcache::store::Filter {
                source,
                ..Default::default()
            };
            let entries = d.store.list(&filter).map_err(store_err)?;
            let leased: std::collections::HashSet<_> = d
                .store
                .leases()
                .map_err(store_err)?
                .into_iter()
                .map(|l| l.key)
                .collect();
            let out = entries
                .iter()
                .filter(|e| r.format.is_empty() || e.type_name.starts_with(&r.format))
                .filter(|e| {
                    r.device.is_empty() || ctcache::device::describe(&e.device).contains(&r.device)
                })
                .filter(|e| {
                    r.model_path.is_empty() || e.model_paths.iter().any(|p| p == &r.model_path)
                })
                .take(if r.limit == 0 {
                    usize::MAX
                } else {
                    r.limit as usize
                })
                .map(|e| {
                    let mut a = d.api_entry(e);
                    a.leased = leased.contains(&e.key);
                    a
                })
                .collect();
            Ok(api::ListResponse { entries: out })
        })
        .await
        .map(Response::new)
    }

    async fn gc(&self, req: Request<api::GcRequest>) -> Result<Response<api::GcResponse>, Status> {
        let peer = Peer::of(&req);
        let r = req.into_inner();
        if !r.dry_run {
            self.require_trusted(&peer, "collect garbage")?;
        }
        let d = self.daemon.clone();
        blocking(move || {
            // Without limits in the request, the configured budget applies.
            let cfg = &d.config;
            let explicit = r.has_max_bytes || r.max_bytes > 0 || r.max_age_s > 0;
            let (max_bytes, max_age_s) = if explicit {
                (
                    (r.has_max_bytes || r.max_bytes > 0).then_some(r.max_bytes),
                    r.max_age_s,
                )
            } else {
                (
                    (cfg.gc_max_bytes > 0).then_some(cfg.gc_max_bytes),
                    cfg.gc_max_age_secs,
                )
            };
            let policy = GcPolicy {
                max_bytes,
                max_age: (max_age_s > 0).then(|| Duration::from_secs(max_age_s)),
                orphans: true,
                temp_files: true,
                dry_run: r.dry_run,
            };
            let report = d.store.gc(&policy).map_err(store_err)?;
            metrics::counter!("ctcache_gc_evictions_total").increment(report.items.len() as u64);
            let mut resp = convert::gc(&report);
            resp.skipped_leased = report.leased_kept as u32;
            Ok(resp)
        })
        .await
        .map(Response::new)
    }

    async fn verify(
        &self,
        req: Request<api::VerifyRequest>,
    ) -> Result<Response<api::VerifyResponse>, Status> {
        let peer = Peer::of(&req);
        self.require_trusted(&peer, "verify the store")?;
        let d = self.daemon.clone();
        blocking(move || {
            let v = d.store.verify(true).map_err(store_err)?;
            let corrupt = v
                .problems
                .iter()
                .filter(|p| p.damage != ctcache::store::Damage::Missing)
                .flat_map(|p| p.entries_dropped.iter().map(convert::key_to_string))
                .collect();
            let missing = v
                .problems
                .iter()
                .filter(|p| p.damage == ctcache::store::Damage::Missing)
                .flat_map(|p| p.entries_dropped.iter().map(convert::key_to_string))
                .collect();
            Ok(api::VerifyResponse {
                checked: v.blobs_checked,
                bytes_checked: v.bytes_checked,
                corrupt,
                missing,
                orphans: v
                    .orphan_files
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect(),
                clean: v.problems.is_empty(),
            })
        })
        .await
        .map(Response::new)
    }

    async fn add_watch(
        &self,
        req: Request<api::WatchRequest>,
    ) -> Result<Response<api::WatchResponse>, Status> {
        let peer = Peer::of(&req);
        let dir = PathBuf::from(req.into_inner().dir);
        tracing::info!(peer = %peer.describe(), dir = %dir.display(), "add watch");
        if !dir.is_absolute() || !dir.is_dir() {
            return Err(Status::invalid_argument(format!(
                "{} is not an absolute path to a folder",
                dir.display()
            )));
        }
        if !peer.is_self_or_root() && !peer.may_read(&dir) {
            return Err(Status::permission_denied(format!(
                "{} may not read {}",
                peer.describe(),
                dir.display()
            )));
        }
        crate::watcher::add(&self.daemon, &dir).map_err(Status::from)?;
        Ok(Response::new(self.watch_list()))
    }

    async fn remove_watch(
        &self,
        req: Request<api::WatchRequest>,
    ) -> Result<Response<api::WatchResponse>, Status> {
        let peer = Peer::of(&req);
        let dir = PathBuf::from(req.into_inner().dir);
        self.require_trusted(&peer, "remove watches")?;
        crate::watcher::remove(&self.daemon, &dir).map_err(Status::from)?;
        Ok(Response::new(self.watch_list()))
    }

    async fn list_watches(
        &self,
        _: Request<api::ListWatchesRequest>,
    ) -> Result<Response<api::ListWatchesResponse>, Status> {
        Ok(Response::new(api::ListWatchesResponse {
            dirs: self.watch_list().dirs,
        }))
    }

    type EventsStream = Stream_<api::Event>;

    async fn events(
        &self,
        _: Request<api::EventsRequest>,
    ) -> Result<Response<Self::EventsStream>, Status> {
        let mut rx = self.daemon.events.subscribe();
        let mut stop = self.shutdown.clone();
        let (tx, out) = mpsc::channel(256);
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await.is_ok();
            };
            tokio::pin!(stopped);
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tx.closed() => break,
                    e = rx.recv() => match e {
                        Ok(e) => {
                            if tx.send(Ok(e)).await.is_err() {
                                break;
                            }
                        }
                        // A slow follower misses events rather than stalling others.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                    },
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(out))))
    }

    async fn status(
        &self,
        _: Request<api::StatusRequest>,
    ) -> Result<Response<api::StatusResponse>, Status> {
        let d = self.daemon.clone();
        blocking(move || {
            let s = d.store.stats().map_err(store_err)?;
            let st = d.scheduler.stats();
            Ok(api::StatusResponse {
                version: env!("CARGO_PKG_VERSION").into(),
                uptime_s: d.started.elapsed().as_secs(),
                entries: s.entries,
                bytes: s.stored_bytes,
                hits: s.hits,
                misses: s.misses,
                jobs_running: st.running.load(std::sync::atomic::Ordering::Relaxed) as u32,
                jobs_queued: d.scheduler.queued() as u32,
                watches: d
                    .watches
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect(),
                cache_dir: d.config.cache_dir.display().to_string(),
                socket: d
                    .socket
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                pid: std::process::id(),
            })
        })
        .await
        .map(Response::new)
    }
}

/// A model shared with blocking tasks.
#[derive(Clone)]
pub(crate) struct Model2(pub(crate) Arc<ctcache::onnx::Model>);

/// An absolute output path in a folder the peer may write.
pub(crate) fn output_path(peer: &Peer, path: &str) -> Result<PathBuf, Status> {
    let out = PathBuf::from(path);
    if !out.is_absolute() {
        return Err(Status::invalid_argument("output_path must be absolute"));
    }
    let out_dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| Status::invalid_argument("output_path needs a folder"))?;
    if !peer.may_write_dir(out_dir) {
        return Err(Status::permission_denied(format!(
            "{} may not write in {}",
            peer.describe(),
            out_dir.display()
        )));
    }
    Ok(out)
}

/// Waits for pack jobs: their entries in order, and how many were packed
/// now (not found in the store).
pub(crate) async fn finish_jobs(
    jobs: Vec<(Wanted, JobHandle<Packed>)>,
) -> Result<(Vec<(Wanted, Entry)>, u32), Status> {
    let mut packed = 0u32;
    let mut entries = Vec::new();
    for (w, h) in jobs {
        match wait(h).await {
            JobState::Done(p) => {
                packed += u32::from(!p.cached);
                entries.push((w, p.entry));
            }
            JobState::Failed(e) => {
                return Err(Status::internal(format!(
                    "{} {}: {e}",
                    w.initializer, w.format
                )))
            }
            other => {
                return Err(Status::aborted(format!(
                    "{} {}: {other:?}",
                    w.initializer, w.format
                )))
            }
        }
    }
    Ok((entries, packed))
}

/// Files the daemon wrote for a peer belong to the peer when the daemon
/// runs as root (otherwise it cannot give them away).
pub(crate) fn give_to_peer<'a>(peer: &Peer, paths: impl Iterator<Item = &'a PathBuf>) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        for p in paths {
            let _ = std::os::unix::fs::chown(p, peer.uid, peer.gid);
        }
    }
}

impl Service {
    fn watch_list(&self) -> api::WatchResponse {
        api::WatchResponse {
            dirs: self
                .daemon
                .watches
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
        }
    }
}
