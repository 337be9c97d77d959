//! Store maintenance: `gc` and `verify`, through the daemon or, with
//! `--cache-dir`, on a cache dir no daemon holds (opened here directly).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use ctcache::store::{GcPolicy, Store, StoreError};
use serde_json::json;

use crate::ctx::Ctx;
use crate::human::{self, parse_duration, parse_size, BadValue, Style, Table};
use crate::output::{print_json, say, Failure};
use ctcache_client::api;
use ctcache_convert as convert;

#[derive(Debug, Args)]
#[command(after_help = "\
A limit left out is the daemon's configured one (gc_max_bytes, by default half the cache's \
file system; gc_max_age_secs; `ctcachectl status` shows them). Offline (--cache-dir) only \
the limits given apply; with none, only leftovers (orphan and stale temp files) go, and gc \
says so. Leased entries always stay. \
A gc that would remove every entry asks first on a terminal and needs --yes otherwise.")]
pub struct GcArgs {
    /// Evict least recently used entries until the store takes at most SIZE
    /// (10G, 512MiB; 0 is refused: --all removes every entry).
    #[arg(long, value_parser = parse_limit_size, value_name = "SIZE")]
    max_size: Option<u64>,
    /// Evict entries not used for DURATION or longer (7d, 12h, 30m; 0 is
    /// refused: --all removes every entry).
    #[arg(long, value_parser = parse_limit_duration, value_name = "DURATION")]
    max_age: Option<u64>,
    /// Remove every entry not leased (needs --yes unless confirmed on a terminal).
    #[arg(long, conflicts_with_all = ["max_size", "max_age"])]
    all: bool,
    /// Confirm a gc that removes every entry (asked on a terminal, refused
    /// without it otherwise).
    #[arg(long)]
    yes: bool,
    /// Report what would go; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Collect this cache dir directly (no daemon may hold it; no configured
    /// budget applies).
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

/// A `--max-size`: a size, not 0 (which once meant "none" in the config and
/// "everything" here).
fn parse_limit_size(s: &str) -> Result<u64, BadValue> {
    match parse_size(s)? {
        0 => Err(BadValue(ZERO_LIMIT.into())),
        n => Ok(n),
    }
}

fn parse_limit_duration(s: &str) -> Result<u64, BadValue> {
    match parse_duration(s)? {
        0 => Err(BadValue(ZERO_LIMIT.into())),
        n => Ok(n),
    }
}

const ZERO_LIMIT: &str = "0 is not a limit: leave the option out for the configured budget, \
                          or give --all to remove every entry not leased";

pub fn gc(ctx: &Ctx, a: GcArgs) -> Result<(), Failure> {
    // --all: a budget of nothing.
    let max_bytes = if a.all { Some(0) } else { a.max_size };
    let run = |dry_run: bool| -> Result<api::GcResponse, Failure> {
        match &a.cache_dir {
            Some(dir) => {
                let store = open_offline(dir)?;
                let policy = GcPolicy {
                    max_bytes,
                    max_age: a.max_age.map(Duration::from_secs),
                    max_bytes_per_uid: None,
                    orphans: true,
                    temp_files: true,
                    dry_run,
                };
                Ok(convert::gc(&store.gc(&policy)?))
            }
            None => {
                let req = api::GcRequest {
                    max_bytes: max_bytes.unwrap_or(0),
                    max_age_s: a.max_age.unwrap_or(0),
                    dry_run,
                    has_max_bytes: max_bytes.is_some(),
                    has_max_age_s: a.max_age.is_some(),
                };
                ctx.block_on(async { Ok(ctx.connect().await?.gc(req).await?) })
            }
        }
    };
    if !a.dry_run && !a.yes {
        // A gc that would remove every entry is confirmed first.
        let plan = run(true)?;
        let entries = plan
            .removed
            .iter()
            .filter(|i| !matches!(i.reason.as_str(), "orphan_file" | "temp_file"))
            .count();
        if entries > 0 && plan.skipped_leased == 0 && plan.bytes_after == 0 {
            confirm_emptying(ctx, entries as u64, plan.bytes_freed)?;
        }
    }
    let resp = run(a.dry_run)?;
    print_gc(ctx, &resp, a.cache_dir.as_deref())
}

/// Asks on a terminal whether to remove every entry; refuses otherwise.
fn confirm_emptying(ctx: &Ctx, entries: u64, bytes: u64) -> Result<(), Failure> {
    use std::io::{BufRead, IsTerminal, Write};
    let what = format!(
        "this gc would remove every entry ({}, {}): the store would be empty",
        human::count(entries, "entry", "entries"),
        human::size(bytes)
    );
    if !std::io::stdin().is_terminal() || ctx.json {
        let why = if ctx.json {
            "--json output does not ask"
        } else {
            "stdin is not a terminal, so gc does not ask"
        };
        return Err(Failure::Failed(format!(
            "{what}; add --yes to confirm ({why})"
        )));
    }
    eprint!("ctcachectl: {what}. Remove them? [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
        Ok(())
    } else {
        Err(Failure::Failed("gc cancelled: nothing removed".into()))
    }
}

fn via(cache_dir: Option<&Path>) -> serde_json::Value {
    match cache_dir {
        Some(d) => json!(d),
        None => json!("daemon"),
    }
}

/// The words people read for a gc reason.
fn reason_text(reason: &str) -> &str {
    match reason {
        "size_budget" => "over the size budget",
        "uid_quota" => "over its uid's quota",
        "max_age" => "unused too long",
        "orphan_entry" => "payload file missing",
        "orphan_file" => "payload file without entry",
        "temp_file" => "stale temp file",
        other => other,
    }
}

/// A list of names for a table cell: `-` when empty.
fn names(v: &[String]) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.join(", ")
    }
}

