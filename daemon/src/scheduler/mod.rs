//! The pack scheduler: bounded pools of worker threads (packing never runs
//! on the async runtime) in two lanes, CPU and GPU (a GPU has its own queue
//! and worker so it is fed while the CPU workers are busy), a priority queue
//! per lane (a waiting client before the watcher), single-flight per job key
//! across lanes, cancellation of jobs whose every waiter went away, and one
//! memory budget for packs in flight.

use crate::error::Error;
use std::collections::{BinaryHeap, HashMap};
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};

use tokio::sync::watch;

/// Who is waiting for a job; higher runs first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    Watcher = 0,
    Background = 1,
    Client = 2,
}

/// Which workers run a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    Cpu = 0,
    /// A GPU queue; without GPU workers its jobs run in the CPU lane.
    Gpu = 1,
}

/// A job's progress, observed through `watch` channels.
#[derive(Debug, Clone, PartialEq)]
pub enum JobState<V> {
    Queued,
    Running,
    Done(V),
    Failed(Error),
    Cancelled,
}

impl<V> JobState<V> {
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            JobState::Done(_) | JobState::Failed(_) | JobState::Cancelled
        )
    }
}

/// Keeps a job wanted: a client job is cancelled once every handle is dropped.
#[derive(Debug)]
pub struct Waiter;

/// What a submitter holds: the job's state stream and its interest in it.
pub struct JobHandle<V> {
    pub id: u64,
    pub state: watch::Receiver<JobState<V>>,
    /// `true` when this call joined a job already queued or running.
    pub joined: bool,
    _waiter: Arc<Waiter>,
}

impl<V: Clone> JobHandle<V> {
    /// Waits until the job reaches a final state.
    pub async fn finished(mut self) -> JobState<V> {
        loop {
            let s = self.state.borrow_and_update().clone();
            if s.is_final() {
                return s;
            }
            if self.state.changed().await.is_err() {
                return self.state.borrow().clone();
            }
        }
    }
}

type Work<V> = Box<dyn FnOnce(&CancelToken) -> Result<V, Error> + Send>;

/// Lets running work notice that nobody wants its result any more.
#[derive(Clone)]
pub struct CancelToken {
    waiters: Arc<Mutex<Vec<Weak<Waiter>>>>,
    background: Arc<AtomicBool>,
}

impl CancelToken {
    pub fn cancelled(&self) -> bool {
        !self.background.load(Ordering::Relaxed)
            && !self
                .waiters
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|w| w.strong_count() > 0)
    }
}

/// An owner already has as many jobs waiting as it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull {
    pub owner: u32,
    pub max: usize,
}

impl std::fmt::Display for QueueFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "uid {} has {} pack jobs waiting, the most allowed; wait for some to finish",
            self.owner, self.max
        )
    }
}

struct Job<K, V> {
    id: u64,
    /// Who queued it (`None`: the daemon itself or an admin; not bounded).
    owner: Option<u32>,
    key: K,
    priority: Priority,
    seq: u64,
    bytes: u64,
    work: Work<V>,
    token: CancelToken,
    state: watch::Sender<JobState<V>>,
}

impl<K, V> PartialEq for Job<K, V> {
    fn eq(&self, o: &Self) -> bool {
        self.seq == o.seq
    }
}
impl<K, V> Eq for Job<K, V> {}
impl<K, V> PartialOrd for Job<K, V> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<K, V> Ord for Job<K, V> {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Highest priority first, then oldest first.
        self.priority.cmp(&o.priority).then(o.seq.cmp(&self.seq))
    }
}

struct InFlight<V> {
    id: u64,
    state: watch::Receiver<JobState<V>>,
    token: CancelToken,
}

struct Shared<K, V> {
    queue: Mutex<Queue<K, V>>,
    wake: Condvar,
    budget: Mutex<u64>,
    budget_total: u64,
    budget_freed: Condvar,
    next_id: AtomicU64,
    stats: Stats,
    gpu_workers: usize,
    max_queued_per_owner: usize,
}

struct Queue<K, V> {
    /// One heap per lane, indexed by `Lane as usize`.
    heaps: [BinaryHeap<Job<K, V>>; 2],
    in_flight: HashMap<K, InFlight<V>>,
    /// Jobs waiting per owner.
    queued_by: HashMap<u32, usize>,
    shutdown: bool,
    seq: u64,
}

