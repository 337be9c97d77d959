//! The gRPC service: each method decodes its request, calls one use case
//! (`ops/`) and encodes the answer. Blocking use cases run off the async
//! threads; streams are fed from the use cases' channels.

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use ctcache::store::LeaseId;
use ctcache_api::served::{self, compiled_tensor_cache_server::CompiledTensorCache};
use ctcache_api::v1 as api;
use ctcache_convert as convert;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::wire_cache::WireCache;
use super::{caller, decode, encode};
use crate::caller::Caller;
use crate::flights::Abandon;
use crate::ops::{self, blocking, Error};
use crate::state::Daemon;

type Answer<T> = Result<Response<T>, Status>;
type Streamed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Bytes per ReadPayload message.
const CHUNK: usize = 1 << 20;

/// The service over a shared daemon.
#[derive(Clone)]
pub(crate) struct Service {
    pub daemon: Arc<Daemon>,
    /// Turns true at shutdown: open Events streams end then, so that the
    /// server's graceful shutdown does not wait for followers.
    pub shutdown: watch::Receiver<bool>,
    /// Lookup answers' encoded entries.
    pub wire: Arc<WireCache>,
}

impl Service {
    fn caller<T>(&self, req: &Request<T>) -> Caller {
        caller::of(req, &self.daemon.config.trusted_uids)
    }

    /// Runs a blocking use case with the daemon and encodes its answer.
    async fn run<T, A>(
        &self,
        op: impl FnOnce(&Daemon) -> ops::Result<T> + Send + 'static,
        encode: impl FnOnce(&Daemon, T) -> A,
    ) -> Answer<A>
    where
        T: Send + 'static,
    {
        let d = self.daemon.clone();
        let out = blocking(move || op(&d)).await?;
        Ok(Response::new(encode(&self.daemon, out)))
    }
}

fn ok<T>(v: T) -> Answer<T> {
    Ok(Response::new(v))
}

#[tonic::async_trait]
impl CompiledTensorCache for Service {
    async fn get_host_devices(
        &self,
        _: Request<api::GetHostDevicesRequest>,
    ) -> Answer<api::GetHostDevicesResponse> {
        ok(api::GetHostDevicesResponse {
            devices: self.daemon.host.devices().to_vec(),
        })
    }

    async fn list_formats(
        &self,
        _: Request<api::ListFormatsRequest>,
    ) -> Answer<api::ListFormatsResponse> {
        ok(encode::formats(&self.daemon))
    }

    async fn lookup(&self, req: Request<api::LookupRequest>) -> Answer<served::LookupResponse> {
        let r = req.into_inner();
        let brief = r.brief;
        let q = decode::lookup(r);
        // Answered on the async worker, not a blocking thread: a lookup
        // reads the store's decoded records (or a few sled pages, in memory
        // once read), about 3 us; the hop to the blocking pool and back
        // (two thread wakeups) cost more than the lookup itself. Batches
        // still go to the pool: a large one takes milliseconds.
        let outcome = ops::lookup::lookup(&self.daemon, &q)?;
        ok(encode::lookup(&self.daemon, &self.wire, outcome, brief))
    }

    async fn batch_lookup(
        &self,
        req: Request<api::BatchLookupRequest>,
    ) -> Answer<served::BatchLookupResponse> {
        let r = req.into_inner();
        let brief: Vec<bool> = r.requests.iter().map(|q| q.brief).collect();
        let qs: Vec<_> = r.requests.into_iter().map(decode::lookup).collect();
        let wire = self.wire.clone();
        self.run(
            move |d| ops::lookup::batch(d, &qs),
            move |d, outcomes| served::BatchLookupResponse {
                responses: outcomes
                    .into_iter()
                    .zip(brief)
                    .map(|(o, b)| encode::lookup(d, &wire, o, b))
                    .collect(),
            },
        )
        .await
    }

    async fn resolve_model(
        &self,
        req: Request<api::ResolveModelRequest>,
    ) -> Answer<api::ResolveModelResponse> {
        let caller = self.caller(&req);
        let r = decode::resolve(req.into_inner());
        let res = ops::resolve::resolve(&self.daemon, &caller, r).await?;
        ok(encode::resolution(&self.daemon, res))
    }

    type PrepackStream = Streamed<api::PrepackProgress>;

    async fn prepack(&self, req: Request<api::PrepackRequest>) -> Answer<Self::PrepackStream> {
        let caller = self.caller(&req);
        let r = decode::prepack(req.into_inner())?;
        let d = self.daemon.clone();
        let model_path = r.model_path.clone();
        let jobs = blocking(move || ops::pack::prepack(&d, &caller, &r)).await?;
        let progress = ops::progress::follow(&self.daemon, jobs, model_path);
        let d = self.daemon.clone();
        let stream = ReceiverStream::new(progress).map(move |p| Ok(encode::progress(&d, &p)));
        ok(Box::pin(stream))
    }

