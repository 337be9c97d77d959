//! The model-directory watcher (notify + notify-debouncer-full): recursive
//! watches; new, changed and renamed `.onnx` files and changes of their
//! external data trigger the policy's prepacks once the file is stable.
//! Deleting a model leaves its entries in place (they are keyed by content).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use notify::{EventKind, RecursiveMode};
use notify_debouncer_full::{new_debouncer, DebounceEventResult, Debouncer, RecommendedCache};

use crate::daemon::{Daemon, OpError, OpResult};
use crate::scheduler::Priority;

type Watcher = Debouncer<notify::RecommendedWatcher, RecommendedCache>;

/// The live watcher and the queue of paths to look at.
pub struct Watching {
    debouncer: Mutex<Watcher>,
    queue: mpsc::Sender<PathBuf>,
}

static WATCHING: OnceLock<Watching> = OnceLock::new();

fn is_model(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "onnx")
}

/// Starts the watcher and the scan thread, then watches and scans every
/// configured folder.
pub fn start(d: &Arc<Daemon>) -> OpResult<()> {
    let (tx, rx) = mpsc::channel::<PathBuf>();
    let events_tx = tx.clone();
    let debouncer = new_debouncer(
        Duration::from_millis(300),
        None,
        move |res: DebounceEventResult| match res {
            Ok(events) => {
                for e in events {
                    if matches!(e.kind, EventKind::Access(_)) {
                        continue;
                    }
                    metrics::counter!("ctcache_watcher_events_total").increment(1);
                    for p in &e.paths {
                        let _ = events_tx.send(p.clone());
                    }
                }
            }
            Err(errors) => {
                for e in errors {
                    tracing::warn!(error = %e, "watcher error");
                }
            }
        },
    )
    .map_err(|e| OpError::Internal(format!("cannot start the watcher: {e}")))?;
    if WATCHING
        .set(Watching {
            debouncer: Mutex::new(debouncer),
            queue: tx,
        })
        .is_err()
    {
        return Err(OpError::Internal("the watcher is already running".into()));
    }
    let daemon = d.clone();
    std::thread::Builder::new()
        .name("ctcache-watch".into())
        .spawn(move || scan_loop(daemon, rx))
        .map_err(|e| OpError::Internal(e.to_string()))?;
    let dirs: Vec<PathBuf> = d
        .watches
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .cloned()
        .collect();
    for dir in dirs {
        if let Err(e) = watch_dir(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch");
        }
    }
    Ok(())
}

fn watch_dir(dir: &Path) -> OpResult<()> {
    let w = WATCHING
        .get()
        .ok_or_else(|| OpError::FailedPrecondition("the watcher is not running".into()))?;
    w.debouncer
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .watch(dir, RecursiveMode::Recursive)
        .map_err(|e| OpError::InvalidArgument(format!("cannot watch {}: {e}", dir.display())))?;
    // Existing models are scanned too (start-up and new watches).
    let _ = w.queue.send(dir.to_path_buf());
    Ok(())
}

/// Adds a watched folder (also recorded for the session).
pub fn add(d: &Daemon, dir: &Path) -> OpResult<()> {
    let dir = dir
        .canonicalize()
        .map_err(|e| OpError::InvalidArgument(format!("{}: {e}", dir.display())))?;
    if d.watches
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&dir)
    {
        return Ok(());
    }
    watch_dir(&dir)?;
    d.watches
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(dir.clone());
    d.emit(
        "watcher",
        String::new(),
        dir.display().to_string(),
        "watch added".into(),
        None,
    );
    Ok(())
}

pub fn remove(d: &Daemon, dir: &Path) -> OpResult<()> {
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let mut watches = d.watches.lock().unwrap_or_else(|e| e.into_inner());
    let key = if watches.contains(&canonical) {
        canonical
    } else {
        dir.to_path_buf()
    };
    if !watches.remove(&key) {
        return Err(OpError::NotFound(format!(
            "{} is not watched",
            dir.display()
        )));
    }
    if let Some(w) = WATCHING.get() {
        let _ = w
            .debouncer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwatch(&key);
    }
    d.emit(
        "watcher",
        String::new(),
        key.display().to_string(),
        "watch removed".into(),
        None,
    );
    Ok(())
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
                    d.emit(
                        "watcher",
                        String::new(),
                        p.display().to_string(),
                        "model removed; its entries stay until gc".into(),
                        None,
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
                d.emit(
                    "watcher",
                    String::new(),
                    m.display().to_string(),
                    format!("skipped: {e}"),
                    None,
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

/// Waits until size and mtime stop changing (a writer may still be copying).
fn wait_stable(p: &Path, stable: Duration) -> bool {
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut last = crate::memo::FileId::of(p).ok();
    loop {
        std::thread::sleep(stable.max(Duration::from_millis(20)));
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

fn consider(d: &Arc<Daemon>, path: &Path, stable: Duration) -> OpResult<()> {
    if !wait_stable(path, stable) {
        return Ok(());
    }
    let canonical = path
        .canonicalize()
        .map_err(|e| OpError::NotFound(e.to_string()))?;
    let model = ctcache::onnx::Model::open(&canonical)?;
    let sel = crate::policy::select(&model, &d.config.policy)?;
    let jobs = d.prepack_model(&canonical, &model, &sel.wanted, Priority::Watcher)?;
    d.emit(
        "watcher",
        String::new(),
        canonical.display().to_string(),
        format!(
            "{} pack job(s) for {} wanted pair(s)",
            jobs.iter().filter(|(_, h)| !h.joined).count(),
            sel.wanted.len()
        ),
        None,
    );
    Ok(())
}
