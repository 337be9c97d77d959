//! Read-only daemon commands: `status`, `devices`, `ls`, `stat`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde_json::json;

use crate::ctx::Ctx;
use crate::human::{self, Style, Table};
use crate::json;
use crate::output::{print_json, say, Failure};
use ctcache_client::{api, Client};

pub async fn status(ctx: &Ctx) -> Result<(), Failure> {
    let c = ctx.connect().await?;
    let s = c.status().await?;
    let stats = c.stats().await?;
    let lookups = s.hits + s.misses;
    let hit_rate = (lookups > 0).then(|| s.hits as f64 / lookups as f64);
    let usage = |v: &[api::CountBytes]| {
        v.iter()
            .map(|u| json!({"name": u.name, "entries": u.entries, "bytes": u.bytes}))
            .collect::<Vec<_>>()
    };
    if ctx.json {
        return print_json(&json!({
            "version": s.version,
            "pid": s.pid,
            "uptime_s": s.uptime_s,
            "socket": s.socket,
            "cache_dir": s.cache_dir,
            "entries": s.entries,
            "bytes": s.bytes,
            "hits": s.hits,
            "misses": s.misses,
            "hit_rate": hit_rate,
            "jobs_running": s.jobs_running,
            "jobs_queued": s.jobs_queued,
            "active_leases": stats.active_leases,
            "watches": s.watches,
            "gc_max_bytes": s.gc_max_bytes,
            "gc_max_bytes_default": s.gc_max_bytes_default,
            "gc_max_age_s": s.gc_max_age_s,
            "by_format": usage(&stats.by_format),
            "by_device": usage(&stats.by_device),
            "remote": s.remote.as_ref().map(crate::remote::status_json),
            "reconciling": s.reconciling,
            "runtimes": s.runtimes.iter().map(runtime_json).collect::<Vec<_>>(),
        }));
    }
    let rate = hit_rate
        .map(|r| format!("{:.1}%", r * 100.0))
        .unwrap_or_else(|| "-".into());
    say(&format!(
        "{} {} (pid {}), up {}",
        ctx.paint("ctcached", Style::Bold),
        s.version,
        s.pid,
        human::long_duration(s.uptime_s)
    ))?;
    let mut t = Table::new(&["", ""]);
    let mut kv = |k: &str, v: String| t.plain(vec![k.to_string(), v]);
    kv("socket", s.socket.clone());
    kv("cache dir", s.cache_dir.clone());
    kv(
        "store",
        format!("{} entries, {}", s.entries, human::size(s.bytes)),
    );
    kv("gc budget", gc_budget(&s));
    kv(
        "hit rate",
        format!("{rate} ({} hits, {} misses)", s.hits, s.misses),
    );
    kv(
        "jobs",
        format!("{} running, {} queued", s.jobs_running, s.jobs_queued),
    );
    if s.reconciling {
        kv(
            "reconcile",
            "running (files and index brought to agree)".into(),
        );
    }
    kv("leases", format!("{} active", stats.active_leases));
    for r in &s.runtimes {
        kv(&r.name, runtime_line(r));
    }
    if let Some(r) = &s.remote {
        kv("remote", crate::remote::summary(r));
    }
    kv(
        "watches",
        if s.watches.is_empty() {
            "none".into()
        } else {
            s.watches.join(", ")
        },
    );
    for u in &stats.by_format {
        kv(
            "format",
            format!(
                "{}: {} entries, {}",
                u.name,
                u.entries,
                human::size(u.bytes)
            ),
        );
    }
    t.print_body(false)
}

/// A configured runtime as status shows it.
fn runtime_line(r: &api::RuntimeStatus) -> String {
    if r.checking {
        format!("checking {}", r.library)
    } else if !r.problem.is_empty() {
        format!("not usable: {}", r.problem)
    } else {
        format!("{} from {} ({})", r.version, r.library, r.build)
    }
}

fn runtime_json(r: &api::RuntimeStatus) -> serde_json::Value {
    serde_json::json!({
        "name": r.name,
        "library": r.library,
        "checking": r.checking,
        "version": r.version,
        "build": r.build,
        "library_blake3": r.library_blake3,
        "problem": r.problem,
    })
}