    async fn put(&self, req: Request<Streaming<api::PutRequest>>) -> Answer<api::PutResponse> {
        let caller = self.caller(&req);
        let mut stream = req.into_inner();
        let header = match stream.next().await {
            Some(Ok(api::PutRequest {
                part: Some(api::put_request::Part::Header(h)),
            })) => h,
            Some(Err(e)) => return Err(e),
            _ => return Err(Error::invalid("the first Put message must be the header").into()),
        };
        let mut session = ops::put::begin(&self.daemon, &caller, decode::put_header(header)?)?;
        while let Some(msg) = stream.next().await {
            match msg?.part {
                Some(api::put_request::Part::Data(chunk)) => session.push(&chunk)?,
                _ => return Err(Error::invalid("only data chunks may follow the header").into()),
            }
        }
        let stored = session.finish(&self.daemon).await?;
        ok(api::PutResponse {
            entry: Some(encode::entry(&self.daemon, stored.entry)),
            already_present: !stored.created,
        })
    }

    type ReadPayloadStream = Streamed<api::PayloadChunk>;

    async fn read_payload(
        &self,
        req: Request<api::ReadPayloadRequest>,
    ) -> Answer<Self::ReadPayloadStream> {
        let caller = self.caller(&req);
        let r = req.into_inner();
        let key = decode::key(&r.key)?;
        let (d, caller2) = (self.daemon.clone(), caller.clone());
        let p = blocking(move || ops::payload_access::read(&d, &caller, &key, r.offset, r.length))
            .await?;
        let (tx, rx) = mpsc::channel(4);
        // Each chunk is copied out of the mapping on a blocking thread (its
        // pages may come from disk); the wait for the client to take it is
        // async, so a client that stops reading holds no thread.
        // Only checked bytes are sent (D12): a rotted group ends the stream
        // with DATA_LOSS, and the entry is packed again.
        let (payload, range) = (std::sync::Arc::new(p.payload), p.range);
        let (entry, d) = (std::sync::Arc::new(p.entry), self.daemon.clone());
        tokio::spawn(async move {
            let mut pos = range.start;
            while pos < range.end {
                let n = ((range.end - pos) as usize).min(CHUNK);
                let at = pos as usize;
                let (payload, entry, d, caller) =
                    (payload.clone(), entry.clone(), d.clone(), caller2.clone());
                let copy = move || {
                    ops::serve::checked(&d, &caller, &entry, &payload, at..at + n)
                        .map(bytes::Bytes::copy_from_slice)
                };
                let data = match tokio::task::spawn_blocking(copy).await {
                    Ok(Ok(data)) => data,
                    Ok(Err(e)) => {
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                    Err(_) => return,
                };
                let chunk = api::PayloadChunk { offset: pos, data };
                if tx.send(Ok(chunk)).await.is_err() {
                    return;
                }
                pos += n as u64;
            }
        });
        ok(Box::pin(ReceiverStream::new(rx)))
    }

    async fn acquire_lease(
        &self,
        req: Request<api::AcquireLeaseRequest>,
    ) -> Answer<api::LeaseResponse> {
        let caller = self.caller(&req);
        let r = req.into_inner();
        let key = decode::key(&r.key)?;
        // The Arc: a rotted payload is packed again in the background.
        let d = self.daemon.clone();
        let g = blocking(move || ops::payload_access::acquire(&d, &caller, &key, r.ttl_ms)).await?;
        ok(encode::lease(&self.daemon, g))
    }

    async fn renew_lease(
        &self,
        req: Request<api::RenewLeaseRequest>,
    ) -> Answer<api::LeaseResponse> {
        let caller = self.caller(&req);
        let r = req.into_inner();
        self.run(
            move |d| ops::payload_access::renew(d, &caller, LeaseId(r.lease_id), r.ttl_ms),
            |_, lease| api::LeaseResponse {
                lease_id: lease.id.0,
                expires_unix_ms: lease.expires_ms as i64,
                entry: None,
            },
        )
        .await
    }

    async fn release_lease(
        &self,
        req: Request<api::ReleaseLeaseRequest>,
    ) -> Answer<api::ReleaseLeaseResponse> {
        let caller = self.caller(&req);
        let id = LeaseId(req.into_inner().lease_id);
        self.run(
            move |d| ops::payload_access::release(d, &caller, id),
            |_, ()| api::ReleaseLeaseResponse {},
        )
        .await
    }

    async fn embed(&self, req: Request<api::EmbedRequest>) -> Answer<api::EmbedResponse> {
        let caller = self.caller(&req);
        let r = decode::embed(req.into_inner());
        let e = ops::embed::embed(&self.daemon, &caller, r).await?;
        ok(encode::embedded(e))
    }

    async fn materialize(
        &self,
        req: Request<api::MaterializeRequest>,
    ) -> Answer<api::MaterializeResponse> {
        let caller = self.caller(&req);
        let r = decode::materialize(req.into_inner())?;
        let m = ops::materialize::materialize(&self.daemon, &caller, r).await?;
        ok(encode::materialized(&self.daemon, m))
    }

    async fn compile(&self, req: Request<api::CompileRequest>) -> Answer<api::CompileResponse> {
        let caller = self.caller(&req);
        let r = decode::compile(req.into_inner())?;
        let c = ops::compile::compile(&self.daemon, &caller, r).await?;
        ok(encode::compiled(&self.daemon, c))
    }

    async fn import(&self, req: Request<api::ImportRequest>) -> Answer<api::ImportResponse> {
        let caller = self.caller(&req);
        let r = req.into_inner();
        self.run(
            move |d| ops::import::import(d, &caller, &r.model_path, &r.handout),
            |_, r| encode::imported(r),
        )
        .await
    }

    async fn stats(&self, _: Request<api::StatsRequest>) -> Answer<api::StatsResponse> {
        self.run(ops::status::stats, |_, (s, leases)| {
            convert::stats(&s, leases)
        })
        .await
    }

    async fn list(&self, req: Request<api::ListRequest>) -> Answer<api::ListResponse> {
        let caller = self.caller(&req);
        let r = decode::list(req.into_inner());
        self.run(
            move |d| ops::status::list(d, &caller, &r),
            |d, listed| api::ListResponse {
                entries: listed
                    .into_iter()
                    .map(|l| {
                        let path = d.store.blob_path(&l.entry.payload.blake3);
                        convert::entry(l.entry, path, l.leased)
                    })
                    .collect(),
            },
        )
        .await
    }

    async fn gc(&self, req: Request<api::GcRequest>) -> Answer<api::GcResponse> {
        let caller = self.caller(&req);
        let r = decode::gc(req.into_inner());
        self.run(
            move |d| ops::gc::gc(d, &caller, &r),
            |_, report| convert::gc(&report),
        )
        .await
    }

    async fn verify(&self, req: Request<api::VerifyRequest>) -> Answer<api::VerifyResponse> {
        let caller = self.caller(&req);
        let repair = req.into_inner().repair;
        self.run(
            move |d| ops::gc::verify(d, &caller, repair),
            |_, (v, r)| convert::verify(&v, r.as_ref()),
        )
        .await
    }

    async fn add_watch(&self, req: Request<api::WatchRequest>) -> Answer<api::WatchResponse> {
        let caller = self.caller(&req);
        let dir = req.into_inner().dir;
        self.run(
            move |d| ops::watch::add(d, &caller, Path::new(&dir)),
            |_, dirs| api::WatchResponse {
                dirs: encode::watches(dirs),
            },
        )
        .await
    }

    async fn remove_watch(&self, req: Request<api::WatchRequest>) -> Answer<api::WatchResponse> {
        let caller = self.caller(&req);
        let dir = req.into_inner().dir;
        self.run(
            move |d| ops::watch::remove(d, &caller, Path::new(&dir)),
            |_, dirs| api::WatchResponse {
                dirs: encode::watches(dirs),
            },
        )
        .await
    }

    async fn list_watches(
        &self,
        req: Request<api::ListWatchesRequest>,
    ) -> Answer<api::ListWatchesResponse> {
        let caller = self.caller(&req);
        self.run(
            move |d| ops::watch::visible(d, &caller),
            |_, dirs| api::ListWatchesResponse {
                dirs: encode::watches(dirs),
            },
        )
        .await
    }

    type EventsStream = Streamed<api::Event>;

    async fn events(&self, req: Request<api::EventsRequest>) -> Answer<Self::EventsStream> {
        let caller = self.caller(&req);
        let followed = ops::follow::follow(&self.daemon, &caller, self.shutdown.clone())?;
        let d = self.daemon.clone();
        ok(Box::pin(
            ReceiverStream::new(followed).map(move |e| Ok(encode::event(&d, &e))),
        ))
    }

    async fn status(&self, req: Request<api::StatusRequest>) -> Answer<api::StatusResponse> {
        let caller = self.caller(&req);
        self.run(
            move |d| ops::status::status(d, &caller),
            |_, s| encode::status(s),
        )
        .await
    }

    async fn remote_status(
        &self,
        _: Request<api::RemoteStatusRequest>,
    ) -> Answer<api::RemoteStatusResponse> {
        self.run(ops::status::remote_status, |_, r| {
            api::RemoteStatusResponse {
                remote: r.map(encode::remote_status),
            }
        })
        .await
    }

    async fn remote_pull(
        &self,
        req: Request<api::RemotePullRequest>,
    ) -> Answer<api::RemoteTransferResponse> {
        let caller = self.caller(&req);
        let r = req.into_inner();
        // Dropped with this call when its caller goes: the pull stops.
        let abandon = Abandon::new(format!("remote pull of {}", r.model_path));
        let (d, gone) = (self.daemon.clone(), abandon.gone());
        let pulled = self
            .run(
                move |_| ops::remote::pull(&d, &caller, (&r.model_path, &r.handout), &gone),
                |_, t| encode::transfer(t),
            )
            .await;
        abandon.finished();
        pulled
    }

    async fn remote_push(
        &self,
        req: Request<api::RemotePushRequest>,
    ) -> Answer<api::RemoteTransferResponse> {
        let caller = self.caller(&req);
        let path = req.into_inner().model_path;
        self.run(
            move |d| ops::remote::push(d, &caller, &path),
            |_, t| encode::transfer(t),
        )
        .await
    }
}
