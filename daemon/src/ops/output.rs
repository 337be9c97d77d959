//! Files the daemon writes for a caller (Embed, Materialize): where they
//! may go, and who owns them afterwards.

use std::path::{Path, PathBuf};

use ctcache::access;

use super::{Error, Result};
use crate::caller::Caller;

/// An absolute output path in a folder the caller may write.
pub(crate) fn output_path(caller: &Caller, path: &str) -> Result<PathBuf> {
    let out = PathBuf::from(path);
    if !out.is_absolute() {
        return Err(Error::invalid("output_path must be absolute"));
    }
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| Error::invalid("output_path needs a folder"))?;
    caller
        .identity()?
        .open_dir(dir, access::WRITE)
        .map_err(|_| {
            Error::denied(format!(
                "{} may not write in {}",
                caller.describe(),
                dir.display()
            ))
        })?;
    Ok(out)
}

/// Files the daemon wrote for a caller belong to the caller when the daemon
/// runs as root (otherwise it cannot give them away).
pub(crate) fn give_to_caller<'a>(caller: &Caller, paths: impl Iterator<Item = &'a Path>) {
    if crate::caller::own_uid() == 0 {
        for p in paths {
            let id = caller.identity.as_ref();
            let _ = std::os::unix::fs::chown(p, id.map(|i| i.uid), id.map(|i| i.gid));
        }
    }
}
