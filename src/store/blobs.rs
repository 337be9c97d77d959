//! Payload files: streaming a payload into tmp/ while hashing it, publishing
//! it under its blake3 (fsync, chmod 0444, rename, fsync the folder),
//! deleting and quarantining. Payload files are never modified after
//! publish; they are only ever replaced whole or unlinked.
//!
//! Per-blob stripe locks order the file operations of one blob against the
//! index commits that reference it: put holds the blob's stripe from the
//! "is it referenced?" check through rename and commit, deleters hold it from
//! the "no references left" check through unlink. Without it a delete could
//! unlink a file a concurrent put had just decided to reuse.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use super::error::{StoreError, StoreResult};
use super::layout::Paths;
use super::options::WriteFault;
use crate::chunks::{ChunkDigests, ChunkHasher};

/// Bytes read from the producer and written per step.
const CHUNK: usize = 1 << 20;
/// First read size; doubled up to `CHUNK` while reads fill it.
const FIRST_CHUNK: usize = 64 << 10;
/// Chunks at least this large are hashed in parallel with their write.
const PARALLEL_HASH: usize = 256 << 10;
/// Locks guarding each blob's references against its deletion. Many, so
/// that a gc batch (which locks the stripes of a few hundred blobs while it
/// commits) rarely holds one that the threads deleting the previous batch's
/// files need: with few stripes a batch took them all and the deletions
/// waited for every commit.
const STRIPES: usize = 4096;

pub(crate) struct Stripes(Box<[Mutex<()>]>);

/// The stripe of `blob` (blob names are uniform: their first bytes do).
fn stripe(blob: &[u8; 32]) -> usize {
    usize::from(u16::from_le_bytes([blob[0], blob[1]])) % STRIPES
}

impl Stripes {
    pub fn new() -> Stripes {
        Stripes((0..STRIPES).map(|_| Mutex::new(())).collect())
    }

    /// Locks the stripes of many blobs, in stripe order (the one order every
    /// multi-stripe holder uses, so they cannot deadlock).
    pub(crate) fn lock_many(&self, blobs: &[[u8; 32]]) -> Vec<MutexGuard<'_, ()>> {
        let mut idx: Vec<usize> = blobs.iter().map(stripe).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter()
            .map(|i| self.0[i].lock().unwrap_or_else(|p| p.into_inner()))
            .collect()
    }

    pub fn lock(&self, blob: &[u8; 32]) -> MutexGuard<'_, ()> {
        // A panic while holding a stripe leaves no state behind it to repair.
        self.0[stripe(blob)]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

/// A payload written to a temp file, not yet published.
pub(crate) struct Written {
    pub tmp: PathBuf,
    pub file: File,
    pub blake3: [u8; 32],
    pub len: u64,
    /// The group digests of what was written (their root is `blake3`).
    pub chunks: ChunkDigests,
}

impl Written {
    fn new(tmp: PathBuf, file: File, chunks: ChunkDigests, len: u64) -> Written {
        Written {
            tmp,
            file,
            blake3: chunks.root(),
            len,
            chunks,
        }
    }

    pub(crate) fn discard(self) {
        let _ = fs::remove_file(&self.tmp);
    }
}

