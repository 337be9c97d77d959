//! Payload integrity on every serve (D12). A payload file is trusted only
//! as the file whose bytes were hashed in this process (when we wrote it,
//! or the first time it is served or shared): its identity (device, inode,
//! size, mtime, ctime) is checked on every serve, so any write to it, a
//! rename over it or a truncation makes the next serve hash it again. The
//! hash leaves the group digests ([`ChunkDigests`]) with which copies and
//! streams check each group as they send it ([`Payload::checked`]), which
//! catches what the identity cannot: bytes that rot under the file system.
//! A file whose bytes do not hash to its name is quarantined and every
//! entry using it dropped (`verify.rs`'s condemn), so the caller can pack
//! again from the entries' model paths; its bytes are never returned.

use std::collections::HashMap;
use std::fs::{File, Metadata};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use memmap2::Mmap;

use crate::fsutil::FileStamp;

use super::error::{StoreError, StoreResult};
use super::key::EntryKey;
use super::{Payload, Store};
use crate::chunks::ChunkDigests;

/// A payload file as hashed.
#[derive(Debug, Clone)]
pub(crate) struct Hashed {
    pub stamp: FileStamp,
    pub chunks: Arc<ChunkDigests>,
}

/// The blobs whose files hashed to their names since the store opened.
#[derive(Default)]
pub(crate) struct Verified(Mutex<HashMap<[u8; 32], Hashed>>);

impl Verified {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Hashed>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The group digests of `blob`, if its file is still the one hashed.
    pub fn get(&self, blob: &[u8; 32], now: &FileStamp) -> Option<Arc<ChunkDigests>> {
        self.map()
            .get(blob)
            .filter(|h| h.stamp == *now)
            .map(|h| h.chunks.clone())
    }

    pub fn insert(&self, blob: [u8; 32], hashed: Hashed) {
        self.map().insert(blob, hashed);
    }

    pub fn remove(&self, blob: &[u8; 32]) {
        self.map().remove(blob);
    }
}

/// Group digests of the file `f` (mapped), if its bytes hash to `blob`.
fn hash_open_file(f: &File, blob: &[u8; 32], parallel: bool) -> std::io::Result<Option<Hashed>> {
    let meta = f.metadata()?;
    let chunks = if meta.len() == 0 {
        ChunkDigests::of(&[], false)
    } else {
        // SAFETY: payload files are read-only once published; a writer
        // that changes one anyway changes its stamp (or fails the digests).
        let map = unsafe { Mmap::map(f) }?;
        ChunkDigests::of(&map, parallel)
    };
    Ok((chunks.root() == *blob).then(|| Hashed {
        stamp: FileStamp::of_meta(&meta),
        chunks: Arc::new(chunks),
    }))
}

/// The first group of `range` that does not hold the bytes hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotted {
    /// Offset of the damaged group in the payload.
    pub offset: u64,
}

impl Payload {
    /// The bytes `range` of the payload, after checking every group they
    /// touch against the digests hashed when it was trusted (D12: copies
    /// and streams send only checked bytes). Hand an `Err` to
    /// [`Store::payload_rotted`].
    pub fn checked(&self, range: Range<usize>) -> Result<&[u8], Rotted> {
        let bytes: &[u8] = self;
        let Some(chunks) = &self.chunks else {
            return Err(Rotted { offset: 0 });
        };
        if range.start > range.end || range.end > bytes.len() {
            return Err(Rotted {
                offset: range.start as u64,
            });
        }
        if range.is_empty() {
            return Ok(&bytes[range]);
        }
        let first = range.start / crate::chunks::GROUP;
        let last = (range.end - 1) / crate::chunks::GROUP;
        for i in first..=last {
            let g = chunks.range(i);
            if !chunks.check(i, &bytes[g.clone()]) {
                return Err(Rotted {
                    offset: g.start as u64,
                });
            }
        }
        Ok(&bytes[range])
    }

    /// Every byte of the payload, checked (see [`Payload::checked`]).
    pub fn checked_all(&self) -> Result<&[u8], Rotted> {
        self.checked(0..self.len())
    }

    /// Whether `m` is the payload file as hashed (the same inode, size and
    /// times): for a hard link made of it, checked after linking.
    pub fn is_file(&self, m: &Metadata) -> bool {
        self.stamp == Some(FileStamp::of_meta(m))
    }

