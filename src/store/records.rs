//! Entry records beside the payloads (D13): the files are the truth, the
//! index a view of them.
//!
//! `records/<xx>/<entry key hex>` (`xx`: the key's first byte, so that no
//! folder grows past a few thousand files and removals in different
//! folders run in parallel) holds one entry's record (the bytes the index
//! keeps under `Tree::Entries`), framed so that a torn or damaged file is
//! recognized:
//!
//! ```text
//! MAGIC (8 bytes) || record || blake3(entry key || record) (32 bytes)
//! ```
//!
//! A put writes its record (temp, fsync, rename, fsync the folder) after the
//! payload is published and before the index commit, so an entry whose put
//! returned survives any crash even when the index lost its last commits. A
//! removal unlinks the record before the index commit that drops the entry.
//! Whatever a crash leaves between the two is repaired towards keeping the
//! entry: a record without an index entry is indexed again (when its
//! payload file is there), an index entry without a record gets its record
//! written again (`Store::sync_records`). So a crash can undo a removal, never
//! lose an acknowledged put, and never point an entry at a missing file.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::error::{StoreError, StoreResult};
use super::key::KeyBytes;
use super::layout::Paths;

/// First bytes of every record file (format version 1).
const MAGIC: &[u8; 8] = b"ctrec01\n";
/// A record file larger than this is damaged: records are a few KiB (the
/// type's encoding plus bounded name lists).
const MAX_FILE: u64 = 4 << 20;
const CHECK_LEN: usize = 32;

/// Where the record of `kb` lives.
pub(crate) fn path(paths: &Paths, kb: &KeyBytes) -> PathBuf {
    let name = hex::encode(kb);
    paths.records.join(&name[..2]).join(name)
}

/// The checksum that closes a record file: it binds the record to its key,
/// so a file renamed by hand is as damaged as a file cut short.
fn check(kb: &KeyBytes, record: &[u8]) -> [u8; CHECK_LEN] {
    let mut h = blake3::Hasher::new();
    h.update(kb);
    h.update(record);
    *h.finalize().as_bytes()
}

/// Writes the record of `kb` (through `tmp`, a fresh temp path) and, with
/// `fsync`, makes it durable before returning.
pub(crate) fn write(
    paths: &Paths,
    tmp: &Path,
    kb: &KeyBytes,
    record: &[u8],
    fsync: bool,
) -> StoreResult<()> {
    let dest = path(paths, kb);
    let r = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(tmp)
            .map_err(|e| io("write", tmp, e))?;
        let mut bytes = Vec::with_capacity(MAGIC.len() + record.len() + CHECK_LEN);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(record);
        bytes.extend_from_slice(&check(kb, record));
        f.write_all(&bytes).map_err(|e| io("write", tmp, e))?;
        if fsync {
            f.sync_all().map_err(|e| io("write", tmp, e))?;
        }
        let shard = dest.parent().unwrap_or(&paths.records);
        if let Err(e) = fs::rename(tmp, &dest) {
            if e.kind() != ErrorKind::NotFound {
                return Err(io("publish", &dest, e));
            }
            // The first record of its folder.
            fs::create_dir_all(shard).map_err(|e| io("create", shard, e))?;
            if fsync {
                crate::fsutil::sync_dir(&paths.records)
                    .map_err(|e| io("sync", &paths.records, e))?;
            }
            fs::rename(tmp, &dest).map_err(|e| io("publish", &dest, e))?;
        }
        if fsync {
            crate::fsutil::sync_dir(shard).map_err(|e| io("sync", shard, e))?;
        }
        Ok(())
    })();
    if r.is_err() {
        let _ = fs::remove_file(tmp);
    }
    r
}

/// A full file system is the store's `NoSpace`, as for payloads.
fn io(op: &'static str, p: &Path, e: std::io::Error) -> StoreError {
    if super::error::io_is_no_space(&e) {
        StoreError::NoSpace {
            dir: p.parent().unwrap_or(p).to_path_buf(),
            written: 0,
        }
    } else {
        StoreError::io(op, p, e)
    }
}

/// Unlinks the record of `kb` (absent is fine).
pub(crate) fn remove(paths: &Paths, kb: &KeyBytes) -> StoreResult<()> {
    let p = path(paths, kb);
    match fs::remove_file(&p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io("remove", &p, e)),
    }
}

/// Threads that unlink the records of a large removal: unlinks wait on the
/// file system, not the CPU, and records in different folders do not
/// serialize (most of a large gc's time otherwise).
const UNLINK_THREADS: usize = 8;

/// Unlinks the records of `keys` (absent ones are fine), on several
/// threads when there are many.
pub(crate) fn remove_many(paths: &Paths, keys: &[KeyBytes]) -> StoreResult<()> {
    if keys.len() < 2 * UNLINK_THREADS {
        return keys.iter().try_for_each(|kb| remove(paths, kb));
    }
    let per = keys.len().div_ceil(UNLINK_THREADS);
    std::thread::scope(|s| {
        let workers: Vec<_> = keys
            .chunks(per)
            .map(|part| s.spawn(move || part.iter().try_for_each(|kb| remove(paths, kb))))
            .collect();
        workers.into_iter().try_for_each(|w| {
            w.join().unwrap_or_else(|_| {
                Err(StoreError::Index {
                    op: "remove records",
                    message: "an unlink thread panicked".into(),
                })
            })
        })
    })
}

