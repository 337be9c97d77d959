//! Placing a payload file next to a materialized model. The default gives
//! every file one link of its own, as onnx >= 1.21 requires of external data
//! (it refuses files with several hard links, and symlinks): a reflink
//! (`FICLONE`: the cache's extents shared, no bytes written) where the
//! filesystem can, a copy otherwise. Hard links (no bytes written, no extra
//! space on any filesystem, but refused by onnx) are an opt-in. Whatever the
//! method, the file appears atomically under its final name.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::outdir::{OutDir, Temp};

/// A payload whose bytes were hashed, as its store serves it: a placed file
/// must be that file, and a copy sends only bytes checked against their
/// group digests (D12).
pub trait Checked {
    /// The payload file.
    fn path(&self) -> &Path;
    /// Its length in bytes.
    fn len(&self) -> usize;
    /// Whether it holds no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether `meta` is the file that was hashed (unchanged since).
    fn is_file(&self, meta: &std::fs::Metadata) -> bool;
    /// Whether (`dev`, `ino`) is the inode that was hashed.
    fn is_inode(&self, dev: u64, ino: u64) -> bool;
    /// The bytes of `range`, checked; else the offset of the first group
    /// that is not the one hashed.
    fn checked_range(&self, range: std::ops::Range<usize>) -> std::result::Result<&[u8], u64>;
    /// Gives back the resident pages of `range` once written.
    fn release(&self, range: std::ops::Range<usize>);
}

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

    /// Parses a [`LinkMode::name`]; `None` for any other string.
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
    /// The name used in reports: `reflink`, `copy`, `hard_link` or `in_place`.
    pub fn name(self) -> &'static str {
        match self {
            Method::Reflink => "reflink",
            Method::Copy => "copy",
            Method::HardLink => "hard_link",
            Method::InPlace => "in_place",
        }
    }
}

/// What placing one file did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// Where the file now is.
    pub path: PathBuf,
    /// How it got there.
    pub method: Method,
    /// Bytes written (a copy's size; 0 otherwise).
    pub bytes_copied: u64,
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

/// Makes `name` in `dir` a reflink, copy or hard link of `src` as `mode`
/// says, atomically replacing whatever `name` was (a link there is
/// replaced, never followed). With `checked` (the store's payload of
/// `src`), `src` must still be the file hashed, and a copy writes only
/// bytes checked against its group digests (D12). The caller fsyncs `dir`
/// once all files are placed.
pub fn place(
    src: &Path,
    checked: Option<&dyn Checked>,
    dir: &OutDir,
    name: &OsStr,
    mode: LinkMode,
) -> Result<Placed> {
    let dst = dir.shown(name);
    let from = File::open(src).map_err(|e| Error::read(src, e))?;
    let src_meta = from.metadata().map_err(|e| Error::read(src, e))?;
    if let Some(p) = checked {
        if !p.is_file(&src_meta) {
            return Err(changed(src, "the file is no longer the one hashed"));
        }
    }
    let placed = |method, bytes_copied| Placed {
        path: dst.clone(),
        method,
        bytes_copied,
    };
    if let Ok(existing) = dir.stat(name) {
        if existing.st_dev == src_meta.dev() && existing.st_ino == src_meta.ino() {
            if fs::canonicalize(src).ok() == fs::canonicalize(&dst).ok() {
                return Ok(placed(Method::InPlace, 0));
            }
            if mode == LinkMode::Hard {
                return Ok(placed(Method::HardLink, 0));
            }
        }
    }
    let (temp, method, bytes) = put(src, &from, checked, dir, name, mode)?;
    dir.commit(temp, name).map_err(|e| Error::write(&dst, e))?;
    Ok(placed(method, bytes))
}

fn changed(src: &Path, problem: &str) -> Error {
    Error::PayloadChanged {
        path: src.to_path_buf(),
        problem: problem.into(),
    }
}

/// A temp file (to become `name`) made from `src` as `mode` says, with the
/// method used and the bytes copied.
fn put(
    src: &Path,
    from: &File,
    checked: Option<&dyn Checked>,
    dir: &OutDir,
    name: &OsStr,
    mode: LinkMode,
) -> Result<(Temp, Method, u64)> {
    let dst = dir.shown(name);
    let failed = |e| Error::write(&dst, e);
    if mode == LinkMode::Hard {
        match dir.link_temp(src, name) {
            Ok(t) => {
                // Linked by path: the link must be of the file checked.
                let same = match (checked, dir.stat_temp(&t)) {
                    (None, _) => true,
                    (Some(p), Ok(m)) => p.is_inode(m.st_dev, m.st_ino),
                    (Some(_), Err(_)) => false,
                };
                if !same {
                    dir.discard(t);
                    return Err(changed(src, "the file linked is not the one hashed"));
                }
                return Ok((t, Method::HardLink, 0));
            }
            Err(e) if link_refused(&e) => {}
            Err(e) => return Err(failed(e)),
        }
    }
    if matches!(mode, LinkMode::Auto | LinkMode::Reflink) {
        let (to, temp) = dir.create_temp(name, true).map_err(failed)?;
        match reflink(from, &to) {
            Ok(()) => return Ok((temp, Method::Reflink, 0)),
            Err(e) if reflink_unsupported(&e) && mode == LinkMode::Auto => dir.discard(temp),
            Err(e) if reflink_unsupported(&e) => {
                dir.discard(temp);
                return Err(Error::Unsupported(format!(
                    "cannot reflink {} to {}: {e} (the filesystem has no reflinks, or the \
                     cache is on another one); --link auto copies where reflinks are impossible",
                    src.display(),
                    dst.display()
                )));
            }
            Err(e) => {
                dir.discard(temp);
                return Err(failed(e));
            }
        }
    }
    let (to, temp) = dir.create_temp(name, true).map_err(failed)?;
    let copied = match checked {
        Some(p) => copy_checked(p, to, &dst),
        None => copy(from, to).map_err(failed),
    };
    match copied {
        Ok(n) => Ok((temp, Method::Copy, n)),
        Err(e) => {
            dir.discard(temp);
            Err(e)
        }
    }
}

