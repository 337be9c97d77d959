//! A form's fetch from the fleet tier, one per form at a time: a compile's
//! and a `remote pull`'s of one form share it, and it stops once neither
//! waits any more (nothing of the form published).

use std::sync::Arc;

use ctcache::store::{Entry, EntryKey};
use futures_util::future::FutureExt;

use super::super::{blocking, Result};
use crate::fleet::FormShape;
use crate::flights::Abandon;
use crate::state::Daemon;

/// The form `key` of the model at `path` (for the log), fetched whole
/// (`None`: not taken); joins the fetch of `key` under way. The caller
/// asked [`crate::fleet::Fleet::asks_for_forms`].
pub(super) async fn fetched(
    d: &Arc<Daemon>,
    (key, shape): (EntryKey, FormShape),
    path: String,
) -> Result<Option<Entry>> {
    let (d2, model) = (d.clone(), path.clone());
    let (flight, under_way) = d
        .form_fetches
        .join_or_start(key, move || fetch(d2, (key, shape), path).boxed());
    if under_way {
        joins(&key, &model);
    }
    flight.await
}

/// The fetch of form `key` of the model at `path` under way (a `remote
/// pull`'s, where the daemon's `fetch` asks nothing itself), awaited;
/// `None` when there is none.
pub(super) async fn under_way(
    d: &Daemon,
    key: &EntryKey,
    path: &str,
) -> Option<Result<Option<Entry>>> {
    let flight = d.form_fetches.under_way(key)?;
    joins(key, path);
    Some(flight.await)
}

/// Logs that a request takes the fetch of `key` under way.
fn joins(key: &EntryKey, model: &str) {
    tracing::info!(%key, %model, "joins the fleet fetch of the form under way");
}

/// One fetch, on a blocking thread; it stops when its future is dropped.
async fn fetch(
    d: Arc<Daemon>,
    (key, shape): (EntryKey, FormShape),
    path: String,
) -> Result<Option<Entry>> {
    let abandon = Abandon::new(format!("the fleet fetch of form {key}"));
    let gone = abandon.gone();
    let model = path.clone();
    let form = blocking(move || {
        let Some(fleet) = &d.fleet else {
            return Ok(None);
        };
        Ok(fleet.fetch_form(&d.store, (&key, shape), &path, &gone)?)
    })
    .await;
    abandon.finished();
    let form = form?;
    if let Some(e) = &form {
        tracing::info!(key = %e.key, model = %model, "form fetched from the fleet");
    }
    Ok(form)
}
