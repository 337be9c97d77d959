//! The watch use cases: add a model folder to watch (a caller who may read
//! it), remove one (trusted callers), list them.

use std::path::{Path, PathBuf};

use super::{Error, Result};
use ctcache::access;

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
    let who = caller.identity()?;
    // Judged on the opened folder. To anyone but root and the daemon's uid a
    // missing folder, a file and a folder they may not read get the same
    // answer.
    if who.open_dir(dir, access::READ).is_err() {
        if caller.is_self_or_root() {
            return Err(not_a_folder());
        }
        return Err(Error::denied(format!(
            "{}: not found, not a folder, or not readable by {}",
            dir.display(),
            caller.describe()
        )));
    }
    // A watch is its adder's: what it finds is read with their rights
    // (root's and the daemon's own watches are the admin's).
    let owner = if caller.is_self_or_root() {
        Owner::Admin
    } else {
        Owner::User(who.clone())
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
