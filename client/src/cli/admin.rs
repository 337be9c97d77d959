//! Store maintenance: `gc` and `verify`, through the daemon or, with
//! `--cache-dir`, on a cache dir no daemon holds (opened here directly).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use ctcache::store::{GcPolicy, Store, StoreError};
use serde_json::json;

use super::ctx::Ctx;
use super::format::{self, parse_duration, parse_size, Style, Table};
use super::output::{print_json, say, Failure};
use crate::client::api;

#[derive(Debug, Args)]
pub struct GcArgs {
    /// Evict least recently used entries until the store takes at most this
    /// (10G, 512MiB, 0 = everything not leased).
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    max_size: Option<u64>,
    /// Evict entries not used for this long (7d, 12h, 30m).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    max_age: Option<u64>,
    /// Report what would go; change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Collect this cache dir directly (no daemon may hold it).
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

pub fn gc(ctx: &Ctx, a: GcArgs) -> Result<(), Failure> {
    let resp = match &a.cache_dir {
        Some(dir) => {
            let store = open_offline(dir)?;
            let policy = GcPolicy {
                max_bytes: a.max_size,
                max_age: a.max_age.map(Duration::from_secs),
                orphans: true,
                temp_files: true,
                dry_run: a.dry_run,
            };
            let report = store.gc(&policy)?;
            // The same reason names as the daemon's answer.
            let removed = report
                .items
                .iter()
                .map(|i| api::GcItem {
                    key: match &i.target {
                        ctcache::store::GcTarget::Entry(k) => hex::encode(k.to_bytes()),
                        ctcache::store::GcTarget::File(p) => p.display().to_string(),
                    },
                    bytes: i.bytes_freed,
                    reason: gc_reason(&i.reason).into(),
                })
                .collect();
            api::GcResponse {
                removed,
                bytes_freed: report.bytes_freed,
                dry_run: report.dry_run,
                skipped_leased: report.leased_kept as u32,
            }
        }
        None => {
            let req = api::GcRequest {
                max_bytes: a.max_size.unwrap_or(0),
                max_age_s: a.max_age.unwrap_or(0),
                dry_run: a.dry_run,
                has_max_bytes: a.max_size.is_some(),
            };
            let mut out = None;
            ctx.block_on(async {
                out = Some(ctx.connect().await?.gc(req).await?);
                Ok(())
            })?;
            out.unwrap_or_default()
        }
    };
    print_gc(ctx, &resp, a.cache_dir.as_deref())
}

fn gc_reason(r: &ctcache::store::GcReason) -> &'static str {
    use ctcache::store::GcReason::*;
    match r {
        MaxAge { .. } => "max_age",
        OverBudget => "size_budget",
        MissingPayload => "orphan_entry",
        OrphanPayload | StrayFile => "orphan_file",
        StaleTemp => "temp_file",
    }
}

fn via(cache_dir: Option<&Path>) -> serde_json::Value {
    match cache_dir {
        Some(d) => json!(d),
        None => json!("daemon"),
    }
}

fn print_gc(ctx: &Ctx, r: &api::GcResponse, cache_dir: Option<&Path>) -> Result<(), Failure> {
    if ctx.json {
        return print_json(&json!({
            "via": via(cache_dir),
            "dry_run": r.dry_run,
            "removed": r.removed.iter().map(|i| json!({"key": i.key, "bytes": i.bytes, "reason": i.reason})).collect::<Vec<_>>(),
            "bytes_freed": r.bytes_freed,
            "skipped_leased": r.skipped_leased,
        }));
    }
    if ctx.quiet {
        return Ok(());
    }
    if !r.removed.is_empty() {
        let mut t = Table::new(&["KEY / FILE", "SIZE", "REASON"]);
        for i in &r.removed {
            t.row(vec![
                (format::short_key(&i.key), Style::Plain),
                (format::size(i.bytes), Style::Plain),
                (i.reason.clone(), Style::Dim),
            ]);
        }
        t.print(ctx.color)?;
    }
    let verb = if r.dry_run { "would remove" } else { "removed" };
    let mut line = format!(
        "{verb} {}, {} freed",
        format::count(r.removed.len() as u64, "item", "items"),
        format::size(r.bytes_freed)
    );
    if r.skipped_leased > 0 {
        line.push_str(&format!(
            "; {} kept",
            format::count(r.skipped_leased, "leased entry", "leased entries")
        ));
    }
    say(&line)
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Also repair what differs between files and index (records pointing
    /// nowhere, stray files); damaged payloads are quarantined and orphan
    /// payload files removed in any case.
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
            let v = store.verify(true)?;
            let keys = |missing: bool| -> Vec<String> {
                v.problems
                    .iter()
                    .filter(|p| (p.damage == ctcache::store::Damage::Missing) == missing)
                    .flat_map(|p| p.entries_dropped.iter().map(|k| hex::encode(k.to_bytes())))
                    .collect()
            };
            let mut orphans: Vec<String> = v
                .orphan_files
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            if a.repair {
                let rec = store.reconcile()?;
                orphans.extend(
                    rec.orphan_files_removed
                        .iter()
                        .chain(&rec.stray_files_removed)
                        .map(|p| p.display().to_string()),
                );
            }
            api::VerifyResponse {
                checked: v.blobs_checked,
                bytes_checked: v.bytes_checked,
                corrupt: keys(false),
                missing: keys(true),
                orphans,
                clean: v.problems.is_empty(),
            }
        }
        None => {
            let mut out = None;
            ctx.block_on(async {
                out = Some(ctx.connect().await?.verify(a.repair).await?);
                Ok(())
            })?;
            out.unwrap_or_default()
        }
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
        for k in &r.corrupt {
            say(&format!(
                "{} {k} (payload quarantined, entry dropped)",
                ctx.paint("corrupt", Style::Red)
            ))?;
        }
        for k in &r.missing {
            say(&format!(
                "{} {k} (payload file gone, entry dropped)",
                ctx.paint("missing", Style::Red)
            ))?;
        }
        for f in &r.orphans {
            say(&format!(
                "{} {f} (removed)",
                ctx.paint("orphan", Style::Yellow)
            ))?;
        }
        if !ctx.quiet {
            say(&format!(
                "{} payload file(s) checked, {}",
                r.checked,
                format::size(r.bytes_checked)
            ))?;
        }
    }
    if r.clean {
        Ok(())
    } else {
        Err(Failure::Failed(format!(
            "store damaged: {} corrupt, {} missing payload(s); the entries were dropped and will be packed again",
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
