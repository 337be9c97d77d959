//! The object store client: reads and writes the two objects of an entry
//! under a short deadline (a load path cannot wait out object_store's
//! default ten retries over three minutes).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ctcache::store::EntryKey;
use futures_util::stream::{BoxStream, StreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
    WriteMultipart,
};

use crate::config::Settings;
use crate::layout;
use crate::manifest::MAX_MANIFEST_BYTES;

/// Payloads above this go up in parts.
const MULTIPART_ABOVE: usize = 32 << 20;
const PART_BYTES: usize = 16 << 20;
/// Parts of one upload under way at once.
const PARTS_AT_ONCE: usize = 4;

/// Why a remote request failed; the caller counts it against the breaker and misses.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// No answer, or a stalled stream, within the configured timeout.
    #[error("the remote did not answer within {0:?}")]
    Timeout(Duration),
    /// The object store client failed (network, auth, not found, ...).
    #[error("{0}")]
    Store(#[from] object_store::Error),
    /// An object's size differs from what its manifest or the limit allows.
    #[error("object {path} has {len} bytes, expected {want}")]
    Size {
        /// The object's name in the bucket.
        path: String,
        /// Its size as the server reports it, bytes.
        len: u64,
        /// The size expected: an exact length or `at most N`.
        want: String,
    },
    /// The `[remote]` config cannot build a client (bad URL, endpoint, ...).
    #[error("remote config: {0}")]
    Config(String),
}

/// `f`'s outcome, or a timeout once `limit` has passed.
async fn within<T>(
    limit: Duration,
    f: impl std::future::Future<Output = object_store::Result<T>>,
) -> Result<T, RemoteError> {
    tokio::time::timeout(limit, f)
        .await
        .map_err(|_| RemoteError::Timeout(limit))?
        .map_err(RemoteError::from)
}

/// How long a request sending `bytes` is waited for: `timeout` for the
/// answer, and the bytes at `floor` bytes a second (object_store reports
/// no progress while a body goes up, so a stalled server is told from a
/// slow one by this floor alone).
pub fn upload_deadline(timeout: Duration, bytes: usize, floor: u64) -> Duration {
    let sending = Duration::from_secs_f64(bytes as f64 / floor.max(1) as f64);
    timeout + sending
}

impl RemoteError {
    /// The object is not on the server.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            RemoteError::Store(object_store::Error::NotFound { .. })
        )
    }
}

/// One bucket prefix on an S3-compatible server.
pub struct Client {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    timeout: Duration,
    /// `min_upload_bytes_per_s`.
    upload_floor: u64,
    /// Where it is, for status.
    pub describe: String,
}

/// A payload being downloaded: its chunks, each due within the timeout.
pub struct PayloadStream {
    inner: BoxStream<'static, object_store::Result<Bytes>>,
    timeout: Duration,
}

impl PayloadStream {
    /// The next chunk; `None` at the end.
    pub async fn next(&mut self) -> Option<Result<Bytes, RemoteError>> {
        match tokio::time::timeout(self.timeout, self.inner.next()).await {
            Err(_) => Some(Err(RemoteError::Timeout(self.timeout))),
            Ok(c) => c.map(|r| r.map_err(RemoteError::from)),
        }
    }
}

