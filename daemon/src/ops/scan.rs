//! The watcher's use case: paths the watcher reports become models to
//! (re)consider; once a model file is stable, the policy's prepacks are
//! submitted at watcher priority. Deleting a model leaves its entries in
//! place (they are keyed by content).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pack::{self, BackendRequest};
use super::{Error, Result};
use crate::events::EventKind;
use crate::scheduler::Priority;
use crate::state::Daemon;

fn is_model(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "onnx")
}

/// Starts the watcher over the configured folders and the thread that
/// scans what it reports (it ends when the watcher stops).
pub(crate) fn start(d: &Arc<Daemon>) -> Result<()> {
    let (tx, rx) = mpsc::channel::<PathBuf>();
    let daemon = d.clone();
    std::thread::Builder::new()
        .name("ctcache-watch".into())
        .spawn(move || scan_loop(daemon, rx))
        .map_err(|e| Error::internal(e.to_string()))?;
    d.watcher.start(tx)
}

/// Turns event paths into models to (re)consider, waits for stability, and
/// submits the policy's prepacks.
fn scan_loop(d: Arc<Daemon>, rx: mpsc::Receiver<PathBuf>) {
    let stable = Duration::from_secs_f64(d.config.stable_secs);
    while let Ok(first) = rx.recv() {
        // Gather a burst of paths, then handle each model once.
        let mut paths = vec![first];
        while let Ok(p) = rx.recv_timeout(Duration::from_millis(50)) {
            paths.push(p);
        }
        let mut models = HashSet::new();
        for p in paths {
            if p.is_dir() {
                models.extend(walk_models(&p));
            } else if is_model(&p) {
                if p.exists() {
                    models.insert(p);
                } else {
                    d.memo.forget(&p);
                    d.events.emit(
                        EventKind::Watcher,
                        None,
                        p.display().to_string(),
                        "model removed; its entries stay until gc".into(),
                    );
                }
            } else if let Some(dir) = p.parent() {
                // An external-data file changed: reconsider the models beside it.
                models.extend(walk_shallow(dir));
            }
        }
        for m in models {
            if let Err(e) = consider(&d, &m, stable) {
                tracing::warn!(model = %m.display(), error = %e, "watched model not prepacked");
                d.events.emit(
                    EventKind::Watcher,
                    None,
                    m.display().to_string(),
                    format!("skipped: {e}"),
                );
            }
        }
    }
}

fn walk_shallow(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| is_model(p) && p.is_file())
                .collect()
        })
        .unwrap_or_default()
}

fn walk_models(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t) if t.is_file() && is_model(&p) => out.push(p),
                _ => {}
            }
        }
    }
    out
}

/// Waits until size and mtime stop changing (a writer may still be
/// copying); false when the file went away, took too long, or the watcher
/// stopped meanwhile.
fn wait_stable(d: &Daemon, p: &Path, stable: Duration) -> bool {
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut last = crate::memo::FileId::of(p).ok();
    loop {
        std::thread::sleep(stable.max(Duration::from_millis(20)));
        if !d.watcher.is_running() {
            return false;
        }
        let now = crate::memo::FileId::of(p).ok();
        if now.is_none() {
            return false;
        }
        if now == last {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        last = now;
    }
}

fn consider(d: &Arc<Daemon>, path: &Path, stable: Duration) -> Result<()> {
    if !wait_stable(d, path, stable) {
        return Ok(());
    }
    let canonical = path
        .canonicalize()
        .map_err(|e| Error::not_found(e.to_string()))?;
    let model = ctcache::onnx::Model::open(&canonical)?;
    let sel = crate::policy::select(&model, &d.config.policy)?;
    let jobs = pack::submit_all(
        d,
        &canonical,
        &model,
        &sel.wanted,
        (None, Priority::Watcher),
        BackendRequest::Auto,
    )?;
    d.events.emit(
        EventKind::Watcher,
        None,
        canonical.display().to_string(),
        format!(
            "{} pack job(s) for {} wanted pair(s)",
            jobs.iter().filter(|(_, h)| !h.joined).count(),
            sel.wanted.len()
        ),
    );
    Ok(())
}