fn print_gc(ctx: &Ctx, r: &api::GcResponse, cache_dir: Option<&Path>) -> Result<(), Failure> {
    if ctx.json {
        return print_json(&json!({
            "via": via(cache_dir),
            "dry_run": r.dry_run,
            "max_bytes": r.max_bytes,
            "max_age_s": r.max_age_s,
            "removed": r.removed.iter().map(|i| json!({
                "key": i.key, "bytes": i.bytes, "reason": i.reason,
                "physical_type": i.physical_type,
                "source_names": i.source_names, "model_paths": i.model_paths,
            })).collect::<Vec<_>>(),
            "bytes_freed": r.bytes_freed,
            "bytes_before": r.bytes_before,
            "bytes_after": r.bytes_after,
            "bytes_still_linked": r.bytes_still_linked,
            "skipped_leased": r.skipped_leased,
        }));
    }
    if ctx.quiet {
        return Ok(());
    }
    if r.max_bytes.is_none() && r.max_age_s.is_none() {
        say(
            "no gc budget is set: give --max-size or --max-age, or set gc_max_bytes / \
             gc_max_age_secs in ctcached.toml; only leftover files are collected",
        )?;
    }
    // Entries carry what they were packed from; leftover files their path.
    let (files, mut entries): (Vec<&api::GcItem>, Vec<&api::GcItem>) = r
        .removed
        .iter()
        .partition(|i| matches!(i.reason.as_str(), "orphan_file" | "temp_file"));
    entries.sort_by(|a, b| {
        (&a.model_paths, &a.source_names, &a.physical_type).cmp(&(
            &b.model_paths,
            &b.source_names,
            &b.physical_type,
        ))
    });
    if !entries.is_empty() {
        let mut t = Table::new(&["MODEL", "INITIALIZER", "PHYSICAL TYPE", "SIZE", "REASON"]);
        for i in &entries {
            t.row(vec![
                (names(&i.model_paths), Style::Plain),
                (names(&i.source_names), Style::Plain),
                (i.physical_type.clone(), Style::Plain),
                (human::size(i.bytes), Style::Plain),
                (reason_text(&i.reason).to_string(), Style::Dim),
            ]);
        }
        t.print(ctx.color)?;
    }
    for f in &files {
        say(&format!(
            "{} {} ({}, {})",
            ctx.paint("leftover", Style::Yellow),
            f.key,
            human::size(f.bytes),
            reason_text(&f.reason)
        ))?;
    }
    let mut line = format!(
        "{}{}, {} freed, store {} -> {}",
        if r.dry_run { "would remove " } else { "" },
        human::count(entries.len() as u64, "entry", "entries"),
        human::size(r.bytes_freed),
        human::size(r.bytes_before),
        human::size(r.bytes_after),
    );
    if !files.is_empty() {
        line.push_str(&format!(
            "; {}",
            human::count(files.len() as u64, "leftover file", "leftover files")
        ));
    }
    if r.bytes_still_linked > 0 {
        line.push_str(&format!(
            "; {} stay on disk through hard links outside the store (--link hard models)",
            human::size(r.bytes_still_linked)
        ));
    }
    if r.skipped_leased > 0 {
        line.push_str(&format!(
            "; {} kept",
            human::count(r.skipped_leased, "leased entry", "leased entries")
        ));
    }
    if r.dry_run {
        line.push_str(" (dry run: nothing changed)");
    }
    say(&line)
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Also repair: damaged payloads are quarantined (their entries dropped),
    /// orphan payload files removed, files and index reconciled. Without
    /// it the store is not changed, only reported on.
    #[arg(long)]
    repair: bool,
    /// Verify this cache dir directly (no daemon may hold it).
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

/// Exit 1 when damage was found (and quarantined), so scripts notice.
pub fn verify(ctx: &Ctx, a: VerifyArgs) -> Result<(), Failure> {
    let r = match &a.cache_dir {
        Some(dir) => {
            let store = open_offline(dir)?;
            let v = store.verify(a.repair)?;
            let repaired = if a.repair {
                Some(store.reconcile()?)
            } else {
                None
            };
            convert::verify(&v, repaired.as_ref())
        }
        None => ctx.block_on(async { Ok(ctx.connect().await?.verify(a.repair).await?) })?,
    };
    if ctx.json {
        print_json(&json!({
            "via": via(a.cache_dir.as_deref()),
            "checked": r.checked,
            "bytes_checked": r.bytes_checked,
            "corrupt": r.corrupt,
            "missing": r.missing,
            "orphans": r.orphans,
            "clean": r.clean,
        }))?;
    } else {
        let (dropped, removed) = if r.repaired {
            ("payload quarantined, entry dropped", "removed")
        } else {
            (
                "not changed: --repair drops it",
                "not changed: --repair removes it",
            )
        };
        for k in &r.corrupt {
            say(&format!(
                "{} {k} ({dropped})",
                ctx.paint("corrupt", Style::Red)
            ))?;
        }
        for k in &r.missing {
            say(&format!(
                "{} {k} (payload file gone; {dropped})",
                ctx.paint("missing", Style::Red)
            ))?;
        }
        for f in &r.orphans {
            say(&format!(
                "{} {f} ({removed})",
                ctx.paint("orphan", Style::Yellow)
            ))?;
        }
        if !ctx.quiet {
            say(&format!(
                "{} payload file(s) checked, {}",
                r.checked,
                human::size(r.bytes_checked)
            ))?;
        }
    }
    if r.clean {
        Ok(())
    } else {
        let then = if r.repaired {
            "the entries were dropped and will be packed again"
        } else {
            "nothing changed; the daemon checks every serve, so their next serve drops them and packs them again; --repair drops them now"
        };
        Err(Failure::Failed(format!(
            "store damaged: {} corrupt, {} missing payload(s); {then}",
            r.corrupt.len(),
            r.missing.len()
        )))
    }
}

/// Opens a cache dir for offline maintenance; refuses a dir a daemon holds.
fn open_offline(dir: &Path) -> Result<Store, Failure> {
    if !dir.is_dir() {
        return Err(Failure::Failed(format!(
            "{}: no such cache dir",
            dir.display()
        )));
    }
    Store::open(dir, Default::default()).map_err(|e| match e {
        StoreError::Locked { dir, pid } => Failure::Failed(format!(
            "cache dir {} is held by a running daemon{}: run the command without --cache-dir to have \
             the daemon do it, or stop the daemon first",
            dir.display(),
            pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
        )),
        other => other.into(),
    })
}
