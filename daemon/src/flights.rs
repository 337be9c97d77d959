//! Single flight: one run of some work per key, shared by every request
//! that waits for it, and dropped (cancelled) when the last of them goes.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::future::{BoxFuture, FutureExt, Shared, WeakShared};

/// A shared run: awaited by each request that joined it.
pub(crate) type Flight<T> = Shared<BoxFuture<'static, T>>;

/// The runs under way, by key. Only weak handles are kept: a run nobody
/// awaits any more is dropped with its last waiter.
pub(crate) struct Flights<K, T: Clone> {
    running: Mutex<HashMap<K, WeakShared<BoxFuture<'static, T>>>>,
}

impl<K, T: Clone> Default for Flights<K, T> {
    fn default() -> Self {
        Flights {
            running: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash, T: Clone> Flights<K, T> {
    /// The run of `key` under way, or the one `start` makes. A run that
    /// has ended is not joined (its outcome may be stale): a new one starts.
    pub(crate) fn join(&self, key: K, start: impl FnOnce() -> BoxFuture<'static, T>) -> Flight<T> {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.retain(|_, w| w.upgrade().is_some_and(|f| f.peek().is_none()));
        if let Some(f) = running.get(&key).and_then(WeakShared::upgrade) {
            return f;
        }
        let f = start().shared();
        if let Some(w) = f.downgrade() {
            running.insert(key, w);
        }
        f
    }
}

/// Tells the blocking part of a flight that nobody waits for it any more:
/// the flag is set when the guard is dropped before [`Abandon::finished`]
/// (the flight's future was dropped with its last waiter), and the work,
/// on a thread of its own, stops at its next check.
pub(crate) struct Abandon {
    flag: Arc<AtomicBool>,
    what: Option<String>,
}

impl Abandon {
    /// A guard for the work `what` (named in the log when abandoned).
    pub(crate) fn new(what: String) -> Abandon {
        Abandon {
            flag: Arc::new(AtomicBool::new(false)),
            what: Some(what),
        }
    }

    /// The flag the work reads.
    pub(crate) fn flag(&self) -> Arc<AtomicBool> {
        self.flag.clone()
    }

    /// The work ended with someone waiting.
    pub(crate) fn finished(mut self) {
        self.what = None;
    }
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if let Some(what) = self.what.take() {
            self.flag.store(true, Ordering::Relaxed);
            tracing::info!(
                "{what}: its request ended (its caller went, or its deadline passed); it stops"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn one_run_per_key_while_someone_waits() {
        let flights: Flights<u8, usize> = Flights::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let start = |runs: Arc<AtomicUsize>, rx: tokio::sync::oneshot::Receiver<()>| {
            move || {
                async move {
                    let _ = rx.await;
                    runs.fetch_add(1, Ordering::SeqCst)
                }
                .boxed()
            }
        };
        let a = flights.join(1, start(runs.clone(), rx));
        let (_unused, rx2) = tokio::sync::oneshot::channel::<()>();
        let b = flights.join(1, start(runs.clone(), rx2));
        tx.send(()).unwrap();
        assert_eq!((a.await, b.await), (0, 0));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_run_that_ended_is_not_joined() {
        let flights: Flights<u8, usize> = Flights::default();
        let first = flights.join(1, || async { 1 }.boxed());
        assert_eq!(first.clone().await, 1);
        let second = flights.join(1, || async { 2 }.boxed());
        assert_eq!(second.await, 2);
    }

    #[tokio::test]
    async fn a_run_nobody_waits_for_is_dropped() {
        let flights: Flights<u8, ()> = Flights::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let f = flights.join(1, move || {
            async move {
                // Holds `tx`'s peer: dropped with the run.
                let _ = rx.await;
            }
            .boxed()
        });
        drop(f);
        assert!(
            tx.is_closed(),
            "the run's future was dropped with its last waiter"
        );
    }

    #[test]
    fn an_abandoned_guard_sets_its_flag_a_finished_one_does_not() {
        let dropped = Abandon::new("a fetch".into());
        let flag = dropped.flag();
        drop(dropped);
        assert!(flag.load(Ordering::Relaxed));
        let done = Abandon::new("a fetch".into());
        let flag = done.flag();
        done.finished();
        assert!(!flag.load(Ordering::Relaxed));
    }
}
