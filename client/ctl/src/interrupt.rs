//! Ctrl-C during a command that writes: the first asks the work to stop
//! (it removes what it wrote; the command exits 130), a second ends the
//! process at once.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use ctcache::cancel::Cancel;
use signal_hook::consts::SIGINT;

use crate::output::Failure;

/// A token that SIGINT sets, for work done in this process.
pub fn on_ctrl_c() -> Result<Cancel, Failure> {
    on_ctrl_c_flag().map(Cancel::from_flag)
}

/// The flag SIGINT sets (a second SIGINT exits at once).
pub fn on_ctrl_c_flag() -> Result<Arc<AtomicBool>, Failure> {
    let flag = Arc::new(AtomicBool::new(false));
    let failed = |e: std::io::Error| Failure::Failed(format!("handling Ctrl-C: {e}"));
    // Registered first, so it runs before the flag is set: only a second
    // SIGINT finds it set and exits.
    signal_hook::flag::register_conditional_shutdown(SIGINT, 130, flag.clone()).map_err(failed)?;
    signal_hook::flag::register(SIGINT, flag.clone()).map_err(failed)?;
    Ok(flag)
}
