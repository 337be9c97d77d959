//! Tests of the scheduler.

use super::*;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

async fn wait<V: Clone>(h: JobHandle<V>) -> JobState<V> {
    h.finished().await
}

#[tokio::test]
async fn single_flight_runs_once() {
    let s: Scheduler<&str, u32> = Scheduler::new(2, 0, 1 << 20);
    let runs = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    for _ in 0..8 {
        let r = runs.clone();
        handles.push(s.submit("k", Lane::Cpu, Priority::Client, 10, move |_| {
            std::thread::sleep(Duration::from_millis(100));
            r.fetch_add(1, Ordering::SeqCst);
            Ok(7)
        }));
    }
    for h in handles {
        assert_eq!(wait(h).await, JobState::Done(7));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn abandoned_client_job_is_cancelled() {
    let s: Scheduler<u32, u32> = Scheduler::new(1, 0, 1 << 20);
    // Occupy the only worker.
    let blocker = s.submit(0, Lane::Cpu, Priority::Client, 1, |_| {
        std::thread::sleep(Duration::from_millis(200));
        Ok(0)
    });
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    let h = s.submit(1, Lane::Cpu, Priority::Client, 1, move |_| {
        r.store(true, Ordering::SeqCst);
        Ok(1)
    });
    let state = h.state.clone();
    drop(h);
    wait(blocker).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(*state.borrow(), JobState::Cancelled);
}

#[tokio::test]
async fn clients_go_before_the_watcher() {
    let s: Scheduler<u32, u32> = Scheduler::new(1, 0, 1 << 20);
    let order = Arc::new(Mutex::new(Vec::new()));
    let blocker = s.submit(0, Lane::Cpu, Priority::Client, 1, |_| {
        std::thread::sleep(Duration::from_millis(100));
        Ok(0)
    });
    let o = order.clone();
    let w = s.submit(1, Lane::Cpu, Priority::Watcher, 1, move |_| {
        o.lock().unwrap().push(1);
        Ok(1)
    });
    let o = order.clone();
    let c = s.submit(2, Lane::Cpu, Priority::Client, 1, move |_| {
        o.lock().unwrap().push(2);
        Ok(2)
    });
    wait(blocker).await;
    wait(w).await;
    wait(c).await;
    assert_eq!(*order.lock().unwrap(), vec![2, 1]);
}

#[tokio::test]
async fn the_gpu_lane_runs_while_the_cpu_workers_are_busy() {
    let s: Scheduler<u32, String> = Scheduler::new(1, 1, 1 << 20);
    assert!(s.has_gpu_lane());
    let release = Arc::new(AtomicBool::new(false));
    let r = release.clone();
    let blocker = s.submit(0, Lane::Cpu, Priority::Client, 1, move |_| {
        while !r.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(String::new())
    });
    let gpu = s.submit(1, Lane::Gpu, Priority::Watcher, 1, |_| {
        Ok(std::thread::current()
            .name()
            .unwrap_or_default()
            .to_string())
    });
    let state = tokio::time::timeout(Duration::from_secs(10), wait(gpu))
        .await
        .expect("the GPU job ran although the only CPU worker was busy");
    assert_eq!(state, JobState::Done("ctcache-gpu-0".into()));
    assert_eq!(s.stats().gpu_runs.load(Ordering::SeqCst), 1);
    release.store(true, Ordering::SeqCst);
    wait(blocker).await;
}

#[tokio::test]
async fn without_gpu_workers_gpu_jobs_run_on_the_cpu() {
    let s: Scheduler<u32, String> = Scheduler::new(1, 0, 1 << 20);
    assert!(!s.has_gpu_lane());
    let h = s.submit(1, Lane::Gpu, Priority::Client, 1, |_| {
        Ok(std::thread::current()
            .name()
            .unwrap_or_default()
            .to_string())
    });
    assert_eq!(wait(h).await, JobState::Done("ctcache-pack-0".into()));
}

#[tokio::test]
async fn a_key_running_on_one_lane_is_joined_from_the_other() {
    let s: Scheduler<u32, u32> = Scheduler::new(1, 1, 1 << 20);
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let a = s.submit(7, Lane::Gpu, Priority::Client, 1, move |_| {
        std::thread::sleep(Duration::from_millis(100));
        r.fetch_add(1, Ordering::SeqCst);
        Ok(1)
    });
    let r = runs.clone();
    let b = s.submit(7, Lane::Cpu, Priority::Client, 1, move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        Ok(2)
    });
    assert!(b.joined);
    assert_eq!(wait(a).await, JobState::Done(1));
    assert_eq!(wait(b).await, JobState::Done(1));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
