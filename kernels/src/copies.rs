//! A bound on the memory that packs in progress hold at once.
//!
//! Every pack copies its source tensor into private memory first (the bytes
//! hashed are the bytes packed: [`crate::compile::compile_on`]) and holds
//! it and its payload until the pack ends. The packers spread one tensor
//! over every core, so packs running side by side (the daemon's workers)
//! gain little time, but each holds its tensor: fifteen workers on a model
//! of 256 MiB tensors would hold fifteen of them. A pack takes its copy's
//! and its payload's size from this budget first and waits while the packs
//! in progress would pass it; turns are first come, first served, and a
//! pack larger than the whole budget waits until no other is in progress,
//! then runs alone. A payload handed back to the caller (to store or write)
//! no longer counts, unless the caller keeps the pack's share until it has
//! stored it (`compile::compile_held`, the daemon's workers).

use std::sync::{Condvar, Mutex, MutexGuard};

/// Bytes that packs in progress hold at once, unless [`set_budget`] says
/// otherwise.
pub const DEFAULT_BUDGET: u64 = 512 << 20;

struct State {
    held: u64,
    budget: u64,
    peak: u64,
    /// The next turn to give out, and the turn that may take its share now.
    next: u64,
    serving: u64,
}

static STATE: Mutex<State> = Mutex::new(State {
    held: 0,
    budget: DEFAULT_BUDGET,
    peak: 0,
    next: 0,
    serving: 0,
});
static CHANGED: Condvar = Condvar::new();

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// A share of the budget, given back when dropped.
#[derive(Debug)]
pub struct Share(u64);

/// Takes `bytes` of the budget, in turn, waiting while the packs in
/// progress would pass it (see the module's documentation).
pub fn take(bytes: u64) -> Share {
    let mut s = state();
    let turn = s.next;
    s.next += 1;
    while s.serving != turn || (s.held > 0 && s.held.saturating_add(bytes) > s.budget) {
        s = CHANGED.wait(s).unwrap_or_else(|p| p.into_inner());
    }
    s.serving += 1;
    s.held += bytes;
    s.peak = s.peak.max(s.held);
    drop(s);
    // The next turn may fit beside this one.
    CHANGED.notify_all();
    Share(bytes)
}

impl Share {
    /// Gives back all but `bytes` of the share (what the pack still holds
    /// once its source copy is freed: the payload).
    pub fn shrink_to(&mut self, bytes: u64) {
        let freed = self.0.saturating_sub(bytes);
        if freed > 0 {
            state().held -= freed;
            self.0 -= freed;
            CHANGED.notify_all();
        }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        state().held -= self.0;
        CHANGED.notify_all();
    }
}

/// Sets the budget in bytes (at least 1): for a host whose memory is
/// bounded otherwise, and for tests.
pub fn set_budget(bytes: u64) {
    state().budget = bytes.max(1);
    CHANGED.notify_all();
}

/// The most bytes held at once by packs in this process so far.
pub fn peak() -> u64 {
    state().peak
}
