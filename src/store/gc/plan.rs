//! The plan of a collection: a pure function of a [`Snapshot`] and the
//! policy, so that a dry run reports exactly what a real run on the same
//! state does. Entries go in this order: missing payloads, idle ones, a
//! uid's over its quota, then the store's over its budget (least recently
//! used first); then orphan and stray files and stale temp files.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use super::report::{GcItem, GcPolicy, GcReason, GcTarget};
use crate::store::key::{EntryKey, KeyBytes};

/// One entry as GC sees it.
#[derive(Debug, Clone)]
pub(crate) struct Cand {
    pub kb: KeyBytes,
    pub blob: [u8; 32],
    pub len: u64,
    pub last_ms: u64,
    pub created_ms: u64,
    /// The uid a per-uid quota charges it to.
    pub requested_by: Option<u32>,
}

/// Everything a plan is computed from.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// In key order.
    pub cands: Vec<Cand>,
    pub leased: HashSet<KeyBytes>,
    /// Payload files present (None when orphans are not collected).
    pub files: Option<HashSet<[u8; 32]>>,
    /// Unreferenced payload files and their sizes.
    pub orphan_files: Vec<(PathBuf, u64)>,
    pub stray_files: Vec<(PathBuf, u64)>,
    pub temps: Vec<(PathBuf, u64)>,
}

/// The plan: items (with bytes freed as planned) and the byte totals.
pub(crate) fn plan(s: &Snapshot, p: &GcPolicy, now_ms: u64) -> (Vec<GcItem>, u64, u64, u64) {
    let mut plan = Planner::new(s);
    let before = plan.total;
    if let Some(max_age) = p.max_age {
        plan.idle(max_age, now_ms);
    }
    if let Some(quota) = p.max_bytes_per_uid {
        // Over a uid's quota before over the store's budget: that uid's
        // least recently used go first.
        plan.over_quota(quota);
    }
    if let Some(max) = p.max_bytes {
        let lru = plan.lru(|_| true);
        plan.evict(lru, &GcReason::OverBudget, None, max);
    }
    if p.orphans {
        plan.files(&s.orphan_files, GcReason::OrphanPayload);
        plan.files(&s.stray_files, GcReason::StrayFile);
    }
    if p.temp_files {
        plan.files(&s.temps, GcReason::StaleTemp);
    }
    (plan.items, before, plan.total, plan.leased_kept)
}

/// The plan's item removing candidate `c`.
fn entry_item(c: &Cand, reason: GcReason, bytes_freed: u64) -> GcItem {
    GcItem {
        target: GcTarget::Entry(EntryKey::from_bytes(&c.kb).expect("own key")),
        reason,
        bytes_freed,
        bytes_still_linked: 0,
        about: None,
    }
}

/// A plan in progress: the removals so far, and what the payload files
/// still referenced hold.
struct Planner<'s> {
    s: &'s Snapshot,
    /// Per payload file: the entries not removed that reference it, and
    /// its length.
    refs: HashMap<[u8; 32], (u32, u64)>,
    /// Bytes of the payload files still referenced.
    total: u64,
    items: Vec<GcItem>,
    gone: HashSet<KeyBytes>,
    leased_kept: u64,
    /// Payload files a leased entry references.
    pinned: HashSet<[u8; 32]>,
}

impl<'s> Planner<'s> {
    /// Counts the references of every payload file, after planning the
    /// removal of the entries whose file is missing (not leased ones).
    fn new(s: &'s Snapshot) -> Self {
        let mut plan = Planner {
            s,
            refs: HashMap::new(),
            total: 0,
            items: Vec::new(),
            gone: HashSet::new(),
            leased_kept: 0,
            pinned: s
                .cands
                .iter()
                .filter(|c| s.leased.contains(&c.kb))
                .map(|c| c.blob)
                .collect(),
        };
        for c in &s.cands {
            let missing = s.files.as_ref().is_some_and(|f| !f.contains(&c.blob));
            if missing {
                if s.leased.contains(&c.kb) {
                    plan.leased_kept += 1;
                } else {
                    plan.items.push(entry_item(c, GcReason::MissingPayload, 0));
                    plan.gone.insert(c.kb);
                }
                continue;
            }
            let r = plan.refs.entry(c.blob).or_insert((0, c.len));
            r.0 += 1;
        }
        // Lengths come from records: a corrupt one must not wrap the totals.
        plan.total = plan
            .refs
            .values()
            .fold(0u64, |sum, r| sum.saturating_add(r.1));
        plan
    }