/// Counters for status and metrics.
#[derive(Debug, Default)]
pub struct Stats {
    pub queued: AtomicU64,
    pub running: AtomicU64,
    pub completed: AtomicU64,
    pub failed: AtomicU64,
    pub cancelled: AtomicU64,
    pub joined: AtomicU64,
    /// Jobs run by a GPU-lane worker.
    pub gpu_runs: AtomicU64,
}

/// The scheduler; cheap to clone.
pub struct Scheduler<K, V> {
    shared: Arc<Shared<K, V>>,
}

impl<K, V> Clone for Scheduler<K, V> {
    fn clone(&self) -> Self {
        Scheduler {
            shared: self.shared.clone(),
        }
    }
}

impl<K, V> Scheduler<K, V>
where
    K: Eq + Hash + Clone + Send + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Starts `workers` CPU threads (at least one) and `gpu_workers` GPU
    /// threads, with `budget` bytes of packs in flight and at most
    /// `max_queued_per_owner` jobs waiting per owner.
    pub fn new(
        workers: usize,
        gpu_workers: usize,
        budget: u64,
        max_queued_per_owner: usize,
    ) -> Self {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                heaps: [BinaryHeap::new(), BinaryHeap::new()],
                in_flight: HashMap::new(),
                queued_by: HashMap::new(),
                shutdown: false,
                seq: 0,
            }),
            wake: Condvar::new(),
            budget: Mutex::new(budget.max(1)),
            budget_total: budget.max(1),
            budget_freed: Condvar::new(),
            next_id: AtomicU64::new(1),
            stats: Stats::default(),
            gpu_workers,
            max_queued_per_owner,
        });
        let lanes = [
            (Lane::Cpu, workers.max(1), "pack"),
            (Lane::Gpu, gpu_workers, "gpu"),
        ];
        for (lane, count, name) in lanes {
            for i in 0..count {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("ctcache-{name}-{i}"))
                    .spawn(move || worker(s, lane))
                    .expect("spawning a pack worker thread");
            }
        }
        Scheduler { shared }
    }

    /// True when GPU-lane jobs have workers of their own.
    pub fn has_gpu_lane(&self) -> bool {
        self.shared.gpu_workers > 0
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Submits `work` under `key` to a lane for `owner`; an identical key
    /// queued or running (in either lane) is joined instead (single-flight,
    /// not counted against the owner). `bytes` is the memory the job needs.
    /// Fails when `owner` already has `max_queued_per_owner` jobs waiting.
    pub fn submit(
        &self,
        owner: Option<u32>,
        key: K,
        lane: Lane,
        priority: Priority,
        bytes: u64,
        work: impl FnOnce(&CancelToken) -> Result<V, Error> + Send + 'static,
    ) -> Result<JobHandle<V>, QueueFull> {
        let waiter = Arc::new(Waiter);
        let mut q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = q.in_flight.get(&key) {
            if !f.state.borrow().is_final() {
                f.token
                    .waiters
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Arc::downgrade(&waiter));
                if priority != Priority::Client {
                    f.token.background.store(true, Ordering::Relaxed);
                }
                // A waiting client lifts a queued watcher job.
                let id = f.id;
                let state = f.state.clone();
                if priority == Priority::Client {
                    for heap in &mut q.heaps {
                        if heap.iter().any(|j| j.id == id) {
                            *heap = std::mem::take(heap)
                                .into_iter()
                                .map(|mut j| {
                                    if j.id == id {
                                        j.priority = Priority::Client;
                                    }
                                    j
                                })
                                .collect();
                        }
                    }
                }
                self.shared.stats.joined.fetch_add(1, Ordering::Relaxed);
                return Ok(JobHandle {
                    id,
                    state,
                    joined: true,
                    _waiter: waiter,
                });
            }
        }
        if let Some(uid) = owner {
            let max = self.shared.max_queued_per_owner;
            let n = q.queued_by.entry(uid).or_default();
            if *n >= max {
                return Err(QueueFull { owner: uid, max });
            }
            *n += 1;
        }
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(JobState::Queued);
        let token = CancelToken {
            waiters: Arc::new(Mutex::new(vec![Arc::downgrade(&waiter)])),
            background: Arc::new(AtomicBool::new(priority != Priority::Client)),
        };
        q.seq += 1;
        let seq = q.seq;
        q.in_flight.insert(
            key.clone(),
            InFlight {
                id,
                state: rx.clone(),
                token: token.clone(),
            },
        );
        let lane = if lane == Lane::Gpu && self.shared.gpu_workers == 0 {
            Lane::Cpu
        } else {
            lane
        };
        q.heaps[lane as usize].push(Job {
            id,
            owner,
            key,
            priority,
            seq,
            bytes,
            work: Box::new(work),
            token,
            state: tx,
        });
        self.shared.stats.queued.fetch_add(1, Ordering::Relaxed);
        drop(q);
        // Workers of both lanes wait on one condvar: wake them all.
        self.shared.wake.notify_all();
        Ok(JobHandle {
            id,
            state: rx,
            joined: false,
            _waiter: waiter,
        })
    }

    /// Jobs waiting in the queue.
    pub fn queued(&self) -> usize {
        self.shared
            .queue
            .lock()
            .map(|q| q.heaps.iter().map(BinaryHeap::len).sum())
            .unwrap_or(0)
    }

    /// Stops taking jobs; queued ones are cancelled, running ones finish.
    pub fn shutdown(&self) {
        let mut q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.shutdown = true;
        q.queued_by.clear();
        for heap in &mut q.heaps {
            for job in heap.drain() {
                let _ = job.state.send(JobState::Cancelled);
            }
        }
        drop(q);
        self.shared.wake.notify_all();
    }
}

