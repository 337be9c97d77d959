//! Read-through on a local miss: whether the miss asks the remote, one
//! fetch (signed manifest, the audit's own pack, the payload checked as it
//! streams into the store), and what its outcome does to the breaker, the
//! counters and the logs.

use std::io::{self, Read};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ctcache::store::{Entry, EntryKey, Store, StoreError, Stored};
use ctcache_remote::audit::{self, Matching};
use ctcache_remote::client::{PayloadStream, RemoteError};
use ctcache_remote::fetch_check::Checked;
use ctcache_remote::manifest::{self, Accepted, Rejected, Trust};
use tokio::runtime::Handle;

use super::{Ask, Fleet, Packing, Repack, Source};
use crate::flights::Gone;
use crate::locks::lock;

/// Quarantined keys remembered at most (then forgotten all at once).
const QUARANTINE_MAX: usize = 65_536;

/// Why one fetch did not produce an entry.
pub(super) enum Failed {
    /// The remote does not have it.
    Absent,
    Rejected(&'static str, String),
    /// Signed by a trusted key, intact, and not what this host's packer
    /// produces.
    AuditMismatch {
        signer: String,
        detail: String,
    },
    Remote(&'static str, RemoteError),
    /// The local store did not take it.
    Store(StoreError),
    /// Something of this host went wrong (an audit that could not pack).
    Local(String),
    /// Nobody waits for it any more: stopped, nothing of it published.
    Abandoned(String),
}

impl Failed {
    /// The failure of a fetch that stopped because nobody waits for it.
    pub(super) fn nobody_waits() -> Failed {
        Failed::Abandoned("nobody waits for the form any more".into())
    }
}

/// `fut` run from a blocking thread to its end, or `None` once `until` is
/// set (the wait for a server's answer or bytes ends with the last waiter).
fn until_gone<F: std::future::Future>(
    rt: &Handle,
    until: Option<&Gone>,
    fut: F,
) -> Option<F::Output> {
    let Some(gone) = until else {
        return Some(rt.block_on(fut));
    };
    rt.block_on(async {
        tokio::select! {
            biased;
            _ = gone.wait() => None,
            out = fut => Some(out),
        }
    })
}

impl Fleet {
    /// [`until_gone`] on this fleet's runtime, its stop a failure.
    fn waited<F: std::future::Future>(
        &self,
        until: Option<&Gone>,
        fut: F,
    ) -> Result<F::Output, Failed> {
        until_gone(&self.rt, until, fut).ok_or_else(Failed::nobody_waits)
    }

    /// Read-through for a local miss of `key`, from a blocking thread (a
    /// pack job's, or a `remote pull`'s): the entry, stored exactly as a
    /// local pack would store it, or `None` (then the job packs); an error
    /// only when the local store is out of space. `ask` says whether the
    /// cost rule decides; `audit_rate` of the fetches are packed again with
    /// `packing.repack` and must be equal.
    pub fn fetch(
        &self,
        store: &Store,
        key: &EntryKey,
        ask: Ask,
        source: Source,
        packing: Packing<'_>,
    ) -> Result<Option<Entry>, StoreError> {
        let rule = (ask == Ask::CostRule).then_some((packing.format, packing.backend));
        if !self.asks_remote(key, rule) {
            return Ok(None);
        }
        let started = Instant::now();
        let mut repacking = Duration::ZERO;
        let got = self.try_fetch(store, key, source, packing.repack, &mut repacking);
        let took = started.elapsed().saturating_sub(repacking);
        self.settle(key, got, Some(took))
    }

    /// Whether a local miss of `key` asks the remote: reads are on, the key
    /// is not quarantined, the cost rule says fetching pays (where `rule`
    /// names the format and backend it weighs), the key is no known miss
    /// and the breaker is closed. Counts the misses and skips it decides.
    pub(super) fn asks_remote(&self, key: &EntryKey, rule: Option<(&str, &str)>) -> bool {
        let s = &self.shared;
        if !s.settings.config.read {
            return false;
        }
        if lock(&self.quarantined).contains(key) {
            s.counters.miss();
            return false;
        }
        if let Some((format, backend)) = rule {
            let fetch = lock(&self.costs).should_fetch(s.settings.config.fetch, format, backend);
            s.counters.chose(fetch);
            if !fetch {
                return false;
            }
        }
        let mut g = lock(&self.guard);
        let now = Instant::now();
        if g.1.known_miss(key, now) {
            s.counters.miss();
            return false;
        }
        if !g.0.allow(now) {
            s.counters.skipped();
            return false;
        }
        true
    }

    /// What the outcome `got` of a fetch of `key` does to the breaker, the
    /// negative cache, the quarantine, the counters and the logs; `took`:
    /// the fetch's time less the audit's own pack, for the cost rule's rate
    /// of the remote (`None`: not a measure of it). Only a full local store
    /// is an error: every other failure is a miss.
    pub(super) fn settle(
        &self,
        key: &EntryKey,
        got: Result<Entry, Failed>,
        took: Option<Duration>,
    ) -> Result<Option<Entry>, StoreError> {
        let s = &self.shared;
        let mut g = lock(&self.guard);
        match got {
            Ok(e) => {
                g.0.success();
                s.answered();
                s.counters.hit(e.payload.len);
                if let Some(took) = took {
                    lock(&self.costs).fetched(e.payload.len, took);
                }
                tracing::debug!(%key, bytes = e.payload.len, "remote hit");
                Ok(Some(e))
            }
            Err(Failed::Absent) => {
                g.0.success();
                s.answered();
                g.1.remember(*key, Instant::now());
                s.counters.miss();
                Ok(None)
            }
            Err(Failed::Rejected(reason, detail)) => {
                // The server answered; what it holds is not for us.
                g.0.success();
                s.answered();
                g.1.remember(*key, Instant::now());
                s.counters.rejected(reason);
                tracing::warn!(%key, reason, "remote entry rejected: {detail}");
                Ok(None)
            }
            Err(Failed::AuditMismatch { signer, detail }) => {
                g.0.success();
                s.answered();
                self.quarantine(*key);
                s.counters.rejected("audit_mismatch");
                s.counters.audit_mismatch(&signer);
                tracing::warn!(
                    %key,
                    signer = %signer,
                    object = %s.client.payload_path(key),
                    "remote entry failed its audit, quarantined (not fetched again until restart): \
                     signed by trusted key {signer:?}, {detail}"
                );
                Ok(None)
            }
            Err(Failed::Remote(during, e)) => {
                s.counters.error(during);
                let opened = g.0.failure(Instant::now());
                s.failed(&format!("remote {during} of {key} failed: {e}"));
                if opened {
                    tracing::warn!(
                        cooldown_s = ctcache_remote::breaker::BREAKER_COOLDOWN.as_secs(),
                        "remote: too many failures in a row; skipping it for a while"
                    );
                }
                Ok(None)
            }
            Err(Failed::Store(e)) => {
                s.counters.error("store");
                // A full disk is the caller's answer (RESOURCE_EXHAUSTED), not
                // a miss to pack instead: packing would fill it the same way.
                if e.is_no_space() {
                    return Err(e);
                }
                tracing::warn!(%key, "storing a fetched entry failed: {e}");
                Ok(None)
            }
            Err(Failed::Local(e)) => {
                s.counters.error("store");
                tracing::warn!(%key, "storing a fetched entry failed: {e}");
                Ok(None)
            }
            Err(Failed::Abandoned(why)) => {
                tracing::info!(%key, "fetch stopped: {why}");
                Ok(None)
            }
        }
    }

    /// Keeps `key` from being fetched again (bounded: when full, the list
    /// starts over).
    fn quarantine(&self, key: EntryKey) {
        let mut q = lock(&self.quarantined);
        if q.len() >= QUARANTINE_MAX {
            q.clear();
        }
        q.insert(key);
    }

    /// One fetch of `key`: its manifest opened against the trusted keys,
    /// this host's own pack when an audit is due (its time in `repacking`),
    /// then the payload checked as it streams into `store`.
    fn try_fetch(
        &self,
        store: &Store,
        key: &EntryKey,
        source: Source,
        repack: &Repack<'_>,
        repacking: &mut Duration,
    ) -> Result<Entry, Failed> {
        let s = &self.shared;
        let accepted = self.manifest(key, &s.settings.trust, None)?;
        // Packed before the download: the payload is compared as it streams
        // and never published when it differs.
        let audit = if audit::due(s.settings.config.audit_rate) {
            let t = Instant::now();
            let packed = repack();
            *repacking = t.elapsed();
            s.counters.audited(packed.is_ok());
            Some(packed.map_err(|e| Failed::Local(format!("cannot audit: {e}")))?)
        } else {
            None
        };
        let new = manifest::new_entry(&accepted, source.shape, source.names, source.model_paths);
        let (put, audit_mismatch) = self.streamed(key, &accepted, None, |checked| match audit {
            None => (store.put(&new, checked), None),
            Some(packed) => {
                let mut matching = Matching::new(checked, packed);
                let put = store.put(&new, &mut matching);
                (put, matching.mismatch().map(ToString::to_string))
            }
        })?;
        if let Some(detail) = audit_mismatch {
            return Err(Failed::AuditMismatch {
                signer: accepted.signer,
                detail,
            });
        }
        stored_as(put, key)
    }

    /// The manifest of `key`, opened against `trust`; the wait for it ends
    /// once `until` is set.
    pub(super) fn manifest(
        &self,
        key: &EntryKey,
        trust: &Trust,
        until: Option<&Gone>,
    ) -> Result<Accepted, Failed> {
        let got = self.waited(until, self.shared.client.manifest(key))?;
        self.opened(key, trust, got)
    }

    /// Both objects of `key` asked for at once, its payload as `len` bytes
    /// (a length the asker knows already): the manifest opened against
    /// `trust`, and the payload's answer, read only once the manifest is
    /// accepted (D11: a payload without its manifest does not exist). A
    /// payload not found is asked again once: its request may have reached
    /// the server before an upload's payload, the manifest's after it (the
    /// manifest goes up last). The wait for the answers ends once `until`
    /// is set.
    pub(super) fn manifest_and_payload(
        &self,
        key: &EntryKey,
        len: u64,
        trust: &Trust,
        until: &Gone,
    ) -> Result<(Accepted, PayloadAnswer), Failed> {
        let c = &self.shared.client;
        let both = futures_util::future::join(c.manifest(key), c.payload(key, len));
        let (manifest, payload) = self.waited(Some(until), both)?;
        let accepted = self.opened(key, trust, manifest)?;
        let payload = match payload {
            Err(e) if e.is_not_found() => self.waited(Some(until), c.payload(key, len))?,
            payload => payload,
        };
        Ok((accepted, payload))
    }

    /// The manifest the remote answered for `key`, opened against `trust`.
    fn opened(
        &self,
        key: &EntryKey,
        trust: &Trust,
        got: Result<Option<Bytes>, RemoteError>,
    ) -> Result<Accepted, Failed> {
        let bytes = got
            .map_err(|e| Failed::Remote("manifest", e))?
            .ok_or(Failed::Absent)?;
        let max = self.shared.settings.config.max_object_bytes;
        manifest::open(&bytes, trust, key, max)
            .map_err(|r: Rejected| Failed::Rejected(r.reason(), r.to_string()))
    }

    /// Streams the payload of the accepted entry `key` into `consume` (a
    /// `put`, a read into memory) through its length and blake3 check; what
    /// `consume` returned, once the stream's end says the bytes were the
    /// manifest's and the transport held. Once `until` is set, the stream
    /// fails, even while it waits for the server's next bytes.
    pub(super) fn streamed<T>(
        &self,
        key: &EntryKey,
        accepted: &Accepted,
        until: Option<&Gone>,
        consume: impl FnOnce(&mut dyn Read) -> T,
    ) -> Result<T, Failed> {
        let asked = self.shared.client.payload(key, accepted.payload.len);
        let answer = self.waited(until, asked)?;
        self.streamed_from(answer, accepted, until, consume)
    }

    /// [`Fleet::streamed`] from a payload request already answered.
    pub(super) fn streamed_from<T>(
        &self,
        answer: PayloadAnswer,
        accepted: &Accepted,
        until: Option<&Gone>,
        consume: impl FnOnce(&mut dyn Read) -> T,
    ) -> Result<T, Failed> {
        let mut reader = self.reader(answer, until)?;
        let mut checked = Checked::new(&mut reader, accepted.payload);
        let out = consume(&mut checked);
        if let Some(m) = checked.mismatch() {
            return Err(Failed::Rejected("bad_checksum", m.to_string()));
        }
        match reader.failed.take() {
            Some(e) => Err(Failed::Remote("payload", e)),
            None => Ok(out),
        }
    }

    /// A payload's answer as a blocking reader.
    fn reader<'a>(
        &'a self,
        answer: PayloadAnswer,
        until: Option<&'a Gone>,
    ) -> Result<Streamed<'a>, Failed> {
        let stream = answer.map_err(|e| match e {
            RemoteError::Size { .. } => Failed::Rejected("bad_length", e.to_string()),
            e => Failed::Remote("payload", e),
        })?;
        Ok(Streamed {
            rt: &self.rt,
            stream,
            until,
            chunk: Bytes::new(),
            failed: None,
        })
    }
}