    /// Whether (`dev`, `ino`) is the payload file as hashed (a link made of
    /// it shares them; its ctime moves with the link count).
    pub(crate) fn is_inode(&self, dev: u64, ino: u64) -> bool {
        self.stamp.is_some_and(|s| s.dev == dev && s.ino == ino)
    }
}

impl ctcache_files::place::Checked for Payload {
    fn path(&self) -> &std::path::Path {
        &self.path
    }

    fn len(&self) -> usize {
        <[u8]>::len(self)
    }

    fn is_file(&self, meta: &Metadata) -> bool {
        Payload::is_file(self, meta)
    }

    fn is_inode(&self, dev: u64, ino: u64) -> bool {
        Payload::is_inode(self, dev, ino)
    }

    fn checked_range(&self, range: Range<usize>) -> Result<&[u8], u64> {
        self.checked(range).map_err(|r| r.offset)
    }

    fn release(&self, range: Range<usize>) {
        Payload::release(self, range)
    }
}

impl Store {
    /// Whether the payload file of `blob` is there with `len` bytes that
    /// hash to its name (hashed once per file as it stands). Caller holds
    /// the blob's stripe, so the hash stays off the rayon pool.
    pub(crate) fn blob_intact(&self, blob: &[u8; 32], len: u64) -> StoreResult<bool> {
        let path = self.paths.blob(blob);
        let f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(StoreError::io("open", &path, e)),
        };
        let meta = f.metadata().map_err(|e| StoreError::io("stat", &path, e))?;
        if !meta.is_file() || meta.len() != len {
            return Ok(false);
        }
        if self
            .verified
            .get(blob, &FileStamp::of_meta(&meta))
            .is_some()
        {
            return Ok(true);
        }
        match hash_open_file(&f, blob, false).map_err(|e| StoreError::io("read", &path, e))? {
            Some(h) => {
                self.verified.insert(*blob, h);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Records a payload file just published from `chunks` (caller holds
    /// the stripe): its next serve needs no hash.
    pub(crate) fn published(&self, blob: &[u8; 32], chunks: ChunkDigests) {
        if let Ok(meta) = std::fs::metadata(self.paths.blob(blob)) {
            let stamp = FileStamp::of_meta(&meta);
            self.verified.insert(
                *blob,
                Hashed {
                    stamp,
                    chunks: Arc::new(chunks),
                },
            );
        }
    }

    /// Checks a payload about to be served (see [`Store::open_payload`]):
    /// the file must be the one hashed, else it is hashed now.
    pub(crate) fn verify_served(
        &self,
        key: &EntryKey,
        p: &mut Payload,
        meta: &Metadata,
    ) -> StoreResult<()> {
        let blob = p.info.blake3;
        let stamp = FileStamp::of_meta(meta);
        p.stamp = Some(stamp);
        if let Some(chunks) = self.verified.get(&blob, &stamp) {
            p.chunks = Some(chunks);
            return Ok(());
        }
        let chunks = ChunkDigests::of(p, true);
        p.release(0..p.len());
        if chunks.root() == blob {
            let chunks = Arc::new(chunks);
            self.verified.insert(
                blob,
                Hashed {
                    stamp,
                    chunks: chunks.clone(),
                },
            );
            p.chunks = Some(chunks);
            return Ok(());
        }
        Err(self.condemn_served(key, p))
    }

    /// What a serve that found `rotted` bytes in `p` answers: the payload
    /// is quarantined and its entries dropped (when its file is still
    /// damaged), and the error names them.
    pub fn payload_rotted(&self, key: &EntryKey, p: &Payload, _rotted: Rotted) -> StoreError {
        // Forgotten first: the condemn then hashes the file as it is now.
        self.verified.remove(&p.info.blake3);
        self.condemn_served(key, p)
    }

    fn condemn_served(&self, key: &EntryKey, p: &Payload) -> StoreError {
        // Checked again under the blob's stripe: a put may have replaced the
        // file with good bytes meanwhile (then nothing is condemned, and the
        // mapping we hold is of the old file: refuse it all the same).
        let problem = match self.condemn(&p.info.blake3, p.info.len, true) {
            Ok(p) => p,
            Err(e) => return e,
        };
        StoreError::PayloadCorrupt {
            key: Box::new(*key),
            path: p.path.clone(),
            dropped: problem
                .as_ref()
                .map(|v| v.entries_dropped.clone())
                .unwrap_or_default(),
            quarantined: problem.and_then(|v| v.quarantined),
        }
    }
}