/// The configured gc budget and the store against it.
fn gc_budget(s: &api::StatusResponse) -> String {
    let mut parts = Vec::new();
    if let Some(max) = s.gc_max_bytes {
        let used = match max {
            0 => String::new(),
            m => format!(" ({:.0}%)", s.bytes as f64 * 100.0 / m as f64),
        };
        let default = match s.gc_max_bytes_default {
            true => ", by default half the cache's file system",
            false => "",
        };
        parts.push(format!(
            "store {} of {}{used}{default}",
            human::size(s.bytes),
            human::size(max)
        ));
    }
    if let Some(age) = s.gc_max_age_s {
        parts.push(format!(
            "entries unused for {} go",
            human::long_duration(age)
        ));
    }
    if parts.is_empty() {
        "none set (gc_max_bytes, gc_max_age_secs in ctcached.toml)".into()
    } else {
        parts.join("; ")
    }
}

pub async fn devices(ctx: &Ctx) -> Result<(), Failure> {
    let c = ctx.connect().await.map_err(|f| match f {
        Failure::Unreachable(m) => Failure::Unreachable(format!(
            "{m}\n(`ctcachectl devices --local` detects this host's devices without a daemon)"
        )),
        other => other,
    })?;
    crate::packing::print_devices(&c.get_host_devices().await?, ctx.json)
}

/// The order of `ls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SortBy {
    /// The index's order (by source digest).
    Key,
    /// By model path, then initializer.
    Model,
    /// Most recently used first.
    LastUse,
    /// Largest payload first.
    Size,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Only physical types starting with this (e.g. gemm.pack_b).
    #[arg(long)]
    format: Option<String>,
    /// Only devices whose description contains this (e.g. "cpu x86_64").
    #[arg(long)]
    device: Option<String>,
    /// Only entries packed from this model.
    #[arg(long)]
    model: Option<PathBuf>,
    /// At most this many entries (the first in --sort order).
    #[arg(long, default_value_t = 0, hide_default_value = true, value_name = "N")]
    limit: u32,
    /// Order of the entries.
    #[arg(long, value_enum, default_value_t = SortBy::Key, value_name = "ORDER")]
    sort: SortBy,
    /// Whole keys instead of abbreviated ones.
    #[arg(long)]
    full: bool,
}

/// The first of a list, and how many more: `/m/a.onnx (+2)`.
fn first_of(v: &[String]) -> String {
    match v {
        [] => "-".into(),
        [one] => one.clone(),
        [first, rest @ ..] => format!("{first} (+{})", rest.len()),
    }
}

pub async fn ls(ctx: &Ctx, a: LsArgs) -> Result<(), Failure> {
    let c = ctx.connect().await?;
    let model_path = match &a.model {
        // Entries record the canonical model path the daemon opened.
        Some(m) => std::fs::canonicalize(m)
            .or_else(|_| std::path::absolute(m))
            .unwrap_or_else(|_| m.clone())
            .display()
            .to_string(),
        None => String::new(),
    };
    // The daemon cuts at --limit in key order; another order cuts here.
    let mut entries = c
        .list(api::ListRequest {
            format: a.format.unwrap_or_default(),
            device: a.device.unwrap_or_default(),
            model_path,
            limit: if a.sort == SortBy::Key { a.limit } else { 0 },
            ..Default::default()
        })
        .await?;
    match a.sort {
        SortBy::Key => {}
        SortBy::Model => entries.sort_by(|x, y| {
            (&x.model_paths, &x.source_names, &x.physical_type).cmp(&(
                &y.model_paths,
                &y.source_names,
                &y.physical_type,
            ))
        }),
        SortBy::LastUse => entries.sort_by_key(|e| std::cmp::Reverse(e.last_access_unix_ms)),
        SortBy::Size => entries.sort_by_key(|e| std::cmp::Reverse(e.payload_len)),
    }
    if a.limit > 0 {
        entries.truncate(a.limit as usize);
    }
    if ctx.json {
        return print_json(
            &json!({ "entries": entries.iter().map(json::entry).collect::<Vec<_>>() }),
        );
    }
    if entries.is_empty() {
        return say("no entries");
    }
    let mut t = Table::new(&[
        "KEY",
        "MODEL",
        "INITIALIZER",
        "PHYSICAL TYPE",
        "DEVICE",
        "SIZE",
        "PACKED IN",
        "LAST USE",
        "",
    ]);
    for e in &entries {
        t.row(vec![
            (
                if a.full {
                    e.key.clone()
                } else {
                    human::short_key(&e.key)
                },
                Style::Plain,
            ),
            (first_of(&e.model_paths), Style::Plain),
            (first_of(&e.source_names), Style::Plain),
            (e.physical_type.clone(), Style::Plain),
            (json::describe_device(e.device.as_ref()), Style::Plain),
            (human::size(e.payload_len), Style::Plain),
            (human::duration_us(e.pack_duration_us), Style::Plain),
            (human::age(e.last_access_unix_ms), Style::Plain),
            (
                if e.leased {
                    "leased".into()
                } else {
                    String::new()
                },
                Style::Yellow,
            ),
        ]);
    }
    t.print(ctx.color)?;
    let total: u64 = entries.iter().map(|e| e.payload_len).sum();
    if !ctx.quiet {
        say(&format!(
            "{}, {}",
            human::count(entries.len() as u64, "entry", "entries"),
            human::size(total)
        ))?;
    }
    Ok(())
}

