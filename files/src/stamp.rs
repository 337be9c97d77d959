//! A file's identity as the file system tells it, and names nobody may
//! guess.

use std::fs::{self, File};
use std::path::Path;

/// The identity of a file's content as the file system tells it: it changes
/// whenever the content may have changed (device, inode, size, mtime and
/// ctime to the nanosecond).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FileStamp {
    /// Device id of the file system.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Length in bytes.
    pub size: u64,
    /// Modification time, ns since the epoch.
    pub mtime_ns: i128,
    /// Inode change time, ns since the epoch.
    pub ctime_ns: i128,
}

impl FileStamp {
    /// The stamp of an open file.
    pub fn of_file(file: &File) -> std::io::Result<FileStamp> {
        Ok(FileStamp::of_meta(&file.metadata()?))
    }

    /// The stamp of the file at `path` (following symbolic links).
    pub fn of_path(path: &Path) -> std::io::Result<FileStamp> {
        Ok(FileStamp::of_meta(&fs::metadata(path)?))
    }

    /// The stamp of the file `m` describes.
    pub fn of_meta(m: &fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        }
    }
}

/// Fills `buf` from the kernel's random generator (for names nobody may
/// guess: temp files, handouts).
pub fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
