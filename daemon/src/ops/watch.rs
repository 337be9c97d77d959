//! The watch use cases: add a model folder to watch (a caller who may read
//! it), remove one (trusted callers), list them.

use std::path::{Path, PathBuf};

use super::{Error, Result};
use crate::caller::Caller;
use crate::events::EventKind;
use crate::state::Daemon;
use crate::watcher::Owner;

/// Watches `dir` for the caller; returns the watched folders.
pub(crate) fn add(d: &Daemon, caller: &Caller, dir: &Path) -> Result<Vec<PathBuf>> {
    tracing::info!(caller = %caller.describe(), dir = %dir.display(), "add watch");
    let not_a_folder = || {
        Error::invalid(format!(
            "{} is not an absolute path to a folder",
            dir.display()
        ))
    };
    if !dir.is_absolute() {
        return Err(not_a_folder());
    }
    // Checked before looking at the folder: to anyone but root and the
    // daemon's uid, a missing folder and one they may not read get the same
    // answer.
    if !caller.may_read(dir) {
        return Err(Error::denied(format!(
            "{}: not found, or not readable by {}",
            dir.display(),
            caller.describe()
        )));
    }
    if !dir.is_dir() {
        return Err(not_a_folder());
    }
    let owner = match caller.uid {
        Some(uid) if !caller.is_self_or_root() => Owner::Uid(uid),
        _ => Owner::Config,
    };
    if let Some(dir) = d.watcher.add(dir, owner)? {
        d.events.emit(
            EventKind::Watcher,
            None,
            dir.display().to_string(),
            "watch added".into(),
        );
    }
    Ok(d.watcher.dirs())
}

/// Stops watching `dir`; returns the watched folders.
pub(crate) fn remove(d: &Daemon, caller: &Caller, dir: &Path) -> Result<Vec<PathBuf>> {
    caller.require_trusted("remove watches")?;
    let dir = d.watcher.remove(dir)?;
    d.events.emit(
        EventKind::Watcher,
        None,
        dir.display().to_string(),
        "watch removed".into(),
    );
    Ok(d.watcher.dirs())
}
