//! The bar `ctcachectl materialize` shows on a terminal while the daemon
//! packs for it: the daemon's `job_progress` events about the model,
//! followed for the length of the call. Nothing shows for a warm call (no
//! job event comes) or off a terminal.

use ctcache_client::{absolute, Client};
use indicatif::ProgressBar;

use crate::ctx::Ctx;

/// Follows the daemon's job events about `model` and draws them; never
/// returns (the caller drops it when its call ends). Without a terminal,
/// or when the daemon's events cannot be followed, it only waits.
pub(super) async fn follow(
    ctx: &Ctx,
    c: &Client,
    model: &std::path::Path,
    bar: &mut Option<ProgressBar>,
) {
    let events = match crate::jobs::shows_progress(ctx) {
        true => c.events().await.ok(),
        false => None,
    };
    let path = absolute(model).map(|p| p.display().to_string());
    if let (Some(mut events), Ok(path)) = (events, path) {
        while let Ok(Some(e)) = events.next().await {
            let Some(p) = e
                .progress
                .filter(|_| e.kind == "job_progress" && e.model_path == path)
            else {
                continue;
            };
            let bar = bar.get_or_insert_with(|| crate::jobs::progress_bar(ctx));
            bar.set_length(p.total.into());
            bar.set_position(p.done.into());
            bar.set_message(format!("{} {}", p.initializer, e.detail));
        }
    }
    std::future::pending::<()>().await
}