    /// Removes every entry not leased that has not been used for
    /// `max_age` or longer.
    fn idle(&mut self, max_age: Duration, now_ms: u64) {
        let max_ms = max_age.as_millis() as u64;
        for c in &self.s.cands {
            let idle = now_ms.saturating_sub(c.last_ms);
            if self.gone.contains(&c.kb) || idle < max_ms {
                continue;
            }
            if self.s.leased.contains(&c.kb) {
                self.leased_kept += 1;
                continue;
            }
            let freed = self.release(&c.blob);
            self.items.push(entry_item(
                c,
                GcReason::MaxAge {
                    idle: Duration::from_millis(idle),
                },
                freed,
            ));
            self.gone.insert(c.kb);
        }
    }

    /// Removes, for each uid whose entries hold more than `quota` bytes,
    /// its least recently used until they hold at most that.
    fn over_quota(&mut self, quota: u64) {
        let mut held: BTreeMap<u32, u64> = BTreeMap::new();
        for c in self.s.cands.iter().filter(|c| !self.gone.contains(&c.kb)) {
            if let Some(uid) = c.requested_by {
                let h = held.entry(uid).or_default();
                *h = h.saturating_add(c.len);
            }
        }
        for (uid, bytes) in held.into_iter().filter(|(_, b)| *b > quota) {
            let lru = self.lru(|c| c.requested_by == Some(uid));
            self.evict(lru, &GcReason::OverQuota { uid }, Some(bytes), quota);
        }
    }

