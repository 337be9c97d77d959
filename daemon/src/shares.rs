//! Per-uid shares of what the daemon bounds (connections, event
//! followers), so that no one caller holds every place and starves the
//! others.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Each uid's share of a bounded resource: at most `max` places at once;
/// the uids in `exempt` (trusted ones) are not counted.
#[derive(Clone)]
pub(crate) struct Shares {
    max: usize,
    exempt: Arc<[u32]>,
    open: Arc<Mutex<HashMap<u32, usize>>>,
}

/// One counted place of a uid; given back when dropped.
pub(crate) struct Share {
    uid: u32,
    open: Arc<Mutex<HashMap<u32, usize>>>,
}

impl Shares {
    pub fn new(max: usize, exempt: &[u32]) -> Shares {
        Shares {
            max,
            exempt: exempt.into(),
            open: Arc::default(),
        }
    }

    /// One more place for `uid` (`Some(None)`: not counted), or `None`
    /// when the uid holds its whole share.
    pub fn take(&self, uid: u32) -> Option<Option<Share>> {
        if self.exempt.contains(&uid) {
            return Some(None);
        }
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

    #[test]
    fn a_uid_holds_at_most_its_share_and_gets_places_back() {
        let shares = Shares::new(2, &[7]);
        let a1 = shares.take(1000).unwrap();
        let _a2 = shares.take(1000).unwrap();
        assert!(shares.take(1000).is_none(), "a third of uid 1000's");
        // Another uid is not held back by uid 1000's connections.
        let _b = shares.take(1001).unwrap();
        // A trusted uid is not counted.
        for _ in 0..5 {
            assert!(shares.take(7).unwrap().is_none());
        }
        drop(a1);
        assert!(shares.take(1000).is_some(), "a place freed by a close");
    }
}
