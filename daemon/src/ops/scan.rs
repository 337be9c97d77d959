//! The watcher's use case: paths the watcher reports become models to
//! (re)consider; once a model file is stable, the policy's prepacks are
//! submitted at watcher priority, and one log line per model says how they
//! ended. Deleting a model leaves its entries in place (they are keyed by
//! content).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctcache::forms;
use ctcache::fsutil::FileStamp;
use ctcache::onnx::Storage;

use super::compile;
use super::model::{self, OpenedModel};
use super::pack::{self, BackendRequest};
use super::{Error, Result};
use crate::error::ErrorKind;
use crate::events::EventKind;
use crate::jobs::Jobs;
use crate::scheduler::{JobState, Priority};
use crate::state::Daemon;
use crate::watcher::{Changes, Owner};

fn is_model(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "onnx")
}

/// Starts the watcher over the configured folders and the thread that
/// scans what it reports (it ends when the watcher stops).
pub(crate) fn start(d: &Arc<Daemon>) -> Result<()> {
    let changes = Arc::new(Changes::default());
    let (daemon, taken) = (d.clone(), changes.clone());
    // The jobs' ends are awaited on the daemon's runtime.
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|e| Error::internal(format!("the watcher needs the daemon's runtime: {e}")))?;
    std::thread::Builder::new()
        .name("ctcache-watch".into())
        .spawn(move || scan_loop(daemon, taken, runtime))
        .map_err(|e| Error::internal(e.to_string()))?;
    d.watcher.start(changes)
}

/// How long the rest of a burst of changes is gathered before a scan: in an
/// event storm, folders are scanned at most this often.
const GATHER: Duration = Duration::from_millis(50);

/// The paths changed since the last call, waiting at most `wait` (without
/// end for `None`) for a first one; every watched folder where the watcher
/// lost changes. `None` once the watcher stopped.
fn next_changes(d: &Daemon, changes: &Changes, wait: Option<Duration>) -> Option<Vec<PathBuf>> {
    let mut changed = changes.take(wait)?;
    if !changed.paths.is_empty() || changed.rescan {
        std::thread::sleep(GATHER);
        let more = changes.take(Some(Duration::ZERO))?;
        changed.paths.extend(more.paths);
        changed.rescan |= more.rescan;
    }
    if changed.rescan {
        tracing::info!("the watcher lost changes; every watched folder is scanned");
        changed
            .paths
            .extend(d.watcher.dirs_with_uids().into_iter().map(|(dir, _)| dir));
    }
    Some(changed.paths)
}

/// A model seen changing: considered once its stamp has held for the
/// stability period, or dropped when it never holds.
struct Settling {
    stamp: FileStamp,
    changed: Instant,
    first: Instant,
}

/// The longest a model may keep changing before it is passed over (until
/// its next change).
const MAX_SETTLING: Duration = Duration::from_secs(600);

/// A user's model whose jobs did not fit that user's share of the queue is
/// tried again this many stability periods later (30 s by default), at
/// most [`MAX_RETRIES`] times.
const RETRY_PERIODS: u32 = 100;
const MAX_RETRIES: u32 = 20;

