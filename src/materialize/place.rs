//! Placing a payload file next to a materialized model. The default gives
//! every file one link of its own, as onnx >= 1.21 requires of external data
//! (it refuses files with several hard links, and symlinks): a reflink
//! (`FICLONE`: the cache's extents shared, no bytes written) where the
//! filesystem can, a copy otherwise. Hard links (no bytes written, no extra
//! space on any filesystem, but refused by onnx) are an opt-in. Whatever the
//! method, the file appears atomically under its final name.

use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// How payload files are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LinkMode {
    /// A reflink where the filesystem supports it (btrfs, XFS, bcachefs),
    /// else a copy: one link per file, which onnx and onnxruntime accept.
    #[default]
    Auto,
    /// A reflink, or an error naming why the filesystem cannot make one.
    Reflink,
    /// Always a copy of the bytes.
    Copy,
    /// A hard link to the cache's file (a copy where the link is refused:
    /// another filesystem, `fs.protected_hardlinks`, the link limit).
    /// onnxruntime loads such a model; onnx >= 1.21 refuses it.
    Hard,
}

impl LinkMode {
    /// Every mode, by [`LinkMode::name`].
    pub const ALL: [LinkMode; 4] = [
        LinkMode::Auto,
        LinkMode::Reflink,
        LinkMode::Copy,
        LinkMode::Hard,
    ];

    /// The mode's name on command lines and in the API.
    pub fn name(self) -> &'static str {
        match self {
            LinkMode::Auto => "auto",
            LinkMode::Reflink => "reflink",
            LinkMode::Copy => "copy",
            LinkMode::Hard => "hard",
        }
    }

    pub fn from_name(name: &str) -> Option<LinkMode> {
        LinkMode::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// How one file came to be in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// A file of its own sharing the source's extents (no bytes written).
    Reflink,
    /// A file of its own holding a copy of the bytes.
    Copy,
    /// The source's own inode under a second name.
    HardLink,
    /// The destination is the source itself (a payload written straight
    /// into the folder); nothing was done.
    InPlace,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Reflink => "reflink",
            Method::Copy => "copy",
            Method::HardLink => "hard_link",
            Method::InPlace => "in_place",
        }
    }

    /// Whether the file has more than one link, which onnx >= 1.21 refuses.
    pub fn shares_inode(self) -> bool {
        self == Method::HardLink
    }
}

/// What placing one file did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub path: PathBuf,
    pub method: Method,
    /// Bytes written (a copy's size; 0 otherwise).
    pub bytes_copied: u64,
}

fn same_inode(a: &fs::Metadata, b: &fs::Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// Errors after which a hard link gives way to a copy.
fn link_refused(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::CrossesDevices
            | ErrorKind::PermissionDenied
            | ErrorKind::Unsupported
            | ErrorKind::TooManyLinks
    ) || e.raw_os_error() == Some(libc::EPERM)
}