impl Client {
    /// A client for `s`; credentials come from the standard AWS environment.
    pub fn new(s: &Settings) -> Result<Client, RemoteError> {
        let t = s.timeout();
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&s.location.bucket)
            .with_allow_http(s.config.allow_http)
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(50),
                    max_backoff: t / 4,
                    base: 2.0,
                },
                max_retries: 1,
                retry_timeout: t,
            })
            // Whole-request timeouts would cut long payload streams: each
            // call below bounds the wait for an answer, and each chunk.
            .with_client_options(
                ClientOptions::new()
                    .with_connect_timeout(t)
                    .with_timeout_disabled()
                    .with_allow_http(s.config.allow_http),
            );
        if !s.config.endpoint.is_empty() {
            b = b.with_endpoint(&s.config.endpoint);
        }
        if !s.config.region.is_empty() {
            b = b.with_region(&s.config.region);
        }
        let store = b.build().map_err(|e| RemoteError::Config(e.to_string()))?;
        let endpoint = if s.config.endpoint.is_empty() {
            "aws"
        } else {
            &s.config.endpoint
        };
        Ok(Client {
            store: Arc::new(store),
            prefix: s.location.prefix.clone(),
            timeout: t,
            upload_floor: s.config.min_upload_bytes_per_s,
            describe: format!("{} at {endpoint}", s.config.url),
        })
    }

    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = object_store::Result<T>>,
    ) -> Result<T, RemoteError> {
        within(self.timeout, f).await
    }

    /// [`Client::bounded`] for a wait on `bytes` going up.
    async fn sending<T>(
        &self,
        bytes: usize,
        f: impl std::future::Future<Output = object_store::Result<T>>,
    ) -> Result<T, RemoteError> {
        within(upload_deadline(self.timeout, bytes, self.upload_floor), f).await
    }

    /// The manifest of `key`; `None` when there is none.
    pub async fn manifest(&self, key: &EntryKey) -> Result<Option<Bytes>, RemoteError> {
        let path = Path::from(layout::objects(&self.prefix, key).manifest);
        let got = match self.bounded(self.store.get(&path)).await {
            Err(RemoteError::Store(object_store::Error::NotFound { .. })) => return Ok(None),
            r => r?,
        };
        if got.meta.size > MAX_MANIFEST_BYTES {
            return Err(RemoteError::Size {
                path: path.to_string(),
                len: got.meta.size,
                want: format!("at most {MAX_MANIFEST_BYTES}"),
            });
        }
        self.bounded(got.bytes()).await.map(Some)
    }

    /// Starts reading the payload of `key`, which must be `len` bytes.
    pub async fn payload(&self, key: &EntryKey, len: u64) -> Result<PayloadStream, RemoteError> {
        let path = Path::from(layout::objects(&self.prefix, key).payload);
        let got = self.bounded(self.store.get(&path)).await?;
        if got.meta.size != len {
            return Err(RemoteError::Size {
                path: path.to_string(),
                len: got.meta.size,
                want: len.to_string(),
            });
        }
        Ok(PayloadStream {
            inner: got.into_stream(),
            timeout: self.timeout,
        })
    }

    /// Uploads the payload of `key` (in parts when large). Each wait gets
    /// the timeout and the time the bytes under way take at
    /// `min_upload_bytes_per_s` ([`upload_deadline`]); the upload as a
    /// whole is the caller's.
    pub async fn put_payload(&self, key: &EntryKey, data: Bytes) -> Result<(), RemoteError> {
        let path = Path::from(layout::objects(&self.prefix, key).payload);
        let len = data.len();
        if len <= MULTIPART_ABOVE {
            let put = self.store.put(&path, PutPayload::from_bytes(data));
            self.sending(len, put).await?;
            return Ok(());
        }
        let upload = self.bounded(self.store.put_multipart(&path)).await?;
        let mut w = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        let under_way = PARTS_AT_ONCE * PART_BYTES;
        for part in data.chunks(PART_BYTES) {
            self.sending(under_way, w.wait_for_capacity(PARTS_AT_ONCE))
                .await?;
            w.write(part);
        }
        self.sending(under_way.min(len), w.finish()).await?;
        Ok(())
    }

    /// The payload object of `key`, for people (logs).
    pub fn payload_path(&self, key: &EntryKey) -> String {
        layout::objects(&self.prefix, key).payload
    }

    /// Uploads a manifest: the commit point of its entry.
    pub async fn put_manifest(&self, key: &EntryKey, manifest: Vec<u8>) -> Result<(), RemoteError> {
        let path = Path::from(layout::objects(&self.prefix, key).manifest);
        self.bounded(self.store.put(&path, PutPayload::from(manifest)))
            .await?;
        Ok(())
    }

    /// Whether the bucket answers (a missing object is an answer).
    pub async fn reachable(&self) -> Result<(), RemoteError> {
        let probe = Path::from(if self.prefix.is_empty() {
            format!("{}/.probe", layout::LAYOUT)
        } else {
            format!("{}/{}/.probe", self.prefix, layout::LAYOUT)
        });
        match self.bounded(self.store.head(&probe)).await {
            Ok(_) | Err(RemoteError::Store(object_store::Error::NotFound { .. })) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
