//! The ctcached client: gRPC over the daemon's Unix socket, a typed async
//! method per RPC, model resolution and leased zero-copy payload access.
//!
//! ```no_run
//! # async fn demo() -> ctcache_client::Result<()> {
//! use ctcache_client::{Client, ResolveOptions};
//! let client = Client::connect().await?;
//! let res = client.resolve_model("/models/m.onnx", &ResolveOptions::default()).await?;
//! for t in &res.tensors {
//!     if let Some(e) = t.entries.first() {
//!         let payload = client.open_payload(e).await?; // leased until dropped
//!         println!("{}: {} bytes", t.name, payload.len());
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Each call is one round trip over the socket. Calls made one at a time
//! get the shortest round trip from a current-thread tokio runtime (as
//! `ctcachectl` uses): a multi-thread runtime adds its thread hops to every
//! call (`daemon_bench`: Lookup p50 ~70-80 µs vs ~115-130 µs on 2 cores).
//! Many lookups go faster as one [`Client::batch_lookup`] or
//! [`Client::resolve_model`].

#![deny(missing_docs)]

mod channel;
mod conn;
mod embed;
mod error;
mod handout;
mod mapped;
mod materialize;
mod socket;
mod stream;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use conn::{Conn, Repeat};

pub use channel::{channel_to, lazy_channel_to};
pub use ctcache_api::v1 as api;
pub use ctcache_files::place::LinkMode;
pub use error::{Error, Result};
pub use handout::Handout;
pub use mapped::{MappedPayload, OpenOptions};
pub use materialize::ForFile;
pub use socket::{default_socket, default_socket_with};
pub use stream::MessageStream;
/// The gRPC status code of a daemon refusal ([`Error::code`]).
pub use tonic::Code;

/// Chunk size of `Put` data messages (the daemon accepts 16 MiB messages).
const PUT_CHUNK: usize = 1 << 20;

/// Options of [`Client::resolve_model`].
#[derive(Debug, Clone, Default)]
pub struct ResolveOptions {
    /// Whether misses start pack jobs, and whether the call waits for them.
    pub on_miss: api::OnMiss,
    /// Formats to resolve; empty = the daemon's policy.
    pub formats: Vec<api::FormatSpec>,
    /// The caller's devices; empty = the daemon's host devices.
    pub devices: Vec<ctcache_format::pb::DeviceProto>,
    /// The caller's runtime (name, version) for the runtime checks of
    /// entries (D5); `None` skips them.
    pub runtime: Option<api::RuntimeIdentity>,
}

/// How long a call that is safe to repeat waits, by default, for a daemon
/// that went away to answer again (a restart by systemd takes well under).
pub const DEFAULT_RETRY_FOR: Duration = Duration::from_secs(5);

/// A connection to ctcached; cheap to clone (one shared HTTP/2 channel).
///
/// When the daemon goes away (a restart), the next call gets a new channel
/// by itself. Calls that are safe to send twice (lookups, resolves, reads,
/// Put of the same bytes, lease renewal, watch changes, status and stats)
/// are sent again with backoff for up to [`Client::retry_for`] before they
/// fail with [`Error::Unavailable`]; the others (AcquireLease,
/// ReleaseLease, Embed, Materialize, Import, Gc, Verify, remote transfers)
/// fail at once, since the daemon may have acted on them. A stream the
/// restart cut (Prepack progress, Events) ends with that error too.
#[derive(Clone)]
pub struct Client {
    conn: Arc<Conn>,
    socket: Arc<PathBuf>,
    retry_for: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("socket", &self.socket)
            .finish()
    }
}

/// An absolute form of a path the caller named: the daemon resolves paths
/// in its own working directory, not the caller's.
pub fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e,
    })
}

