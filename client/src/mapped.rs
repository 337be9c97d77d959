//! Payloads opened for use: a read-only map of the daemon's payload file,
//! kept in the store by a lease that a background task renews, or (when the
//! file is not readable by this process) a copy streamed over the socket.
//!
//! What is checked: the daemon compares the payload file with the one it
//! hashed (identity: device, inode, size, mtime, ctime; rehashed if it
//! changed) when it grants the lease, and refuses damaged bytes (DATA_LOSS);
//! a streamed copy was checked group by group as it was sent.
//! [`OpenOptions::verify`] rehashes the whole payload at open. Bytes that
//! change on disk after the lease was granted (a failing disk under a live
//! map) are seen only by [`MappedPayload::checked`], which hashes the
//! 256 KiB groups a read touches, every time.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use memmap2::Mmap;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use ctcache_format::chunks::ChunkDigests;

use crate::api;
use crate::error::{Error, Result};
use crate::Client;

/// How [`Client::open_payload_with`] opens a payload.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Lease time to live; renewed every `ttl / 3` while the payload is open,
    /// so a crashed caller's lease lapses after at most `ttl`.
    pub ttl: Duration,
    /// Rehash the bytes and compare with the entry's `payload_blake3`.
    pub verify: bool,
    /// Map the payload file when readable (default); `false` always streams
    /// it with `ReadPayload` into memory.
    pub map: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            ttl: Duration::from_secs(60),
            verify: false,
            map: true,
        }
    }
}

enum Data {
    Mapped(Mmap),
    Memory(Vec<u8>),
}

/// A payload's bytes (`Deref<Target = [u8]>`). While a mapped payload is
/// alive its entry is leased, so gc leaves it in the store; dropping it
/// releases the lease from a task on the runtime it was opened on. That
/// runtime must keep running for renewals and the release (on a
/// current-thread runtime: be driven); if it is gone, the lease lapses after
/// its ttl. [`MappedPayload::release`] releases and waits for the daemon.
pub struct MappedPayload {
    data: Data,
    entry: api::Entry,
    lease: Option<LeaseGuard>,
    /// The group digests, taken (and checked against `payload_blake3`) at
    /// the first [`MappedPayload::checked`] read.
    digests: OnceLock<std::result::Result<ChunkDigests, RootMismatch>>,
}

/// The whole payload does not hash to its entry's `payload_blake3`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("its blake3 is {found}, the entry says {expected}")]
struct RootMismatch {
    found: String,
    expected: String,
}

/// The group digests of `bytes`, when their root is `expected` (the
/// entry's `payload_blake3`, hex).
fn group_digests(bytes: &[u8], expected: &str) -> std::result::Result<ChunkDigests, RootMismatch> {
    let d = ChunkDigests::of(bytes, true);
    let root = blake3::Hash::from(d.root()).to_hex();
    if root.as_str().eq_ignore_ascii_case(expected) {
        Ok(d)
    } else {
        Err(RootMismatch {
            found: root.to_string(),
            expected: expected.to_string(),
        })
    }
}

impl MappedPayload {
    /// The entry, as the daemon described it when the lease was taken.
    pub fn entry(&self) -> &api::Entry {
        &self.entry
    }

    /// True when the bytes are a map of the payload file (zero-copy).
    pub fn is_mapped(&self) -> bool {
        matches!(self.data, Data::Mapped(_))
    }

    /// The lease keeping the entry, while one is held.
    pub fn lease_id(&self) -> Option<u64> {
        self.lease.as_ref().map(|l| l.id.load(Ordering::Relaxed))
    }

    /// The payload's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.data {
            Data::Mapped(m) => m,
            Data::Memory(v) => v,
        }
    }

    /// The bytes of `range`, every 256 KiB group it touches hashed now and
    /// compared with the group digests taken at the first checked read
    /// (which hashes the whole payload once and checks it against the
    /// entry's `payload_blake3`): bytes that changed on disk since are an
    /// error ([`Error::PayloadMismatch`] naming the offset), never returned.
    pub fn checked(&self, range: Range<usize>) -> Result<&[u8]> {
        let bytes = self.as_bytes();
        let mismatch = |detail: String| Error::PayloadMismatch {
            key: self.entry.key.clone(),
            detail,
        };
        if range.start > range.end || range.end > bytes.len() {
            return Err(Error::InvalidArgument(format!(
                "range {range:?} of a payload of {} bytes",
                bytes.len()
            )));
        }
        let digests = self
            .digests
            .get_or_init(|| group_digests(bytes, &self.entry.payload_blake3))
            .as_ref()
            .map_err(|e| mismatch(e.to_string()))?;
        if range.is_empty() {
            return Ok(&bytes[range]);
        }
        let group = ctcache_format::chunks::GROUP;
        for i in range.start / group..=(range.end - 1) / group {
            let g = digests.range(i);
            if !digests.check(i, &bytes[g.clone()]) {
                return Err(mismatch(format!(
                    "bytes {}..{} changed since they were checked",
                    g.start, g.end
                )));
            }
        }
        Ok(&bytes[range])
    }

    /// Releases the lease now and waits for the daemon to confirm.
    pub async fn release(mut self) -> Result<()> {
        match self.lease.take() {
            Some(l) => l.release().await,
            None => Ok(()),
        }
    }
}

