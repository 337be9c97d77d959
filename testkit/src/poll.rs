//! Polling until a condition holds, with a deadline.

use std::future::Future;
use std::time::{Duration, Instant};

/// How long [`eventually`] waits.
const EVENTUALLY: Duration = Duration::from_secs(30);

/// Polls `f` every 100 ms until it returns true; panics, naming `what`,
/// after 30 s.
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < EVENTUALLY, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
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
