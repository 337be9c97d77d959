//! Ctrl-C during a command that writes: the first asks the work to stop
//! (it removes what it wrote; the command exits 130), a second ends the
//! process at once.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctcache::cancel::Cancel;
use signal_hook::consts::SIGINT;

use crate::output::Failure;

/// A token that SIGINT sets, for work done in this process.
pub fn on_ctrl_c() -> Result<Cancel, Failure> {
    let flag = Arc::new(AtomicBool::new(false));
    let failed = |e: std::io::Error| Failure::Failed(format!("handling Ctrl-C: {e}"));
    // Registered first, so it runs before the flag is set: only a second
    // SIGINT finds it set and exits.
    signal_hook::flag::register_conditional_shutdown(SIGINT, 130, flag.clone()).map_err(failed)?;
    signal_hook::flag::register(SIGINT, flag.clone()).map_err(failed)?;
    Ok(Cancel::from_flag(flag))
}

/// Waits (a few seconds at most) until the daemon, told by the dropped
/// call, has removed `dir`, the data folder it was making; then the
/// folders this command made are empty and go too.
pub async fn wait_removed(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while dir.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The failure of an interrupted command.
pub fn interrupted(what: &str) -> Failure {
    Failure::Interrupted(format!("interrupted; {what}"))
}
