//! A small tmpfs of a test's own: a real full disk (ENOSPC, from the
//! kernel) without filling the machine's. Only root may mount one.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// A tmpfs mounted at a folder, unmounted (lazily) on drop.
pub struct Tmpfs {
    at: PathBuf,
    /// The temp folder it is mounted on, removed after the unmount.
    _dir: Option<tempfile::TempDir>,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (mount(8)'s syntax: `16m`) on a new temp
    /// folder; `None`, said on stderr, when not root or mount fails (the
    /// caller skips).
    pub fn mount(size: &str) -> Option<Tmpfs> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: not root, cannot mount a tmpfs");
            return None;
        }
        let dir = tempfile::tempdir().ok()?;
        match Tmpfs::mount_at(dir.path(), size) {
            Ok(mut t) => {
                t._dir = Some(dir);
                Some(t)
            }
            Err(e) => {
                eprintln!("skipped: {e:#}");
                None
            }
        }
    }

    /// Mounts a tmpfs of `size` at `at` (made when missing).
    pub fn mount_at(at: &Path, size: &str) -> Result<Tmpfs> {
        std::fs::create_dir_all(at).with_context(|| format!("making {}", at.display()))?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .context("running mount")?
            .success();
        if !ok {
            bail!("mount -t tmpfs at {} failed", at.display());
        }
        Ok(Tmpfs {
            at: at.to_path_buf(),
            _dir: None,
        })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.at
    }

    /// Fills it to the last byte with a file `ballast`; returns its path
    /// (remove it to give the space back).
    pub fn fill(&self) -> PathBuf {
        fill(&self.at)
    }
}

/// Fills the file system of `dir` to the last byte with a file `ballast`
/// in it; returns its path.
pub fn fill(dir: &Path) -> PathBuf {
    let ballast = dir.join("ballast");
    let mut f = std::fs::File::create(&ballast)
        .unwrap_or_else(|e| panic!("creating {}: {e}", ballast.display()));
    let chunk = vec![1u8; 64 << 10];
    while f.write_all(&chunk).is_ok() {}
    let small = [1u8; 512];
    while f.write_all(&small).is_ok() {}
    ballast
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}
