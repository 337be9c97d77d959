//! A folder the process writes files into, held open: every file is made
//! relative to the folder's descriptor under an unpredictable temp name
//! (`O_CREAT|O_EXCL|O_NOFOLLOW`) and renamed into place, so no symbolic link
//! in the folder (one a peer planted for the daemon to follow) is ever
//! written through.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, CWD};

use crate::stamp::FileStamp;

/// An open output folder.
#[derive(Debug)]
pub struct OutDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// A file to be written in an open folder.
#[derive(Debug)]
pub struct OutFile {
    /// The open folder the file goes into.
    pub dir: OutDir,
    /// The file's name in it (one component).
    pub name: OsString,
}

impl OutFile {
    /// `path`'s folder, opened, and its file name.
    pub fn open(path: &Path) -> io::Result<OutFile> {
        let (dir, name) = folder_and_name(path)?;
        Ok(OutFile {
            dir: OutDir::open(dir)?,
            name: name.to_os_string(),
        })
    }

    /// The file's path, for messages and reports.
    pub fn path(&self) -> PathBuf {
        self.dir.shown(&self.name)
    }

    /// Whether this output names the file `input` was read from: the same
    /// device and inode, however it is spelled (a symbolic or hard link,
    /// `./`, `..`). Writing it would replace what the command reads.
    pub fn is_input(&self, input: &FileStamp) -> bool {
        rustix::fs::statat(&self.dir.fd, &self.name, AtFlags::empty())
            .is_ok_and(|st| st.st_dev == input.dev && st.st_ino == input.ino)
    }