/// One call through [`Conn::call`]: `unary!(self, "Rpc", method, req)`
/// fails at once when the connection is lost; `unary!(safe self, ...)` is
/// sent again while the daemon comes back.
macro_rules! unary {
    (safe $self:ident, $rpc:literal, $method:ident, $req:expr, $wrap:path) => {
        $self
            .conn
            .call($rpc, Repeat::Safe, $self.retry_for, $req, |mut grpc, req| async move {
                grpc.$method($wrap(req)).await
            })
            .await
    };
    // A request naming a model: handed over for each attempt.
    (model $repeat:expr, $self:ident, $rpc:literal, $method:ident, $req:expr) => {
        $self
            .call_naming_model($rpc, $repeat, ($req, &[]), |mut grpc, req| async move {
                grpc.$method(req).await
            })
            .await
    };
    (safe $self:ident, $rpc:literal, $method:ident, $req:expr) => {
        unary!(@ Repeat::Safe, $self, $rpc, $method, $req)
    };
    ($self:ident, $rpc:literal, $method:ident, $req:expr) => {
        unary!(@ Repeat::Never, $self, $rpc, $method, $req)
    };
    (@ $repeat:expr, $self:ident, $rpc:literal, $method:ident, $req:expr) => {
        $self
            .conn
            .call($rpc, $repeat, $self.retry_for, $req, |mut grpc, req| async move {
                grpc.$method(req).await
            })
            .await
    };
}

impl Client {
    /// Connects to `CTCACHE_SOCKET`, else the D8 default socket.
    pub async fn connect() -> Result<Client> {
        Client::connect_to(default_socket()).await
    }

    /// Connects to the daemon's socket at `path`.
    pub async fn connect_to(path: impl AsRef<Path>) -> Result<Client> {
        let socket = path.as_ref().to_path_buf();
        socket::probe(&socket).await?;
        let channel = channel_to(&socket).await?;
        let socket = Arc::new(socket);
        Ok(Client {
            conn: Arc::new(Conn::new(socket.clone(), channel)),
            socket,
            retry_for: DEFAULT_RETRY_FOR,
        })
    }

    /// How long calls that are safe to repeat wait for a daemon that went
    /// away (default [`DEFAULT_RETRY_FOR`]; zero: never repeated).
    pub fn retry_for(mut self, wait: Duration) -> Client {
        self.retry_for = wait;
        self
    }

    /// The socket this client talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The daemon host's devices as `DeviceProto`s (D5).
    pub async fn get_host_devices(&self) -> Result<Vec<ctcache_format::pb::DeviceProto>> {
        Ok(unary!(safe
            self,
            "GetHostDevices",
            get_host_devices,
            api::GetHostDevicesRequest {}
        )?
        .devices)
    }

    /// The packers (formats) the daemon can produce, with their parameters.
    pub async fn list_formats(&self) -> Result<Vec<api::FormatInfo>> {
        Ok(unary!(safe
            self,
            "ListFormats",
            list_formats,
            api::ListFormatsRequest {}
        )?
        .formats)
    }

    /// Entries usable by the caller for one source digest.
    pub async fn lookup(&self, req: api::LookupRequest) -> Result<api::LookupResponse> {
        unary!(safe self, "Lookup", lookup, req)
    }

    /// [`Client::lookup`] for several digests in one call; answers in request order.
    pub async fn batch_lookup(
        &self,
        requests: Vec<api::LookupRequest>,
    ) -> Result<Vec<api::LookupResponse>> {
        Ok(unary!(safe
            self,
            "BatchLookup",
            batch_lookup,
            api::BatchLookupRequest { requests }
        )?
        .responses)
    }

    /// Per initializer of the model: digest, usable entries, misses (and,
    /// with `on_miss`, pack jobs for the misses).
    pub async fn resolve_model(
        &self,
        model: impl AsRef<Path>,
        opts: &ResolveOptions,
    ) -> Result<api::ResolveModelResponse> {
        let req = api::ResolveModelRequest {
            model_path: absolute(model.as_ref())?.display().to_string(),
            on_miss: opts.on_miss as i32,
            formats: opts.formats.clone(),
            devices: opts.devices.clone(),
            runtime: opts.runtime.clone(),
            handout: String::new(),
        };
        unary!(model Repeat::Safe, self, "ResolveModel", resolve_model, req)
    }

    /// Starts (or joins) pack jobs; the stream reports each job's states.
    /// Dropping the stream cancels jobs nobody else waits for.
    pub async fn prepack(
        &self,
        mut req: api::PrepackRequest,
    ) -> Result<MessageStream<api::PrepackProgress>> {
        req.model_path = absolute(Path::new(&req.model_path))?.display().to_string();
        let s = unary!(model Repeat::Safe, self, "Prepack", prepack, req)?;
        Ok(MessageStream::new(s, "Prepack", self.socket.clone()))
    }

