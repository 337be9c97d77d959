//! The watched model folders and the notify watcher over them (symbolic
//! links not followed): changed paths are gathered in [`Changes`], which
//! the watch use case (`ops/scan.rs`) turns into prepacks (it waits for a
//! model to hold still itself, so events are not debounced here). The
//! admin's folders are watched with their subfolders; a user's folder alone
//! (one inotify watch, held as the daemon's user: a user's tree of many
//! folders must not use up those), and a uid adds at most
//! `max_watches_per_uid` folders.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::locks::lock;

use notify::{EventKind as FsEvent, RecommendedWatcher, RecursiveMode, Watcher as _};

use ctcache::access::Identity;

use crate::error::{Error, Result};

mod changes;
pub(crate) use changes::Changes;

/// Who added a watched folder, and so with whose rights what it finds is
/// read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Owner {
    /// The config file, the command line, root or the daemon's own user.
    Admin,
    /// Another caller of AddWatch.
    User(Identity),
}

/// The live notify watcher and the changes it feeds; dropping it closes
/// them.
struct Live {
    notify: RecommendedWatcher,
    changes: Arc<Changes>,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.changes.close();
    }
}

/// A watched folder: who added it and, for a user's, the folder as it was
/// opened and judged, kept open: the inotify watch is placed on that handle
/// (`/proc/self/fd/N`), never on the path resolved again, and the folder is
/// listed through it.
struct Watched {
    owner: Owner,
    handle: Option<File>,
}

impl Watched {
    /// The path the watch is placed on and the folder listed through.
    fn reach(&self, dir: &Path) -> PathBuf {
        match &self.handle {
            Some(f) => handle_path(f),
            None => dir.to_path_buf(),
        }
    }
}

/// Whether the real path `path` lies under one of the admin's folders in
/// `dirs` (taken by their real paths).
fn admin_holds(dirs: &BTreeMap<PathBuf, Watched>, path: &Path) -> bool {
    dirs.iter().any(|(w, watched)| {
        watched.owner == Owner::Admin && w.canonicalize().is_ok_and(|w| path.starts_with(w))
    })
}