    /// Refuses an output that is the input `what` (`model`) the command
    /// read (see [`OutFile::is_input`]): the one check every command that
    /// writes a file runs. `hint` says what to do instead (`None`: choose
    /// another path).
    pub fn refuse_input(
        &self,
        input: Option<FileStamp>,
        what: &str,
        hint: Option<&str>,
    ) -> crate::Result<()> {
        match input {
            Some(st) if self.is_input(&st) => Err(crate::Error::write(
                self.path(),
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "the output path is the input {what}; {}",
                        hint.unwrap_or("choose another path")
                    ),
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// A temp file made in an [`OutDir`], to be renamed into place or dropped.
#[derive(Debug)]
pub struct Temp {
    name: OsString,
}

impl OutDir {
    /// Opens the folder `path`, following links on the way (what is
    /// checked and written is the folder this opens).
    pub fn open(path: &Path) -> io::Result<OutDir> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(CWD, path, flags, Mode::empty())?;
        Ok(OutDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// Opens the folder `path`, making the folders of it that are missing
    /// (see [`OutDir::make_path`]): the deepest existing one is opened as
    /// [`OutDir::open`] does. Returns the folder and the folders made.
    pub fn open_or_make(path: &Path) -> io::Result<(OutDir, Vec<PathBuf>)> {
        let (base, rest) = existing_ancestor(path, |p| OutDir::open(p).map(|_| ()))?;
        OutDir::open(&base)?.make_path(&rest)
    }

    /// The folder `rest` below this one, each missing component made (0755)
    /// and every one opened
    /// without following a link ([`OutDir::subdir`]). Returns the folder and
    /// the folders made, outermost first.
    pub fn make_path(self, rest: &Path) -> io::Result<(OutDir, Vec<PathBuf>)> {
        let mut dir = self;
        let mut made = Vec::new();
        for c in rest.components() {
            let std::path::Component::Normal(name) = c else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{}: a missing folder is named through {:?}; name it plainly",
                        dir.shown(rest.as_os_str()).display(),
                        c.as_os_str()
                    ),
                ));
            };
            let (sub, new) = dir.subdir(name)?;
            if new {
                made.push(sub.path.clone());
            }
            dir = sub;
        }
        Ok((dir, made))
    }

    /// The folder `dir`, already open (checked by its opener).
    pub fn from_open(dir: File, path: &Path) -> OutDir {
        OutDir {
            fd: dir.into(),
            path: path.to_path_buf(),
        }
    }

    /// The folder as it was named.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` inside this folder, for messages.
    pub fn shown(&self, name: &OsStr) -> PathBuf {
        self.path.join(name)
    }

    /// The subfolder `name`, made here when missing. An existing one must
    /// be a real folder (not a link) and this process's.
    /// Returns the folder and whether it was made now.
    pub fn subdir(&self, name: &OsStr) -> io::Result<(OutDir, bool)> {
        let made = match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o755)) {
            Ok(()) => true,
            Err(rustix::io::Errno::EXIST) => false,
            Err(e) => return Err(e.into()),
        };
        let fd = rustix::fs::openat(&self.fd, name, dir_flags(), Mode::empty()).map_err(|e| {
            if e == rustix::io::Errno::LOOP || e == rustix::io::Errno::NOTDIR {
                refused(format!(
                    "{} exists and is not a folder (a symbolic link is not followed)",
                    self.shown(name).display()
                ))
            } else {
                e.into()
            }
        })?;
        let st = rustix::fs::fstat(&fd)?;
        if made {
            // The name was opened again: write only into the folder made
            // here, not another user's swapped in by a rename meanwhile.
            if st.st_uid != own_uid() {
                return Err(refused(format!(
                    "{} changed while it was being made",
                    self.shown(name).display()
                )));
            }
        } else if st.st_uid != own_uid() {
            // Whoever writes, root included: another user's folder could be
            // changed under the files written into it.
            return Err(refused(format!(
                "{} exists and belongs to another user; remove it or choose another output",
                self.shown(name).display()
            )));
        }
        let sub = OutDir {
            fd,
            path: self.shown(name),
        };
        Ok((sub, made))
    }

    /// A new file for `name`: read-only when `read_only` (immutable payload
    /// files), else 0644.
    pub fn create_temp(&self, name: &OsStr, read_only: bool) -> io::Result<(File, Temp)> {
        let mode = Mode::from_raw_mode(if read_only { 0o444 } else { 0o644 });
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
        loop {
            let temp = Temp::for_name(name)?;
            match rustix::fs::openat(&self.fd, &temp.name, flags | OFlags::CLOEXEC, mode) {
                Ok(fd) => return Ok((File::from(fd), temp)),
                Err(rustix::io::Errno::EXIST) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// A hard link to `src` under a temp name for `name` (it keeps `src`'s
    /// owner: the file is shared, not given away).
    pub fn link_temp(&self, src: &Path, name: &OsStr) -> io::Result<Temp> {
        loop {
            let temp = Temp::for_name(name)?;
            match rustix::fs::linkat(CWD, src, &self.fd, &temp.name, AtFlags::empty()) {
                Ok(()) => return Ok(temp),
                Err(rustix::io::Errno::EXIST) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Renames `temp` to `name`, replacing what was there (a link named
    /// `name` is replaced, never followed). In a sticky folder an existing
    /// `name` must be this process's, root included: another user's file there is not replaced.
    pub fn commit(&self, temp: Temp, name: &OsStr) -> io::Result<()> {
        if let Err(e) = self.may_replace(name) {
            self.discard(temp);
            return Err(e);
        }
        match rustix::fs::renameat(&self.fd, &temp.name, &self.fd, name) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.discard(temp);
                Err(e.into())
            }
        }
    }

    fn may_replace(&self, name: &OsStr) -> io::Result<()> {
        let uid = own_uid();
        let dir = rustix::fs::fstat(&self.fd)?;
        if dir.st_mode & libc::S_ISVTX == 0 || dir.st_uid == uid {
            return Ok(());
        }
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_uid != uid => Err(refused(format!(
                "{} belongs to another user in a shared (sticky) folder",
                self.shown(name).display()
            ))),
            Ok(_) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes the file `name` (a link is removed, not followed). For what
    /// this process made in this request only.
    pub fn remove(&self, name: &OsStr) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(&self.fd, name, AtFlags::empty())?)
    }

    /// Removes the empty folder `name`. For what this process made only.
    pub fn remove_dir(&self, name: &OsStr) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR)?)
    }

    /// Removes a temp file that will not be committed.
    pub fn discard(&self, temp: Temp) {
        let _ = rustix::fs::unlinkat(&self.fd, &temp.name, AtFlags::empty());
    }

    /// Writes `name` whole or not at all: a temp file filled by `fill`,
    /// fsynced, renamed into place, then the folder fsynced.
    pub fn write(
        &self,
        name: &OsStr,
        fill: impl FnOnce(&mut BufWriter<&File>) -> io::Result<()>,
    ) -> io::Result<()> {
        let (file, temp) = self.create_temp(name, false)?;
        let filled = (|| {
            let mut w = BufWriter::with_capacity(1 << 20, &file);
            fill(&mut w)?;
            w.flush()?;
            drop(w);
            file.sync_all()
        })();
        if let Err(e) = filled {
            self.discard(temp);
            return Err(e);
        }
        self.commit(temp, name)?;
        self.sync()
    }

    /// The metadata of `name` here, not following a link.
    pub fn stat(&self, name: &OsStr) -> io::Result<rustix::fs::Stat> {
        Ok(rustix::fs::statat(
            &self.fd,
            name,
            AtFlags::SYMLINK_NOFOLLOW,
        )?)
    }

    /// `stat` of a temp file made here, not following links.
    pub fn stat_temp(&self, temp: &Temp) -> io::Result<rustix::fs::Stat> {
        self.stat(&temp.name)
    }

    /// Opens the file `name` here to read it, not following a link.
    pub fn open_file(&self, name: &OsStr) -> io::Result<File> {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.fd, name, flags, Mode::empty())?;
        Ok(File::from(fd))
    }

    /// Flushes the folder's entries to disk.
    pub fn sync(&self) -> io::Result<()> {
        Ok(rustix::fs::fsync(&self.fd)?)
    }

    /// Removes the regular files here not named in `keep`.
    pub fn prune(&self, keep: &[&OsStr]) -> io::Result<()> {
        let dup = rustix::fs::openat(&self.fd, ".", dir_flags(), Mode::empty())?;
        let dir = rustix::fs::Dir::read_from(&dup)?;
        for entry in dir {
            let entry = entry?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if entry.file_type() == rustix::fs::FileType::RegularFile && !keep.contains(&name) {
                let _ = rustix::fs::unlinkat(&self.fd, name, AtFlags::empty());
            }
        }
        Ok(())
    }
}