/// Turns event paths into models to (re)consider and submits the policy's
/// prepacks for each once it is stable. Models settle side by side: one
/// that keeps changing (a slow copy, or a user touching a file on purpose)
/// holds up no other.
fn scan_loop(d: Arc<Daemon>, changes: Arc<Changes>, runtime: tokio::runtime::Handle) {
    let stable = Duration::from_secs_f64(d.config.stable_secs).max(Duration::from_millis(20));
    let retry_after = stable * RETRY_PERIODS;
    let mut settling: HashMap<PathBuf, Settling> = HashMap::new();
    // User's models waiting for room in the queue: when to try, tries so far.
    let mut deferred: HashMap<PathBuf, (Instant, u32)> = HashMap::new();
    loop {
        // Without end while nothing settles or waits, else until the next
        // stability check or retry.
        let wait = if !settling.is_empty() {
            Some(stable)
        } else {
            deferred
                .values()
                .map(|(at, _)| at.saturating_duration_since(Instant::now()))
                .min()
        };
        let Some(paths) = next_changes(&d, &changes, wait) else {
            return;
        };
        let now = Instant::now();
        for m in models_of(&d, paths) {
            if let Ok(stamp) = FileStamp::of_path(&m) {
                settling.entry(m).or_insert(Settling {
                    stamp,
                    changed: now,
                    first: now,
                });
            }
        }
        if !d.watcher.is_running() {
            return;
        }
        let mut due = settled(&mut settling, now, stable);
        let tries: HashMap<PathBuf, u32> = deferred
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(m, (_, n))| (m.clone(), *n))
            .collect();
        deferred.retain(|m, _| !tries.contains_key(m));
        due.extend(tries.keys().cloned());
        for m in due {
            let Err(e) = consider(&d, &m, &runtime) else {
                continue;
            };
            let tried = tries.get(&m).copied().unwrap_or(0) + 1;
            let user = matches!(d.watcher.owner_of(&m), Some(Owner::User(_)));
            if user && e.kind == ErrorKind::QueueFull && tried <= MAX_RETRIES {
                deferred.insert(m.clone(), (now + retry_after, tried));
                d.events.emit(
                    EventKind::Watcher,
                    None,
                    m.display().to_string(),
                    format!(
                        "waiting ({e}); tried again in {:.1} s",
                        retry_after.as_secs_f64()
                    ),
                );
                continue;
            }
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

/// The models event `paths` concern (a folder's models, a model, the
/// models beside a changed data file) that the watch's owner may list;
/// removed models are reported and forgotten.
fn models_of(d: &Daemon, paths: Vec<PathBuf>) -> HashSet<PathBuf> {
    let mut models = HashSet::new();
    for p in paths {
        if !owner_may_list(d, &p) {
            continue;
        }
        if p.is_dir() {
            // A user's watch covers its folder alone (see watcher.rs): a
            // subfolder of it is not walked.
            match d.watcher.owner_of(&p) {
                Some(Owner::User(_)) => models.extend(walk_shallow(d, &p)),
                _ => models.extend(walk_models(&p)),
            }
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
            // Another file changed: reconsider the models beside it that
            // read their external data from it (a note or a log file
            // beside models is no reason to read them again).
            models.extend(
                walk_shallow(d, dir)
                    .into_iter()
                    .filter(|m| reads_from(d, m, &p)),
            );
        }
    }
    models.retain(|m| owner_may_list(d, m));
    models
}

/// Whether the watched model at `model` keeps external data in `file`. A
/// model that cannot be opened does not (it is reconsidered when it
/// changes itself).
fn reads_from(d: &Daemon, model: &Path, file: &Path) -> bool {
    let (Ok(Some((m, _))), Some(dir)) = (open_watched(d, model), model.parent()) else {
        return false;
    };
    m.model.initializers().is_ok_and(|tensors| {
        tensors.iter().any(|t| match &t.storage {
            Storage::External(loc) => loc.file_in(dir).is_some_and(|f| f == file),
            _ => false,
        })
    })
}

/// Takes out of `settling` the models whose stamp has held for `stable`
/// (a writer may still be copying until then); drops those gone, and those
/// still changing after [`MAX_SETTLING`].
fn settled(
    settling: &mut HashMap<PathBuf, Settling>,
    now: Instant,
    stable: Duration,
) -> Vec<PathBuf> {
    let mut ready = Vec::new();
    settling.retain(|p, s| {
        let Ok(stamp) = FileStamp::of_path(p) else {
            return false;
        };
        if stamp != s.stamp {
            s.stamp = stamp;
            s.changed = now;
            let keeps = now.duration_since(s.first) <= MAX_SETTLING;
            if !keeps {
                tracing::warn!(model = %p.display(), "still changing after 600 s; passed over");
            }
            return keeps;
        }
        if now.duration_since(s.changed) >= stable {
            ready.push(p.clone());
            return false;
        }
        true
    });
    ready
}

/// Whether the owner of the watch that reports `p` may list the folder `p`
/// is in (`p` itself for a folder). The watcher walks and is told about a
/// user's watched tree with the daemon's rights; what lies in folders that
/// user may not list (under a watch of `/`, say) is neither read nor named
/// in an event.
fn owner_may_list(d: &Daemon, p: &Path) -> bool {
    match d.watcher.owner_of(p) {
        Some(Owner::User(who)) => {
            let folder = if p.is_dir() { Some(p) } else { p.parent() };
            folder.is_some_and(|f| who.open_dir(f, ctcache::access::READ).is_ok())
        }
        Some(Owner::Admin) | None => true,
    }
}

/// The models in the folder `dir`, listed through the handle a user's
/// watched folder is held by (the folder that was judged, whatever `dir`
/// leads to now), named under `dir`.
fn walk_shallow(d: &Daemon, dir: &Path) -> Vec<PathBuf> {
    let Some(listed) = d.watcher.listing_path(dir) else {
        return Vec::new();
    };
    std::fs::read_dir(&listed)
        .map(|rd| {
            rd.flatten()
                .filter(|e| is_model(&e.path()) && e.path().is_file())
                .map(|e| dir.join(e.file_name()))
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

/// The watched model at `path`, opened with the rights of its watch's
/// owner, and the uid whose queue bound its jobs wait within (`None`
/// when the model is not to be read: no watch has it, or it is not directly
/// in a user's watched folder).
fn open_watched(d: &Daemon, path: &Path) -> Result<Option<(OpenedModel, Option<u32>)>> {
    // Read with the rights of the watch's owner: a user's watch never
    // packs what that user may not read (a link to another's file).
    let Some(owner) = d.watcher.owner_of(path) else {
        return Ok(None);
    };
    // And its jobs wait as that user's: within max_queued_jobs_per_uid, as
    // the user's own Prepack calls (a folder of many models cannot fill the
    // queue).
    let (m, queue_owner) = match owner {
        // The admin's rights reach only as far as the admin's folders.
        Owner::Admin => (model::open_admin(d, path)?, None),
        Owner::User(who) => {
            let bounded = crate::caller::bounded_uid(who.uid, &d.config.trusted_uids);
            // A user's model is opened in the folder that was judged, through
            // its handle, not along its path (a folder on the way may have
            // been swapped); one not directly in it is not read.
            let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
                return Ok(None);
            };
            let Some(held) = d.watcher.held_folder(dir) else {
                return Ok(None);
            };
            (model::open_in(&held, Path::new(name), path, &who)?, bounded)
        }
    };
    Ok(Some((m, queue_owner)))
}

/// Submits the policy's prepacks of the watched model at `path`.
fn consider(d: &Arc<Daemon>, path: &Path, runtime: &tokio::runtime::Handle) -> Result<()> {
    let Some((m, queue_owner)) = open_watched(d, path)? else {
        return Ok(());
    };
    let sel = crate::policy::select(&m.model, &d.config.policy)?;
    // A user's model submits only the pairs not stored yet (they take
    // places in its share of the queue); the admin's all, so that a job
    // checks each stored payload (and packs a damaged one again).
    let todo = match queue_owner {
        Some(_) => pack::missing(d, queue_owner, &m, &sel.wanted)?,
        None => sel.wanted.clone(),
    };
    let stored = sel.wanted.len() - todo.len();
    let jobs = pack::submit_all(
        d,
        &m,
        &todo,
        (queue_owner, Priority::Watcher),
        BackendRequest::Auto,
    )?;
    d.events.emit(
        EventKind::Watcher,
        None,
        m.path.display().to_string(),
        format!(
            "{} pack job(s) for {} wanted pair(s)",
            jobs.iter().filter(|(_, h)| !h.joined).count(),
            sel.wanted.len()
        ),
    );
    runtime.spawn(log_when_done(m.path.clone(), jobs, stored, Instant::now()));
    // Runtime forms the policy asks for, made before first use.
    for rule in d
        .config
        .policy
        .iter()
        .filter(|r| forms::is_form_type(&r.format))
    {
        runtime.spawn(compile::rules::for_watched(
            d.clone(),
            m.clone(),
            rule.format.clone(),
            rule.params.clone(),
            queue_owner,
        ));
    }
    Ok(())
}

/// Waits for a watched model's jobs and logs one line: what was packed,
/// what was stored already, what failed.
async fn log_when_done(model: PathBuf, jobs: Jobs, stored: usize, started: Instant) {
    let wanted = jobs.len() + stored;
    let (mut packed, mut stored, mut failed) = (0, stored, Vec::new());
    for (w, h) in jobs {
        match h.finished().await {
            JobState::Done(p) if p.cached => stored += 1,
            JobState::Done(_) => packed += 1,
            JobState::Failed(e) => failed.push(format!("{} as {}: {e}", w.initializer, w.format)),
            _ => failed.push(format!("{} as {}: cancelled", w.initializer, w.format)),
        }
    }
    let secs = started.elapsed().as_secs_f64();
    if wanted == 0 {
        tracing::info!(
            "watcher: {}: nothing to pack (no initializer matches the policy)",
            model.display()
        );
    } else if failed.is_empty() {
        tracing::info!(
            "watcher: {}: {packed} packed, {stored} stored already, in {secs:.2} s",
            model.display()
        );
    } else {
        tracing::warn!(
            "watcher: {}: {packed} packed, {stored} stored already, {} failed ({}), in {secs:.2} s",
            model.display(),
            failed.len(),
            failed.join("; ")
        );
    }
}
