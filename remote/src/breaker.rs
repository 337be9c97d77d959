//! What keeps a slow or empty remote off the load path: a circuit breaker
//! (after consecutive failures the remote is skipped for a cool-down, then
//! one request probes it) and a short negative cache of known misses.
//! Time is passed in, so both are tested without sleeping.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ctcache::store::EntryKey;

/// Failures in a row that open the breaker.
pub const BREAKER_FAILURES: u32 = 3;
/// How long an open breaker skips the remote before it probes again.
pub const BREAKER_COOLDOWN: Duration = Duration::from_secs(30);
/// How long a remote miss is remembered.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(60);
const NEGATIVE_MAX: usize = 65_536;

/// Where a [`Breaker`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// The remote is used.
    Closed,
    /// Skipping the remote until the cool-down ends.
    Open,
    /// The cool-down ended: the next request probes.
    HalfOpen,
}

impl BreakerState {
    /// The name shown in status and metrics: `closed`, `open` or `half-open`.
    pub fn name(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half-open",
        }
    }
}

/// A circuit breaker for one remote: opens after `threshold` failures in a row.
#[derive(Debug)]
pub struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
    threshold: u32,
    cooldown: Duration,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker::new(BREAKER_FAILURES, BREAKER_COOLDOWN)
    }
}

impl Breaker {
    /// A breaker that opens after `threshold` (at least 1) failures and stays open for `cooldown`.
    pub fn new(threshold: u32, cooldown: Duration) -> Breaker {
        Breaker {
            failures: 0,
            open_until: None,
            threshold: threshold.max(1),
            cooldown,
        }
    }

    /// The state at `now`.
    pub fn state(&self, now: Instant) -> BreakerState {
        match self.open_until {
            None => BreakerState::Closed,
            Some(t) if now < t => BreakerState::Open,
            Some(_) => BreakerState::HalfOpen,
        }
    }

    /// Whether a request may go to the remote now. In the half-open state
    /// one request goes; the breaker stays open for the others until it
    /// reports back.
    pub fn allow(&mut self, now: Instant) -> bool {
        match self.state(now) {
            BreakerState::Closed => true,
            BreakerState::Open => false,
            BreakerState::HalfOpen => {
                self.open_until = Some(now + self.cooldown);
                true
            }
        }
    }

    /// Counts a success: closes the breaker and resets the failure count.
    pub fn success(&mut self) {
        self.failures = 0;
        self.open_until = None;
    }

    /// Counts a failure; returns true when it opened the breaker.
    pub fn failure(&mut self, now: Instant) -> bool {
        self.failures = self.failures.saturating_add(1);
        if self.failures >= self.threshold {
            let was_closed = self.open_until.is_none();
            self.open_until = Some(now + self.cooldown);
            return was_closed;
        }
        false
    }
}

/// Keys the remote recently did not have.
#[derive(Debug)]
pub struct NegativeCache {
    until: HashMap<EntryKey, Instant>,
    ttl: Duration,
    max: usize,
}

impl Default for NegativeCache {
    fn default() -> Self {
        NegativeCache::new(NEGATIVE_TTL, NEGATIVE_MAX)
    }
}

impl NegativeCache {
    /// A cache that remembers misses for `ttl` and holds at most `max` (at least 1) keys.
    pub fn new(ttl: Duration, max: usize) -> NegativeCache {
        NegativeCache {
            until: HashMap::new(),
            ttl,
            max: max.max(1),
        }
    }

    /// Whether the remote missed `key` within the last `ttl` before `now`.
    pub fn known_miss(&self, key: &EntryKey, now: Instant) -> bool {
        self.until.get(key).is_some_and(|t| now < *t)
    }

    /// Remembers that the remote missed `key` at `now`; when full, drops expired keys (or all).
    pub fn remember(&mut self, key: EntryKey, now: Instant) {
        if self.until.len() >= self.max {
            self.until.retain(|_, t| now < *t);
            if self.until.len() >= self.max {
                // Still full of live entries: forget them all rather than grow.
                self.until.clear();
            }
        }
        self.until.insert(key, now + self.ttl);
    }

    /// Forgets a miss (the key is known to exist now).
    pub fn forget(&mut self, key: &EntryKey) {
        self.until.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctcache::digest::SourceDigest;
    use ctcache::structs::PhysicalTypeKey;

    fn key(b: u8) -> EntryKey {
        EntryKey {
            source: SourceDigest {
                algorithm: Default::default(),
                bytes: [b; 32],
            },
            device: [0; 32],
            physical_type: PhysicalTypeKey([0; 32]),
        }
    }

    #[test]
    fn breaker_opens_after_consecutive_failures_and_probes_after_cooldown() {
        let t0 = Instant::now();
        let cd = Duration::from_secs(10);
        let mut b = Breaker::new(3, cd);
        assert!(!b.failure(t0));
        b.success();
        assert!(!b.failure(t0));
        assert!(!b.failure(t0));
        assert_eq!(b.state(t0), BreakerState::Closed);
        assert!(b.failure(t0));
        assert!(!b.allow(t0 + cd / 2));
        assert_eq!(b.state(t0 + cd), BreakerState::HalfOpen);
        assert!(b.allow(t0 + cd), "one probe goes");
        assert!(!b.allow(t0 + cd), "the others wait for it");
        assert!(!b.failure(t0 + cd), "a failed probe keeps it open");
        assert_eq!(b.state(t0 + cd + cd / 2), BreakerState::Open);
        b.success();
        assert!(b.allow(t0 + cd + cd / 2));
    }

    #[test]
    fn negative_cache_expires_and_stays_bounded() {
        let t0 = Instant::now();
        let mut n = NegativeCache::new(Duration::from_secs(5), 2);
        n.remember(key(1), t0);
        assert!(n.known_miss(&key(1), t0));
        assert!(!n.known_miss(&key(1), t0 + Duration::from_secs(5)));
        n.remember(key(2), t0);
        n.remember(key(3), t0);
        assert!(n.until.len() <= 2);
        assert!(n.known_miss(&key(3), t0));
        n.forget(&key(3));
        assert!(!n.known_miss(&key(3), t0));
    }
}
