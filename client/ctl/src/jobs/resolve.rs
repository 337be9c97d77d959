//! `resolve MODEL`: what the daemon holds and misses for each initializer
//! of a model, and (with `--on-miss`) the pack jobs it starts for the
//! misses.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde_json::{json, Value};

use super::FormatArgs;
use crate::ctx::Ctx;
use crate::human::{Style, Table};
use crate::json;
use crate::output::{print_json, say, Failure};
use ctcache_client::{api, ResolveOptions};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OnMissArg {
    /// Only report.
    None,
    /// Start pack jobs for the misses and return at once.
    Background,
    /// Pack the misses and report the result.
    Wait,
}

#[derive(Debug, Args)]
pub struct ResolveArgs {
    /// The ONNX model file.
    model: PathBuf,
    /// What the daemon does about misses.
    #[arg(long, value_enum, default_value = "none")]
    on_miss: OnMissArg,
    #[command(flatten)]
    fmt: FormatArgs,
    /// Also list initializers nothing is wanted or stored for.
    #[arg(long)]
    all: bool,
}

pub async fn resolve(ctx: &Ctx, a: ResolveArgs) -> Result<(), Failure> {
    let c = ctx.connect().await?;
    let on_miss = match a.on_miss {
        OnMissArg::None => api::OnMiss::None,
        OnMissArg::Background => api::OnMiss::Background,
        OnMissArg::Wait => api::OnMiss::Wait,
    };
    let opts = ResolveOptions {
        on_miss,
        formats: a.fmt.specs(),
        ..Default::default()
    };
    let res = c.resolve_model(&a.model, &opts).await?;
    if ctx.json {
        return print_json(&resolution_json(&res));
    }
    let hidden = print_tensors(ctx, &res, a.all)?;
    for n in &res.not_sources {
        say(&format!("not a source: {}: {}", n.name, n.reason))?;
    }
    for r in &res.tensors {
        for why in &r.refused {
            say(&format!("not wanted: {}: {why}", r.name))?;
        }
    }
    for f in &res.forms {
        say(&format!("runtime form: {}", form_line(f)))?;
    }
    if !ctx.quiet {
        print_notes(&res, a.on_miss, hidden)?;
    }
    Ok(())
}

/// A stored form as its key reads: runtime, version, options, device.
fn form_line(e: &api::Entry) -> String {
    let props = e
        .struct_type
        .as_ref()
        .and_then(|t| t.decode().ok())
        .map(|t| t.metadata_props)
        .unwrap_or_default();
    let meta = |k: &str| {
        props
            .iter()
            .find(|p| p.key == k)
            .map_or("?", |p| p.value.as_str())
    };
    let options: Vec<String> = props
        .iter()
        .filter_map(|p| {
            let name = p.key.strip_prefix("ctcache.form.option.")?;
            Some(format!("{name}={}", p.value))
        })
        .collect();
    format!(
        "{} {} ({}), {} on {}, {} bytes",
        meta("ctcache.form.runtime"),
        meta("ctcache.form.version"),
        options.join(", "),
        meta("ctcache.form.provider"),
        e.device.as_ref().map_or("?", |d| d.architecture.as_str()),
        e.payload_len
    )
}

/// The `--json` document of a resolution.
fn resolution_json(res: &api::ResolveModelResponse) -> Value {
    json!({
        "model_path": res.model_path,
        "jobs_started": res.jobs_started,
        "tensors": res.tensors.iter().map(|t| json!({
            "name": t.name,
            "data_type": t.data_type,
            "dims": t.dims,
            "source_digest": hex::encode(&t.source_digest),
            "digest_algorithm": t.digest_algorithm,
            "wanted_formats": t.wanted_formats,
            "status": tensor_status(t),
            "entries": t.entries.iter().map(json::entry).collect::<Vec<_>>(),
            "misses": t.misses.iter().map(json::miss).collect::<Vec<_>>(),
            "refused": t.refused,
        })).collect::<Vec<_>>(),
        "not_sources": res.not_sources.iter().map(|n| json!({"name": n.name, "reason": n.reason})).collect::<Vec<_>>(),
        "forms": res.forms.iter().map(json::entry).collect::<Vec<_>>(),
    })
}

/// Prints the table of initializers (those with nothing wanted or stored
/// only with `all`); how many it left out.
fn print_tensors(ctx: &Ctx, res: &api::ResolveModelResponse, all: bool) -> Result<usize, Failure> {
    let mut t = Table::new(&["INITIALIZER", "DIMS", "WANTED", "STATUS", "DETAIL"]);
    let mut hidden = 0;
    for r in &res.tensors {
        let status = tensor_status(r);
        if status == "-" && !all {
            hidden += 1;
            continue;
        }
        let style = match status {
            "hit" => Style::Green,
            "partial" => Style::Yellow,
            "miss" => Style::Red,
            _ => Style::Dim,
        };
        t.row(vec![
            (r.name.clone(), Style::Plain),
            (format!("{:?}", r.dims), Style::Plain),
            (r.wanted_formats.join(","), Style::Plain),
            (status.to_string(), style),
            (tensor_detail(r), Style::Plain),
        ]);
    }
    if t.is_empty() {
        say(&format!(
            "{}: nothing wanted or stored for any initializer",
            res.model_path
        ))?;
    } else {
        t.print(ctx.color)?;
    }
    Ok(hidden)
}

/// The misses' reasons, or the physical types of the entries when nothing
/// is missing.
fn tensor_detail(r: &api::TensorResolution) -> String {
    if r.misses.is_empty() {
        r.entries
            .iter()
            .map(|e| e.physical_type.clone())
            .collect::<Vec<_>>()
            .join(", ")
    } else {
        r.misses
            .iter()
            .map(|m| format!("{}: {}", m.reason, m.detail))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The lines after the table: initializers left out, and the pack jobs the
/// call started.
fn print_notes(
    res: &api::ResolveModelResponse,
    on_miss: OnMissArg,
    hidden: usize,
) -> Result<(), Failure> {
    if hidden > 0 {
        say(&format!(
            "({hidden} initializer(s) with nothing wanted or stored not shown; --all shows them)"
        ))?;
    }
    if res.jobs_started > 0 {
        say(&match on_miss {
            OnMissArg::Wait => format!(
                "{} missing entr{} packed before this answer (shown above)",
                res.jobs_started,
                if res.jobs_started == 1 { "y" } else { "ies" }
            ),
            _ => format!(
                "{} pack job(s) started in the background (`ctcachectl events` follows them)",
                res.jobs_started
            ),
        })?;
    }
    Ok(())
}

/// hit (every wanted format stored), partial, miss, or `-` (nothing wanted
/// and nothing stored).
fn tensor_status(t: &api::TensorResolution) -> &'static str {
    match (t.entries.is_empty(), t.misses.is_empty()) {
        (false, true) => "hit",
        (false, false) => "partial",
        (true, false) => "miss",
        (true, true) if t.wanted_formats.is_empty() => "-",
        (true, true) => "miss",
    }
}