/// The deepest of `path` and its ancestors that `open` opens, and the rest
/// of `path` below it: a missing folder is the only reason to go up (any
/// other error is returned).
pub fn existing_ancestor(
    path: &Path,
    open: impl Fn(&Path) -> io::Result<()>,
) -> io::Result<(PathBuf, PathBuf)> {
    let mut first = None;
    for a in path.ancestors() {
        // A relative path's last ancestor is "": the current folder, below
        // which lies the whole path.
        let (a, rest) = if a.as_os_str().is_empty() {
            (Path::new("."), path)
        } else {
            (a, path.strip_prefix(a).unwrap_or(Path::new("")))
        };
        match open(a) {
            Ok(()) => return Ok((a.to_path_buf(), rest.to_path_buf())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                first.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
        if a == Path::new(".") {
            break;
        }
    }
    Err(first.unwrap_or_else(|| io::Error::from(io::ErrorKind::NotFound)))
}

/// `path`'s folder (`.` when it names none) and file name.
fn folder_and_name(path: &Path) -> io::Result<(&Path, &OsStr)> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the output path has no file name",
        )
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Ok((dir, name))
}

impl OutFile {
    /// [`OutFile::open`], making the missing folders of `path`'s parent
    /// ([`OutDir::open_or_make`]); returns the folders made.
    pub fn create(path: &Path) -> io::Result<(OutFile, Vec<PathBuf>)> {
        let (dir, name) = folder_and_name(path)?;
        let (dir, made) = OutDir::open_or_make(dir)?;
        Ok((
            OutFile {
                dir,
                name: name.to_os_string(),
            },
            made,
        ))
    }
}

impl AsFd for OutDir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Temp {
    /// `.NAME.tmp-<16 random hex>`: hidden, and not guessable in advance.
    fn for_name(name: &OsStr) -> io::Result<Temp> {
        let mut r = [0u8; 8];
        crate::stamp::fill_random(&mut r)?;
        let mut t = OsString::from(".");
        t.push(name);
        t.push(format!(".tmp-{}", hex::encode(r)));
        Ok(Temp { name: t })
    }
}

fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn refused(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A relative path none of whose folders exists yet lies wholly below
    /// the current folder (it once came back as "." with nothing below).
    #[test]
    fn a_relative_path_with_no_folder_yet_is_below_the_current_one() {
        // Folders where only `dir` exists.
        let only = |dir: &'static str| {
            move |p: &Path| match p == Path::new(dir) {
                true => Ok(()),
                false => Err(io::Error::from(io::ErrorKind::NotFound)),
            }
        };
        let (base, rest) = existing_ancestor(Path::new("out/m.onnx"), only(".")).unwrap();
        assert_eq!(
            (base, rest),
            (PathBuf::from("."), PathBuf::from("out/m.onnx"))
        );
        let (base, rest) = existing_ancestor(Path::new("out/sub/m.onnx"), only("out")).unwrap();
        assert_eq!(
            (base, rest),
            (PathBuf::from("out"), PathBuf::from("sub/m.onnx"))
        );
    }

    /// Root writing into a shared sticky folder
    /// (of a third user) where another user made the names first: neither
    /// that user's `.weights` folder nor its file is used or replaced.
    #[test]
    fn another_users_folder_or_file_is_refused_for_root_too() {
        if own_uid() != 0 {
            eprintln!("skipped: needs root to make another user's files");
            return;
        }
        let shared = tempfile::tempdir().unwrap();
        std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        std::os::unix::fs::chown(shared.path(), Some(4242), Some(4242)).unwrap();
        let planted = shared.path().join("OUT.weights");
        std::fs::create_dir(&planted).unwrap();
        let theirs = shared.path().join("OUT.onnx");
        std::fs::write(&theirs, b"theirs").unwrap();
        for p in [&planted, &theirs] {
            std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
        }
        let dir = OutDir::open(shared.path()).unwrap();
        let e = dir.subdir(OsStr::new("OUT.weights")).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("belongs to another user"), "{e}");
        let (_, temp) = dir.create_temp(OsStr::new("OUT.onnx"), false).unwrap();
        let e = dir.commit(temp, OsStr::new("OUT.onnx")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert_eq!(std::fs::read(&theirs).unwrap(), b"theirs");
        // Its own folder it uses.
        std::fs::create_dir(shared.path().join("MINE.weights")).unwrap();
        assert!(dir.subdir(OsStr::new("MINE.weights")).is_ok());
    }
}