/// A payload request's answer: its stream, or why there is none.
pub(super) type PayloadAnswer = Result<PayloadStream, RemoteError>;

/// The entry `put` stored for a fetch of `key`.
pub(super) fn stored_as(put: Result<Stored, StoreError>, key: &EntryKey) -> Result<Entry, Failed> {
    let stored = put.map_err(Failed::Store)?;
    if stored.entry.key != *key {
        // `open` checked the key the record derives; `put` derived the
        // same. A difference is a bug, never a hit.
        return Err(Failed::Local(format!(
            "stored under {} instead of {key}",
            stored.entry.key
        )));
    }
    Ok(stored.entry)
}

/// The payload stream as a blocking reader (for `Store::put`, on a pack
/// job's thread, never an async one). A transport failure is kept apart
/// from the bytes' check.
struct Streamed<'a> {
    rt: &'a Handle,
    stream: PayloadStream,
    /// Set once nobody waits for the bytes: the read fails.
    until: Option<&'a Gone>,
    chunk: Bytes,
    failed: Option<RemoteError>,
}

impl Streamed<'_> {
    /// The stream's next chunk, or `Err` once `until` is set.
    fn next(&mut self) -> io::Result<Option<Result<Bytes, RemoteError>>> {
        until_gone(self.rt, self.until, self.stream.next())
            .ok_or_else(|| io::Error::other("nobody waits for the bytes any more"))
    }
}

impl Read for Streamed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.chunk.is_empty() {
            match self.next()? {
                None => return Ok(0),
                Some(Ok(c)) => self.chunk = c,
                Some(Err(e)) => {
                    let msg = e.to_string();
                    self.failed = Some(e);
                    return Err(io::Error::other(msg));
                }
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}
