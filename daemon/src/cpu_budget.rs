//! How much of the daemon's CPU time an untrusted uid may use: at most
//! `max_cpu_secs_per_uid_per_hour` in any hour (a leaky bucket, see
//! `budget`), counted from the CPU clocks of the threads that work for it:
//! the blocking part of each of its requests and its pack jobs. CPU time
//! cannot be known before the work, so a request is admitted while the
//! uid's hour has time left (RESOURCE_EXHAUSTED naming the key otherwise)
//! and charged what it used after. A request's payer rides with its task
//! (`PAYER`), so that the use cases need not pass it along.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::budget::Hourly;
use crate::error::Error;

tokio::task_local! {
    static PAYER: Payer;
}

/// The per-uid CPU budget.
pub(crate) struct CpuBudget {
    hourly: Hourly,
}

/// Who pays for the CPU time of work done for a request.
#[derive(Clone)]
pub(crate) struct Payer {
    budget: Arc<CpuBudget>,
    uid: u32,
}

impl CpuBudget {
    pub fn new(secs_per_hour: u64) -> Arc<CpuBudget> {
        Arc::new(CpuBudget {
            hourly: Hourly::new(secs_per_hour.saturating_mul(1_000_000)),
        })
    }

    /// Admits a request of `uid` while its hour has CPU time left.
    pub fn admit(&self, uid: u32) -> Result<(), Error> {
        self.admit_at(uid, Instant::now())
    }

    fn admit_at(&self, uid: u32, now: Instant) -> Result<(), Error> {
        self.hourly.room_at(uid, now).map_err(|wait| {
            Error::exhausted(format!(
                "uid {uid} has used its max_cpu_secs_per_uid_per_hour ({} s) of the daemon's CPU \
                 time; try again in {} s",
                self.hourly.per_hour() / 1_000_000,
                wait.as_secs().max(1)
            ))
        })
    }

    /// The payer for work done for `uid`.
    pub fn payer(self: &Arc<CpuBudget>, uid: u32) -> Payer {
        Payer {
            budget: self.clone(),
            uid,
        }
    }
}

impl Payer {
    /// The payer of the request this task serves, if it pays.
    pub fn current() -> Option<Payer> {
        PAYER.try_with(Payer::clone).ok()
    }

    /// Runs `fut` (a request's handling) with this payer as its task's.
    pub async fn serve<F: std::future::Future>(self, fut: F) -> F::Output {
        PAYER.scope(self, fut).await
    }

    /// This payer, while its uid's hour has CPU time left.
    pub fn admitted(&self) -> Result<&Payer, Error> {
        self.budget.admit(self.uid).map(|()| self)
    }

    /// Runs `work` on this thread and charges the CPU time it used.
    pub fn run<T>(&self, work: impl FnOnce() -> T) -> T {
        let t0 = thread_cpu();
        let out = work();
        self.charge(thread_cpu().saturating_sub(t0));
        out
    }

    /// Charges CPU time used elsewhere for this payer (a worker process).
    pub fn charge(&self, used: Duration) {
        let us = u64::try_from(used.as_micros()).unwrap_or(u64::MAX);
        self.budget.hourly.spend_at(self.uid, us, Instant::now());
    }
}

/// The CPU time this thread has used.
fn thread_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a timespec of this frame.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_that_used_its_hour_is_refused_naming_the_key() {
        let b = CpuBudget::new(1);
        b.admit(7).unwrap();
        b.hourly.spend_at(7, 1_500_000, Instant::now());
        let e = b.admit(7).unwrap_err();
        assert!(
            e.message.contains("max_cpu_secs_per_uid_per_hour (1 s)"),
            "{e:?}"
        );
        b.admit(8).expect("another uid has its own hour");
    }

    #[test]
    fn work_is_charged_the_cpu_time_its_thread_used() {
        let b = CpuBudget::new(3600);
        let spin = || {
            let t0 = thread_cpu();
            while thread_cpu() - t0 < Duration::from_millis(50) {
                std::hint::black_box(0u64);
            }
        };
        b.payer(7).run(spin);
        // The hour less 25 ms more leaves no room: the 50 ms were charged.
        let now = Instant::now();
        b.hourly.spend_at(7, b.hourly.per_hour() - 25_000, now);
        assert!(
            b.admit_at(7, now).is_err(),
            "the spin's CPU time was charged"
        );
        assert!(b.admit_at(8, now).is_ok());
    }
}
