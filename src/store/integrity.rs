//! Payload integrity on serve: a payload file is trusted only after its
//! bytes were hashed in this process (when we wrote it, or the first time
//! it is served or shared). A file whose bytes do not hash to its name is
//! quarantined and every entry using it dropped (`verify.rs`'s condemn), so
//! the caller can pack again from the entries' model paths; its bytes are
//! never returned.

use std::collections::HashSet;
use std::sync::Mutex;

use super::blobs;
use super::error::{StoreError, StoreResult};
use super::key::EntryKey;
use super::{Payload, Store};

/// Payloads at least this large are hashed on several threads.
const PARALLEL_HASH: usize = 1 << 20;

/// The blobs whose files hashed to their names since the store opened.
#[derive(Default)]
pub(crate) struct Verified(Mutex<HashSet<[u8; 32]>>);

impl Verified {
    pub fn contains(&self, blob: &[u8; 32]) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(blob)
    }

    pub fn insert(&self, blob: [u8; 32]) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(blob);
    }

    pub fn remove(&self, blob: &[u8; 32]) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(blob);
    }
}

impl Store {
    /// Whether the payload file of `blob` is there with `len` bytes that
    /// hash to its name (hashed at most once per process). Caller holds the
    /// blob's stripe, so the hash stays off the rayon pool.
    pub(crate) fn blob_intact(&self, blob: &[u8; 32], len: u64) -> StoreResult<bool> {
        if !blobs::present(&self.paths, blob, len) {
            return Ok(false);
        }
        if self.verified.contains(blob) {
            return Ok(true);
        }
        let path = self.paths.blob(blob);
        let ok = match blobs::hash_file(&path, false) {
            Ok((n, h)) => n == len && h == *blob,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(StoreError::io("read", &path, e)),
        };
        if ok {
            self.verified.insert(*blob);
        }
        Ok(ok)
    }

    /// Checks a payload about to be served (see [`Store::open_payload`]).
    pub(crate) fn verify_served(&self, key: &EntryKey, p: &Payload) -> StoreResult<()> {
        let blob = p.info.blake3;
        if self.verified.contains(&blob) {
            return Ok(());
        }
        let mut h = blake3::Hasher::new();
        if p.len() >= PARALLEL_HASH {
            h.update_rayon(p);
        } else {
            h.update(p);
        }
        if *h.finalize().as_bytes() == blob {
            self.verified.insert(blob);
            return Ok(());
        }
        // Checked again under the blob's stripe: a put may have replaced the
        // file with good bytes meanwhile (then nothing is condemned, and the
        // mapping we hold is of the old file: refuse it all the same).
        let problem = self.condemn(&blob, p.info.len, true)?;
        Err(StoreError::PayloadCorrupt {
            key: Box::new(*key),
            path: p.path.clone(),
            dropped: problem
                .as_ref()
                .map(|v| v.entries_dropped.clone())
                .unwrap_or_default(),
            quarantined: problem.and_then(|v| v.quarantined),
        })
    }
}