/// Finds one entry by a whole key, a unique prefix, or the `PREFIX…SUFFIX`
/// abbreviation `ls` prints.
pub async fn find_entry(c: &Client, key: &str) -> Result<api::Entry, Failure> {
    let key = key.trim();
    let (prefix, suffix) = key
        .split_once('…')
        .or_else(|| key.split_once(".."))
        .unwrap_or((key, ""));
    if prefix.is_empty()
        || !prefix
            .chars()
            .chain(suffix.chars())
            .all(|c| c.is_ascii_hexdigit())
    {
        return Err(Failure::Usage(format!(
            "{key:?} is not an entry key (hex, as `ctcachectl ls` prints)"
        )));
    }
    // A prefix that covers the source digest narrows the listing to it.
    let source = hex::decode(prefix.get(2..66).unwrap_or_default())
        .ok()
        .filter(|d| d.len() == 32);
    let mut entries = Vec::new();
    if let Some(d) = source {
        let req = api::ListRequest {
            source_digest: bytes::Bytes::from(d),
            ..Default::default()
        };
        entries = c.list(req).await?;
    }
    if entries.is_empty() {
        entries = c.list(api::ListRequest::default()).await?;
    }
    let lower = (prefix.to_ascii_lowercase(), suffix.to_ascii_lowercase());
    let mut hits: Vec<api::Entry> = entries
        .into_iter()
        .filter(|e| e.key.starts_with(&lower.0) && e.key.ends_with(&lower.1))
        .collect();
    match hits.len() {
        0 => Err(Failure::Failed(format!(
            "no entry {key} (`ctcachectl ls` lists them)"
        ))),
        1 => Ok(hits.remove(0)),
        n => Err(Failure::Failed(format!(
            "{key} matches {n} entries; give more of the key (`ctcachectl ls --full`)"
        ))),
    }
}

pub async fn stat(ctx: &Ctx, key: &str) -> Result<(), Failure> {
    let c = ctx.connect().await?;
    let e = find_entry(&c, key).await?;
    if ctx.json {
        return print_json(&json::entry(&e));
    }
    let mut t = Table::new(&["", ""]);
    let mut kv = |k: &str, v: String| t.plain(vec![k.to_string(), v]);
    kv("key", e.key.clone());
    kv(
        "source",
        format!(
            "{} {}:{}",
            e.source_names.join(","),
            e.digest_algorithm,
            hex::encode(&e.source_digest)
        ),
    );
    kv(
        "physical type",
        format!(
            "{} (format version {}, type key {})",
            e.physical_type, e.format_version, e.type_key
        ),
    );
    kv("dims", format!("{:?}", e.dims));
    kv("device", json::describe_device(e.device.as_ref()));
    kv(
        "payload",
        format!(
            "{} ({} bytes), blake3 {}",
            human::size(e.payload_len),
            e.payload_len,
            e.payload_blake3
        ),
    );
    kv("payload file", e.payload_path.clone());
    kv("producer", e.producer.clone());
    kv("packed in", human::duration_us(e.pack_duration_us));
    kv("created", human::age(e.created_unix_ms));
    kv(
        "last use",
        format!(
            "{} ({} uses)",
            human::age(e.last_access_unix_ms),
            e.access_count
        ),
    );
    kv("models", e.model_paths.join(", "));
    kv("leased", e.leased.to_string());
    t.print_body(false)
}
