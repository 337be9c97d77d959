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
    if !dir.is_absolute() || !dir.is_dir() {
        return Err(Error::invalid(format!(
            "{} is not an absolute path to a folder",
            dir.display()
        )));
    }
    let who = caller.identity()?;
    who.open_dir(dir, access::READ).map_err(|_| {
        Error::denied(format!(
            "{} may not read {}",
            caller.describe(),
            dir.display()
        ))
    })?;
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
