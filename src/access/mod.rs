//! Acting for another user: an [`Identity`] opens files and folders with
//! its own rights. Where the process runs as root the kernel judges each
//! open with the identity's filesystem ids and groups ([`creds`]);
//! elsewhere the process opens with its own rights and the identity's
//! rights are judged on what was opened (the inode's owner, mode bits and
//! POSIX ACL, and the folders of its real path), never on a path string
//! checked earlier. No open follows a /proc "magic" link or ends on a
//! /proc file: those reach other processes' files and memory. The daemon
//! uses this for its callers.

pub mod creds;

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// The permission bits of a request.
pub const READ: u32 = 4;
/// Write (create and remove entries, for a folder).
pub const WRITE: u32 = 2;
/// Search (for a folder) or execute.
pub(crate) const SEARCH: u32 = 1;

/// Name of the access ACL extended attribute (Linux, POSIX.1e draft).
const ACL_XATTR: &str = "system.posix_acl_access";
/// The only ACL xattr layout Linux writes.
const ACL_VERSION: u32 = 2;
/// Largest ACL read (the kernel caps entries far below this).
const ACL_MAX_BYTES: usize = 64 << 10;

/// Who the checks are for: a uid, its primary gid and its supplementary
/// groups (an empty list where they are unknown: group grants then come
/// only from the primary gid, which errs towards refusing).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    /// The user id the checks are for.
    pub uid: u32,
    /// Its primary group id.
    pub gid: u32,
    /// Its supplementary group ids (empty where unknown).
    pub groups: Vec<u32>,
}

/// One ACL entry's tag (linux/posix_acl_xattr.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tag {
    UserObj,
    User(u32),
    GroupObj,
    Group(u32),
    Mask,
    Other,
}

/// The entries of an access ACL; `None` for a malformed one.
fn parse_acl(bytes: &[u8]) -> Option<Vec<(Tag, u32)>> {
    let (head, body) = bytes.split_at_checked(4)?;
    if u32::from_le_bytes(head.try_into().ok()?) != ACL_VERSION || body.len() % 8 != 0 {
        return None;
    }
    body.chunks_exact(8)
        .map(|e| {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let perm = u32::from(u16::from_le_bytes([e[2], e[3]]) & 7);
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            let tag = match tag {
                0x01 => Tag::UserObj,
                0x02 => Tag::User(id),
                0x04 => Tag::GroupObj,
                0x08 => Tag::Group(id),
                0x10 => Tag::Mask,
                0x20 => Tag::Other,
                _ => return None,
            };
            Some((tag, perm))
        })
        .collect()
}

impl Identity {
    /// Root: the kernel grants reads and writes whatever the mode says.
    pub(crate) fn is_root(&self) -> bool {
        self.uid == 0
    }

    fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// Whether `want` (a mix of [`READ`], [`WRITE`], [`SEARCH`]) is granted
    /// on an inode with this owner, group and mode, and this access ACL
    /// (POSIX.1e: owner entry, else a named user entry under the mask, else
    /// any matching group entry under the mask, else other). A malformed
    /// ACL grants nothing beyond ownership.
    fn grants(&self, uid: u32, gid: u32, mode: u32, acl: Option<&[u8]>, want: u32) -> bool {
        if self.is_root() {
            return true;
        }
        let has = |perm: u32| perm & want == want;
        if self.uid == uid {
            return has(mode >> 6 & 7);
        }
        let Some(acl) = acl else {
            return if self.in_group(gid) {
                has(mode >> 3 & 7)
            } else {
                has(mode & 7)
            };
        };
        let Some(entries) = parse_acl(acl) else {
            return false;
        };
        let mask = entries
            .iter()
            .find(|(t, _)| *t == Tag::Mask)
            .map_or(7, |(_, p)| *p);
        if let Some((_, p)) = entries.iter().find(|(t, _)| *t == Tag::User(self.uid)) {
            return has(p & mask);
        }
        let groups: Vec<u32> = entries
            .iter()
            .filter(|(t, _)| match t {
                Tag::GroupObj => self.in_group(gid),
                Tag::Group(g) => self.in_group(*g),
                _ => false,
            })
            .map(|(_, p)| *p)
            .collect();
        if !groups.is_empty() {
            return groups.iter().any(|p| has(p & mask));
        }
        entries
            .iter()
            .find(|(t, _)| *t == Tag::Other)
            .is_some_and(|(_, p)| has(*p))
    }

