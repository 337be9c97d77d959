//! Files the daemon writes for a caller (Embed, Materialize): the output's
//! folder is opened once and the caller's right to write there judged on
//! that open folder; every file is then made through it (see
//! `ctcache::outdir`), handed to the caller by descriptor.

use std::path::PathBuf;

use ctcache::access;
use ctcache::outdir::{OutDir, OutFile, Recipient};

use super::{Error, Result};
use crate::caller::Caller;

/// The output `path` (absolute) in a folder the caller may write, opened.
pub(crate) fn output_file(caller: &Caller, path: &str) -> Result<OutFile> {
    let out = PathBuf::from(path);
    if !out.is_absolute() {
        return Err(Error::invalid("output_path must be absolute"));
    }
    let (Some(dir), Some(name)) = (out.parent(), out.file_name()) else {
        return Err(Error::invalid("output_path needs a folder and a file name"));
    };
    let identity = caller.identity()?;
    let opened = identity.open_dir(dir, access::WRITE).map_err(|e| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            Error::denied(format!(
                "{} may not write in {}{}",
                caller.describe(),
                dir.display(),
                crate::caller::own_rights_clause("writes outputs")
            ))
        } else {
            Error::invalid(format!("cannot open {}: {e}", dir.display()))
        }
    })?;
    let recipient = (!caller.is_self_or_root()).then_some(Recipient {
        uid: identity.uid,
        gid: identity.gid,
    });
    Ok(OutFile {
        dir: OutDir::from_open(opened, dir).for_recipient(recipient),
        name: name.to_os_string(),
    })
}
