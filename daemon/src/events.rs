//! The daemon's event feed, followed through the Events RPC: entries added,
//! pack progress and watcher activity. Followers that fall behind miss
//! events rather than slow the daemon down; at most `max_event_subscribers`
//! follow at once, and one uid (other than root and the daemon's own) at
//! most a quarter of them, so one user cannot take every place. Such a
//! follower sees only the events of models it may read (`view.rs`).

use std::sync::Arc;

use ctcache::store::EntryKey;
use tokio::sync::{broadcast, OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};

use crate::jobs::JobProgress;
use crate::shares::{Share, Shares};

/// Events kept for followers that fall behind.
const BACKLOG: usize = 1024;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    EntryAdded,
    JobProgress,
    Watcher,
    /// A hold ended with the connection that held it.
    LeaseEnded,
}

impl EventKind {
    /// The name followers see.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::EntryAdded => "entry_added",
            EventKind::JobProgress => "job_progress",
            EventKind::Watcher => "watcher",
            EventKind::LeaseEnded => "lease_ended",
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

/// The broadcast channel of events, and the places for followers.
pub(crate) struct Events {
    tx: broadcast::Sender<Event>,
    followers: Arc<Semaphore>,
    max_followers: usize,
    /// Each uid's share of the places.
    shares: Shares,
}

/// A follower's subscription; its places are freed when dropped.
pub(crate) struct Subscription {
    pub rx: broadcast::Receiver<Event>,
    _place: OwnedSemaphorePermit,
    _share: Option<Share>,
}

impl Events {
    /// A feed for at most `max_followers` followers at once.
    pub fn new(max_followers: usize) -> Events {
        Events {
            tx: broadcast::channel(BACKLOG).0,
            followers: Arc::new(Semaphore::new(max_followers)),
            max_followers,
            shares: Shares::new((max_followers / 4).max(1)),
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

    /// Follows the feed for `uid` (`None`: a trusted caller, see
    /// `caller::is_trusted_uid`, without a share); RESOURCE_EXHAUSTED when every
    /// place is taken, or the uid holds its share.
    pub fn subscribe(&self, uid: Option<u32>) -> Result<Subscription> {
        let share = match uid {
            None => None,
            Some(uid) => Some(self.shares.take(Some(uid)).flatten().ok_or_else(|| {
                Error::exhausted(format!(
                    "uid {uid} follows events as often as one uid may (a quarter of \
                     max_event_subscribers)"
                ))
            })?),
        };
        let place = self.followers.clone().try_acquire_owned().map_err(|_| {
            Error::exhausted(format!(
                "{} event followers already, the most allowed (max_event_subscribers)",
                self.max_followers
            ))
        })?;
        Ok(Subscription {
            rx: self.tx.subscribe(),
            _place: place,
            _share: share,
        })
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
