//! Tests of the scheduler.

use super::*;
use std::sync::atomic::AtomicUsize;
use std::sync::Condvar;
use std::time::Duration;

async fn wait<V: Clone>(h: JobHandle<V>) -> JobState<V> {
    h.finished().await
}

/// A latch: a job waits on it until the test opens it, so a test says when
/// a job ends instead of assuming how long it takes.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn wait(&self) {
        let (open, changed) = &*self.0;
        let mut open = open.lock().unwrap();
        while !*open {
            open = changed.wait(open).unwrap();
        }
    }

    fn open(&self) {
        let (open, changed) = &*self.0;
        *open.lock().unwrap() = true;
        changed.notify_all();
    }
}

#[tokio::test]
async fn single_flight_runs_once() {
    let s: Scheduler<&str, u32> = Scheduler::new(2, 0, 1 << 20, usize::MAX);
    let runs = Arc::new(AtomicUsize::new(0));
    // The first job runs until all eight were submitted.
    let gate = Gate::default();
    let mut handles = Vec::new();
    for _ in 0..8 {
        let (r, g) = (runs.clone(), gate.clone());
        handles.push(
            s.submit(None, "k", Lane::Cpu, Priority::Client, 10, move |_| {
                g.wait();
                r.fetch_add(1, Ordering::SeqCst);
                Ok(7)
            })
            .unwrap(),
        );
    }
    gate.open();
    for h in handles {
        assert_eq!(wait(h).await, JobState::Done(7));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn abandoned_client_job_is_cancelled() {
    let s: Scheduler<u32, u32> = Scheduler::new(1, 0, 1 << 20, usize::MAX);
    // Occupy the only worker until the job behind it is abandoned.
    let gate = Gate::default();
    let g = gate.clone();
    let blocker = s
        .submit(None, 0, Lane::Cpu, Priority::Client, 1, move |_| {
            g.wait();
            Ok(0)
        })
        .unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let h = s
        .submit(None, 1, Lane::Cpu, Priority::Client, 1, move |_| {
            r.store(true, Ordering::SeqCst);
            Ok(1)
        })
        .unwrap();
    let state = h.state.clone();
    drop(h);
    gate.open();
    wait(blocker).await;
    // A job queued after it has run on the only worker: the abandoned job
    // was passed over, not run.
    let after = s
        .submit(None, 2, Lane::Cpu, Priority::Client, 1, |_| Ok(2))
        .unwrap();
    assert_eq!(wait(after).await, JobState::Done(2));
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(*state.borrow(), JobState::Cancelled);
}

#[tokio::test]
async fn clients_go_before_the_watcher() {
    let s: Scheduler<u32, u32> = Scheduler::new(1, 0, 1 << 20, usize::MAX);
    let order = Arc::new(Mutex::new(Vec::new()));
    let gate = Gate::default();
    let g = gate.clone();
    let blocker = s
        .submit(None, 0, Lane::Cpu, Priority::Client, 1, move |_| {
            g.wait();
            Ok(0)
        })
        .unwrap();
    let o = order.clone();
    let w = s
        .submit(None, 1, Lane::Cpu, Priority::Watcher, 1, move |_| {
            o.lock().unwrap().push(1);
            Ok(1)
        })
        .unwrap();
    let o = order.clone();
    let c = s
        .submit(None, 2, Lane::Cpu, Priority::Client, 1, move |_| {
            o.lock().unwrap().push(2);
            Ok(2)
        })
        .unwrap();
    gate.open();
    wait(blocker).await;
    wait(w).await;
    wait(c).await;
    assert_eq!(*order.lock().unwrap(), vec![2, 1]);
}

#[tokio::test]
async fn the_gpu_lane_runs_while_the_cpu_workers_are_busy() {
    let s: Scheduler<u32, String> = Scheduler::new(1, 1, 1 << 20, usize::MAX);
    assert!(s.has_gpu_lane());
    let release = Gate::default();
    let r = release.clone();
    let blocker = s
        .submit(None, 0, Lane::Cpu, Priority::Client, 1, move |_| {
            r.wait();
            Ok(String::new())
        })
        .unwrap();
    let gpu = s
        .submit(None, 1, Lane::Gpu, Priority::Watcher, 1, |_| {
            Ok(std::thread::current()
                .name()
                .unwrap_or_default()
                .to_string())
        })
        .unwrap();
    let state = tokio::time::timeout(Duration::from_secs(10), wait(gpu))
        .await
        .expect("the GPU job ran although the only CPU worker was busy");
    assert_eq!(state, JobState::Done("ctcache-gpu-0".into()));
    assert_eq!(s.stats().gpu_runs.load(Ordering::SeqCst), 1);
    release.open();
    wait(blocker).await;
}

#[tokio::test]
async fn without_gpu_workers_gpu_jobs_run_on_the_cpu() {
    let s: Scheduler<u32, String> = Scheduler::new(1, 0, 1 << 20, usize::MAX);
    assert!(!s.has_gpu_lane());
    let h = s
        .submit(None, 1, Lane::Gpu, Priority::Client, 1, |_| {
            Ok(std::thread::current()
                .name()
                .unwrap_or_default()
                .to_string())
        })
        .unwrap();
    assert_eq!(wait(h).await, JobState::Done("ctcache-pack-0".into()));
}

#[tokio::test]
async fn a_key_running_on_one_lane_is_joined_from_the_other() {
    let s: Scheduler<u32, u32> = Scheduler::new(1, 1, 1 << 20, usize::MAX);
    let runs = Arc::new(AtomicUsize::new(0));
    let (r, gate) = (runs.clone(), Gate::default());
    let g = gate.clone();
    let a = s
        .submit(None, 7, Lane::Gpu, Priority::Client, 1, move |_| {
            g.wait();
            r.fetch_add(1, Ordering::SeqCst);
            Ok(1)
        })
        .unwrap();
    let r = runs.clone();
    let b = s
        .submit(None, 7, Lane::Cpu, Priority::Client, 1, move |_| {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(2)
        })
        .unwrap();
    assert!(b.joined);
    gate.open();
    assert_eq!(wait(a).await, JobState::Done(1));
    assert_eq!(wait(b).await, JobState::Done(1));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn waiting_jobs_are_bounded_per_owner() {
    let s: Scheduler<u32, u32> = Scheduler::new(1, 0, 1 << 20, 2);
    // Occupies the only worker (it says when it runs) until told to finish.
    let (started, release) = (Gate::default(), Gate::default());
    let (st, r) = (started.clone(), release.clone());
    let blocker = s
        .submit(Some(7), 0, Lane::Cpu, Priority::Client, 1, move |_| {
            st.open();
            r.wait();
            Ok(0)
        })
        .unwrap();
    started.wait();
    let a = s
        .submit(Some(7), 1, Lane::Cpu, Priority::Client, 1, |_| Ok(1))
        .unwrap();
    let b = s
        .submit(Some(7), 2, Lane::Cpu, Priority::Client, 1, |_| Ok(2))
        .unwrap();
    let full = s
        .submit(Some(7), 3, Lane::Cpu, Priority::Client, 1, |_| Ok(3))
        .err()
        .expect("a third waiting job of uid 7 is refused");
    assert_eq!(full, QueueFull { owner: 7, max: 2 });
    // Joining a waiting job takes no place; other owners have their own.
    let joined = s
        .submit(Some(7), 1, Lane::Cpu, Priority::Client, 1, |_| Ok(9))
        .unwrap();
    assert!(joined.joined);
    let other = s
        .submit(Some(8), 4, Lane::Cpu, Priority::Client, 1, |_| Ok(4))
        .unwrap();
    let admin = s
        .submit(None, 5, Lane::Cpu, Priority::Client, 1, |_| Ok(5))
        .unwrap();
    release.open();
    for h in [blocker, a, b, joined, other, admin] {
        assert!(matches!(wait(h).await, JobState::Done(_)));
    }
    // Once they ran, uid 7 may queue again.
    let again = s
        .submit(Some(7), 3, Lane::Cpu, Priority::Client, 1, |_| Ok(3))
        .unwrap();
    assert_eq!(wait(again).await, JobState::Done(3));
}