    /// The candidates `keep` selects not removed yet, least recently used
    /// first.
    fn lru(&self, keep: impl Fn(&Cand) -> bool) -> Vec<&'s Cand> {
        let s: &'s Snapshot = self.s;
        let mut lru: Vec<&'s Cand> = s
            .cands
            .iter()
            .filter(|c| !self.gone.contains(&c.kb) && keep(c))
            .collect();
        lru.sort_by_key(|c| (c.last_ms, c.created_ms, c.kb));
        lru
    }

    /// Removes from `lru` in order while the bytes held exceed `limit`:
    /// `held` counted down by each entry's length, or (`None`) the store's
    /// total of payload files. A leased entry stays, and so does one whose
    /// file a leased entry shares (removing it would free nothing).
    fn evict(&mut self, lru: Vec<&Cand>, reason: &GcReason, mut held: Option<u64>, limit: u64) {
        for c in lru {
            if held.unwrap_or(self.total) <= limit {
                break;
            }
            if self.s.leased.contains(&c.kb) {
                self.leased_kept += 1;
                continue;
            }
            if self.pinned.contains(&c.blob) {
                continue;
            }
            let freed = self.release(&c.blob);
            if let Some(h) = held.as_mut() {
                *h = h.saturating_sub(c.len);
            }
            self.items.push(entry_item(c, reason.clone(), freed));
            self.gone.insert(c.kb);
        }
    }

    /// Drops one reference to `blob`; returns the bytes freed when it was
    /// the last.
    fn release(&mut self, blob: &[u8; 32]) -> u64 {
        let r = self.refs.get_mut(blob).expect("counted");
        r.0 -= 1;
        if r.0 == 0 {
            self.total = self.total.saturating_sub(r.1);
            r.1
        } else {
            0
        }
    }

    /// Removes each of `files` (with no entry) for `reason`.
    fn files(&mut self, files: &[(PathBuf, u64)], reason: GcReason) {
        self.items.extend(files.iter().map(|(path, len)| GcItem {
            target: GcTarget::File(path.clone()),
            reason: reason.clone(),
            bytes_freed: *len,
            bytes_still_linked: 0,
            about: None,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(n: u8, blob: u8, len: u64, last: u64) -> Cand {
        let mut kb = [0u8; crate::store::KEY_LEN];
        kb[0] = 1;
        kb[1] = n;
        Cand {
            kb,
            blob: [blob; 32],
            len,
            last_ms: last,
            created_ms: 0,
            requested_by: None,
        }
    }

    fn keys(items: &[GcItem]) -> Vec<u8> {
        items
            .iter()
            .map(|i| match &i.target {
                GcTarget::Entry(k) => k.source.bytes[0],
                GcTarget::File(_) => 0,
            })
            .collect()
    }

    #[test]
    fn budget_removes_least_recently_used_and_skips_leased() {
        let mut s = Snapshot {
            cands: vec![
                cand(1, 1, 100, 50),
                cand(2, 2, 100, 10),
                cand(3, 3, 100, 30),
                cand(4, 4, 100, 20),
            ],
            ..Default::default()
        };
        s.leased.insert(s.cands[1].kb);
        let p = GcPolicy {
            max_bytes: Some(200),
            ..Default::default()
        };
        let (items, before, after, kept) = plan(&s, &p, 100);
        assert_eq!(keys(&items), vec![4, 3]);
        assert_eq!((before, after, kept), (400, 200, 1));
        assert!(items.iter().all(|i| i.bytes_freed == 100));
    }

    #[test]
    fn a_uid_over_its_quota_loses_its_least_recently_used_first() {
        let of = |uid, c: Cand| Cand {
            requested_by: Some(uid),
            ..c
        };
        // Entry 1 (nobody's) is the oldest, yet uid 7's go first: 7 holds
        // 400 with a quota of 150, so its three least recently used not
        // leased go (5 is leased and stays); uid 8 is under its quota.
        let mut s = Snapshot {
            cands: vec![
                cand(1, 1, 100, 1),
                of(7, cand(2, 2, 100, 50)),
                of(7, cand(3, 3, 100, 20)),
                of(7, cand(4, 4, 100, 30)),
                of(7, cand(5, 5, 100, 10)),
                of(8, cand(6, 6, 100, 5)),
            ],
            ..Default::default()
        };
        s.leased.insert(s.cands[4].kb);
        let p = GcPolicy {
            max_bytes_per_uid: Some(150),
            ..Default::default()
        };
        let (items, before, after, kept) = plan(&s, &p, 100);
        assert_eq!(keys(&items), vec![3, 4, 2]);
        assert!(items
            .iter()
            .all(|i| i.reason == GcReason::OverQuota { uid: 7 }));
        assert_eq!((before, after, kept), (600, 300, 1));

        // With a size budget too, the budget takes the rest by age.
        let p = GcPolicy {
            max_bytes: Some(200),
            ..p
        };
        let (items, _, after, _) = plan(&s, &p, 100);
        assert_eq!(keys(&items), vec![3, 4, 2, 1]);
        assert_eq!(items[3].reason, GcReason::OverBudget);
        assert_eq!(after, 200);
    }

    #[test]
    fn shared_payload_frees_bytes_with_its_last_entry() {
        let s = Snapshot {
            cands: vec![cand(1, 9, 100, 1), cand(2, 9, 100, 2), cand(3, 3, 100, 3)],
            ..Default::default()
        };
        let p = GcPolicy {
            max_bytes: Some(100),
            ..Default::default()
        };
        let (items, before, after, _) = plan(&s, &p, 10);
        assert_eq!(keys(&items), vec![1, 2]);
        assert_eq!(
            items.iter().map(|i| i.bytes_freed).collect::<Vec<_>>(),
            vec![0, 100]
        );
        assert_eq!((before, after), (200, 100));
    }

    #[test]
    fn a_zero_age_takes_every_entry_like_a_zero_budget() {
        let s = Snapshot {
            cands: vec![cand(1, 1, 10, 100), cand(2, 2, 10, 40)],
            ..Default::default()
        };
        let age = GcPolicy {
            max_age: Some(Duration::ZERO),
            ..Default::default()
        };
        let size = GcPolicy {
            max_bytes: Some(0),
            ..Default::default()
        };
        // Entry 1 was used at this very millisecond: still idle "0 or longer".
        let (by_age, ..) = plan(&s, &age, 100);
        let (by_size, ..) = plan(&s, &size, 100);
        let mut a = keys(&by_age);
        let mut b = keys(&by_size);
        a.sort();
        b.sort();
        assert_eq!((a, b), (vec![1, 2], vec![1, 2]));
    }

    #[test]
    fn age_and_missing_payloads() {
        let mut s = Snapshot {
            cands: vec![cand(1, 1, 10, 0), cand(2, 2, 10, 95), cand(3, 3, 10, 0)],
            ..Default::default()
        };
        s.files = Some([[1u8; 32], [2u8; 32]].into_iter().collect());
        let p = GcPolicy {
            max_age: Some(Duration::from_millis(50)),
            ..Default::default()
        };
        let (items, ..) = plan(&s, &p, 100);
        assert_eq!(keys(&items), vec![3, 1]);
        assert_eq!(items[0].reason, GcReason::MissingPayload);
        assert_eq!(
            items[1].reason,
            GcReason::MaxAge {
                idle: Duration::from_millis(100)
            }
        );
    }
}
