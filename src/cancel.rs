//! A stop asked for from outside a long call (a client that went away, a
//! Ctrl-C): the call checks it between steps, stops, and removes what it
//! made.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};

/// A flag shared between the one who may stop a call and the call.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A flag not set (yet).
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// A token over `flag`, set by someone else (a signal handler).
    pub fn from_flag(flag: Arc<AtomicBool>) -> Cancel {
        Cancel(flag)
    }

    /// Asks the call to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// True once a stop was asked for.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// [`Error::Cancelled`] once a stop was asked for.
    pub fn check(&self) -> Result<()> {
        if self.is_cancelled() {
            Err(Error::Cancelled)
        } else {
            Ok(())
        }
    }
}