    /// Whether `want` is granted on the open file or folder `fd`.
    pub fn may(&self, fd: impl AsFd, want: u32) -> io::Result<bool> {
        let st = rustix::fs::fstat(&fd)?;
        let acl = read_acl(|buf| rustix::fs::fgetxattr(&fd, ACL_XATTR, buf))?;
        Ok(self.grants(st.st_uid, st.st_gid, st.st_mode, acl.as_deref(), want))
    }

    /// Whether the identity may search every folder from `/` down to `dir`
    /// (a real path: no symbolic links in it).
    fn may_reach(&self, dir: &Path) -> io::Result<bool> {
        for d in dir.ancestors() {
            if d.as_os_str().is_empty() {
                continue;
            }
            let st = rustix::fs::stat(d)?;
            let acl = read_acl(|buf| rustix::fs::getxattr(d, ACL_XATTR, buf))?;
            if !self.grants(st.st_uid, st.st_gid, st.st_mode, acl.as_deref(), SEARCH) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Opens the regular file `path` for reading with this identity's
    /// rights (following symbolic links, as a model tree may): a link to a
    /// file the identity cannot read is refused, whoever made the link.
    pub fn open_read(&self, path: &Path) -> io::Result<File> {
        self.open_read_at(rustix::fs::CWD, path, path)
    }

    /// [`Identity::open_read`] of `name` in the open folder `dir` (named
    /// `shown` in errors).
    pub fn open_read_at(&self, dir: impl AsFd, name: &Path, shown: &Path) -> io::Result<File> {
        if creds::can_switch() {
            return creds::with_rights_of(self, || open_regular_at(dir, name));
        }
        let file = open_regular_at(dir, name)?;
        self.check_read(&file, shown)?;
        Ok(file)
    }

    /// Fails with PermissionDenied (naming `shown`) unless this identity may
    /// read the open `file` and reach it along its real path.
    fn check_read(&self, file: &File, shown: &Path) -> io::Result<()> {
        if self.is_root() {
            return Ok(());
        }
        let real = real_path(file)?;
        let folder = real.parent().unwrap_or(Path::new("/"));
        if self.may(file, READ)? && self.may_reach(folder)? {
            Ok(())
        } else {
            Err(denied(shown))
        }
    }

    /// Opens the folder `dir` (following symbolic links) and keeps it only
    /// when this identity may reach it and has `want` on it ([`READ`] to
    /// list it, [`WRITE`] to create in it; [`SEARCH`] is implied).
    pub fn open_dir(&self, dir: &Path, want: u32) -> io::Result<File> {
        let open = || {
            let fd = open_resolved(rustix::fs::CWD, dir, OFlags::RDONLY | OFlags::DIRECTORY)?;
            refuse_proc(&fd)?;
            Ok(File::from(fd))
        };
        if self.is_root() {
            return open();
        }
        if creds::can_switch() {
            // The kernel judged the way there; the folder's own bits say
            // whether `want` is granted.
            let file = creds::with_rights_of(self, open)?;
            return if self.may(&file, want | SEARCH)? {
                Ok(file)
            } else {
                Err(denied(dir))
            };
        }
        let file = open()?;
        let real = real_path(&file)?;
        if self.may(&file, want | SEARCH)? && self.may_reach(&real)? {
            Ok(file)
        } else {
            Err(denied(dir))
        }
    }
}

/// How model files and their external data are opened: with the process's
/// own rights, or only what an [`Identity`] may read.
pub trait Opener: Send + Sync + std::fmt::Debug {
    /// Opens `path` for reading.
    fn open(&self, path: &Path) -> io::Result<File>;

    /// Whether a model's data file it opens must really lie in the model's
    /// folder: true for opens by path (a link there must not lead the reader
    /// elsewhere); false where the caller opened each file itself, with its
    /// own rights, and handed it over.
    fn confines(&self) -> bool {
        true
    }
}

/// The process's own rights.
#[derive(Debug, Clone, Copy, Default)]
pub struct OwnRights;

impl Opener for OwnRights {
    fn open(&self, path: &Path) -> io::Result<File> {
        open_regular(path)
    }
}

/// Opens nothing: for a model whose external data is nobody's to open
/// (a runtime's output, which names no file of a caller's).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFiles;

impl Opener for NoFiles {
    fn open(&self, path: &Path) -> io::Result<File> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{}: this model's external data is not opened",
                path.display()
            ),
        ))
    }
}

