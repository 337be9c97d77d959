//! How much hashing an untrusted uid may make the daemon do: the declared
//! bytes of the initializers it asks about (a sparse file or a zero-length
//! external file counts at its declared size, since that is what is read),
//! at most `max_hashed_bytes_per_uid_per_hour` in any hour. A leaky bucket:
//! each uid's count drains at the hourly rate, and a request is charged in
//! full before any of its bytes are read, or refused.

use std::time::{Duration, Instant};

use crate::budget::Hourly;

/// A refused charge.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OverBudget {
    pub uid: u32,
    /// What the request declares.
    pub bytes: u64,
    /// The hourly budget.
    pub per_hour: u64,
    /// How long until the request would fit (`None`: it never does, being
    /// larger than the whole budget).
    pub retry_after: Option<Duration>,
}

impl std::fmt::Display for OverBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "uid {} would make the daemon hash {} more bytes, over its max_hashed_bytes_per_uid_per_hour ({})",
            self.uid, self.bytes, self.per_hour
        )?;
        match self.retry_after {
            Some(wait) => write!(f, "; try again in {} s", wait.as_secs().max(1)),
            None => write!(
                f,
                "; the model is larger than the whole budget: an admin can raise it or watch the model's folder"
            ),
        }
    }
}

/// The per-uid hashing budget.
pub(crate) struct HashBudget {
    hourly: Hourly,
}

impl HashBudget {
    pub fn new(per_hour: u64) -> HashBudget {
        HashBudget {
            hourly: Hourly::new(per_hour),
        }
    }

    /// Charges `uid` for hashing `bytes` now, or refuses with nothing charged.
    pub fn charge(&self, uid: u32, bytes: u64) -> Result<(), OverBudget> {
        self.charge_at(uid, bytes, Instant::now())
    }

    fn charge_at(&self, uid: u32, bytes: u64, now: Instant) -> Result<(), OverBudget> {
        self.hourly
            .charge_at(uid, bytes, now)
            .map_err(|retry_after| OverBudget {
                uid,
                bytes,
                per_hour: self.hourly.per_hour(),
                retry_after,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3600 << 20;

    #[test]
    fn a_uid_spends_its_hour_then_waits_for_it_to_drain() {
        let b = HashBudget::new(HOUR);
        let t0 = Instant::now();
        b.charge_at(7, HOUR / 2, t0).unwrap();
        b.charge_at(7, HOUR / 2, t0).unwrap();
        let e = b.charge_at(7, 10 << 20, t0).unwrap_err();
        // 1 MiB drains per second: 10 MiB more fit in 10 s.
        assert_eq!(e.retry_after.unwrap().as_secs(), 10, "{e}");
        assert!(e.to_string().contains("max_hashed_bytes_per_uid_per_hour"));
        // Another uid has its own hour.
        b.charge_at(8, HOUR, t0).unwrap();
        b.charge_at(7, 10 << 20, t0 + Duration::from_secs(10))
            .unwrap();
        assert!(b
            .charge_at(7, 1 << 20, t0 + Duration::from_secs(10))
            .is_err());
    }

    #[test]
    fn a_request_larger_than_the_hour_is_refused_for_good() {
        let b = HashBudget::new(HOUR);
        let e = b.charge_at(7, HOUR + 1, Instant::now()).unwrap_err();
        assert_eq!(e.retry_after, None);
        assert!(
            e.to_string().contains("larger than the whole budget"),
            "{e}"
        );
        // And nothing was charged.
        b.charge_at(7, HOUR, Instant::now()).unwrap();
    }
}