    /// Stores a payload this process produced (only trusted users may).
    pub async fn put(
        &self,
        header: api::PutHeader,
        payload: bytes::Bytes,
    ) -> Result<api::PutResponse> {
        use api::put_request::Part;
        let mut parts = vec![api::PutRequest {
            part: Some(Part::Header(header)),
        }];
        let mut rest = payload;
        while !rest.is_empty() {
            let chunk = rest.split_to(rest.len().min(PUT_CHUNK));
            parts.push(api::PutRequest {
                part: Some(Part::Data(chunk)),
            });
        }
        // The same key and bytes again store nothing twice: safe.
        unary!(safe self, "Put", put, parts, tokio_stream::iter)
    }

    /// Streams `length` bytes (0 = to the end) of a payload into memory.
    pub async fn read_payload(&self, key: &str, offset: u64, length: u64) -> Result<Vec<u8>> {
        let req = api::ReadPayloadRequest {
            key: key.into(),
            offset,
            length,
        };
        let mut s = MessageStream::new(
            unary!(safe self, "ReadPayload", read_payload, req)?,
            "ReadPayload",
            self.socket.clone(),
        );
        // The length is the caller's wish, not a size anyone checked: the
        // buffer grows with what arrives beyond a first 64 MiB.
        let mut out = Vec::with_capacity(usize::try_from(length).unwrap_or(0).min(64 << 20));
        while let Some(chunk) = s.next().await? {
            let expected = offset.saturating_add(out.len() as u64);
            let mismatch = |detail: String| Error::PayloadMismatch {
                key: key.into(),
                detail,
            };
            if chunk.offset != expected {
                return Err(mismatch(format!(
                    "chunk at offset {} where {expected} was expected",
                    chunk.offset
                )));
            }
            let total = out.len() as u64 + chunk.data.len() as u64;
            if length != 0 && total > length {
                return Err(mismatch(format!(
                    "{total} bytes sent where {length} were asked for"
                )));
            }
            out.extend_from_slice(&chunk.data);
        }
        Ok(out)
    }

    /// Pins entry `key` against gc for `ttl` (the daemon clamps it to its
    /// limit); returns the lease.
    pub async fn acquire_lease(&self, key: &str, ttl: Duration) -> Result<api::LeaseResponse> {
        let req = api::AcquireLeaseRequest {
            key: key.into(),
            ttl_ms: ttl.as_millis() as u64,
        };
        unary!(self, "AcquireLease", acquire_lease, req)
    }

    /// Extends a lease to `ttl` from now.
    pub async fn renew_lease(&self, lease_id: u64, ttl: Duration) -> Result<api::LeaseResponse> {
        let req = api::RenewLeaseRequest {
            lease_id,
            ttl_ms: ttl.as_millis() as u64,
        };
        unary!(safe self, "RenewLease", renew_lease, req)
    }

    /// Ends a lease; the entry may be collected again.
    pub async fn release_lease(&self, lease_id: u64) -> Result<()> {
        unary!(
            self,
            "ReleaseLease",
            release_lease,
            api::ReleaseLeaseRequest { lease_id }
        )
        .map(|_| ())
    }

    /// A payload's bytes under a lease: mapped when the file is readable,
    /// else streamed (see [`OpenOptions`]).
    pub async fn open_payload(&self, entry: &api::Entry) -> Result<MappedPayload> {
        self.open_payload_with(entry, &OpenOptions::default()).await
    }

    /// [`Client::open_payload`] with explicit options (mapping, lease ttl).
    pub async fn open_payload_with(
        &self,
        entry: &api::Entry,
        opts: &OpenOptions,
    ) -> Result<MappedPayload> {
        mapped::open(self, entry, opts).await
    }

    /// An onnxruntime-ready model for the request's target, built in
    /// memory: the model's bytes and a lease on each payload it reads (see
    /// [`Client::materialize_to`] for a file); the model path is made
    /// absolute here.
    pub async fn materialize(
        &self,
        mut req: api::MaterializeRequest,
    ) -> Result<api::MaterializeResponse> {
        req.model_path = absolute(Path::new(&req.model_path))?.display().to_string();
        unary!(model Repeat::Never, self, "Materialize", materialize, req)
    }

    /// A runtime's compiled form of a model (D15), leased to this process:
    /// the daemon compiles it when no form of the key is stored (unless
    /// `lookup_only`); a miss names why. The path is made absolute here and
    /// the model handed over.
    pub async fn compile(&self, mut req: api::CompileRequest) -> Result<api::CompileResponse> {
        req.model_path = absolute(Path::new(&req.model_path))?.display().to_string();
        unary!(model Repeat::Never, self, "Compile", compile, req)
    }

