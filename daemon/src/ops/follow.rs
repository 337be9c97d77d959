//! The Events use case: follow the daemon's event feed, seeing only what the
//! caller may see.

use std::sync::Arc;

use tokio::sync::{broadcast, mpsc, watch};

use super::{blocking, Result};
use crate::caller::Caller;
use crate::events::Event;
use crate::state::Daemon;
use crate::view::View;

/// Events buffered for a follower before it is waited for.
const BUFFERED: usize = 256;

/// The events from now on that `caller` may see, until it stops reading,
/// the feed closes or `shutdown` turns true. A follower takes a place among
/// `max_event_subscribers` (and its uid's share of them) for as long as it
/// follows; one that reads too slowly misses events rather than stalling
/// the others.
pub(crate) fn follow(
    d: &Arc<Daemon>,
    caller: &Caller,
    mut shutdown: watch::Receiver<bool>,
) -> Result<mpsc::Receiver<Event>> {
    let sub = d.events.subscribe(caller.bounded_uid())?;
    let view = View::of(caller);
    let (tx, rx) = mpsc::channel(BUFFERED);
    tokio::spawn(async move {
        let stopped = async move {
            let _ = shutdown.wait_for(|s| *s).await.is_ok();
        };
        tokio::pin!(stopped);
        // The whole subscription (and so its place) lives as long as the
        // task: moved in whole, not only the receiver the loop names.
        let mut sub = sub;
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                _ = tx.closed() => break,
                e = sub.rx.recv() => match e {
                    Ok(e) => {
                        let shown = if view.sees_all() {
                            Some(e)
                        } else {
                            // Judging takes file system calls.
                            let v = view.clone();
                            blocking(move || Ok(v.event(e))).await.ok().flatten()
                        };
                        if let Some(e) = shown {
                            if tx.send(e).await.is_err() {
                                break;
                            }
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => break,
                },
            }
        }
    });
    Ok(rx)
}
