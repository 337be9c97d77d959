//! Single flight: one run of some work per key, shared by every request
//! that waits for it, and dropped (cancelled) when the last of them goes.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::future::{BoxFuture, FutureExt, Shared, WeakShared};
use tokio::sync::Notify;

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
        self.join_or_start(key, start).0
    }

    /// The run of `key` under way, if any (none is started).
    pub(crate) fn under_way(&self, key: &K) -> Option<Flight<T>> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let f = running.get(key).and_then(WeakShared::upgrade)?;
        f.peek().is_none().then_some(f)
    }

    /// [`Flights::join`], and whether the run was under way already.
    pub(crate) fn join_or_start(
        &self,
        key: K,
        start: impl FnOnce() -> BoxFuture<'static, T>,
    ) -> (Flight<T>, bool) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.retain(|_, w| w.upgrade().is_some_and(|f| f.peek().is_none()));
        if let Some(f) = running.get(&key).and_then(WeakShared::upgrade) {
            return (f, true);
        }
        let f = start().shared();
        if let Some(w) = f.downgrade() {
            running.insert(key, w);
        }
        (f, false)
    }
}

/// Tells the work of a flight that nobody waits for it any more: [`Gone`]
/// is set when the guard is dropped before [`Abandon::finished`] (the
/// flight's future was dropped with its last waiter), and the work, on a
/// thread of its own, stops at its next check.
pub(crate) struct Abandon {
    gone: Arc<Gone>,
    what: Option<String>,
}

/// Set once nobody waits for some work any more: read by its blocking
/// part, awaited by a wait that ends with it.
#[derive(Default)]
pub(crate) struct Gone {
    set: AtomicBool,
    notify: Notify,
}

impl Gone {
    /// Whether it is set.
    pub(crate) fn is_set(&self) -> bool {
        self.set.load(Ordering::Relaxed)
    }

    /// Ends once it is set.
    pub(crate) async fn wait(&self) {
        loop {
            // Registered before the check: a set in between still wakes it.
            let woken = self.notify.notified();
            if self.is_set() {
                return;
            }
            woken.await;
        }
    }

    fn set(&self) {
        self.set.store(true, Ordering::Relaxed);
        self.notify.notify_waiters();
    }
}

impl Abandon {
    /// A guard for the work `what` (named in the log when abandoned).
    pub(crate) fn new(what: String) -> Abandon {
        Abandon {
            gone: Arc::default(),
            what: Some(what),
        }
    }

    /// What the work reads, or awaits.
    pub(crate) fn gone(&self) -> Arc<Gone> {
        self.gone.clone()
    }

    /// The work ended with someone waiting.
    pub(crate) fn finished(mut self) {
        self.what = None;
    }
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if let Some(what) = self.what.take() {
            self.gone.set();
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
        let (a, joined_a) = flights.join_or_start(1, start(runs.clone(), rx));
        let (_unused, rx2) = tokio::sync::oneshot::channel::<()>();
        let (b, joined_b) = flights.join_or_start(1, start(runs.clone(), rx2));
        assert!(!joined_a && joined_b);
        tx.send(()).unwrap();
        assert_eq!((a.await, b.await), (0, 0));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_run_that_ended_is_not_joined() {
        let flights: Flights<u8, usize> = Flights::default();
        let first = flights.join(1, || async { 1 }.boxed());
        assert!(flights.under_way(&1).is_some() && flights.under_way(&2).is_none());
        assert_eq!(first.clone().await, 1);
        assert!(flights.under_way(&1).is_none(), "it ended");
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
        let gone = dropped.gone();
        drop(dropped);
        assert!(gone.is_set());
        let done = Abandon::new("a fetch".into());
        let gone = done.gone();
        done.finished();
        assert!(!gone.is_set());
    }

    #[tokio::test]
    async fn a_wait_ends_when_its_guard_is_dropped() {
        let guard = Abandon::new("a pull".into());
        let gone = guard.gone();
        let waiting = tokio::spawn(async move { gone.wait().await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(guard);
        waiting.await.unwrap();
        // Set before the wait began: it ends at once.
        let guard = Abandon::new("a pull".into());
        let gone = guard.gone();
        drop(guard);
        gone.wait().await;
    }
}