impl Opener for Identity {
    fn open(&self, path: &Path) -> io::Result<File> {
        self.open_read(path)
    }
}

fn denied(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{}: permission denied", path.display()),
    )
}

/// The access ACL through `get` (an xattr read into spare capacity), or
/// `None` when there is none.
fn read_acl(
    get: impl Fn(rustix::buffer::SpareCapacity<'_, u8>) -> rustix::io::Result<usize>,
) -> io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::with_capacity(256);
    loop {
        buf.clear();
        match get(rustix::buffer::spare_capacity(&mut buf)) {
            Ok(_) => return Ok(Some(buf)),
            Err(rustix::io::Errno::NODATA | rustix::io::Errno::NOTSUP) => return Ok(None),
            Err(rustix::io::Errno::RANGE) if buf.capacity() < ACL_MAX_BYTES => {
                buf.reserve(buf.capacity() * 4);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Opens `path` following ordinary symbolic links but never a /proc magic
/// link (`/proc/<pid>/fd/*`, `map_files`, `root`, `cwd`): through those a
/// privileged opener reaches files and memory of other processes that no
/// path leads to. Kernels without `openat2` (before 5.6) open plainly.
fn open_resolved(dir: impl AsFd, path: &Path, flags: OFlags) -> io::Result<rustix::fd::OwnedFd> {
    let flags = flags | OFlags::CLOEXEC;
    match rustix::fs::openat2(
        &dir,
        path,
        flags,
        Mode::empty(),
        rustix::fs::ResolveFlags::NO_MAGICLINKS,
    ) {
        Err(rustix::io::Errno::NOSYS) => Ok(rustix::fs::openat(dir, path, flags, Mode::empty())?),
        // ELOOP is also what a magic link answers: say which it was not.
        Err(rustix::io::Errno::LOOP) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many levels of symbolic links, or a /proc link to another process's file",
        )),
        r => Ok(r?),
    }
}

/// Refuses an open file of procfs: its files describe processes (their
/// environment, memory, open files), never a model or a folder of one.
fn refuse_proc(fd: impl AsFd) -> io::Result<()> {
    if rustix::fs::fstatfs(fd)?.f_type == rustix::fs::PROC_SUPER_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a file of /proc, not a model's file or folder",
        ));
    }
    Ok(())
}

/// Opens `path` (following symbolic links, never a /proc one) for reading
/// only when it is a regular file outside /proc, without opening anything
/// else: opening a FIFO blocks until a writer comes, a device's open can
/// act on the device, a terminal can become the controlling one. A handle
/// that opens nothing (`O_PATH`) is judged first and that same inode is
/// then opened through `/proc/self/fd`.
pub fn open_regular(path: &Path) -> io::Result<File> {
    open_regular_at(rustix::fs::CWD, path)
}

/// [`open_regular`] of `name` in the open folder `dir`.
fn open_regular_at(dir: impl AsFd, name: &Path) -> io::Result<File> {
    let handle = open_resolved(dir, name, OFlags::PATH)?;
    refuse_proc(&handle)?;
    let st = rustix::fs::fstat(&handle)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            // Callers name the file.
            "not a regular file",
        ));
    }
    let fd = rustix::fs::open(
        format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&handle)),
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )?;
    Ok(File::from(fd))
}

