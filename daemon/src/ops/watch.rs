//! The watch use cases: add a model folder to watch (a caller who may read
//! it), remove one (trusted callers), list them (what the caller may know).

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
    if !dir.is_absolute() {
        return Err(Error::invalid(format!(
            "{} is not an absolute path",
            dir.display()
        )));
    }
    let who = caller.identity()?;
    // Judged on the opened folder. To anyone but root and the daemon's uid a
    // missing folder, a file and a folder they may not read get the same
    // answer.
    let opened = match who.open_dir(dir, access::READ) {
        Ok(f) => f,
        // The admin may know why: say it.
        Err(e) if caller.is_self_or_root() => {
            return Err(Error::invalid(match e.kind() {
                std::io::ErrorKind::NotFound => format!("{} does not exist", dir.display()),
                std::io::ErrorKind::NotADirectory => {
                    format!("{} is not a folder", dir.display())
                }
                _ => format!("cannot open {}: {e}", dir.display()),
            }))
        }
        Err(_) => {
            return Err(Error::denied(format!(
                "{}: not found, not a folder, or not readable by {}",
                dir.display(),
                caller.describe()
            )))
        }
    };
    // What is watched is the folder that was judged, found from the open
    // handle: the caller's path resolved again could lead elsewhere by now
    // (a link of theirs swapped after the check).
    let real = access::real_path(&opened)
        .map_err(|e| Error::internal(format!("{}: {e}", dir.display())))?;
    // A watch is its adder's: what it finds is read with their rights
    // (root's and the daemon's own watches are the admin's).
    let owner = if caller.is_self_or_root() {
        Owner::Admin
    } else {
        Owner::User(who.clone())
    };
    let bounded = caller.bounded_uid().is_some();
    if let Some(dir) = d.watcher.add(&real, opened, owner, bounded)? {
        d.events.emit(
            EventKind::Watcher,
            None,
            dir.display().to_string(),
            "watch added".into(),
        );
    }
    visible(d, caller)
}

/// The watched folders the caller may know of: all to root, the daemon's
/// user and trusted callers; to another uid its own and those whose name it
/// could list anyway (in a folder it may read), as events show it only
/// models of such folders; none to a caller with no uid that is not
/// trusted (plain TCP).
pub(crate) fn visible(d: &Daemon, caller: &Caller) -> Result<Vec<PathBuf>> {
    let dirs = d.watcher.dirs_with_uids();
    if caller.is_self_or_root() || caller.trusted {
        return Ok(dirs.into_iter().map(|(dir, _)| dir).collect());
    }
    let Some(uid) = caller.uid() else {
        return Ok(Vec::new());
    };
    let who = caller.identity()?;
    Ok(dirs
        .into_iter()
        .filter(|(dir, owner)| {
            *owner == Some(uid)
                || dir
                    .parent()
                    .is_some_and(|parent| who.open_dir(parent, access::READ).is_ok())
        })
        .map(|(dir, _)| dir)
        .collect())
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
    visible(d, caller)
}