/// Streams `src` into `tmp`, hashing as it goes; fsyncs when asked. On any
/// failure the temp file is removed.
pub(crate) fn write_temp(
    paths: &Paths,
    tmp: PathBuf,
    src: &mut dyn Read,
    fsync: bool,
    fault: Option<&WriteFault>,
) -> StoreResult<Written> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| classify(paths, &tmp, 0, e))?;
    let mut hasher = ChunkHasher::default();
    // Small payloads are common: start small and grow while reads fill the
    // buffer, rather than zeroing a full chunk for every put.
    let mut buf = vec![0u8; FIRST_CHUNK];
    let mut len = 0u64;
    let result = (|| {
        loop {
            // Every write ends on a multiple of the buffer size (1 MiB once
            // grown), so the page cache keeps the file in large folios and a
            // later map of it takes few page faults.
            let cap = buf.len() - (len % buf.len() as u64) as usize;
            let n = match src.read(&mut buf[..cap]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(StoreError::PayloadRead {
                        read: len,
                        source: e,
                    })
                }
            };
            if let Some(f) = fault {
                f(len).map_err(|e| classify(paths, &tmp, len, e))?;
            }
            let chunk = &buf[..n];
            let write = |file: &mut File| -> std::io::Result<()> {
                file.write_all(chunk)?;
                if fsync {
                    start_writeback(file, len, n);
                }
                Ok(())
            };
            if n >= PARALLEL_HASH {
                // Hash on another core while this one copies into the page
                // cache: put then costs about what the write alone does.
                let (w, _) = rayon::join(|| write(&mut file), || hasher.update(chunk));
                w
            } else {
                hasher.update(chunk);
                write(&mut file)
            }
            .map_err(|e| classify(paths, &tmp, len, e))?;
            len += n as u64;
            if n == cap && buf.len() < CHUNK {
                buf.resize(buf.len() * 2, 0);
            }
        }
        if fsync {
            file.sync_all().map_err(|e| classify(paths, &tmp, len, e))?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(Written::new(tmp, file, hasher.finish(), len)),
        Err(e) => {
            drop(file);
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Asks the kernel to start writing a range back now, so that the disk
/// works while we hash and read the next chunk and the final fsync has
/// little left to do. Advisory: failures are ignored (fsync still follows).
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset: u64, len: usize) {
    use std::os::unix::io::AsRawFd;
    // SAFETY: sync_file_range only reads its integer arguments.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _offset: u64, _len: usize) {}

fn classify(paths: &Paths, tmp: &Path, written: u64, e: std::io::Error) -> StoreError {
    if super::error::io_is_no_space(&e) {
        StoreError::NoSpace {
            dir: paths.root.clone(),
            written,
        }
    } else {
        StoreError::io("write", tmp, e)
    }
}

/// Publishes a written payload as `blobs/<xx>/<hex>` (caller holds the
/// stripe); returns its group digests.
pub(crate) fn publish(
    paths: &Paths,
    w: Written,
    fsync: bool,
    verity: &super::verity::Verity,
) -> StoreResult<ChunkDigests> {
    let dest = paths.blob(&w.blake3);
    let tmp = w.tmp.clone();
    let chunks = w.chunks.clone();
    let r = (|| {
        w.file
            .set_permissions(Permissions::from_mode(0o444))
            .map_err(|e| StoreError::io("chmod", &tmp, e))?;
        drop(w.file);
        // Before the rename: whatever stat the store takes of the file
        // later already sees it as it stays.
        verity.enable(&tmp);
        if let Err(e) = fs::rename(&tmp, &dest) {
            if e.kind() != ErrorKind::NotFound {
                return Err(StoreError::io("publish", &dest, e));
            }
            // The shard folder went missing (removed by hand): recreate it.
            let shard = paths.shard(&w.blake3);
            fs::create_dir_all(&shard).map_err(|e| StoreError::io("create", &shard, e))?;
            fs::rename(&tmp, &dest).map_err(|e| StoreError::io("publish", &dest, e))?;
        }
        if fsync {
            let shard = paths.shard(&w.blake3);
            crate::fsutil::sync_dir(&shard).map_err(|e| StoreError::io("sync", &shard, e))?;
        }
        Ok(())
    })();
    if r.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    r.map(|()| chunks)
}

/// Whether a complete payload file of `len` bytes is present for `blob`.
pub(crate) fn present(paths: &Paths, blob: &[u8; 32], len: u64) -> bool {
    fs::metadata(paths.blob(blob))
        .map(|m| m.is_file() && m.len() == len)
        .unwrap_or(false)
}

/// What unlinking a payload file did: the bytes it freed, and the bytes that
/// stay on disk because the file has other links (a `--link hard` model
/// outside the store), which no unlink of the store frees.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Unlinked {
    pub freed: u64,
    pub still_linked: u64,
}

/// Unlinks a file; returns what that freed, or `None` when it was already
/// gone.
pub(crate) fn delete_path(p: &Path) -> StoreResult<Option<Unlinked>> {
    use std::os::unix::fs::MetadataExt;
    let gone = match fs::symlink_metadata(p) {
        // Other links keep the inode: its bytes stay on disk.
        Ok(m) if m.nlink() > 1 => Unlinked {
            freed: 0,
            still_linked: m.len(),
        },
        Ok(m) => Unlinked {
            freed: m.len(),
            still_linked: 0,
        },
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io("stat", p, e)),
    };
    match fs::remove_file(p) {
        Ok(()) => Ok(Some(gone)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::io("remove", p, e)),
    }
}

/// Moves a damaged payload file into quarantine/ (caller holds the stripe
/// and has flushed the removal of its entries); returns where it went.
pub(crate) fn quarantine(
    paths: &Paths,
    blob: &[u8; 32],
    now_ms: u64,
) -> StoreResult<Option<PathBuf>> {
    let from = paths.blob(blob);
    let to = paths
        .quarantine
        .join(format!("{}.{now_ms}", hex::encode(blob)));
    match fs::rename(&from, &to) {
        Ok(()) => Ok(Some(to)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::io("quarantine", &from, e)),
    }
}

/// Hashes a payload file: (length, blake3), on the rayon pool when
/// `parallel`. Never pass `parallel` while holding a stripe: pool threads
/// may be waiting for that stripe (GC unlinks on the pool).
pub(crate) fn hash_file(p: &Path, parallel: bool) -> std::io::Result<(u64, [u8; 32])> {
    let mut h = blake3::Hasher::new();
    if parallel {
        h.update_mmap_rayon(p)?;
    } else {
        h.update_mmap(p)?;
    }
    let len = h.count();
    Ok((len, *h.finalize().as_bytes()))
}

/// Lists the payload files under blobs/: (blob, path) of well-named files,
/// and the paths of anything else found in the shards.
/// Well-named payload files (blob, path) and stray paths.
pub(crate) type Listing = (Vec<([u8; 32], PathBuf)>, Vec<PathBuf>);

pub(crate) fn list(paths: &Paths) -> StoreResult<Listing> {
    use rayon::prelude::*;
    let shards: Vec<Listing> = (0..=255u8)
        .into_par_iter()
        .map(|b| list_shard(paths, b))
        .collect::<StoreResult<_>>()?;
    let mut good = Vec::new();
    let mut stray = Vec::new();
    for (g, s) in shards {
        good.extend(g);
        stray.extend(s);
    }
    Ok((good, stray))
}

fn list_shard(paths: &Paths, b: u8) -> StoreResult<Listing> {
    let mut good = Vec::new();
    let mut stray = Vec::new();
    let shard = paths.blobs.join(hex::encode([b]));
    let rd = match fs::read_dir(&shard) {
        Ok(rd) => rd,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok((good, stray)),
        Err(e) => return Err(StoreError::io("list", &shard, e)),
    };
    for e in rd {
        let e = e.map_err(|e| StoreError::io("list", &shard, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        match paths.names.parse(&name) {
            Some(blob) if blob[0] == b && e.file_type().map(|t| t.is_file()).unwrap_or(false) => {
                good.push((blob, e.path()))
            }
            _ => stray.push(e.path()),
        }
    }
    Ok((good, stray))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_publish_delete() {
        let d = tempfile::tempdir().unwrap();
        let (p, _) = super::super::layout::prepare(d.path()).unwrap();
        let data = vec![5u8; 3 * CHUNK + 17];
        let w = write_temp(&p, p.tmp.join("a.part"), &mut data.as_slice(), true, None).unwrap();
        assert_eq!(w.len, data.len() as u64);
        assert_eq!(w.blake3, *blake3::hash(&data).as_bytes());
        let blob = w.blake3;
        publish(&p, w, true, &crate::store::verity::Verity::default()).unwrap();
        let path = p.blob(&blob);
        assert_eq!(fs::read(&path).unwrap(), data);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o444
        );
        assert!(present(&p, &blob, data.len() as u64));
        assert_eq!(hash_file(&path, true).unwrap(), (data.len() as u64, blob));
        assert_eq!(hash_file(&path, false).unwrap(), (data.len() as u64, blob));
        let (good, stray) = list(&p).unwrap();
        assert_eq!(good, vec![(blob, path.clone())]);
        assert!(stray.is_empty());
        let linked = p.tmp.join("elsewhere");
        fs::hard_link(&path, &linked).unwrap();
        let gone = delete_path(&path).unwrap().unwrap();
        assert_eq!((gone.freed, gone.still_linked), (0, data.len() as u64));
        fs::hard_link(&linked, &path).unwrap();
        fs::remove_file(&linked).unwrap();
        let gone = delete_path(&path).unwrap().unwrap();
        assert_eq!((gone.freed, gone.still_linked), (data.len() as u64, 0));
        assert_eq!(delete_path(&path).unwrap(), None);
        assert_eq!(fs::read_dir(&p.tmp).unwrap().count(), 0);
    }

    #[test]
    fn fault_removes_temp_and_names_no_space() {
        let d = tempfile::tempdir().unwrap();
        let (p, _) = super::super::layout::prepare(d.path()).unwrap();
        let fault: WriteFault = std::sync::Arc::new(|n| {
            if n > 0 {
                Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
            } else {
                Ok(())
            }
        });
        let data = vec![1u8; 2 * CHUNK];
        let e = write_temp(
            &p,
            p.tmp.join("b.part"),
            &mut data.as_slice(),
            true,
            Some(&fault),
        )
        .err()
        .unwrap();
        assert!(matches!(e, StoreError::NoSpace { written, .. } if written == FIRST_CHUNK as u64));
        assert_eq!(fs::read_dir(&p.tmp).unwrap().count(), 0);
    }

    /// A gc batch locks the stripes of its blobs while it commits; the
    /// threads deleting the previous batch's files must still get theirs
    /// (with 64 stripes a batch of a few hundred held them all).
    #[test]
    fn a_batch_leaves_other_blobs_stripes_free() {
        let stripes = Stripes::new();
        let batch: Vec<[u8; 32]> = (0..=255u8)
            .map(|i| {
                let mut b = [7u8; 32];
                (b[0], b[1]) = (i, 0);
                b
            })
            .collect();
        let _held = stripes.lock_many(&batch);
        let mut other = [7u8; 32];
        (other[0], other[1]) = (0, 1);
        assert!(stripes.0[stripe(&other)].try_lock().is_ok());
    }
}
