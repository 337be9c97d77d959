//! Polling until a condition holds, with a deadline.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long [`eventually`] waits.
const EVENTUALLY: Duration = Duration::from_secs(30);

/// Calls `f` every `every` until it returns `Some`, and returns that; `None`
/// once `timeout` has passed. The suite's one blocking poll: a test waits
/// on its condition through this (or [`eventually_async`]), never for a
/// fixed time.
pub fn poll<T>(timeout: Duration, every: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// Waits until the wall clock, read as the store reads it, is past
/// `unix_ms` (a stamp the daemon gave), so that a stamp taken from now on
/// is later; panics after 5 s.
pub fn clock_past(unix_ms: i64) {
    let clock = ctcache::store::Clock::system();
    poll(Duration::from_secs(5), Duration::from_millis(1), || {
        (clock.now_ms() as i64 > unix_ms).then_some(())
    })
    .expect("the wall clock moves");
}

/// Polls `f` every 100 ms until it returns true; panics, naming `what`,
/// after 30 s.
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    poll(EVENTUALLY, Duration::from_millis(100), || f().then_some(()))
        .unwrap_or_else(|| panic!("timed out waiting for {what}"));
}

/// Polls `f` every 50 ms until it returns `Some`; `None` once `timeout` has
/// passed.
pub async fn eventually_async<T, F, Fut>(timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
