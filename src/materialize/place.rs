//! Placing a file next to a materialized model: a hard link to the cache's
//! payload when possible (no bytes written; the shared inode keeps the data
//! alive whatever the cache's gc does later), a copy otherwise. Either way
//! the file appears atomically under its final name.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// How a file is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LinkMode {
    /// Hard link; copy when the link is refused (another filesystem,
    /// `fs.protected_hardlinks`, link count limit, no link support).
    #[default]
    LinkOrCopy,
    /// Always copy (a model that must not share inodes with the cache).
    Copy,
}

/// What placing one file did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub path: PathBuf,
    /// The file is (now or already) a hard link to the source.
    pub linked: bool,
    /// Bytes written (0 for a link or a file already in place).
    pub bytes_copied: u64,
}

fn same_inode(a: &fs::Metadata, b: &fs::Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// Errors after which a copy is the way to go.
fn link_refused(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::CrossesDevices
            | ErrorKind::PermissionDenied
            | ErrorKind::Unsupported
            | ErrorKind::TooManyLinks
    ) || e.raw_os_error() == Some(libc::EPERM)
}

fn temp_name(dst: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = dst
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dst.with_file_name(format!(
        ".{name}.tmp-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Makes `dst` a link to (or a copy of) `src`, atomically replacing whatever
/// `dst` was. The caller fsyncs `dst`'s folder once all files are placed.
pub fn place(src: &Path, dst: &Path, mode: LinkMode) -> Result<Placed> {
    let src_meta = fs::metadata(src).map_err(|e| Error::io(src, e))?;
    if let Ok(existing) = fs::symlink_metadata(dst) {
        let linked = same_inode(&existing, &src_meta);
        if linked && mode == LinkMode::LinkOrCopy {
            return Ok(Placed {
                path: dst.to_path_buf(),
                linked: true,
                bytes_copied: 0,
            });
        }
    }
    let tmp = temp_name(dst);
    let result = (|| -> std::io::Result<Placed> {
        if mode == LinkMode::LinkOrCopy {
            match fs::hard_link(src, &tmp) {
                Ok(()) => {
                    fs::rename(&tmp, dst)?;
                    return Ok(Placed {
                        path: dst.to_path_buf(),
                        linked: true,
                        bytes_copied: 0,
                    });
                }
                Err(e) if link_refused(&e) => {}
                Err(e) => return Err(e),
            }
        }
        // fs::copy uses copy_file_range, which clones extents where the
        // filesystem can (btrfs, xfs) and copies in the kernel otherwise.
        let bytes = fs::copy(src, &tmp)?;
        let f = fs::File::open(&tmp)?;
        f.set_permissions(fs::Permissions::from_mode(0o444))?;
        f.sync_all()?;
        fs::rename(&tmp, dst)?;
        Ok(Placed {
            path: dst.to_path_buf(),
            linked: false,
            bytes_copied: bytes,
        })
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(|e| Error::io(dst, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_then_reuses_then_copies_on_request() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::write(&src, b"payload").unwrap();
        let dst = dir.path().join("dst");
        let p = place(&src, &dst, LinkMode::LinkOrCopy).unwrap();
        assert!(p.linked);
        assert_eq!(p.bytes_copied, 0);
        assert_eq!(fs::metadata(&src).unwrap().nlink(), 2);
        // Already in place: nothing to do.
        let again = place(&src, &dst, LinkMode::LinkOrCopy).unwrap();
        assert!(again.linked);
        // A copy replaces the link with an independent file.
        let c = place(&src, &dst, LinkMode::Copy).unwrap();
        assert!(!c.linked);
        assert_eq!(c.bytes_copied, 7);
        assert_eq!(fs::metadata(&src).unwrap().nlink(), 1);
        assert_eq!(fs::read(&dst).unwrap(), b"payload");
        assert!(fs::read_dir(dir.path()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".tmp-")));
    }

    #[test]
    fn copies_across_filesystems() {
        let shm = Path::new("/dev/shm");
        let src_dir = tempfile::tempdir().unwrap();
        let src = src_dir.path().join("src");
        fs::write(&src, vec![7u8; 10_000]).unwrap();
        let Ok(dst_dir) = tempfile::tempdir_in(shm) else {
            eprintln!("no /dev/shm here; the daemon end-to-end test covers the copy path");
            return;
        };
        let same_fs =
            fs::metadata(shm).unwrap().dev() == fs::metadata(src_dir.path()).unwrap().dev();
        let p = place(&src, &dst_dir.path().join("dst"), LinkMode::LinkOrCopy).unwrap();
        assert_eq!(p.linked, same_fs);
        if !same_fs {
            assert_eq!(p.bytes_copied, 10_000);
        }
        assert_eq!(fs::read(&p.path).unwrap(), vec![7u8; 10_000]);
    }

    #[test]
    fn missing_source_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = place(
            &dir.path().join("nope"),
            &dir.path().join("dst"),
            LinkMode::LinkOrCopy,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("nope"), "{e}");
    }
}