/// Errors by which `FICLONE` says this pair of files cannot share extents
/// (not a failure of the filesystem): no reflink support (ext4, tmpfs:
/// EOPNOTSUPP, or ENOTTY / ENOSYS from older kernels and some FUSE
/// filesystems), another filesystem (EXDEV), or files the filesystem will
/// not share (EINVAL, e.g. btrfs nodatacow against datacow).
fn reflink_unsupported(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::Unsupported
        || e.kind() == ErrorKind::CrossesDevices
        || matches!(
            e.raw_os_error(),
            Some(libc::EOPNOTSUPP | libc::EXDEV | libc::EINVAL | libc::ENOTTY | libc::ENOSYS)
        )
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

/// A new read-only file at `tmp` (the payloads are immutable).
fn create_read_only(tmp: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(tmp)
}

/// Makes `tmp` a reflink of `src`.
fn reflink(src: &File, tmp: &Path) -> std::io::Result<()> {
    let to = create_read_only(tmp)?;
    rustix::fs::ioctl_ficlone(&to, src)?;
    to.sync_all()
}

/// Makes `tmp` a copy of `src`; returns the bytes copied.
fn copy(mut src: &File, tmp: &Path) -> std::io::Result<u64> {
    let mut to = create_read_only(tmp)?;
    // io::copy between files uses copy_file_range (in-kernel; on btrfs and
    // XFS it may share extents, which a copy does not promise or need).
    let bytes = std::io::copy(&mut src, &mut to)?;
    to.sync_all()?;
    Ok(bytes)
}

/// Makes `dst` a reflink, copy or hard link of `src` as `mode` says,
/// atomically replacing whatever `dst` was. The caller fsyncs `dst`'s folder
/// once all files are placed.
pub fn place(src: &Path, dst: &Path, mode: LinkMode) -> Result<Placed> {
    let from = File::open(src).map_err(|e| Error::io(src, e))?;
    let src_meta = from.metadata().map_err(|e| Error::io(src, e))?;
    let placed = |method, bytes_copied| Placed {
        path: dst.to_path_buf(),
        method,
        bytes_copied,
    };
    if let Ok(existing) = fs::symlink_metadata(dst) {
        if same_inode(&existing, &src_meta) {
            if fs::canonicalize(src).ok() == fs::canonicalize(dst).ok() {
                return Ok(placed(Method::InPlace, 0));
            }
            if mode == LinkMode::Hard {
                return Ok(placed(Method::HardLink, 0));
            }
        }
    }
    let tmp = temp_name(dst);
    let result = put(src, &from, &tmp, dst, mode).and_then(|(method, bytes)| {
        fs::rename(&tmp, dst).map_err(|e| Error::write(dst, e))?;
        Ok(placed(method, bytes))
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Creates `tmp` (to become `dst`) from `src` as `mode` says; returns the
/// method used and the bytes copied.
fn put(src: &Path, from: &File, tmp: &Path, dst: &Path, mode: LinkMode) -> Result<(Method, u64)> {
    let failed = |e| Error::write(dst, e);
    if mode == LinkMode::Hard {
        match fs::hard_link(src, tmp) {
            Ok(()) => return Ok((Method::HardLink, 0)),
            Err(e) if link_refused(&e) => {}
            Err(e) => return Err(failed(e)),
        }
    }
    if matches!(mode, LinkMode::Auto | LinkMode::Reflink) {
        match reflink(from, tmp) {
            Ok(()) => return Ok((Method::Reflink, 0)),
            Err(e) if reflink_unsupported(&e) && mode == LinkMode::Auto => {
                let _ = fs::remove_file(tmp);
            }
            Err(e) if reflink_unsupported(&e) => {
                return Err(Error::Unsupported(format!(
                    "cannot reflink {} to {}: {e} (the filesystem has no reflinks, or the \
                     cache is on another one); --link auto copies where reflinks are impossible",
                    src.display(),
                    dst.display()
                )))
            }
            Err(e) => return Err(failed(e)),
        }
    }
    copy(from, tmp).map(|n| (Method::Copy, n)).map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_temp_files(dir: &Path) -> bool {
        fs::read_dir(dir)
            .unwrap()
            .all(|e| !e.unwrap().file_name().to_string_lossy().contains(".tmp-"))
    }

    /// A temp folder holding `src`, 7 bytes.
    fn source() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::write(&src, b"payload").unwrap();
        (dir, src)
    }

    /// Whether `dir`'s filesystem makes reflinks.
    fn reflinks_in(dir: &Path) -> bool {
        let src = dir.join("probe-src");
        fs::write(&src, b"probe").unwrap();
        let ok = reflink(&File::open(&src).unwrap(), &dir.join("probe-dst")).is_ok();
        let _ = fs::remove_file(dir.join("probe-dst"));
        fs::remove_file(src).unwrap();
        ok
    }

    #[test]
    fn auto_gives_a_file_of_its_own() {
        let (dir, src) = source();
        let dst = dir.path().join("dst");
        let p = place(&src, &dst, LinkMode::Auto).unwrap();
        let expected = if reflinks_in(dir.path()) {
            (Method::Reflink, 0)
        } else {
            (Method::Copy, 7)
        };
        assert_eq!((p.method, p.bytes_copied), expected);
        assert_eq!(fs::metadata(&src).unwrap().nlink(), 1);
        assert_eq!(fs::metadata(&dst).unwrap().nlink(), 1);
        assert_eq!(fs::metadata(&dst).unwrap().mode() & 0o777, 0o444);
        assert_eq!(fs::read(&dst).unwrap(), b"payload");
        assert!(no_temp_files(dir.path()));
    }

    #[test]
    fn hard_links_then_reuses_then_auto_replaces_the_link() {
        let (dir, src) = source();
        let dst = dir.path().join("dst");
        let p = place(&src, &dst, LinkMode::Hard).unwrap();
        assert_eq!((p.method, p.bytes_copied), (Method::HardLink, 0));
        assert!(p.method.shares_inode());
        assert_eq!(fs::metadata(&src).unwrap().nlink(), 2);
        // Already in place: nothing to do.
        let again = place(&src, &dst, LinkMode::Hard).unwrap();
        assert_eq!(again.method, Method::HardLink);
        // Any other mode replaces the link with a file of its own.
        for mode in [LinkMode::Copy, LinkMode::Auto] {
            place(&src, &dst, LinkMode::Hard).unwrap();
            let c = place(&src, &dst, mode).unwrap();
            assert!(!c.method.shares_inode(), "{mode:?}: {c:?}");
            assert_eq!(fs::metadata(&src).unwrap().nlink(), 1, "{mode:?}");
            assert_eq!(fs::read(&dst).unwrap(), b"payload");
        }
        let c = place(&src, &dst, LinkMode::Copy).unwrap();
        assert_eq!((c.method, c.bytes_copied), (Method::Copy, 7));
        assert!(no_temp_files(dir.path()));
    }

    #[test]
    fn a_file_onto_itself_is_in_place() {
        let (dir, src) = source();
        for mode in LinkMode::ALL {
            let p = place(&src, &src, mode).unwrap();
            assert_eq!((p.method, p.bytes_copied), (Method::InPlace, 0), "{mode:?}");
            assert_eq!(fs::read(&src).unwrap(), b"payload");
        }
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn reflink_mode_fails_clearly_where_reflinks_are_impossible() {
        let (dir, src) = source();
        let dst = dir.path().join("dst");
        if reflinks_in(dir.path()) {
            let p = place(&src, &dst, LinkMode::Reflink).unwrap();
            assert_eq!(p.method, Method::Reflink);
            eprintln!("this filesystem reflinks; the refusal is covered where it does not");
            return;
        }
        let e = place(&src, &dst, LinkMode::Reflink)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("cannot reflink") && e.contains("--link auto"),
            "{e}"
        );
        assert!(!dst.exists());
        assert!(no_temp_files(dir.path()));
    }

    #[test]
    fn names_round_trip() {
        for m in LinkMode::ALL {
            assert_eq!(LinkMode::from_name(m.name()), Some(m));
        }
        assert_eq!(LinkMode::from_name("symlink"), None);
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
        for mode in [LinkMode::Hard, LinkMode::Auto] {
            let p = place(&src, &dst_dir.path().join("dst"), mode).unwrap();
            if !same_fs {
                assert_eq!(
                    (p.method, p.bytes_copied),
                    (Method::Copy, 10_000),
                    "{mode:?}"
                );
            }
            assert_eq!(fs::read(&p.path).unwrap(), vec![7u8; 10_000]);
        }
    }

    #[test]
    fn missing_source_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = place(
            &dir.path().join("nope"),
            &dir.path().join("dst"),
            LinkMode::Auto,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn an_unwritable_folder_says_cannot_write() {
        let (dir, src) = source();
        let e = place(&src, &dir.path().join("no/such/dir/dst"), LinkMode::Copy)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("cannot write") && e.contains("no/such/dir"),
            "{e}"
        );
    }
}