/// Writes `p`'s bytes into `to` (shown as `dst`) one checked piece at a
/// time: a rotted piece is never written, and a written one is released
/// (`Checked::release`: only a piece of the payload stays resident).
fn copy_checked(p: &dyn Checked, mut to: File, dst: &Path) -> Result<u64> {
    use std::io::Write;
    const PIECE: usize = 1 << 20;
    let mut at = 0;
    while at < p.len() {
        let end = (at + PIECE).min(p.len());
        let bytes = p.checked_range(at..end).map_err(|offset| {
            let why = format!("the bytes at offset {offset} are not the ones hashed");
            changed(p.path(), &why)
        })?;
        to.write_all(bytes).map_err(|e| Error::write(dst, e))?;
        p.release(at..end);
        at = end;
    }
    to.sync_all().map_err(|e| Error::write(dst, e))?;
    Ok(p.len() as u64)
}

/// Makes `to` share `src`'s extents.
fn reflink(src: &File, to: &File) -> std::io::Result<()> {
    rustix::fs::ioctl_ficlone(to, src)?;
    to.sync_all()
}

/// Copies `src` into `to`; returns the bytes copied.
fn copy(mut src: &File, mut to: File) -> std::io::Result<u64> {
    // io::copy between files uses copy_file_range (in-kernel; on btrfs and
    // XFS it may share extents, which a copy does not promise or need).
    let bytes = std::io::copy(&mut src, &mut to)?;
    to.sync_all()?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `place` into `dst`'s folder, opened here.
    fn place_at(src: &Path, dst: &Path, mode: LinkMode) -> Result<Placed> {
        let dir = OutDir::open(dst.parent().unwrap()).unwrap();
        place(src, None, &dir, dst.file_name().unwrap(), mode)
    }

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
        let to = File::create(dir.join("probe-dst")).unwrap();
        let ok = reflink(&File::open(&src).unwrap(), &to).is_ok();
        let _ = fs::remove_file(dir.join("probe-dst"));
        fs::remove_file(src).unwrap();
        ok
    }

    #[test]
    fn auto_gives_a_file_of_its_own() {
        let (dir, src) = source();
        let dst = dir.path().join("dst");
        let p = place_at(&src, &dst, LinkMode::Auto).unwrap();
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
        let p = place_at(&src, &dst, LinkMode::Hard).unwrap();
        assert_eq!((p.method, p.bytes_copied), (Method::HardLink, 0));
        assert_eq!(p.method, Method::HardLink);
        assert_eq!(fs::metadata(&src).unwrap().nlink(), 2);
        // Already in place: nothing to do.
        let again = place_at(&src, &dst, LinkMode::Hard).unwrap();
        assert_eq!(again.method, Method::HardLink);
        // Any other mode replaces the link with a file of its own.
        for mode in [LinkMode::Copy, LinkMode::Auto] {
            place_at(&src, &dst, LinkMode::Hard).unwrap();
            let c = place_at(&src, &dst, mode).unwrap();
            assert_ne!(c.method, Method::HardLink, "{mode:?}: {c:?}");
            assert_eq!(fs::metadata(&src).unwrap().nlink(), 1, "{mode:?}");
            assert_eq!(fs::read(&dst).unwrap(), b"payload");
        }
        let c = place_at(&src, &dst, LinkMode::Copy).unwrap();
        assert_eq!((c.method, c.bytes_copied), (Method::Copy, 7));
        assert!(no_temp_files(dir.path()));
    }

    #[test]
    fn a_file_onto_itself_is_in_place() {
        let (dir, src) = source();
        for mode in LinkMode::ALL {
            let p = place_at(&src, &src, mode).unwrap();
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
            let p = place_at(&src, &dst, LinkMode::Reflink).unwrap();
            assert_eq!(p.method, Method::Reflink);
            eprintln!("this filesystem reflinks; the refusal is covered where it does not");
            return;
        }
        let e = place_at(&src, &dst, LinkMode::Reflink)
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
            let p = place_at(&src, &dst_dir.path().join("dst"), mode).unwrap();
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
        let e = place_at(
            &dir.path().join("nope"),
            &dir.path().join("dst"),
            LinkMode::Auto,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn a_link_at_the_destination_is_replaced_not_followed() {
        let (dir, src) = source();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        let dst = dir.path().join("dst");
        std::os::unix::fs::symlink(&victim, &dst).unwrap();
        for mode in LinkMode::ALL {
            if mode == LinkMode::Reflink && !reflinks_in(dir.path()) {
                continue;
            }
            fs::remove_file(&dst).unwrap();
            std::os::unix::fs::symlink(&victim, &dst).unwrap();
            place_at(&src, &dst, mode).unwrap();
            assert!(
                !fs::symlink_metadata(&dst).unwrap().is_symlink(),
                "{mode:?}"
            );
            assert_eq!(fs::read(&dst).unwrap(), b"payload");
            assert_eq!(fs::read(&victim).unwrap(), b"precious", "{mode:?}");
        }
        assert!(no_temp_files(dir.path()));
    }
}
