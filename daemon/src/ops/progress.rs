//! Following pack jobs: each job's state in the form callers see, sent as
//! the jobs finish and published on the event feed (also for the jobs a
//! Materialize or Embed waits for, so a client can show their progress).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::events::{now_ms, Event, EventKind};
use crate::jobs::{JobPhase, JobProgress, Jobs, Packed};
use crate::policy::Wanted;
use crate::scheduler::JobState;
use crate::state::Daemon;

/// A job's progress in the form followers see.
fn progress(job: u64, w: &Wanted, state: &JobState<Packed>, done: u32, total: u32) -> JobProgress {
    let mut p = JobProgress {
        job_id: job,
        initializer: w.initializer.clone(),
        format: w.format.clone(),
        phase: JobPhase::Queued,
        done,
        total,
        entry: None,
        error: String::new(),
        failure: None,
        backend: None,
        pack_duration: Duration::ZERO,
    };
    match state {
        JobState::Queued => {}
        JobState::Running => p.phase = JobPhase::Running,
        JobState::Done(packed) => {
            p.phase = if packed.cached {
                JobPhase::Cached
            } else {
                JobPhase::Done
            };
            p.pack_duration = packed.entry.pack_duration;
            p.backend = packed.backend;
            p.entry = Some(packed.entry.clone());
        }
        JobState::Failed(e) => {
            p.phase = JobPhase::Failed;
            p.error = e.message.clone();
            p.failure = Some(e.kind);
        }
        JobState::Cancelled => {
            p.phase = JobPhase::Cancelled;
            p.error = "cancelled".into();
            p.failure = Some(crate::error::ErrorKind::Cancelled);
        }
    }
    p
}

/// Follows jobs: the state now of each job still queued or running, then
/// each job's final state as it comes, exactly once per job (also published
/// as a `job_progress` event naming `model_path`). Dropping the receiver drops
/// the handles, which cancels jobs nobody else waits for.
pub(crate) fn follow(
    d: &Arc<Daemon>,
    jobs: Jobs,
    model_path: String,
) -> mpsc::Receiver<JobProgress> {
    let (tx, rx) = mpsc::channel(64);
    let d = d.clone();
    tokio::spawn(async move {
        let total = jobs.len() as u32;
        for (w, h) in &jobs {
            let now = h.state.borrow().clone();
            // A finished job is reported once, by the loop below.
            if now.is_final() {
                continue;
            }
            if tx.send(progress(h.id, w, &now, 0, total)).await.is_err() {
                return;
            }
        }
        let mut done = 0u32;
        for (w, h) in jobs {
            let id = h.id;
            let state = h.finished().await;
            done += 1;
            let p = progress(id, &w, &state, done, total);
            publish(&d, &model_path, &p);
            if tx.send(p).await.is_err() {
                return;
            }
        }
    });
    rx
}

/// Publishes a job's final state `state` as a `job_progress` event about
/// `model_path`: the `done`-th of `total` jobs of one request to finish.
pub(crate) fn publish_finished(
    d: &Daemon,
    model_path: &str,
    (job, w): (u64, &Wanted),
    state: &JobState<Packed>,
    done: u32,
    total: u32,
) {
    publish(d, model_path, &progress(job, w, state, done, total));
}

fn publish(d: &Daemon, model_path: &str, p: &JobProgress) {
    d.events.publish(Event {
        unix_ms: now_ms(),
        kind: EventKind::JobProgress,
        key: None,
        model_path: model_path.to_string(),
        detail: phase_name(p.phase).into(),
        progress: Some(p.clone()),
    });
}

/// The word for a phase in events and logs.
pub(crate) fn phase_name(p: JobPhase) -> &'static str {
    match p {
        JobPhase::Queued => "queued",
        JobPhase::Running => "running",
        JobPhase::Done => "done",
        JobPhase::Cached => "cached",
        JobPhase::Failed => "failed",
        JobPhase::Cancelled => "cancelled",
    }
}