    /// Copies the compiled tensors a model carries into the store.
    pub async fn import(&self, model: impl AsRef<Path>) -> Result<api::ImportResponse> {
        let req = api::ImportRequest {
            model_path: absolute(model.as_ref())?.display().to_string(),
            handout: String::new(),
        };
        unary!(model Repeat::Never, self, "Import", import, req)
    }

    /// Entry counts, bytes per format and device, hits, misses and leases.
    pub async fn stats(&self) -> Result<api::StatsResponse> {
        unary!(safe self, "Stats", stats, api::StatsRequest {})
    }

    /// Entries matching the filters of `req` (format, device, digest, model).
    pub async fn list(&self, req: api::ListRequest) -> Result<Vec<api::Entry>> {
        Ok(unary!(safe self, "List", list, req)?.entries)
    }

    /// Collects unleased entries over the size or age budget (or reports them, with `dry_run`).
    pub async fn gc(&self, req: api::GcRequest) -> Result<api::GcResponse> {
        unary!(self, "Gc", gc, req)
    }

    /// Checks every payload against its hash; `repair` also removes orphans and dangling records.
    pub async fn verify(&self, repair: bool) -> Result<api::VerifyResponse> {
        unary!(self, "Verify", verify, api::VerifyRequest { repair })
    }

    /// Adds a folder the daemon watches for new models; returns every watched folder.
    pub async fn add_watch(&self, dir: impl AsRef<Path>) -> Result<Vec<String>> {
        let dir = absolute(dir.as_ref())?.display().to_string();
        Ok(unary!(safe self, "AddWatch", add_watch, api::WatchRequest { dir })?.dirs)
    }

    /// Stops watching a folder; returns the folders still watched.
    pub async fn remove_watch(&self, dir: impl AsRef<Path>) -> Result<Vec<String>> {
        let dir = absolute(dir.as_ref())?.display().to_string();
        Ok(unary!(safe self, "RemoveWatch", remove_watch, api::WatchRequest { dir })?.dirs)
    }

    /// The folders the daemon watches.
    pub async fn list_watches(&self) -> Result<Vec<String>> {
        Ok(unary!(safe
            self,
            "ListWatches",
            list_watches,
            api::ListWatchesRequest {}
        )?
        .dirs)
    }

    /// Follows the daemon's events from now on.
    pub async fn events(&self) -> Result<MessageStream<api::Event>> {
        let s = unary!(safe self, "Events", events, api::EventsRequest {})?;
        Ok(MessageStream::new(s, "Events", self.socket.clone()))
    }

    /// The daemon's identity, uptime and counters (`ctcachectl status`).
    pub async fn status(&self) -> Result<api::StatusResponse> {
        unary!(safe self, "Status", status, api::StatusRequest {})
    }

    /// The daemon's fleet tier, its remote probed now (`None`: no remote
    /// configured).
    pub async fn remote_status(&self) -> Result<Option<api::RemoteStatus>> {
        let r = unary!(safe
            self,
            "RemoteStatus",
            remote_status,
            api::RemoteStatusRequest {}
        )?;
        Ok(r.remote)
    }

    /// Fetches every wanted entry of `model` the daemon's store lacks from
    /// its remote (packs nothing).
    pub async fn remote_pull(&self, model: &Path) -> Result<api::RemoteTransferResponse> {
        let model_path = absolute(model)?.display().to_string();
        let req = api::RemotePullRequest {
            model_path,
            handout: String::new(),
        };
        unary!(model Repeat::Safe, self, "RemotePull", remote_pull, req)
    }

    /// Uploads the daemon's entries (of `model`, or all) its remote lacks.
    pub async fn remote_push(&self, model: Option<&Path>) -> Result<api::RemoteTransferResponse> {
        // Entries record the model's real path.
        let model_path = match model {
            Some(m) => std::fs::canonicalize(m)
                .map_err(|source| Error::Io {
                    path: m.to_path_buf(),
                    source,
                })?
                .display()
                .to_string(),
            None => String::new(),
        };
        unary!(
            self,
            "RemotePush",
            remote_push,
            api::RemotePushRequest { model_path }
        )
    }
}

/// An error and its sources on one line (tonic's own text is only
/// "transport error"); a status shows its message, not its debug fields.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = match e.downcast_ref::<tonic::Status>() {
        Some(status) => status.message().to_string(),
        None => e.to_string(),
    };
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
