//! Serving a stored payload: its file mapped read-only, once the entry,
//! the file's length and (D12) its bytes are found sound.

use std::fs::File;
use std::io::ErrorKind;
use std::ops::Deref;
use std::path::PathBuf;

use memmap2::Mmap;

use super::entry::{self, PayloadInfo};
use super::error::{StoreError, StoreResult};
use super::index::Tree;
use super::key::EntryKey;
use super::Store;
use crate::fsutil::FileStamp;

/// A payload mapped read-only. The mapping stays valid after the entry is
/// removed (the file is unlinked, never truncated or rewritten).
pub struct Payload {
    map: Option<Mmap>,
    /// The payload file.
    pub path: PathBuf,
    /// Its hash and length, as the entry records them.
    pub info: PayloadInfo,
    /// The file as it was when its bytes were hashed.
    pub(super) stamp: Option<FileStamp>,
    /// The group digests copies check as they send (see [`Payload::checked`]).
    pub(super) chunks: Option<std::sync::Arc<crate::chunks::ChunkDigests>>,
}

impl Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Payload")
            .field("path", &self.path)
            .field("len", &self.info.len)
            .finish()
    }
}

impl Payload {
    /// Gives back this process's hold on the pages of `range` of the
    /// mapping (`MADV_DONTNEED`; the page cache keeps them, and a later read
    /// faults them in again): a copy of a large payload releases each piece
    /// once written, and a hash the whole payload once hashed, so a
    /// materialize of GiBs keeps a piece resident rather than every payload.
    pub fn release(&self, range: std::ops::Range<usize>) {
        let Some(map) = &self.map else { return };
        let end = range.end.min(map.len());
        if range.start < end {
            // SAFETY: a read-only mapping of an immutable file: dropping its
            // page-table entries changes no byte a reader sees.
            let advised = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    range.start,
                    end - range.start,
                )
            };
            // Advice only: a refusal leaves the pages resident, nothing else.
            let _ = advised;
        }
    }
}

impl Store {
    /// Maps an entry's payload read-only for a client and records the use
    /// (its last use for LRU and age gc). The first time a payload file is
    /// served after the store was opened its bytes are hashed: a file that
    /// does not hash to its name is quarantined, every entry using it is
    /// dropped, and the answer is [`StoreError::PayloadCorrupt`] naming
    /// them, never the bytes.
    pub fn open_payload(&self, key: &EntryKey) -> StoreResult<Payload> {
        let payload = self.check_payload(key)?;
        self.note_access(key.to_bytes());
        Ok(payload)
    }

    /// [`Store::open_payload`] for the store's owner's own checks (is a
    /// stored payload still sound before a pack reuses it, an upload): the
    /// same checks, and no use recorded.
    pub fn check_payload(&self, key: &EntryKey) -> StoreResult<Payload> {
        self.resync_if_reopened()?;
        let kb = key.to_bytes();
        let v = self
            .index
            .get(Tree::Entries, &kb)?
            .ok_or(StoreError::NotFound(*key))?;
        let b = entry::decode_brief(&kb, &v)?;
        let info = PayloadInfo {
            blake3: b.blob(),
            len: b.payload_len,
        };
        let path = self.paths.blob(&info.blake3);
        let damaged = |detail: String| StoreError::PayloadDamaged {
            key: Box::new(*key),
            path: path.clone(),
            detail,
        };
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                // Collected since the record was read: files go only after
                // their last entry is gone (and that is durable).
                if self.index.get(Tree::Entries, &kb)?.is_none() {
                    return Err(StoreError::NotFound(*key));
                }
                return Err(damaged("the payload file is missing".into()));
            }
            Err(e) => return Err(StoreError::io("open", &path, e)),
        };
        let meta = file
            .metadata()
            .map_err(|e| StoreError::io("stat", &path, e))?;
        let len = meta.len();
        if len != info.len {
            return Err(damaged(format!(
                "the file has {len} bytes, the entry {}",
                info.len
            )));
        }
        let map = if len == 0 {
            None
        } else {
            // SAFETY: payload files are immutable once published (mode 0444,
            // replaced only by rename, removed only by unlink), so the mapped
            // bytes cannot change under the mapping.
            Some(unsafe { Mmap::map(&file) }.map_err(|e| StoreError::io("map", &path, e))?)
        };
        let mut payload = Payload {
            map,
            path,
            info,
            stamp: None,
            chunks: None,
        };
        self.verify_served(key, &mut payload, &meta)?;
        Ok(payload)
    }
}
