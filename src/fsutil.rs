//! Atomic file publication: write to a temp file in the target folder, fsync,
//! rename over the target, fsync the folder. Readers see the old file or the
//! new one, never a torn one.

use std::fs::{self, File};
use std::io::BufWriter;
use std::path::Path;

use crate::error::{Error, Result};

/// Writes `path` atomically with the bytes `fill` produces.
pub fn atomic_write(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<&File>) -> std::io::Result<()>,
) -> Result<()> {
    crate::outdir::OutFile::open(path)
        .and_then(|o| o.dir.write(&o.name, fill))
        .map_err(|e| Error::write(path, e))
}

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
    pub(crate) fn of_file(file: &File) -> std::io::Result<FileStamp> {
        Ok(FileStamp::of_meta(&file.metadata()?))
    }

    /// The stamp of the file at `path` (following symbolic links).
    pub fn of_path(path: &Path) -> std::io::Result<FileStamp> {
        Ok(FileStamp::of_meta(&fs::metadata(path)?))
    }

    fn of_meta(m: &fs::Metadata) -> FileStamp {
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

/// The size in bytes of the file system holding `path`.
pub fn fs_size(path: &Path) -> std::io::Result<u64> {
    let s = rustix::fs::statvfs(path)?;
    Ok(s.f_blocks.saturating_mul(s.f_frsize))
}

/// fsyncs a folder so a rename inside it is durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
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

#[cfg(test)]
mod concurrent_tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn concurrent_writers_of_one_path_leave_one_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        std::thread::scope(|s| {
            for i in 0..8u8 {
                let path = &path;
                s.spawn(move || {
                    atomic_write(path, |w| w.write_all(&vec![i; 256 << 10])).unwrap();
                });
            }
        });
        let got = fs::read(&path).unwrap();
        assert_eq!(got.len(), 256 << 10);
        assert!(got.iter().all(|&b| b == got[0]), "a torn file");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["out.bin"], "temp files left: {names:?}");
    }
}