fn worker<K: Eq + Hash + Clone, V: Clone>(s: Arc<Shared<K, V>>, lane: Lane) {
    loop {
        let job = {
            let mut q = s.queue.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if q.shutdown {
                    return;
                }
                if let Some(job) = q.heaps[lane as usize].pop() {
                    if let Some(uid) = job.owner {
                        if let Some(n) = q.queued_by.get_mut(&uid) {
                            *n -= 1;
                            if *n == 0 {
                                q.queued_by.remove(&uid);
                            }
                        }
                    }
                    break job;
                }
                q = s.wake.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        s.stats.queued.fetch_sub(1, Ordering::Relaxed);
        let Job {
            id,
            key,
            bytes,
            work,
            token,
            state,
            ..
        } = job;
        let final_state = if token.cancelled() {
            s.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            JobState::Cancelled
        } else {
            if lane == Lane::Gpu {
                s.stats.gpu_runs.fetch_add(1, Ordering::Relaxed);
            }
            run(&s, bytes, work, &token, &state)
        };
        let mut q = s.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.in_flight.get(&key).is_some_and(|f| f.id == id) {
            q.in_flight.remove(&key);
        }
        let _ = state.send(final_state);
    }
}

/// Runs one job inside the memory budget, turning panics into failures.
fn run<K, V>(
    s: &Shared<K, V>,
    bytes: u64,
    work: Work<V>,
    token: &CancelToken,
    state: &watch::Sender<JobState<V>>,
) -> JobState<V> {
    // Reserve memory; a job larger than the whole budget runs alone.
    let want = bytes.min(s.budget_total);
    {
        let mut free = s.budget.lock().unwrap_or_else(|p| p.into_inner());
        while *free < want {
            free = s.budget_freed.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        *free -= want;
    }
    let _ = state.send(JobState::Running);
    s.stats.running.fetch_add(1, Ordering::Relaxed);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(token)));
    s.stats.running.fetch_sub(1, Ordering::Relaxed);
    *s.budget.lock().unwrap_or_else(|p| p.into_inner()) += want;
    s.budget_freed.notify_all();
    match result {
        Ok(Ok(v)) => {
            s.stats.completed.fetch_add(1, Ordering::Relaxed);
            JobState::Done(v)
        }
        Ok(Err(e)) if token.cancelled() => {
            s.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            JobState::Failed(Error::cancelled(format!("cancelled: {e}")))
        }
        Ok(Err(e)) => {
            s.stats.failed.fetch_add(1, Ordering::Relaxed);
            JobState::Failed(e)
        }
        Err(_) => {
            s.stats.failed.fetch_add(1, Ordering::Relaxed);
            JobState::Failed(Error::internal(
                "pack job panicked (bug); the daemon keeps running",
            ))
        }
    }
}

#[cfg(test)]
mod tests;
