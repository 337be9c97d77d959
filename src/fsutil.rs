//! Atomic file publication: write to a temp file in the target folder, fsync,
//! rename over the target, fsync the folder. Readers see the old file or the
//! new one, never a torn one.

use std::fs::File;
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

pub use ctcache_files::{fill_random, FileStamp};

/// The size in bytes of the file system holding `path`.
pub fn fs_size(path: &Path) -> std::io::Result<u64> {
    let s = rustix::fs::statvfs(path)?;
    Ok(s.f_blocks.saturating_mul(s.f_frsize))
}

/// fsyncs a folder so a rename inside it is durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod concurrent_tests {
    use super::*;
    use std::fs;
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
