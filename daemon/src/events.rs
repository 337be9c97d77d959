//! The daemon's event feed, followed through the Events RPC: entries added,
//! pack progress and watcher activity. Followers that fall behind miss
//! events rather than slow the daemon down.

use ctcache::store::EntryKey;
use tokio::sync::broadcast;

use crate::jobs::JobProgress;

/// Events kept for followers that fall behind.
const BACKLOG: usize = 1024;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    EntryAdded,
    JobProgress,
    Watcher,
}

impl EventKind {
    /// The name followers see.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::EntryAdded => "entry_added",
            EventKind::JobProgress => "job_progress",
            EventKind::Watcher => "watcher",
        }
    }
}

/// One event.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub unix_ms: i64,
    pub kind: EventKind,
    pub key: Option<EntryKey>,
    pub model_path: String,
    pub detail: String,
    pub progress: Option<JobProgress>,
}

/// The broadcast channel of events.
pub(crate) struct Events {
    tx: broadcast::Sender<Event>,
}

impl Events {
    pub fn new() -> Events {
        Events {
            tx: broadcast::channel(BACKLOG).0,
        }
    }

    /// Publishes an event (dropped when nobody follows).
    pub fn emit(&self, kind: EventKind, key: Option<EntryKey>, model_path: String, detail: String) {
        self.publish(Event {
            unix_ms: now_ms(),
            kind,
            key,
            model_path,
            detail,
            progress: None,
        });
    }

    pub fn publish(&self, event: Event) {
        let _ = self.tx.send(event);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