impl std::ops::Deref for MappedPayload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<[u8]> for MappedPayload {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl std::fmt::Debug for MappedPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedPayload")
            .field("key", &self.entry.key)
            .field("len", &self.as_bytes().len())
            .field("mapped", &self.is_mapped())
            .field("lease", &self.lease_id())
            .finish()
    }
}

/// Owns a lease: renews it every ttl/3; dropping `stop` (or sending on it)
/// makes the task release it.
struct LeaseGuard {
    id: Arc<AtomicU64>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<()>>>,
}

impl LeaseGuard {
    fn start(client: Client, key: String, id: u64, ttl: Duration) -> LeaseGuard {
        let shared = Arc::new(AtomicU64::new(id));
        let (stop, mut stopped) = oneshot::channel::<()>();
        let ids = shared.clone();
        let task = tokio::spawn(async move {
            let period = (ttl / 3).max(Duration::from_millis(10));
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tokio::time::sleep(period) => {
                        let current = ids.load(Ordering::Relaxed);
                        if client.renew_lease(current, ttl).await.is_err() {
                            // Expired (e.g. this process was suspended past
                            // the ttl): take a new lease on the same entry.
                            if let Ok(l) = client.acquire_lease(&key, ttl).await {
                                ids.store(l.lease_id, Ordering::Relaxed);
                            }
                        }
                    }
                }
            }
            client.release_lease(ids.load(Ordering::Relaxed)).await
        });
        LeaseGuard {
            id: shared,
            stop: Some(stop),
            task: Some(task),
        }
    }

    async fn release(mut self) -> Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.task.take() {
            Some(t) => t
                .await
                .map_err(|e| Error::InvalidArgument(format!("lease task failed: {e}")))?,
            None => Ok(()),
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        // Dropping the sender wakes the task, which releases the lease.
        self.stop.take();
    }
}

pub(crate) async fn open(
    client: &Client,
    entry: &api::Entry,
    opts: &OpenOptions,
) -> Result<MappedPayload> {
    let lease = client.acquire_lease(&entry.key, opts.ttl).await?;
    // The lease is taken before the file is opened: gc cannot remove the
    // entry in between.
    let guard = LeaseGuard::start(client.clone(), entry.key.clone(), lease.lease_id, opts.ttl);
    let entry = lease.entry.unwrap_or_else(|| entry.clone());
    let mapped = if opts.map { map_file(&entry)? } else { None };
    let mut payload = match mapped {
        Some(m) => MappedPayload {
            data: Data::Mapped(m),
            entry,
            lease: Some(guard),
            digests: OnceLock::new(),
        },
        None => {
            let bytes = client.read_payload(&entry.key, 0, 0).await?;
            // The copy is ours: no lease needed to keep it.
            guard.release().await?;
            MappedPayload {
                data: Data::Memory(bytes),
                entry,
                lease: None,
                digests: OnceLock::new(),
            }
        }
    };
    if opts.verify {
        if let Err(e) = verify(&payload) {
            if let Some(l) = payload.lease.take() {
                let _ = l.release().await;
            }
            return Err(e);
        }
    }
    Ok(payload)
}

/// Maps the payload file; `None` when this process may not read it (or it
/// lives in a file system it cannot see), so the bytes must be streamed.
fn map_file(entry: &api::Entry) -> Result<Option<Mmap>> {
    if entry.payload_path.is_empty() || entry.payload_len == 0 {
        // A zero-length map is an error on Linux; stream (nothing) instead.
        return Ok(None);
    }
    let file = match std::fs::File::open(&entry.payload_path) {
        Ok(f) => f,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::NotFound
            ) =>
        {
            return Ok(None)
        }
        Err(e) => {
            return Err(Error::Io {
                path: entry.payload_path.clone().into(),
                source: e,
            })
        }
    };
    // SAFETY: payload files are published once and never modified or
    // truncated afterwards (store invariant); removal only unlinks, and the
    // map stays valid after that.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::Io {
        path: entry.payload_path.clone().into(),
        source: e,
    })?;
    // Payloads are read whole: where the file is not cached yet, this makes
    // the kernel read it in huge-page folios and map each with one page
    // table entry, so this map and every later one take far fewer page
    // faults. Advisory: ignored where unsupported.
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    Ok(Some(map))
}

fn verify(p: &MappedPayload) -> Result<()> {
    let e = p.entry();
    let bytes = p.as_bytes();
    if bytes.len() as u64 != e.payload_len {
        return Err(Error::PayloadMismatch {
            key: e.key.clone(),
            detail: format!("{} bytes, the entry says {}", bytes.len(), e.payload_len),
        });
    }
    let actual = blake3::hash(bytes).to_hex();
    if !actual.as_str().eq_ignore_ascii_case(&e.payload_blake3) {
        return Err(Error::PayloadMismatch {
            key: e.key.clone(),
            detail: format!(
                "its blake3 is {actual}, the entry says {}",
                e.payload_blake3
            ),
        });
    }
    Ok(())
}
