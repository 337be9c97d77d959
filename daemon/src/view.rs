//! What a caller may see when it enumerates the cache (List, gc reports,
//! Events, Status). A source digest is a capability: looking an entry up
//! by digest stays open to every peer, since knowing a 256-bit digest means
//! having had the weights. Enumeration is not: it shows a caller only the
//! entries of models it may read (or entries it put itself), with only the
//! model paths it may read, and never a digest of another's model. Trusted
//! callers see everything. "May read" is judged by opening the model with
//! the caller's rights, once per path for the view's life.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ctcache::access::Identity;
use ctcache::store::Entry;

use crate::caller::Caller;
use crate::events::Event;

/// Paths remembered per view before the memory starts over.
const MEMORY: usize = 4096;

/// One caller's view of the cache.
#[derive(Clone)]
pub(crate) struct View {
    who: Seer,
    /// Path -> whether the caller may read it.
    judged: Arc<Mutex<HashMap<PathBuf, bool>>>,
}

#[derive(Clone)]
enum Seer {
    /// A trusted caller: sees everything.
    All,
    /// A peer with a uid: sees what it may read and what it put.
    Peer(Arc<Identity>),
    /// A TCP peer without a uid: sees no model and no entry.
    Nobody,
}

impl View {
    /// The view of `caller`.
    pub fn of(caller: &Caller) -> View {
        let who = match (&caller.identity, caller.trusted) {
            (_, true) => Seer::All,
            (Some(who), false) => Seer::Peer(Arc::new(who.clone())),
            (None, false) => Seer::Nobody,
        };
        View {
            who,
            judged: Arc::default(),
        }
    }

    /// Whether this view sees everything (no filtering needed).
    pub fn sees_all(&self) -> bool {
        matches!(self.who, Seer::All)
    }

    /// Whether the caller may read the model at `path` (file system calls:
    /// run it where blocking is fine).
    pub fn sees_path(&self, path: &str) -> bool {
        let who = match &self.who {
            Seer::All => return true,
            Seer::Nobody => return false,
            Seer::Peer(who) => who,
        };
        let path = Path::new(path);
        if !path.is_absolute() {
            return false;
        }
        if let Some(&seen) = self.memory().get(path) {
            return seen;
        }
        let seen = who.open_read(path).is_ok();
        let mut memory = self.memory();
        if memory.len() >= MEMORY {
            memory.clear();
        }
        memory.insert(path.to_path_buf(), seen);
        seen
    }

    /// `e` as this view shows it: with only the model paths the caller may
    /// read, or `None` when the caller may see none of them and did not put
    /// it.
    pub fn entry(&self, mut e: Entry) -> Option<Entry> {
        if self.sees_all() {
            return Some(e);
        }
        if !self.sees_entry_of(&e.model_paths, e.producer.client_uid) {
            return None;
        }
        e.model_paths.retain(|p| self.sees_path(p));
        Some(e)
    }

    /// `e` as this view shows it, `None` when hidden: an event about a
    /// model the caller may not read, or about an entry or job that names
    /// no model (a job's event names the model it packs).
    pub fn event(&self, mut e: Event) -> Option<Event> {
        if self.sees_all() {
            return Some(e);
        }
        if e.model_path.is_empty() {
            if e.key.is_some() || e.progress.is_some() {
                return None;
            }
        } else if !self.sees_path(&e.model_path) {
            return None;
        }
        if let Some(p) = &mut e.progress {
            if let Some(entry) = p.entry.take() {
                p.entry = Some(self.entry(entry)?);
            }
        }
        Some(e)
    }

    /// Whether the caller sees an entry packed from `model_paths` and put
    /// by `client_uid`.
    pub fn sees_entry_of(&self, model_paths: &[String], client_uid: Option<u32>) -> bool {
        match &self.who {
            Seer::All => true,
            Seer::Nobody => false,
            Seer::Peer(who) => {
                client_uid == Some(who.uid) || model_paths.iter().any(|p| self.sees_path(p))
            }
        }
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, bool>> {
        self.judged.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caller::Transport;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_peer_sees_the_models_it_may_read_once_judged() {
        if !ctcache::access::creds::can_switch() {
            eprintln!("skipped: needs root to judge as another user");
            return;
        }
        let top = tempfile::tempdir().unwrap();
        let mode = |p: &Path, m| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
        mode(top.path(), 0o755).unwrap();
        let (open, private) = (
            top.path().join("open.onnx"),
            top.path().join("private.onnx"),
        );
        std::fs::write(&open, b"m").unwrap();
        std::fs::write(&private, b"m").unwrap();
        mode(&open, 0o644).unwrap();
        mode(&private, 0o600).unwrap();
        let nobody = Identity {
            uid: 65534,
            gid: 65534,
            groups: vec![],
        };
        let peer = View::of(&Caller::new(Some(nobody), None, Transport::Unix, &[]));
        let s = |p: &Path| p.display().to_string();
        assert!(peer.sees_path(&s(&open)));
        assert!(!peer.sees_path(&s(&private)));
        assert!(!peer.sees_path("relative.onnx"));
        assert!(peer.sees_entry_of(&[s(&private), s(&open)], None));
        assert!(!peer.sees_entry_of(&[s(&private)], None));
        assert!(
            peer.sees_entry_of(&[s(&private)], Some(65534)),
            "its own put"
        );
        // Judged once: a later change is not looked at again.
        mode(&private, 0o644).unwrap();
        assert!(!peer.sees_path(&s(&private)));
        let tcp = View::of(&Caller::new(
            None,
            None,
            Transport::Tcp {
                verified_client: false,
            },
            &[],
        ));
        assert!(!tcp.sees_path(&s(&open)));
        let root = View::of(&Caller::new(
            Some(Identity {
                uid: 0,
                gid: 0,
                groups: vec![],
            }),
            None,
            Transport::Unix,
            &[],
        ));
        assert!(root.sees_all() && root.sees_path(&s(&private)));
    }
}
