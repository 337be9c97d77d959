//! Per-uid shares of what the daemon bounds (connections, event
//! followers), so that no one caller holds every place and starves the
//! others.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Each uid's share of a bounded resource: at most `max` places at once.
/// Only bounded uids take places (`caller::bounded_uid`: trusted ones are
/// not counted).
#[derive(Clone)]
pub(crate) struct Shares {
    max: usize,
    open: Arc<Mutex<HashMap<u32, usize>>>,
}

/// One counted place of a uid; given back when dropped.
pub(crate) struct Share {
    uid: u32,
    open: Arc<Mutex<HashMap<u32, usize>>>,
}

impl Shares {
    pub fn new(max: usize) -> Shares {
        Shares {
            max,
            open: Arc::default(),
        }
    }

    /// One more place for `uid` (`Some(None)`: not counted, `uid` is
    /// `None`), or `None` when the uid holds its whole share.
    pub fn take(&self, uid: Option<u32>) -> Option<Option<Share>> {
        let Some(uid) = uid else {
            return Some(None);
        };
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(uid).or_default();
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Some(Share {
            uid,
            open: self.open.clone(),
        }))
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caller::{bounded_uid, own_uid};

    #[test]
    fn a_uid_holds_at_most_its_share_and_gets_places_back() {
        let shares = Shares::new(2);
        let a1 = shares.take(Some(1000)).unwrap();
        let _a2 = shares.take(Some(1000)).unwrap();
        assert!(shares.take(Some(1000)).is_none(), "a third of uid 1000's");
        // Another uid is not held back by uid 1000's connections.
        let _b = shares.take(Some(1001)).unwrap();
        drop(a1);
        assert!(
            shares.take(Some(1000)).is_some(),
            "a place freed by a close"
        );
    }

    /// The one rule decides who takes places: root, the daemon's user and a
    /// trusted uid never run out; uid 65534 does.
    #[test]
    fn trusted_uids_take_no_places_and_others_do() {
        let trusted = [4242];
        let shares = Shares::new(1);
        for uid in [0, own_uid(), 4242] {
            for _ in 0..5 {
                let place = shares.take(bounded_uid(uid, &trusted));
                assert!(place.is_some_and(|p| p.is_none()), "uid {uid} is counted");
            }
        }
        let _first = shares.take(bounded_uid(65534, &trusted)).unwrap();
        assert!(shares.take(bounded_uid(65534, &trusted)).is_none());
    }
}
