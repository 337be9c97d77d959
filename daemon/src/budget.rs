//! Per-uid hourly budgets as leaky buckets: each uid's bucket drains at the
//! hour's rate, so a uid may spend at most the budget in any hour. The
//! hashing budget charges in full before the work; the CPU budget admits
//! while the bucket has room and adds what the work used after.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Uids kept before the drained ones are forgotten.
const KEPT_UIDS: usize = 4096;

/// One uid's spending, as it stood at `at`.
#[derive(Debug, Clone, Copy)]
struct Spent {
    amount: f64,
    at: Instant,
}

/// The buckets of every uid for one budget of `per_hour` units.
pub(crate) struct Hourly {
    per_hour: u64,
    spent: Mutex<HashMap<u32, Spent>>,
}

impl Hourly {
    pub fn new(per_hour: u64) -> Hourly {
        Hourly {
            per_hour,
            spent: Mutex::new(HashMap::new()),
        }
    }

    pub fn per_hour(&self) -> u64 {
        self.per_hour
    }

    /// Units drained per second.
    fn rate(&self) -> f64 {
        self.per_hour as f64 / 3600.0
    }

    /// What `s` has drained to at `now`.
    fn drained(&self, s: Spent, now: Instant) -> f64 {
        let gone = now.saturating_duration_since(s.at).as_secs_f64() * self.rate();
        (s.amount - gone).max(0.0)
    }

    /// How long until `over` units have drained.
    fn wait(&self, over: f64) -> Duration {
        Duration::from_secs_f64(over / self.rate().max(f64::MIN_POSITIVE))
    }

    /// Adds `amount` to `uid`'s bucket when it then holds at most the
    /// hour's budget; else nothing is added, and the answer is how long
    /// until it would fit (`None`: never, being more than the whole hour).
    pub fn charge_at(&self, uid: u32, amount: u64, now: Instant) -> Result<(), Option<Duration>> {
        if amount > self.per_hour {
            return Err(None);
        }
        let mut spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
        let after = spent.get(&uid).map_or(0.0, |s| self.drained(*s, now)) + amount as f64;
        let over = after - self.per_hour as f64;
        if over > 0.0 {
            return Err(Some(self.wait(over)));
        }
        self.keep(&mut spent, uid, after, now);
        Ok(())
    }

    /// Whether `uid`'s bucket has room left; else how long until it has.
    pub fn room_at(&self, uid: u32, now: Instant) -> Result<(), Duration> {
        let spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
        let level = spent.get(&uid).map_or(0.0, |s| self.drained(*s, now));
        let over = level - self.per_hour as f64;
        match over >= 0.0 {
            true => Err(self.wait(over).max(Duration::from_secs(1))),
            false => Ok(()),
        }
    }

    /// Adds `amount` (work already done) to `uid`'s bucket, room or not.
    pub fn spend_at(&self, uid: u32, amount: u64, now: Instant) {
        let mut spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
        let after = spent.get(&uid).map_or(0.0, |s| self.drained(*s, now)) + amount as f64;
        self.keep(&mut spent, uid, after, now);
    }

    fn keep(&self, spent: &mut HashMap<u32, Spent>, uid: u32, amount: f64, now: Instant) {
        if spent.len() >= KEPT_UIDS && !spent.contains_key(&uid) {
            spent.retain(|_, s| self.drained(*s, now) > 0.0);
        }
        spent.insert(uid, Spent { amount, at: now });
    }

    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.spent.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3600 << 20;

    #[test]
    fn drained_uids_are_forgotten_when_many_are_kept() {
        let b = Hourly::new(HOUR);
        let t0 = Instant::now();
        for uid in 0..KEPT_UIDS as u32 {
            b.charge_at(uid, 1 << 20, t0).unwrap();
        }
        b.charge_at(99_999, 1, t0 + Duration::from_secs(2)).unwrap();
        assert_eq!(b.kept(), 1);
    }

    #[test]
    fn work_done_is_added_and_room_comes_back_as_it_drains() {
        let b = Hourly::new(3600);
        let t0 = Instant::now();
        b.room_at(7, t0).unwrap();
        // One unit drains per second; 3,610 spent leave no room for 10 s.
        b.spend_at(7, 3610, t0);
        assert_eq!(b.room_at(7, t0), Err(Duration::from_secs(10)));
        assert!(b.room_at(7, t0 + Duration::from_secs(11)).is_ok());
        b.room_at(8, t0).expect("another uid has its own hour");
    }
}