/// `/proc/self/fd/N` of an open folder: resolving it leads to that folder,
/// whatever its path leads to now.
fn handle_path(f: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// The watched folders and, once started, the watcher over them.
pub(crate) struct Watcher {
    dirs: Mutex<BTreeMap<PathBuf, Watched>>,
    /// Handle path of a user's folder -> its real path, to name what its
    /// events report.
    labels: Arc<Mutex<HashMap<PathBuf, PathBuf>>>,
    live: Mutex<Option<Live>>,
    /// Folders one uid may add.
    max_per_uid: usize,
}

/// `path` as reported under a handle path, named under its folder's real
/// path; `None` for a handle path no watch has now.
fn relabel(labels: &HashMap<PathBuf, PathBuf>, path: &Path) -> Option<PathBuf> {
    let mut parts = path.components();
    let handle: PathBuf = parts.by_ref().take(5).collect();
    match labels.get(&handle) {
        Some(real) => Some(real.join(parts.as_path())),
        None if path.starts_with("/proc/self/fd") => None,
        None => Some(path.to_path_buf()),
    }
}

impl Watcher {
    /// The configured folders, not watched until [`Watcher::start`]; a uid
    /// may add at most `max_per_uid` more.
    pub fn new(config_dirs: &[PathBuf], max_per_uid: usize) -> Watcher {
        Watcher {
            dirs: Mutex::new(
                config_dirs
                    .iter()
                    .map(|d| {
                        let admin = Watched {
                            owner: Owner::Admin,
                            handle: None,
                        };
                        (d.clone(), admin)
                    })
                    .collect(),
            ),
            labels: Arc::default(),
            live: Mutex::new(None),
            max_per_uid,
        }
    }

    /// Starts watching every folder known so far; changed paths (and each
    /// folder itself, to scan what is already there) go to `changes`. The
    /// notify thread only notes paths: an event storm costs it a set
    /// insert each, and holds up no AddWatch.
    pub fn start(&self, changes: Arc<Changes>) -> Result<()> {
        let noted = changes.clone();
        let labels = self.labels.clone();
        let config = notify::Config::default().with_follow_symlinks(false);
        let handler = move |res: notify::Result<notify::Event>| match res {
            Ok(e) if e.need_rescan() => noted.rescan(),
            Ok(e) if matches!(e.kind, FsEvent::Access(_)) => {}
            Ok(e) => {
                metrics::counter!("ctcache_watcher_events_total").increment(1);
                let labels = lock(&labels);
                for p in &e.paths {
                    // A handle path with no label is of a watch removed
                    // meanwhile (the fd may be another file's now).
                    if let Some(p) = relabel(&labels, p) {
                        noted.note(p);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "watcher error"),
        };
        let notify = RecommendedWatcher::new(handler, config)
            .map_err(|e| Error::internal(format!("cannot start the watcher: {e}")))?;
        {
            let mut live = lock(&self.live);
            if live.is_some() {
                return Err(Error::internal("the watcher is already running"));
            }
            *live = Some(Live { notify, changes });
        }
        let known: Vec<(PathBuf, Owner, PathBuf)> = lock(&self.dirs)
            .iter()
            .map(|(d, w)| (d.clone(), w.owner.clone(), w.reach(d)))
            .collect();
        for (dir, owner, reach) in known {
            if let Err(e) = self.watch(&dir, &owner, &reach) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch");
            }
        }
        Ok(())
    }

    /// Stops watching; the queue closes.
    pub fn stop(&self) {
        lock(&self.live).take();
    }

    /// Whether it watches (started and not stopped).
    pub fn is_running(&self) -> bool {
        lock(&self.live).is_some()
    }

    /// Watches `dir` at `reach` (its handle path for a user's folder).
    fn watch(&self, dir: &Path, owner: &Owner, reach: &Path) -> Result<()> {
        let mut live = lock(&self.live);
        let w = live
            .as_mut()
            .ok_or_else(|| Error::precondition("the watcher is not running"))?;
        let mode = match owner {
            Owner::Admin => RecursiveMode::Recursive,
            Owner::User(_) => RecursiveMode::NonRecursive,
        };
        if reach != dir {
            lock(&self.labels).insert(reach.to_path_buf(), dir.to_path_buf());
        }
        if let Err(e) = w.notify.watch(reach, mode) {
            // A recursive watch may have been placed on part of the tree.
            let _ = w.notify.unwatch(reach);
            return Err(Error::invalid(format!(
                "cannot watch {}: {e}",
                dir.display()
            )));
        }
        // Existing models are scanned too (start-up and new watches).
        w.changes.note(dir.to_path_buf());
        Ok(())
    }

    /// The watched folders with the uid of a user who added each (`None`:
    /// the admin's).
    pub fn dirs_with_uids(&self) -> Vec<(PathBuf, Option<u32>)> {
        lock(&self.dirs)
            .iter()
            .map(|(d, w)| {
                let uid = match &w.owner {
                    Owner::User(who) => Some(who.uid),
                    Owner::Admin => None,
                };
                (d.clone(), uid)
            })
            .collect()
    }

    /// Whether the real path `path` lies under a folder the admin watches.
    pub fn admin_covers(&self, path: &Path) -> bool {
        admin_holds(&lock(&self.dirs), path)
    }

    /// The owner of the watched folder a reported path was found under:
    /// the admin whenever one of the admin's folders holds it (a user's
    /// watch inside the admin's tree does not take the admin's models over),
    /// else the user of the most specific folder; `None` when no watched
    /// folder holds it.
    pub fn owner_of(&self, path: &Path) -> Option<Owner> {
        lock(&self.dirs)
            .iter()
            .filter(|(w, _)| path.starts_with(w))
            .max_by_key(|(w, watched)| (watched.owner == Owner::Admin, w.as_os_str().len()))
            .map(|(_, watched)| watched.owner.clone())
    }

    /// Where to list and read the watched folder `dir`: through its handle
    /// for a user's folder (the folder that was judged, whatever `dir` leads
    /// to now), `dir` itself for the admin's; `None` for a folder that is
    /// not a watched one (a subfolder of a user's is not read).
    pub fn listing_path(&self, dir: &Path) -> Option<PathBuf> {
        let dirs = lock(&self.dirs);
        if let Some(w) = dirs.get(dir) {
            return Some(w.reach(dir));
        }
        dirs.iter()
            .any(|(w, watched)| watched.owner == Owner::Admin && dir.starts_with(w))
            .then(|| dir.to_path_buf())
    }

    /// The open handle of the user's watched folder `dir` (the folder that
    /// was judged); `None` for any other folder.
    pub fn held_folder(&self, dir: &Path) -> Option<File> {
        lock(&self.dirs)
            .get(dir)
            .and_then(|w| w.handle.as_ref())
            .and_then(|f| f.try_clone().ok())
    }

    /// Adds the folder `opened`, found at its real path `dir`; returns
    /// `dir`, or `None` when it was watched already. RESOURCE_EXHAUSTED when
    /// a `bounded` uid owner has `max_watches_per_uid` folders already. A
    /// user's folder is watched through `opened`, kept open while it is
    /// watched.
    pub fn add(
        &self,
        dir: &Path,
        opened: File,
        owner: Owner,
        bounded: bool,
    ) -> Result<Option<PathBuf>> {
        let dir = dir.to_path_buf();
        // Held until the folder is watched or taken back, so that a
        // concurrent add of the same folder is told "watched already" only
        // once it is.
        let mut dirs = lock(&self.dirs);
        if dirs.contains_key(&dir) {
            return Ok(None);
        }
        // A user's folder inside the admin's tree is watched already (and a
        // second inotify watch of the same folder would share the admin's
        // and take its recursion over).
        if matches!(owner, Owner::User(_)) && admin_holds(&dirs, &dir) {
            return Ok(None);
        }
        if let (Owner::User(who), true) = (&owner, bounded) {
            let uid = who.uid;
            let held = dirs
                .values()
                .filter(|w| matches!(&w.owner, Owner::User(o) if o.uid == uid))
                .count();
            if held >= self.max_per_uid {
                return Err(Error::exhausted(format!(
                    "uid {uid} watches {} folders, the most allowed (max_watches_per_uid); remove one first",
                    self.max_per_uid
                )));
            }
        }
        let handle = matches!(owner, Owner::User(_)).then_some(opened);
        let watched = Watched {
            owner: owner.clone(),
            handle,
        };
        let reach = watched.reach(&dir);
        if let Err(e) = self.watch(&dir, &owner, &reach) {
            lock(&self.labels).remove(&reach);
            return Err(e);
        }
        dirs.insert(dir.clone(), watched);
        Ok(Some(dir))
    }

    /// Removes a folder; returns the path it was watched under. A folder
    /// not watched is NOT_FOUND.
    pub fn remove(&self, dir: &Path) -> Result<PathBuf> {
        let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        let key = if lock(&self.dirs).contains_key(&canonical) {
            canonical
        } else {
            dir.to_path_buf()
        };
        if !self.forget(&key) {
            return Err(Error::not_found(format!(
                "{} is not watched",
                dir.display()
            )));
        }
        Ok(key)
    }

    /// Stops watching exactly the folder `key`; whether it was watched.
    fn forget(&self, key: &Path) -> bool {
        let Some(watched) = lock(&self.dirs).remove(key) else {
            return false;
        };
        let reach = watched.reach(key);
        if let Some(w) = lock(&self.live).as_mut() {
            let _ = w.notify.unwatch(&reach);
        }
        lock(&self.labels).remove(&reach);
        // The handle closes only now, after its watch is gone.
        drop(watched);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two adds of one folder at once: neither is told "watched already"
    /// unless the folder is watched (here it cannot be: the watcher is not
    /// running, so every add fails).
    #[test]
    fn a_concurrent_add_is_not_told_of_a_watch_that_failed() {
        let dir = tempfile::tempdir().unwrap();
        let w = Watcher::new(&[], 16);
        for _ in 0..500 {
            let both = std::sync::Barrier::new(2);
            let answers: Vec<Result<Option<PathBuf>>> = std::thread::scope(|s| {
                let add = || {
                    both.wait();
                    w.add(
                        dir.path(),
                        File::open(dir.path()).unwrap(),
                        Owner::Admin,
                        false,
                    )
                };
                let a = s.spawn(add);
                let b = s.spawn(add);
                vec![a.join().unwrap(), b.join().unwrap()]
            });
            for a in answers {
                assert!(a.is_err(), "{a:?}");
            }
            assert!(w.dirs_with_uids().is_empty());
        }
    }

    /// A user's folder inside the admin's tree is the admin's already: it
    /// is answered "watched already" and gets no watch of its own (one would
    /// share the admin's inotify watch and take its recursion over).
    #[test]
    fn a_users_folder_in_the_admins_tree_is_watched_already() {
        let admin = tempfile::tempdir().unwrap();
        let inside = admin.path().join("sub");
        std::fs::create_dir(&inside).unwrap();
        let w = Watcher::new(&[admin.path().to_path_buf()], 16);
        let user = Owner::User(Identity {
            uid: 65534,
            gid: 65534,
            groups: Vec::new(),
        });
        let inside = inside.canonicalize().unwrap();
        let added = w.add(&inside, File::open(&inside).unwrap(), user, true);
        assert!(matches!(added, Ok(None)), "{added:?}");
        assert_eq!(w.dirs_with_uids(), vec![(admin.path().to_path_buf(), None)]);
        assert!(w.listing_path(&inside).is_some());
        // Outside the admin's tree an add is tried (and fails here: the
        // watcher is not running).
        let outside = tempfile::tempdir().unwrap();
        let user = Owner::User(Identity {
            uid: 65534,
            gid: 65534,
            groups: Vec::new(),
        });
        assert!(w
            .add(
                outside.path(),
                File::open(outside.path()).unwrap(),
                user,
                true
            )
            .is_err());
        assert!(w.listing_path(outside.path()).is_none());
    }

    /// Where the admin's folder holds a user's (the admin's added later),
    /// what is found there is the admin's: read with the admin's rights and
    /// queued without the user's bound.
    #[test]
    fn the_admins_folder_takes_precedence_over_a_users_inside_it() {
        let top = tempfile::tempdir().unwrap();
        let top_path = top.path().canonicalize().unwrap();
        let inner = top_path.join("u");
        std::fs::create_dir(&inner).unwrap();
        let w = Watcher::new(&[], 16);
        w.start(Arc::default()).unwrap();
        let user = Owner::User(Identity {
            uid: 65534,
            gid: 65534,
            groups: Vec::new(),
        });
        let model = inner.join("m.onnx");
        w.add(&inner, File::open(&inner).unwrap(), user.clone(), true)
            .unwrap();
        assert_eq!(w.owner_of(&model), Some(user));
        w.add(
            &top_path,
            File::open(&top_path).unwrap(),
            Owner::Admin,
            false,
        )
        .unwrap();
        assert_eq!(w.owner_of(&model), Some(Owner::Admin));
        w.stop();
    }
}
