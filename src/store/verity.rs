//! fs-verity on payload files, where the kernel and file system have it:
//! once enabled, the kernel checks every page it reads from disk against a
//! Merkle tree and answers EIO for a rotted one, even under a client's map.
//! It is an extra guard, never the guarantee (that is the group digests of
//! `crate::chunks`), so a file system without it is a quiet fallback: the
//! first refusal turns the attempts off for the store's lifetime.

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// `FS_IOC_ENABLE_VERITY`: `_IOW('f', 133, struct fsverity_enable_arg)`.
const FS_IOC_ENABLE_VERITY: libc::c_ulong = 0x4080_6685;

/// `struct fsverity_enable_arg` (linux/fsverity.h), 128 bytes.
#[repr(C)]
struct EnableArg {
    version: u32,
    hash_algorithm: u32,
    block_size: u32,
    salt_size: u32,
    salt_ptr: u64,
    sig_size: u32,
    reserved1: u32,
    sig_ptr: u64,
    reserved2: [u64; 11],
}

/// Whether to try, and how many files have it.
pub(crate) struct Verity {
    available: AtomicBool,
    enabled: AtomicU64,
    tried: AtomicU64,
}

impl Default for Verity {
    fn default() -> Self {
        Verity {
            available: AtomicBool::new(true),
            enabled: AtomicU64::new(0),
            tried: AtomicU64::new(0),
        }
    }
}

impl Verity {
    /// Enables fs-verity on the finished (closed for writing) file at
    /// `path` when the file system supports it; true when it is on.
    pub fn enable(&self, path: &Path) -> bool {
        if !self.available.load(Ordering::Relaxed) {
            return false;
        }
        self.tried.fetch_add(1, Ordering::Relaxed);
        let Ok(f) = File::open(path) else {
            return false;
        };
        let arg = EnableArg {
            version: 1,
            hash_algorithm: 1, // SHA-256
            block_size: 4096,
            salt_size: 0,
            salt_ptr: 0,
            sig_size: 0,
            reserved1: 0,
            sig_ptr: 0,
            reserved2: [0; 11],
        };
        // SAFETY: the ioctl reads `arg` (a valid, initialised struct of the
        // kernel's layout, no salt or signature pointers) during the call.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_ENABLE_VERITY as _, &arg) };
        if r == 0 {
            self.enabled.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EEXIST) => true,
            // No fs-verity here (kernel, file system or its feature flag).
            Some(libc::ENOTTY | libc::EOPNOTSUPP | libc::EINVAL | libc::ENOSYS) => {
                self.available.store(false, Ordering::Relaxed);
                false
            }
            // Anything else (a file still open for writing, EPERM): this
            // file only.
            _ => false,
        }
    }

    /// Files it was tried on, and files that have it.
    #[cfg(test)]
    pub fn counts(&self) -> (u64, u64) {
        (
            self.tried.load(Ordering::Relaxed),
            self.enabled.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arg_has_the_kernels_size() {
        assert_eq!(std::mem::size_of::<EnableArg>(), 128);
    }

    #[test]
    fn without_fs_verity_the_first_refusal_stops_the_attempts() {
        let d = tempfile::tempdir().unwrap();
        let v = Verity::default();
        for i in 0..3 {
            let p = d.path().join(i.to_string());
            std::fs::write(&p, vec![7u8; 10_000]).unwrap();
            let on = v.enable(&p);
            // Where the file system has it (ext4/f2fs/btrfs with the
            // feature on), every file gets it; elsewhere none, and the file
            // stays as it was.
            assert_eq!(std::fs::read(&p).unwrap(), vec![7u8; 10_000]);
            if !on {
                assert_eq!(v.counts(), (1, 0), "tried once, then not again");
            }
        }
    }
}