/// Makes every record written without fsync durable (one `syncfs` of the
/// file system records/ is on).
pub(crate) fn sync_all(paths: &Paths) -> StoreResult<()> {
    use std::os::unix::io::AsRawFd;
    let dir = File::open(&paths.records).map_err(|e| StoreError::io("open", &paths.records, e))?;
    // SAFETY: syncfs takes a descriptor we own and touches no memory.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(StoreError::io("sync", &paths.records, e));
    }
    Ok(())
}

/// What reading a record file found.
#[derive(Debug)]
pub(crate) enum Found {
    /// The record bytes, checked against the key.
    Record(Vec<u8>),
    /// No file.
    Missing,
    /// A file that is not a whole record of this key (cut short, too
    /// large, or its check does not match content and name).
    Damaged,
}

/// Reads and checks the record of `kb`.
pub(crate) fn read(paths: &Paths, kb: &KeyBytes) -> StoreResult<Found> {
    let p = path(paths, kb);
    let f = match File::open(&p) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Found::Missing),
        Err(e) => return Err(StoreError::io("open", &p, e)),
    };
    let mut bytes = Vec::new();
    f.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| StoreError::io("read", &p, e))?;
    Ok(parse(kb, bytes))
}

fn parse(kb: &KeyBytes, mut bytes: Vec<u8>) -> Found {
    if bytes.len() as u64 > MAX_FILE {
        return Found::Damaged; // larger than any record
    }
    if bytes.len() < MAGIC.len() + CHECK_LEN || !bytes.starts_with(MAGIC) {
        return Found::Damaged; // cut short, or no magic
    }
    let end = bytes.len() - CHECK_LEN;
    if bytes[end..] != check(kb, &bytes[MAGIC.len()..end]) {
        return Found::Damaged; // content or name do not match the check
    }
    bytes.truncate(end);
    bytes.drain(..MAGIC.len());
    Found::Record(bytes)
}

/// The entry keys of the record files, and the paths of files in records/
/// that are not record files (left by hand, removed by reconcile).
pub(crate) fn list(paths: &Paths) -> StoreResult<(Vec<KeyBytes>, Vec<PathBuf>)> {
    let mut keys = Vec::new();
    let mut stray = Vec::new();
    let read = |dir: &Path| match fs::read_dir(dir) {
        Ok(rd) => Ok(Some(rd)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::io("list", dir, e)),
    };
    let Some(top) = read(&paths.records)? else {
        return Ok((keys, stray));
    };
    for shard in top {
        let shard = shard.map_err(|e| StoreError::io("list", &paths.records, e))?;
        let name = shard.file_name();
        let is_dir = shard.file_type().is_ok_and(|t| t.is_dir());
        let shard_name = name.to_str().filter(|n| n.len() == 2);
        let (Some(prefix), true) = (shard_name, is_dir) else {
            if !is_dir {
                stray.push(shard.path());
            }
            continue;
        };
        let Some(rd) = read(&shard.path())? else {
            continue;
        };
        for e in rd {
            let e = e.map_err(|e| StoreError::io("list", shard.path(), e))?;
            let key = e.file_name().to_str().and_then(parse_name);
            match key {
                Some(kb)
                    if hex::encode(&kb[..1]) == prefix
                        && e.file_type().is_ok_and(|t| t.is_file()) =>
                {
                    keys.push(kb)
                }
                _ if e.file_type().is_ok_and(|t| t.is_dir()) => {}
                _ => stray.push(e.path()),
            }
        }
    }
    Ok((keys, stray))
}

/// A record file name: the entry key in lowercase hex.
fn parse_name(name: &str) -> Option<KeyBytes> {
    if name.len() != 2 * super::KEY_LEN || name.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let mut kb = [0u8; super::KEY_LEN];
    hex::decode_to_slice(name, &mut kb).ok()?;
    Some(kb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_damage_is_named() {
        let d = tempfile::tempdir().unwrap();
        let (paths, _) = super::super::layout::prepare(d.path()).unwrap();
        let kb = [7u8; super::super::KEY_LEN];
        write(&paths, &paths.tmp.join("t"), &kb, b"record", true).unwrap();
        assert!(matches!(read(&paths, &kb).unwrap(), Found::Record(r) if r == b"record"));
        assert_eq!(list(&paths).unwrap().0, vec![kb]);
        // A flipped byte, a cut, and the file under another key's name.
        let p = path(&paths, &kb);
        let good = fs::read(&p).unwrap();
        let mut flipped = good.clone();
        flipped[9] ^= 1;
        fs::write(&p, &flipped).unwrap();
        assert!(matches!(read(&paths, &kb).unwrap(), Found::Damaged));
        fs::write(&p, &good[..good.len() - 1]).unwrap();
        assert!(matches!(read(&paths, &kb).unwrap(), Found::Damaged));
        let other = [8u8; super::super::KEY_LEN];
        fs::create_dir_all(paths.records.join("08")).unwrap();
        fs::write(path(&paths, &other), &good).unwrap();
        assert!(matches!(read(&paths, &other).unwrap(), Found::Damaged));
        remove(&paths, &kb).unwrap();
        remove(&paths, &kb).unwrap();
        assert!(matches!(read(&paths, &kb).unwrap(), Found::Missing));
        fs::write(paths.records.join("notes.txt"), "x").unwrap();
        fs::write(paths.records.join("07/notes.txt"), "x").unwrap();
        let (keys, mut stray) = list(&paths).unwrap();
        assert_eq!(keys, vec![other]);
        stray.sort();
        assert_eq!(
            stray,
            vec![
                paths.records.join("07/notes.txt"),
                paths.records.join("notes.txt")
            ]
        );
    }
}
