//! The paths the watcher saw change, gathered for the scan loop. A set, not
//! a queue: a user renaming two names back and forth as fast as it can
//! costs two entries, however many events it makes. Bounded: past
//! [`MAX_PENDING`] paths (or when the kernel's own event queue overflowed)
//! the paths are dropped and every watched folder is scanned instead.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The most changed paths held at once.
pub(crate) const MAX_PENDING: usize = 16 * 1024;

#[derive(Default)]
struct Pending {
    paths: HashSet<PathBuf>,
    /// Paths were dropped: scan every watched folder.
    rescan: bool,
    /// The watcher stopped: the scan loop ends.
    closed: bool,
}

impl Pending {
    /// Changes were lost: the paths give way to a scan of every folder.
    fn lost(&mut self) {
        self.paths.clear();
        self.rescan = true;
    }
}

/// What changed since the last [`Changes::take`].
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Changed {
    pub paths: Vec<PathBuf>,
    /// Scan every watched folder (changes were too many to name).
    pub rescan: bool,
}

/// Changed paths shared between the notify thread and the scan loop.
#[derive(Default)]
pub(crate) struct Changes {
    pending: Mutex<Pending>,
    ready: Condvar,
}

impl Changes {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes that `path` changed (or a folder to scan as a whole).
    pub fn note(&self, path: PathBuf) {
        let mut p = self.lock();
        if p.paths.len() < MAX_PENDING || p.paths.contains(&path) {
            p.paths.insert(path);
        } else {
            p.lost();
        }
        self.ready.notify_one();
    }

    /// Notes that changes were lost: every watched folder is scanned.
    pub fn rescan(&self) {
        self.lock().lost();
        self.ready.notify_one();
    }

    /// Ends the scan loop's waits for good.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    /// Waits until something changed (without end for `None`), then takes
    /// what has; `None` once closed. What is taken may be empty (the wait
    /// timed out).
    pub fn take(&self, wait: Option<Duration>) -> Option<Changed> {
        let deadline = wait.map(|w| Instant::now() + w);
        let mut p = self.lock();
        while !p.closed && p.paths.is_empty() && !p.rescan {
            p = match deadline {
                None => self.ready.wait(p).unwrap_or_else(|e| e.into_inner()),
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    let (p, _) = self
                        .ready
                        .wait_timeout(p, left)
                        .unwrap_or_else(|e| e.into_inner());
                    p
                }
            };
        }
        if p.closed {
            return None;
        }
        Some(Changed {
            paths: p.paths.drain().collect(),
            rescan: std::mem::take(&mut p.rescan),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_path_changed_many_times_is_held_once() {
        let c = Changes::default();
        for _ in 0..100_000 {
            c.note(PathBuf::from("/m/a"));
            c.note(PathBuf::from("/m/b"));
        }
        let mut got = c.take(Some(Duration::ZERO)).unwrap();
        got.paths.sort();
        assert_eq!(
            got.paths,
            vec![PathBuf::from("/m/a"), PathBuf::from("/m/b")]
        );
        assert!(!got.rescan);
        assert_eq!(c.take(Some(Duration::ZERO)), Some(Changed::default()));
    }

    #[test]
    fn too_many_paths_become_one_rescan() {
        let c = Changes::default();
        for i in 0..=MAX_PENDING {
            c.note(PathBuf::from(format!("/m/{i}")));
        }
        let got = c.take(None).unwrap();
        assert!(got.rescan && got.paths.is_empty(), "{}", got.paths.len());
    }

    #[test]
    fn a_waiting_take_wakes_on_a_change_and_ends_on_close() {
        let c = std::sync::Arc::new(Changes::default());
        let waiter = {
            let c = c.clone();
            std::thread::spawn(move || c.take(None))
        };
        c.note(PathBuf::from("/m/a"));
        let got = waiter.join().unwrap().unwrap();
        assert_eq!(got.paths, vec![PathBuf::from("/m/a")]);
        let waiter = {
            let c = c.clone();
            std::thread::spawn(move || c.take(None))
        };
        c.close();
        assert_eq!(waiter.join().unwrap(), None);
    }
}