/// Where an open file really is (its path with no symbolic links).
pub fn real_path(file: &File) -> io::Result<PathBuf> {
    std::fs::read_link(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(file)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(uid: u32, gid: u32, groups: &[u32]) -> Identity {
        Identity {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut b = ACL_VERSION.to_le_bytes().to_vec();
        for (tag, perm, id) in entries {
            b.extend_from_slice(&tag.to_le_bytes());
            b.extend_from_slice(&perm.to_le_bytes());
            b.extend_from_slice(&id.to_le_bytes());
        }
        b
    }

    #[test]
    fn mode_bits_owner_group_other() {
        let (owner, group, other) = (who(10, 20, &[]), who(11, 99, &[20]), who(12, 30, &[]));
        // rw- r-- ---
        for (id, read, write) in [
            (&owner, true, true),
            (&group, true, false),
            (&other, false, false),
        ] {
            assert_eq!(id.grants(10, 20, 0o640, None, READ), read, "{id:?}");
            assert_eq!(id.grants(10, 20, 0o640, None, WRITE), write, "{id:?}");
        }
        // The owner class decides for the owner, even when other may more.
        assert!(!owner.grants(10, 20, 0o007, None, READ));
        assert!(who(0, 0, &[]).grants(10, 20, 0o000, None, READ | WRITE));
    }

    #[test]
    fn acl_named_entries_and_mask() {
        // user::rw- user:11:r-- group::r-- group:40:rwx mask::r-x other::---
        let a = acl(&[
            (0x01, 6, u32::MAX),
            (0x02, 4, 11),
            (0x04, 4, u32::MAX),
            (0x08, 7, 40),
            (0x10, 5, u32::MAX),
            (0x20, 0, u32::MAX),
        ]);
        let grants = |id: Identity, want| id.grants(10, 20, 0o650, Some(&a), want);
        assert!(grants(who(11, 99, &[]), READ), "named user");
        assert!(!grants(who(11, 99, &[]), WRITE));
        assert!(
            grants(who(12, 99, &[40]), READ | SEARCH),
            "named group under the mask"
        );
        assert!(
            !grants(who(12, 99, &[40]), WRITE),
            "the mask takes w from rwx"
        );
        assert!(grants(who(13, 20, &[]), READ), "owning group");
        assert!(!grants(who(14, 99, &[]), READ), "other: nothing");
        // A named user entry of --- refuses even where other would allow.
        let b = acl(&[
            (0x01, 6, u32::MAX),
            (0x02, 0, 11),
            (0x04, 4, u32::MAX),
            (0x10, 4, u32::MAX),
            (0x20, 4, u32::MAX),
        ]);
        assert!(!who(11, 99, &[]).grants(10, 20, 0o644, Some(&b), READ));
        assert!(who(12, 99, &[]).grants(10, 20, 0o644, Some(&b), READ));
        // Malformed: nothing beyond ownership.
        assert!(!who(12, 99, &[]).grants(10, 20, 0o644, Some(b"junk"), READ));
        assert!(who(10, 99, &[]).grants(10, 20, 0o644, Some(b"junk"), READ));
    }

    #[test]
    fn open_read_judges_the_file_opened_not_the_link() {
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("private");
        std::fs::write(&private, b"secret").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&private, &link).unwrap();
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let stranger = who(me.wrapping_add(12345), 65534, &[]);
        let owner = who(me, 65534, &[]);
        for p in [&private, &link] {
            let err = stranger.open_read(p).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{p:?}");
            if me != 0 {
                assert!(owner.open_read(p).is_ok(), "{p:?}");
            }
        }
    }

    #[test]
    fn only_regular_files_are_opened() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.onnx");
        std::fs::write(&file, b"x").unwrap();
        assert!(open_regular(&file).is_ok());
        let fifo = dir.path().join("fifo.onnx");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        // A plain open of these would block (the FIFO) or act on a device.
        for p in [&fifo, Path::new("/dev/null"), dir.path()] {
            let e = open_regular(p).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{p:?}");
            assert!(e.to_string().contains("not a regular file"), "{e}");
        }
    }
}
