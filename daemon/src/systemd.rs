//! systemd integration: READY=1 once serving, STATUS= lines, WATCHDOG=1 pings
//! when WatchdogSec is set. All calls are no-ops outside systemd.

use std::time::Duration;

use sd_notify::NotifyState;

/// READY=1 with a status line.
pub(crate) fn ready(status: &str) {
    let _ = sd_notify::notify(false, &[NotifyState::Ready, NotifyState::Status(status)]);
}

/// STOPPING=1 while draining.
pub(crate) fn stopping() {
    let _ = sd_notify::notify(
        false,
        &[NotifyState::Stopping, NotifyState::Status("draining")],
    );
}

/// Pings the watchdog at half its interval until the task is dropped.
pub(crate) fn spawn_watchdog() -> Option<tokio::task::JoinHandle<()>> {
    let mut usec = 0u64;
    if !sd_notify::watchdog_enabled(false, &mut usec) || usec == 0 {
        return None;
    }
    let period = Duration::from_micros(usec / 2);
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            let _ = sd_notify::notify(false, &[NotifyState::Watchdog]);
        }
    }))
}
