//! Locking a mutex whatever happened while another thread held it.

use std::sync::{Mutex, MutexGuard};

/// A mutex's guard, also once a panic elsewhere poisoned it: every
/// critical section of the daemon leaves its data whole.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
